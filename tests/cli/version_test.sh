# granule-cli --version and --help succeed; a bad command line fails with one line.
source "$(dirname "$0")/cli_test_lib.sh"

run_cli --version
if [[ $RC -eq 0 ]] && grep -Eq '^granule-cli [0-9]+\.[0-9]+\.[0-9]+$' "$OUT"; then pass; else fail "--version: exit $RC: $(cat "$OUT" "$ERR")"; fi

run_cli --help
if [[ $RC -eq 0 ]] && grep -q 'info' "$OUT" && grep -q 'tokenize' "$OUT" && grep -q 'chat' "$OUT"; then
  pass
else
  fail "--help: exit $RC"
fi

run_cli run --help
if [[ $RC -eq 0 ]] && grep -q -- '--temp' "$OUT" && grep -q -- '--raw' "$OUT"; then pass; else fail "run --help: exit $RC"; fi

# A bad command line: one line naming what is wrong. The model is a real, loadable file, so
# only the error under test can explain the failure (a missing file would fail them all).
MODEL=$(loadable_model)
if [[ -z $MODEL ]]; then
  fail "no loadable model: neither the default model nor granule-test-model (third argument)"
  finish
fi
# (usage_errors_test.sh checks the exact wording of each of these and more.)
expect_failure_saying "no subcommand" '^granule-cli: no command given; commands: info, tokenize, run'
expect_failure_saying "unknown subcommand" "^granule-cli: unknown command 'frobnicate'; commands: info," frobnicate
expect_failure_saying "unknown option" '^granule-cli: unknown option --no-such-option$' info --no-such-option "$MODEL"
expect_failure_saying "unknown option (run)" '^granule-cli: unknown option --no-such-option$' run "$MODEL" -p hi --no-such-option
expect_failure_saying "missing model argument" 'model is required' info
expect_failure_saying "run without a prompt" '--prompt is required' run "$MODEL"
expect_failure_saying "run with -n 0" '^granule-cli: -n/--max-tokens must be from 1 to 1048576, got 0$' run "$MODEL" -p hi -n 0
expect_failure_saying "unknown device" '--device: tpu not in \{cpu,cuda,auto\}' run "$MODEL" -p hi --device tpu
expect_failure_saying "unknown template name" '--template: vicuna not in \{.*chatml.*\}' run "$MODEL" -p hi --template vicuna
# The same options well formed do get past the command line (the file loads and replies).
run_cli run "$MODEL" -p hi -n 1 --temp 0 --device cpu --template chatml --no-stats
if [[ $RC -eq 0 ]]; then pass; else fail "the well-formed run: exit $RC: $(cat "$ERR")"; fi

finish
