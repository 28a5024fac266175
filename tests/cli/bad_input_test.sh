# granule-cli on files a user can get wrong: missing, not a file, empty, truncated and
# bit-flipped GGUFs. Each must end with exit code 1 and one stderr line, never a signal;
# a random flip the reader cannot notice (inside a string) may also succeed. The corrupted
# copies start from llama.cpp's llama-spm vocabulary when the testdata has it, else from the
# tiny synthetic model; the checks that need a particular file say "SKIP: " when it is absent.
source "$(dirname "$0")/cli_test_lib.sh"

SOURCE="$VOCAB_DIR/ggml-vocab-llama-spm.gguf"
if [[ ! -f $SOURCE ]]; then
  SOURCE=$(synthetic_model)
  if [[ -z $SOURCE ]]; then
    skip_all "neither $VOCAB_DIR/ggml-vocab-llama-spm.gguf nor granule-test-model (third argument) to make a model to corrupt"
  fi
  skip_note "$VOCAB_DIR/ggml-vocab-llama-spm.gguf is absent: corrupting the tiny synthetic model instead"
fi

expect_clean_failure "missing file (info)" info "$WORK/no-such-model.gguf"
if grep -q "no-such-model.gguf" "$ERR"; then pass; else fail "the error does not name the file: $(cat "$ERR")"; fi
expect_clean_failure "missing file (tokenize)" tokenize "$WORK/no-such-model.gguf" hi
expect_clean_failure "missing file (run)" run "$WORK/no-such-model.gguf" -p hi
expect_clean_failure "a directory" info "$WORK"
: >"$WORK/empty.gguf"
expect_clean_failure "empty file" info "$WORK/empty.gguf"
echo "this is not a model" >"$WORK/text.gguf"
expect_clean_failure "text file" tokenize "$WORK/text.gguf" hi
if [[ -f $VOCAB_DIR/ggml-vocab-llama-spm.gguf ]]; then
  expect_clean_failure "run on a vocabulary-only file" run "$VOCAB_DIR/ggml-vocab-llama-spm.gguf" -p hi -n 1
else
  skip_note "run on a vocabulary-only file: $VOCAB_DIR/ggml-vocab-llama-spm.gguf is absent"
fi

# Truncated copies: in the header, in the metadata, in the vocabulary arrays.
size=$(stat -c %s "$SOURCE")
for length in 3 4 8 16 23 24 40 100 1000 100000 $((size / 2)) $((size - 1)); do
  head -c "$length" "$SOURCE" >"$WORK/truncated.gguf"
  expect_clean_failure "truncated to $length bytes (info)" info "$WORK/truncated.gguf"
  expect_clean_failure "truncated to $length bytes (tokenize)" tokenize "$WORK/truncated.gguf" hi
done

# write_byte FILE OFFSET VALUE
write_byte() {
  printf "$(printf '\\%03o' "$3")" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
read_byte() { od -An -tu1 -j "$2" -N1 "$1" | tr -d ' '; }

# Targeted corruptions of the GGUF header (magic, version, counts) and of the first key's
# length (a u64 at byte 24).
corrupt() {   # corrupt WHAT OFFSET VALUE
  cp "$SOURCE" "$WORK/corrupt.gguf"
  write_byte "$WORK/corrupt.gguf" "$2" "$3"
  expect_clean_failure "$1 (info)" info "$WORK/corrupt.gguf"
  expect_clean_failure "$1 (tokenize)" tokenize "$WORK/corrupt.gguf" hi
}
corrupt "bad magic" 0 0x58
corrupt "version 99" 4 99
corrupt "version 0" 4 0
corrupt "tensor count 2^56" 15 1
corrupt "key/value count 2^56" 23 1
corrupt "first key length 2^40" 29 1
corrupt "first key length 255" 24 255

# Random single-bit flips over the first 4 KiB (header, keys, the start of the vocabulary):
# whatever the reader makes of them, no crash and at most one line of complaint (or a
# success with only logged warnings).
RANDOM=20261202
for trial in $(seq 1 40); do
  offset=$((RANDOM % 4096))
  bit=$((RANDOM % 8))
  cp "$SOURCE" "$WORK/flipped.gguf"
  value=$(read_byte "$WORK/flipped.gguf" "$offset")
  write_byte "$WORK/flipped.gguf" "$offset" $((value ^ (1 << bit)))
  for command in info tokenize; do
    args=("$command" "$WORK/flipped.gguf")
    [[ $command == tokenize ]] && args+=("Hello world")
    run_cli "${args[@]}"
    lines=$(wc -l <"$ERR")
    # A flip that leaves a valid but odd file (a token twice in the vocabulary) may load with
    # logged warnings; anything else on stderr of a success is a failure.
    warnings=$(grep -c '^\[[0-9:.]*\] \[engine\.[a-z_]*\] \[warning\] ' "$ERR")
    if [[ ($RC -eq 0 && $lines -eq $warnings) || ($RC -eq 1 && $lines -eq 1) ]]; then
      pass
    else
      fail "bit $bit of byte $offset flipped ($command): exit $RC, $lines stderr lines: $(head -c 300 "$ERR")"
    fi
  done
done

# A valid file whose pre-tokenizer the engine does not know: tokenize refuses it by name.
GPT2="$VOCAB_DIR/ggml-vocab-gpt-2.gguf"
key_at=""
[[ -f $GPT2 ]] && key_at=$(grep -boa 'tokenizer.ggml.pre' "$GPT2" | head -1 | cut -d: -f1)
if [[ ! -f $GPT2 ]]; then
  skip_note "unknown pre-tokenizer: $GPT2 is absent"
elif [[ -n $key_at ]]; then
  cp "$GPT2" "$WORK/unknown-pre.gguf"
  # key (18 bytes), value type (4), string length (8), then "gpt-2": make it "gpt-9".
  write_byte "$WORK/unknown-pre.gguf" $((key_at + 18 + 4 + 8 + 4)) 0x39
  expect_clean_failure "unknown pre-tokenizer" tokenize "$WORK/unknown-pre.gguf" hi
  if grep -q "gpt-9" "$ERR"; then pass; else fail "the error does not name the pre-tokenizer: $(cat "$ERR")"; fi
else
  fail "tokenizer.ggml.pre not found in $GPT2"
fi

# The real model, truncated inside its tensor data: info and run must both refuse it.
MODEL=$(default_model)
if [[ -n $MODEL ]]; then
  head -c 50000000 "$MODEL" >"$WORK/model-truncated.gguf"
  expect_clean_failure "default model truncated (info)" info "$WORK/model-truncated.gguf"
  expect_clean_failure "default model truncated (run)" run "$WORK/model-truncated.gguf" -p hi -n 1
else
  skip_note "the default model truncated inside its tensor data: the default model is absent"
fi

finish
