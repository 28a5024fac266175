# granule-cli serve's structured output and tool calling, checked with the official OpenAI
# Python client on the default model (structured_serve_test.py): response_format json_schema
# and chat.completions.parse with pydantic, a tool round trip, streamed tool calls, and 400s.
source "$(dirname "$0")/cli_test_lib.sh"

require_server
require_python openai pydantic
require_default_model
require_structured_output "$MODEL"

if python3 "$(dirname "$0")/structured_serve_test.py" "$CLI" "$MODEL"; then pass; else fail "structured_serve_test.py"; fi
finish
