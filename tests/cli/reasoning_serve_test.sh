# granule-cli serve's reasoning: reasoning_content (whole and streamed), chat_template_kwargs
# and reasoning_effort, checked with the official OpenAI Python client against a synthetic
# model whose chat template opens <think> as Qwen3's does (reasoning_serve_test.py).
source "$(dirname "$0")/cli_test_lib.sh"

require_server
require_python openai

# A Qwen3-style template: the generation prompt opens <think> unless enable_thinking is false,
# when it writes an empty block, so the reply is the answer.
cat >"$WORK/qwen3_style.jinja" <<'JINJA'
{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{%- else %}{{ '<think>\n' }}{%- endif %}{%- endif %}
JINJA
MODEL=$WORK/qwen3_style.gguf
"$MODEL_WRITER" "$MODEL" "$WORK/qwen3_style.jinja" || {
  fail "granule-test-model could not write $MODEL"
  finish
}
require_jinja "$MODEL"

if python3 "$(dirname "$0")/reasoning_serve_test.py" "$CLI" "$MODEL"; then pass; else fail "reasoning_serve_test.py"; fi
finish
