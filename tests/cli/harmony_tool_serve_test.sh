# granule-cli serve's forced tool calls on gpt-oss's harmony format, checked with the official
# OpenAI Python client (harmony_tool_serve_test.py) against the synthetic model carrying
# gpt-oss's chat template: a named function and tool_choice required (one tool or several)
# give one call whose arguments validate, whole and streamed (name first, then the arguments in
# pieces); auto and none unchanged.
source "$(dirname "$0")/cli_test_lib.sh"

require_server
require_python openai
MODEL=$WORK/gpt_oss_template.gguf
"$MODEL_WRITER" "$MODEL" "$(dirname "$0")/../data/chat/gpt_oss.jinja" || {
  fail "granule-test-model could not write $MODEL"
  finish
}
require_jinja "$MODEL"
require_structured_output "$MODEL"

if python3 "$(dirname "$0")/harmony_tool_serve_test.py" "$CLI" "$MODEL"; then pass; else fail "harmony_tool_serve_test.py"; fi
finish
