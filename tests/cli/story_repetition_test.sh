# The default sampling does not loop on the default model: a 512-token story at the default
# settings (fixed seed, so the run is the same every time) repeats no sentence more than
# MAX_REPEATS times. Measured with this seed: the defaults (repetition penalty 1.1 over the
# last 64 tokens) repeat no sentence; with the penalty off (the default before) the same run
# repeats one sentence 11 times, so the check does fail on a looping story.
source "$(dirname "$0")/cli_test_lib.sh"

MODEL=$(default_model)
if [[ -z $MODEL ]]; then
  skip_all "the default model is absent (\`bash packaging/setup.sh model\`)"
fi
PROMPT="Write a long story about a programmer."
SEED=2
MAX_REPEATS=2

# most_repeated FILE: "COUNT SENTENCE" for the most repeated sentence of three words or
# more (split after . ! ? and at line ends, spaces folded, case kept).
most_repeated() {
  tr '\n' ' ' <"$1" | sed -E 's/([.!?])[[:space:]]+/\1\n/g' | sed -E 's/[[:space:]]+/ /g; s/^ //; s/ $//' |
    awk 'NF >= 3' | sort | uniq -c | sort -rn | head -1 | sed -E 's/^ +//'
}

run_cli run "$MODEL" -p "$PROMPT" -n 512 --seed $SEED --device cpu --no-stats
top=$(most_repeated "$OUT")
count=${top%% *}
echo "default settings, seed $SEED: $(wc -w <"$OUT") words, most repeated sentence ${count:-0}x: ${top#* }"
if [[ $RC -eq 0 && -n $count && $count -le $MAX_REPEATS ]]; then pass; else fail "a sentence repeats ${count}x (at most $MAX_REPEATS allowed): $top"; fi

finish
