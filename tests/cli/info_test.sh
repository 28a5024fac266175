# granule-cli info: the tiny synthetic model, the shared vocabulary-only GGUFs (no tensors) and,
# when present, the default model (SmolLM2-135M-Instruct Q4_1: llama, 30 layers, hidden 576, vocab 49152).
source "$(dirname "$0")/cli_test_lib.sh"

MODEL=$(default_model)

# The tiny synthetic model (always available): the values its spec sets (the testkit's "tiny").
TINY=$(synthetic_model)
if [[ -n $TINY ]]; then
  run_cli info "$TINY"
  if [[ $RC -eq 0 && ! -s $ERR ]]; then pass; else fail "info tiny synthetic model: exit $RC: $(cat "$ERR")"; fi
  expect_field architecture llama
  expect_field layers 2
  expect_field hidden 64
  expect_field heads 4
  expect_field "kv heads" 2
  expect_field "head dim" 16
  expect_field feed-forward 128
  expect_field vocab 384
  expect_field "context length" 2048
  expect_field "dominant type" F32
  expect_field "bos id" 1
  expect_field "eos id" 2
  expect_field "chat template" chatml
elif [[ ! -d $VOCAB_DIR && -z $MODEL ]]; then
  skip_all "neither $VOCAB_DIR (\`bash packaging/setup.sh testdata\`), the default model (\`bash packaging/setup.sh model\`) nor granule-test-model (third argument) is present"
else
  skip_note "the tiny synthetic model's checks: granule-test-model (third argument) is absent"
fi

if [[ ! -d $VOCAB_DIR ]]; then
  skip_note "the vocabulary-only files' checks (gpt-2, llama-spm, phi-3): $VOCAB_DIR is absent (\`bash packaging/setup.sh testdata\`)"
else
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
  skip_note "the default model's checks: the default model is absent (\`bash packaging/setup.sh model\`)"
fi

finish
