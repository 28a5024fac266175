# granule-cli chat --endpoint against a server on loopback, directly and through the fault
# proxy (remote_chat_test.py): `granule-cli serve`, or with "llama-server" as the second
# argument llama.cpp's llama-server as `setup.sh llamaserver` builds it. Skips (77), saying
# why, without the server build, the default model or the llama-server build.
CLI=${1:?usage: bash remote_chat_test.sh <granule-cli> [granule|llama-server]}
WHICH=${2:-granule}
MODEL=""
for m in "${GRANULE_DEFAULT_MODEL:-}" "${XDG_DATA_HOME:-$HOME/.local/share}/granule/models/SmolLM2-135M-Instruct.Q4_1.gguf"; do
  if [[ -n $m && -f $m ]]; then MODEL=$m; break; fi
done
if [[ -z $MODEL ]]; then
  echo "SKIP: the default model is absent (bash packaging/setup.sh model)"
  exit 77
fi
if [[ $WHICH == llama-server ]]; then
  LLAMA_SERVER=${XDG_DATA_HOME:-$HOME/.local/share}/granule/third_party/llama-server/bin/llama-server
  if [[ ! -x $LLAMA_SERVER ]]; then
    echo "SKIP: llama-server is not built (bash packaging/setup.sh llamaserver builds it, about 8 min on 2 cores)"
    exit 77
  fi
  exec python3 "$(dirname "$0")/remote_chat_test.py" "$CLI" "$MODEL" "$LLAMA_SERVER"
fi
if ! "$CLI" serve --help 2>/dev/null | grep -q -- "--api-key"; then
  echo "SKIP: this granule-cli was built without the server (cpp-httplib)"
  exit 77
fi
exec python3 "$(dirname "$0")/remote_chat_test.py" "$CLI" "$MODEL"
