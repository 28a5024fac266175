# granule-cli info: the shared vocabulary-only GGUFs (no tensors) and, when present, the
# default model (SmolLM2-135M-Instruct Q4_1: llama, 30 layers, hidden 576, vocab 49152).
source "$(dirname "$0")/cli_test_lib.sh"

MODEL=$(default_model)
if [[ ! -d $VOCAB_DIR && -z $MODEL ]]; then
  echo "skip: neither $VOCAB_DIR nor the default model is present"
  exit 77
fi

if [[ -d $VOCAB_DIR ]]; then
  # Expected values read from the files' metadata with the gguf Python package.
  run_cli info "$VOCAB_DIR/ggml-vocab-gpt-2.gguf"
  if [[ $RC -eq 0 ]]; then pass; else fail "info gpt-2 vocab: exit $RC: $(cat "$ERR")"; fi
  expect_field architecture gpt2
  expect_field "vocab size" 50257
  expect_field tokenizer "gpt2 \(pre-tokenizer gpt-2\)"
  expect_field weights "none \(vocabulary-only file\)"
  expect_field "chat template" "\(none in the file\)"

  run_cli info "$VOCAB_DIR/ggml-vocab-llama-spm.gguf"
  if [[ $RC -eq 0 ]]; then pass; else fail "info llama-spm vocab: exit $RC: $(cat "$ERR")"; fi
  expect_field architecture llama
  expect_field "vocab size" 32000
  expect_field "bos id" 1

  run_cli info "$VOCAB_DIR/ggml-vocab-phi-3.gguf"
  if [[ $RC -eq 0 ]]; then pass; else fail "info phi-3 vocab: exit $RC: $(cat "$ERR")"; fi
  expect_field "vocab size" 32064
  expect_field "eos id" 32000
  expect_field "chat template" phi3
fi

if [[ -n $MODEL ]]; then
  run_cli info "$MODEL"
  if [[ $RC -eq 0 && ! -s $ERR ]]; then pass; else fail "info default model: exit $RC: $(cat "$ERR")"; fi
  expect_field architecture llama
  expect_field layers 30
  expect_field hidden 576
  expect_field heads 9
  expect_field "kv heads" 3
  expect_field "head dim" 64
  expect_field feed-forward 1536
  expect_field vocab 49152
  expect_field "context length" 8192
  expect_field "rope theta" 100000
  expect_field tensors 272
  expect_field "dominant type" Q4_1
  expect_field "  Q4_1" "[0-9]+ tensors, [0-9.]+ MiB"
  expect_field "chat template" chatml
  expect_field "default system" '"You are a helpful AI assistant named SmolLM, trained by Hugging Face"'
else
  echo "note: default model absent, its checks skipped"
fi

finish
