# Helpers shared by the granule-cli end-to-end scripts (sourced, not run by ctest).
# Each script is run as: bash SCRIPT <granule-cli> <shared testdata dir>; exit 77 = skip.

CLI=${1:?usage: bash SCRIPT <granule-cli> <testdata-dir>}
TESTDATA=${2:-}
VOCAB_DIR="$TESTDATA/tokenizer"
if [[ ! -x $CLI ]]; then
  echo "FAIL: $CLI is not an executable"
  exit 1
fi
FAILURES=0
CHECKS=0
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The default model, found as the tests in tests/engine find it; "" when absent.
default_model() {
  local candidates=("${GRANULE_DEFAULT_MODEL:-}"
                    "${XDG_DATA_HOME:-$HOME/.local/share}/granule/models/SmolLM2-135M-Instruct.Q4_1.gguf"
                    "$HOME/.local/share/granule/models/SmolLM2-135M-Instruct.Q4_1.gguf")
  local m
  for m in "${candidates[@]}"; do
    if [[ -n $m && -f $m ]]; then echo "$m"; return; fi
  done
}

pass() { CHECKS=$((CHECKS + 1)); }
fail() { CHECKS=$((CHECKS + 1)); FAILURES=$((FAILURES + 1)); echo "FAIL: $*"; }

# run_cli ARGS...: runs granule-cli, leaving $RC, $OUT (stdout file) and $ERR (stderr file).
run_cli() {
  OUT="$WORK/stdout" ERR="$WORK/stderr"
  "$CLI" "$@" >"$OUT" 2>"$ERR"
  RC=$?
}

# expect_clean_failure WHAT ARGS...: exit code 1 and exactly one line on stderr, starting
# with "granule-cli: " — never a signal (exit code > 128), never a second line.
expect_clean_failure() {
  local what=$1; shift
  run_cli "$@"
  local lines
  lines=$(wc -l <"$ERR")
  if [[ $RC -eq 1 && $lines -eq 1 ]] && grep -q '^granule-cli: ' "$ERR"; then
    pass
  else
    fail "$what: exit $RC, $lines stderr lines: $(head -c 300 "$ERR")"
  fi
}

# expect_field NAME VALUE: the info output has "NAME:   VALUE" on a line.
expect_field() {
  if grep -Eq "^$1: +$2\$" "$OUT"; then pass; else fail "info field '$1' is not '$2': $(grep -E "^$1:" "$OUT")"; fi
}

finish() {
  echo "$CHECKS checks, $FAILURES failed"
  [[ $FAILURES -eq 0 ]]
  exit $?
}
