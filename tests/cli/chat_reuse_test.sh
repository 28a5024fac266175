# granule-cli chat keeps each reply's KV: five turns piped into `chat MODEL -c 256` all finish
# without an error, and every turn after the first reports "prompt: N new tokens, M reused" with
# M > 0 (the earlier turns are not computed again), even once the conversation outgrows the
# context and its oldest turns are left out. /help is answered by the CLI, never by the model;
# --no-kv-reuse computes everything every turn. Runs on the default model, else on the
# synthetic model granule-test-model writes.
source "$(dirname "$0")/cli_test_lib.sh"

MODEL=$(loadable_model)
if [[ -z $MODEL ]]; then
  skip_all "neither the default model nor granule-test-model is available"
fi
REUSE='^prompt: ([0-9]+) new tokens, ([0-9]+) reused$'

chat_five() {  # chat_five EXTRA-ARGS...: five turns with a /help between the first two
  printf 'Hello! Who are you?\n/help\nTell me a short story about a dragon.\nWhat was the dragon called?\nAnd what did it eat?\nThank you, goodbye.\n' |
    "$CLI" chat "$MODEL" -c 256 -n 48 --temp 0 --device cpu "$@" >"$WORK/chat.out" 2>"$WORK/chat.err"
  RC=$?
}

chat_five
turns=$(grep -Ec "$REUSE" "$WORK/chat.err")
if [[ $RC -eq 0 && $turns -eq 5 ]]; then pass; else fail "five turns: exit $RC, $turns turns: $(cat "$WORK/chat.err")"; fi
if grep -q '^granule-cli:' "$WORK/chat.err"; then fail "an error in the chat: $(grep '^granule-cli:' "$WORK/chat.err")"; else pass; fi
# Every turn after the first reuses the KV of the ones before.
turn=0
while read -r line; do
  turn=$((turn + 1))
  [[ $line =~ $REUSE ]] || continue
  new=${BASH_REMATCH[1]} reused=${BASH_REMATCH[2]}
  if [[ $turn -eq 1 ]]; then
    if [[ $reused -eq 0 && $new -gt 0 ]]; then pass; else fail "turn 1: $line"; fi
  else
    if [[ $reused -gt 0 ]]; then pass; else fail "turn $turn reused nothing: $line"; fi
  fi
done < <(grep -E "$REUSE" "$WORK/chat.err")
# /help is listed on stderr and is not a turn (five prompts for five messages, above).
if grep -q '^  /reset' "$WORK/chat.err" && ! grep -q '/reset' "$WORK/chat.out"; then pass; else fail "/help: $(cat "$WORK/chat.err")"; fi
# An unknown command is refused without reaching the model.
printf '/frobnicate\n' | "$CLI" chat "$MODEL" -c 256 -n 4 --temp 0 --device cpu >"$WORK/cmd.out" 2>"$WORK/cmd.err"
if grep -q 'unknown command /frobnicate' "$WORK/cmd.err" && ! grep -Eq "$REUSE" "$WORK/cmd.err"; then pass; else fail "/frobnicate: $(cat "$WORK/cmd.err")"; fi

# Without reuse every turn computes its whole prompt.
chat_five --no-kv-reuse
turns=$(grep -Ec '^prompt: [0-9]+ new tokens, 0 reused$' "$WORK/chat.err")
if [[ $RC -eq 0 && $turns -eq 5 ]]; then pass; else fail "--no-kv-reuse: exit $RC, $turns turns without reuse: $(cat "$WORK/chat.err")"; fi

finish
