# granule-cli perplexity: the output format of llama-perplexity ("[1]x,[2]y,..." and
# "Final estimate: PPL = X +/- Y"), the number of chunks, standard input, a text too short
# for the context, and every value against the independent float64 numpy computation of
# tests/reference/perplexity_reference.py (when numpy and gguf are installed), on the tiny
# synthetic model (byte-level vocabulary, so ~1 token per byte) with a 64-token context.
source "$(dirname "$0")/cli_test_lib.sh"

MODEL=$(synthetic_model)
if [[ -z $MODEL ]]; then skip_all "granule-test-model (third argument) is needed"; fi
TEXT="$(dirname "$0")/../data/text/lighthouse.txt"
REFERENCE="$(dirname "$0")/../reference/perplexity_reference.py"
CTX=64

run_cli tokenize "$MODEL" -f "$TEXT"
cp "$OUT" "$WORK/ids"
n_tokens=$(wc -w <"$WORK/ids")
chunks=$((n_tokens / CTX))

run_cli perplexity "$MODEL" -f "$TEXT" -c $CTX --device cpu
cp "$OUT" "$WORK/ppl.out"
running=$(sed -n 1p "$OUT")
final=$(sed -n 2p "$OUT")
if [[ $RC -eq 0 && $(wc -l <"$OUT") -eq 2 ]]; then pass; else fail "perplexity: exit $RC: $(cat "$OUT" "$ERR")"; fi
if [[ $running =~ ^(\[[0-9]+\][0-9]+\.[0-9]{4},)+$ ]] && [[ $(grep -o '\[' <<<"$running" | wc -l) -eq $chunks ]]; then
  pass
else
  fail "running values: expected $chunks chunks of $n_tokens tokens, got '$running'"
fi
if [[ $final =~ ^Final\ estimate:\ PPL\ =\ [0-9]+\.[0-9]{4}\ \+/-\ [0-9]+\.[0-9]{5}$ ]]; then pass; else fail "final line: '$final'"; fi
# The last running value is the final estimate.
last=$(grep -oE '[0-9.]+,$' <<<"$running" | tr -d ,)
if [[ $final == "Final estimate: PPL = $last "* ]]; then pass; else fail "last running value $last, final '$final'"; fi

# Standard input and a smaller forward batch give the same numbers.
"$CLI" perplexity "$MODEL" -f - -c $CTX --batch 7 --device cpu <"$TEXT" >"$WORK/stdin.out" 2>"$WORK/stdin.err"
if cmp -s "$WORK/stdin.out" "$WORK/ppl.out"; then pass; else fail "-f - --batch 7: $(cat "$WORK/stdin.out" "$WORK/stdin.err")"; fi

# --chunks limits the chunks scored.
run_cli perplexity "$MODEL" -f "$TEXT" -c $CTX --chunks 2 --device cpu
if [[ $(sed -n 1p "$OUT") == "$(grep -oE '^\[1\][0-9.]+,\[2\][0-9.]+,' <<<"$running")" ]]; then pass; else fail "--chunks 2: '$(sed -n 1p "$OUT")'"; fi

# A text shorter than two contexts is one clean line that says what is needed.
head -c 100 "$TEXT" >"$WORK/short.txt"
expect_failure_saying "short text" "short.txt has [0-9]+ tokens; perplexity with a context of 64 needs at least 128" \
  perplexity "$MODEL" -f "$WORK/short.txt" -c $CTX --device cpu
expect_failure_saying "missing text file" "no-such.txt: cannot open" \
  perplexity "$MODEL" -f "$WORK/no-such.txt" --device cpu

# Against the numpy reference: every running value and the final estimate to 4 decimals
# (float32 against float64 logits moves them by far less than 1e-3 relative).
if ! python3 -c "import numpy, gguf" 2>/dev/null; then
  skip_note "numpy or gguf is not installed: the comparison with the numpy reference is skipped"
  finish
fi
python3 "$REFERENCE" "$MODEL" --tokens-file "$WORK/ids" --ctx $CTX >"$WORK/ref.out" 2>"$WORK/ref.err"
python3 - "$WORK/ppl.out" "$WORK/ref.out" <<'PY'
import re, sys
got, want = (open(p).read() for p in sys.argv[1:3])
numbers = lambda s: [float(x) for x in re.findall(r"\](\d+\.\d+),", s)]
final = lambda s: [float(x) for x in re.search(r"PPL = ([\d.]+) \+/- ([\d.]+)", s).groups()]
g, w = numbers(got), numbers(want)
assert len(g) == len(w) > 0, (got, want)
for i, (a, b) in enumerate(zip(g, w)):
    assert abs(a - b) <= 1e-3 * b + 2e-4, f"chunk {i + 1}: granule {a}, numpy {b}"
(gp, ge), (wp, we) = final(got), final(want)
assert abs(gp - wp) <= 1e-3 * wp and abs(ge - we) <= 1e-2 * we + 1e-5, (got, want)
print(f"perplexity matches numpy over {len(g)} chunks: {gp} +/- {ge} vs {wp} +/- {we}")
PY
if [[ $? -eq 0 ]]; then pass; else fail "granule-cli and the numpy reference differ: $(cat "$WORK/ppl.out" "$WORK/ref.out" "$WORK/ref.err")"; fi

finish
