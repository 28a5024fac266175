# Helpers shared by the granule-cli end-to-end scripts (sourced, not run by ctest).
# Each script is run as: bash SCRIPT <granule-cli> <shared testdata dir> <granule-test-model>;
# exit 77 = skip, and every skip (whole script or part) prints a line starting "SKIP: ".

CLI=${1:?usage: bash SCRIPT <granule-cli> <testdata-dir> [granule-test-model]}
TESTDATA=${2:-}
MODEL_WRITER=${3:-}
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

# A real, loadable model for checks that must get past opening the file (so that only the
# error under test can explain a failure): the default model when present, else the tiny
# synthetic model granule-test-model writes (once per script). Prints "" when neither is
# available.
loadable_model() {
  local m
  m=$(default_model)
  if [[ -n $m ]]; then echo "$m"; return; fi
  synthetic_model
}

# The tiny synthetic model granule-test-model writes (once per script); "" without the writer.
synthetic_model() {
  if [[ ! -f $WORK/tiny.gguf && -n $MODEL_WRITER && -x $MODEL_WRITER ]]; then
    "$MODEL_WRITER" "$WORK/tiny.gguf" >&2 || rm -f "$WORK/tiny.gguf"
  fi
  if [[ -f $WORK/tiny.gguf ]]; then echo "$WORK/tiny.gguf"; fi
}

skip_note() { echo "SKIP: $*"; }
skip_all() { echo "SKIP: $*"; exit 77; }

# The serve tests' preconditions, each a skip of the whole script when not met.
require_server() {
  # Without the subcommand, `serve --help` prints the main help: look for serve's own options.
  "$CLI" serve --help 2>/dev/null | grep -q -- "--api-key" ||
    skip_all "this granule-cli was built without the server (cpp-httplib, libcpp-httplib-dev, not found)"
}
# require_python MODULE...: the modules import with the packages `setup.sh pydeps` installs
# (put on PYTHONPATH for the rest of the script).
require_python() {
  export PYTHONPATH="${XDG_DATA_HOME:-$HOME/.local/share}/granule/python${PYTHONPATH:+:$PYTHONPATH}"
  local modules
  modules=$(IFS=,; echo "$*")
  python3 -c "import $modules" 2>/dev/null ||
    skip_all "Python cannot import $* (bash packaging/setup.sh pydeps)"
}
require_default_model() {
  MODEL=$(default_model)
  [[ -n $MODEL ]] || skip_all "the default model is absent (bash packaging/setup.sh model)"
}
require_jinja() {
  "$CLI" info "$1" | grep -q "^template engine: *Jinja" ||
    skip_all "this build has no Jinja engine (bash packaging/setup.sh jinja, then rebuild)"
}
require_structured_output() {
  "$CLI" info "$1" | grep -qi "structured output: *yes" ||
    skip_all "this build has no structured output (bash packaging/setup.sh xgrammar, then rebuild)"
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

# expect_failure_saying WHAT PATTERN ARGS...: a clean failure (as above) whose one line
# matches the extended regular expression PATTERN.
expect_failure_saying() {
  local what=$1 pattern=$2; shift 2
  expect_clean_failure "$what" "$@"
  if grep -Eq -- "$pattern" "$ERR"; then pass; else fail "$what: expected /$pattern/, got: $(head -c 300 "$ERR")"; fi
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
