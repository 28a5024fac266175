# granule-cli serve's forced tool calls on gpt-oss's harmony format, checked with the official
# OpenAI Python client (harmony_tool_serve_test.py) against the synthetic model carrying
# gpt-oss's chat template: a named function and tool_choice required (one tool or several)
# give one call whose arguments validate, whole and streamed (name first, then the arguments in
# pieces); auto and none unchanged.
source "$(dirname "$0")/cli_test_lib.sh"

if ! "$CLI" serve --help 2>/dev/null | grep -q -- "--api-key"; then
  echo "skip: this granule-cli was built without the server (cpp-httplib, libcpp-httplib-dev, not found)"
  exit 77
fi
export PYTHONPATH="${XDG_DATA_HOME:-$HOME/.local/share}/granule/python${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c 'import openai' 2>/dev/null; then
  echo "skip: the openai Python package is absent (bash packaging/setup.sh pydeps)"
  exit 77
fi
MODEL=$WORK/gpt_oss_template.gguf
"$MODEL_WRITER" "$MODEL" "$(dirname "$0")/../data/chat/gpt_oss.jinja" || {
  fail "granule-test-model could not write $MODEL"
  finish
}
if ! "$CLI" info "$MODEL" | grep -q "^template engine: *Jinja"; then
  echo "skip: this build has no Jinja engine (bash packaging/setup.sh jinja, then rebuild)"
  exit 77
fi
if ! "$CLI" info "$MODEL" | grep -qi "structured output: *yes"; then
  echo "skip: this build has no structured output (bash packaging/setup.sh xgrammar, then rebuild)"
  exit 77
fi

if python3 "$(dirname "$0")/harmony_tool_serve_test.py" "$CLI" "$MODEL"; then pass; else fail "harmony_tool_serve_test.py"; fi
finish
