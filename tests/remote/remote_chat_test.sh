# granule-cli chat --endpoint against granule-cli serve, directly and through the fault proxy
# (remote_chat_test.py); skips without the server build or the default model.
CLI=${1:?usage: bash remote_chat_test.sh <granule-cli>}
if ! "$CLI" serve --help 2>/dev/null | grep -q -- "--api-key"; then
  echo "SKIP: this granule-cli was built without the server (cpp-httplib)"
  exit 77
fi
MODEL=""
for m in "${GRANULE_DEFAULT_MODEL:-}" "${XDG_DATA_HOME:-$HOME/.local/share}/granule/models/SmolLM2-135M-Instruct.Q4_1.gguf"; do
  if [[ -n $m && -f $m ]]; then MODEL=$m; break; fi
done
if [[ -z $MODEL ]]; then
  echo "SKIP: the default model is absent (bash packaging/setup.sh model)"
  exit 77
fi
exec python3 "$(dirname "$0")/remote_chat_test.py" "$CLI" "$MODEL"
