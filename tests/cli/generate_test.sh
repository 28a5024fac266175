# granule-cli run and chat on the default model (skipped when it is absent): a streamed
# greedy answer with the speeds line on stderr, raw prompts, template override, a chat over
# stdin with /reset and /exit, and Ctrl-C cancelling a reply without killing the process.
source "$(dirname "$0")/cli_test_lib.sh"

MODEL=$(default_model)
if [[ -z $MODEL ]]; then
  skip_all "the default model is absent (\`bash packaging/setup.sh model\`)"
fi
# chat adds the tokens computed and reused: "prompt: 96 tokens (18 new, 78 reused), ..."
SPEEDS='^prompt: [0-9]+ tokens( \([0-9]+ new, [0-9]+ reused\))?, [0-9.]+ ms \([0-9.]+ tok/s\) \| generation: [0-9]+ tokens, [0-9.]+ ms \([0-9.]+ tok/s\) \| stop: [a-z]+$'

# SmolLM2-135M-Instruct answers this greedily with "The capital of France is Paris."
run_cli run "$MODEL" -p "What is the capital of France?" -n 12 --temp 0 --device cpu
if [[ $RC -eq 0 ]] && grep -q "Paris" "$OUT"; then pass; else fail "run: exit $RC: $(cat "$OUT" "$ERR")"; fi
if [[ $(wc -l <"$ERR") -eq 1 ]] && grep -Eq "$SPEEDS" "$ERR"; then pass; else fail "run speeds line: $(cat "$ERR")"; fi

run_cli run "$MODEL" -p "The capital of France is" --raw -n 3 --temp 0 --no-stats
if [[ $RC -eq 0 ]] && grep -q "Paris" "$OUT" && [[ ! -s $ERR ]]; then pass; else fail "run --raw: exit $RC: $(cat "$OUT" "$ERR")"; fi

# Sampling with a seed is repeatable.
run_cli run "$MODEL" -p "Tell me a joke." -n 8 --temp 0.9 --seed 7 --no-stats
first=$(cat "$OUT")
run_cli run "$MODEL" -p "Tell me a joke." -n 8 --temp 0.9 --seed 7 --no-stats
if [[ $RC -eq 0 && -n $first && $(cat "$OUT") == "$first" ]]; then pass; else fail "seeded runs differ: '$first' vs '$(cat "$OUT")'"; fi

# A template override is accepted and used (any non-empty reply).
run_cli run "$MODEL" -p "Hi" -n 2 --temp 0 --template llama3 --system "Be brief."
if [[ $RC -eq 0 ]]; then pass; else fail "run --template llama3: exit $RC: $(cat "$ERR")"; fi

# A prompt longer than the context is refused with one line.
expect_failure_saying "prompt longer than the context" "the prompt has [0-9]+ tokens, more than the context of 64" run "$MODEL" -p "$(printf 'word %.0s' $(seq 1 300))" --ctx 64 -n 4

# Chat over stdin: two replies (the /reset in between), then /exit stops before "ignored".
printf 'Hi!\n/reset\nHello!\n/exit\nignored\n' | "$CLI" chat "$MODEL" -n 3 --temp 0 >"$WORK/chat.out" 2>"$WORK/chat.err"
RC=$?
replies=$(grep -Ec "$SPEEDS" "$WORK/chat.err")
if [[ $RC -eq 0 && $replies -eq 2 ]]; then pass; else fail "chat: exit $RC, $replies replies: $(cat "$WORK/chat.err")"; fi

# Ctrl-C during a reply cancels it: the process ends normally with "stop: cancelled".
"$CLI" run "$MODEL" -p "Write a very long story about a dragon." -n 2000 --temp 0 >"$WORK/long.out" 2>"$WORK/long.err" &
pid=$!
for _ in $(seq 1 600); do   # wait up to 60 s for the first streamed text
  [[ -s $WORK/long.out ]] && break
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
RC=$?
if [[ $RC -eq 0 ]] && grep -q "stop: cancelled" "$WORK/long.err"; then
  pass
else
  fail "Ctrl-C: exit $RC (a signal if > 128): $(cat "$WORK/long.err")"
fi

finish
