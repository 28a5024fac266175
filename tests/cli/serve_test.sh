# granule-cli serve end to end: serve_test.py drives a running server with the official
# OpenAI Python client (installed by `setup.sh pydeps`), curl and raw sockets.
source "$(dirname "$0")/cli_test_lib.sh"

# Without the subcommand, `serve --help` prints the main help: look for serve's own options.
if ! "$CLI" serve --help 2>/dev/null | grep -q -- "--api-key"; then
  echo "skip: this granule-cli was built without the server (cpp-httplib, libcpp-httplib-dev, not found)"
  exit 77
fi
MODEL=$(default_model)
if [[ -z $MODEL ]]; then
  echo "skip: the default model is absent (bash packaging/setup.sh model)"
  exit 77
fi
# Where `setup.sh pydeps` installs the client.
export PYTHONPATH="${XDG_DATA_HOME:-$HOME/.local/share}/granule/python${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c 'import openai' 2>/dev/null; then
  echo "skip: the openai Python package is absent (bash packaging/setup.sh pydeps)"
  exit 77
fi
if ! command -v curl >/dev/null; then
  fail "curl is missing (bash packaging/setup.sh deps)"
  finish
fi

if python3 "$(dirname "$0")/serve_test.py" "$CLI" "$MODEL"; then pass; else fail "serve_test.py"; fi
finish
