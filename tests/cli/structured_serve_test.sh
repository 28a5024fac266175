# granule-cli serve's structured output and tool calling, checked with the official OpenAI
# Python client on the default model (structured_serve_test.py): response_format json_schema
# and chat.completions.parse with pydantic, a tool round trip, streamed tool calls, and 400s.
source "$(dirname "$0")/cli_test_lib.sh"

if ! "$CLI" serve --help 2>/dev/null | grep -q -- "--api-key"; then
  echo "skip: this granule-cli was built without the server (cpp-httplib, libcpp-httplib-dev, not found)"
  exit 77
fi
export PYTHONPATH="${XDG_DATA_HOME:-$HOME/.local/share}/granule/python${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c 'import openai, pydantic' 2>/dev/null; then
  echo "skip: the openai Python package is absent (bash packaging/setup.sh pydeps)"
  exit 77
fi
MODEL=$(default_model)
if [[ -z $MODEL ]]; then
  echo "skip: the default model is absent (bash packaging/setup.sh model)"
  exit 77
fi
if ! "$CLI" info "$MODEL" | grep -qi "structured output: *yes"; then
  echo "skip: this build has no structured output (bash packaging/setup.sh xgrammar, then rebuild)"
  exit 77
fi

if python3 "$(dirname "$0")/structured_serve_test.py" "$CLI" "$MODEL"; then pass; else fail "structured_serve_test.py"; fi
finish
