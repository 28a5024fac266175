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

expect_clean_failure "no subcommand"
expect_clean_failure "unknown subcommand" frobnicate
expect_clean_failure "unknown option" info --no-such-option x.gguf
expect_clean_failure "missing model argument" info
expect_clean_failure "run without a prompt" run x.gguf
expect_clean_failure "run with -n 0" run x.gguf -p hi -n 0
expect_clean_failure "unknown device" run x.gguf -p hi --device tpu
expect_clean_failure "unknown template name" run x.gguf -p hi --template vicuna

finish
