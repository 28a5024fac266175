# granule-cli tokenize on the shared vocabulary-only GGUFs: every test string of the
# llama.cpp goldens (.inp/.out: ids from the Hugging Face tokenizers, no BOS, specials not
# parsed) must give the golden ids with --no-bos; BOS and --parse-special behave as the
# vocabulary says.
source "$(dirname "$0")/cli_test_lib.sh"

if [[ ! -d $VOCAB_DIR ]]; then
  skip_all "$VOCAB_DIR is absent (\`bash packaging/setup.sh testdata\`)"
fi

# Splits NAME.inp into INPUTS (strings end with a line "__ggml_vocab_test__").
read_inputs() {
  INPUTS=()
  local line current="" first=1
  while IFS= read -r line || [[ -n $line ]]; do
    if [[ $line == "__ggml_vocab_test__" ]]; then
      INPUTS+=("$current"); current=""; first=1
    elif ((first)); then
      current=$line; first=0
    else
      current+=$'\n'$line
    fi
  done <"$1"
}

for vocab in gpt-2 llama-spm phi-3; do
  file="$VOCAB_DIR/ggml-vocab-$vocab.gguf"
  read_inputs "$file.inp"
  mapfile -t EXPECTED <"$file.out"
  if [[ ${#INPUTS[@]} -lt 10 || ${#INPUTS[@]} -ne ${#EXPECTED[@]} ]]; then
    fail "$vocab: ${#INPUTS[@]} inputs but ${#EXPECTED[@]} golden lines"
    continue
  fi
  # The tokenizer's own tests check every string; every third one here (blanks, whitespace
  # runs, accents, Cyrillic, emoji, code) shows the command passes text and ids through intact.
  mismatches=0 checked=0
  for ((i = 0; i < ${#INPUTS[@]}; i += 3)); do
    checked=$((checked + 1))
    run_cli tokenize --no-bos "$file" -- "${INPUTS[$i]}"
    got=$(cat "$OUT")
    want=$(echo ${EXPECTED[$i]})   # the goldens start with a space; compare normalised
    if [[ $RC -ne 0 || $got != "$want" ]]; then
      mismatches=$((mismatches + 1))
      fail "$vocab input $i $(printf %q "${INPUTS[$i]}"): got '$got' want '$want' $(cat "$ERR")"
    else
      pass
    fi
  done
  echo "$vocab: $checked of ${#INPUTS[@]} strings, $mismatches mismatches"
done

# llama-spm adds BOS (id 1) by default (tokenizer.ggml.add_bos_token = true).
run_cli tokenize "$VOCAB_DIR/ggml-vocab-llama-spm.gguf" "Hello world"
if [[ $(cat "$OUT") == "1 15043 3186" ]]; then pass; else fail "llama-spm BOS: got '$(cat "$OUT")'"; fi
run_cli tokenize --no-bos "$VOCAB_DIR/ggml-vocab-llama-spm.gguf" "Hello world"
if [[ $(cat "$OUT") == "15043 3186" ]]; then pass; else fail "llama-spm --no-bos: got '$(cat "$OUT")'"; fi

# Phi-3's <|end|> (id 32007) is one token only with --parse-special.
run_cli tokenize --no-bos --parse-special "$VOCAB_DIR/ggml-vocab-phi-3.gguf" "<|end|>"
if [[ $(cat "$OUT") == "32007" ]]; then pass; else fail "phi-3 --parse-special: got '$(cat "$OUT")'"; fi
run_cli tokenize --no-bos "$VOCAB_DIR/ggml-vocab-phi-3.gguf" "<|end|>"
if [[ $RC -eq 0 && $(wc -w <"$OUT") -gt 1 ]]; then pass; else fail "phi-3 without --parse-special: got '$(cat "$OUT")'"; fi

finish
