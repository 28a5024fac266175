# granule-cli serve end to end: serve_test.py drives a running server with the official
# OpenAI Python client (installed by `setup.sh pydeps`), curl and raw sockets.
source "$(dirname "$0")/cli_test_lib.sh"

require_server
require_default_model
require_python openai
if ! command -v curl >/dev/null; then
  fail "curl is missing (bash packaging/setup.sh deps)"
  finish
fi

if python3 "$(dirname "$0")/serve_test.py" "$CLI" "$MODEL"; then pass; else fail "serve_test.py"; fi
finish
