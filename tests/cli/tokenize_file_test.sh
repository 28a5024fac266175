# granule-cli tokenize -f FILE and -f - (standard input): the same ids as the text given as
# an argument; a 1 MB text (past what an argument list holds) is tokenized whole from a file
# and from a pipe; a missing file and text given twice are one clean line each.
source "$(dirname "$0")/cli_test_lib.sh"

MODEL=$(loadable_model)
if [[ -z $MODEL ]]; then skip_all "neither the default model nor granule-test-model (third argument)"; fi
TEXT="$(dirname "$0")/../data/text/lighthouse.txt"

text=$(cat "$TEXT"; printf x)   # keeps the final newline, which $(cat) would drop
text=${text%x}
run_cli tokenize "$MODEL" "$text"
argument_ids=$(cat "$OUT")
run_cli tokenize "$MODEL" -f "$TEXT"
if [[ $RC -eq 0 && -n $argument_ids && $(cat "$OUT") == "$argument_ids" ]]; then pass; else fail "-f FILE differs from the argument: $(head -c 200 "$OUT" "$ERR")"; fi
"$CLI" tokenize "$MODEL" -f - <"$TEXT" >"$WORK/stdin.out" 2>"$WORK/stdin.err"
if [[ $(cat "$WORK/stdin.out") == "$argument_ids" ]]; then pass; else fail "-f - differs: $(head -c 200 "$WORK/stdin.err")"; fi
run_cli tokenize "$MODEL" --pieces -f "$TEXT"
if [[ $RC -eq 0 && $(wc -l <"$OUT") -ge $(wc -w <<<"$argument_ids") ]]; then pass; else fail "--pieces -f: $(head -c 200 "$ERR")"; fi

# 1 MB: the text 384 times (1,049,088 bytes); the count scales with the copies (each copy
# tokenizes alike after the first's boundary, so allow a few tokens either way per copy).
for _ in $(seq 1 384); do cat "$TEXT"; done >"$WORK/big.txt"
run_cli tokenize --no-bos "$MODEL" -f "$WORK/big.txt"
big_count=$(wc -w <"$OUT")
one_count=$("$CLI" tokenize --no-bos "$MODEL" -f "$TEXT" | wc -w)
if [[ $RC -eq 0 && $big_count -ge $((one_count * 384 - 384)) && $big_count -le $((one_count * 384 + 384)) ]]; then
  pass
else
  fail "1 MB text: exit $RC, $big_count tokens for 384 copies of $one_count: $(head -c 200 "$ERR")"
fi
cat "$WORK/big.txt" | "$CLI" tokenize --no-bos "$MODEL" -f - >"$WORK/big_stdin.out" 2>"$WORK/big_stdin.err"
if cmp -s "$WORK/big_stdin.out" "$OUT"; then pass; else fail "1 MB from a pipe differs: $(head -c 200 "$WORK/big_stdin.err")"; fi
echo "1 MB text: $big_count tokens ($one_count per copy)"

expect_failure_saying "missing file" "no-such.txt: cannot open: No such file or directory" \
  tokenize "$MODEL" -f "$WORK/no-such.txt"
expect_clean_failure "text and -f" tokenize "$MODEL" "hello" -f "$TEXT"

finish
