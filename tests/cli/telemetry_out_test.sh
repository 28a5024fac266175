# granule-cli run and chat with --telemetry-out on the default model (skipped when it is
# absent): the file holds one JSON frame a line (TELEMETRY_JSON.md), each with every section,
# the last one after the reply; an unwritable path is one error line naming it.
source "$(dirname "$0")/cli_test_lib.sh"

MODEL=$(default_model)
if [[ -z $MODEL ]]; then
  skip_all "the default model is absent (\`bash packaging/setup.sh model\`)"
fi
if ! command -v python3 >/dev/null; then
  skip_all "python3 is absent (it reads the frames)"
fi

# check_frames FILE MIN_STEPS: every line parses as a JSON object with the sections and a
# "t" that never goes back; the last frame, taken after the reply ended, counts at least
# MIN_STEPS engine steps and no sequence left. Prints the number of frames.
check_frames() {
  python3 - "$1" "$2" <<'PY'
import json, sys
path, min_steps = sys.argv[1], int(sys.argv[2])
with open(path, encoding="utf-8") as f:
    text = f.read()
assert text.endswith("\n"), "the last line is not whole"
lines = text.splitlines()
assert len(lines) >= 1, "no frames"
previous_t = 0.0
for number, line in enumerate(lines, 1):
    frame = json.loads(line)
    for key in ("t", "device", "kv", "scheduler", "graphs", "streaming", "throughput", "sequences"):
        assert key in frame, f"line {number}: no {key}"
    assert frame["t"] >= previous_t, f"line {number}: t went back"
    previous_t = frame["t"]
    assert isinstance(frame["device"]["ledger"]["weights"], int), f"line {number}: ledger"
    assert frame["device"]["ledger"]["weights"] > 0, f"line {number}: no weights in the ledger"
    assert isinstance(frame["sequences"], list)
last = json.loads(lines[-1])
assert last["throughput"]["steps"] >= min_steps, f"last frame: {last['throughput']['steps']} steps"
assert last["sequences"] == [] and last["scheduler"]["running"] == 0, "last frame: a sequence left"
print(len(lines))
PY
}

run_cli run "$MODEL" -p "What is the capital of France?" -n 12 --temp 0 --device cpu --no-stats \
  --telemetry-out "$WORK/run.jsonl"
if [[ $RC -eq 0 ]] && grep -q "Paris" "$OUT" && [[ ! -s $ERR ]]; then pass; else fail "run: exit $RC: $(cat "$OUT" "$ERR")"; fi
# The answer takes the prompt's step and at least one decode step.
if frames=$(check_frames "$WORK/run.jsonl" 2 2>&1); then pass; else fail "run frames: $frames"; fi

# A chat records across replies: two replies, the file rewritten from the start.
printf 'Hi!\nHello!\n/exit\n' | "$CLI" chat "$MODEL" -n 3 --temp 0 --no-stats \
  --telemetry-out "$WORK/run.jsonl" >"$WORK/chat.out" 2>"$WORK/chat.err"
RC=$?
if [[ $RC -eq 0 ]]; then pass; else fail "chat: exit $RC: $(cat "$WORK/chat.err")"; fi
# Each reply ends with a frame: at least 2 lines, the last after both replies' steps.
if frames=$(check_frames "$WORK/run.jsonl" 4 2>&1) && [[ $frames -ge 2 ]]; then
  pass
else
  fail "chat frames: $frames"
fi

expect_clean_failure "unwritable telemetry path" run "$MODEL" -p hi -n 1 \
  --telemetry-out "$WORK/no-such-dir/frames.jsonl"
if grep -q "^granule-cli: cannot write telemetry to $WORK/no-such-dir/frames.jsonl: " "$ERR"; then
  pass
else
  fail "the error does not name the telemetry file: $(cat "$ERR")"
fi

finish
