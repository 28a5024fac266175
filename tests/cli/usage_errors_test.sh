# granule-cli's messages for command lines it cannot take: one line each, exit code 1, the
# exact wording (a misspelt command lists the commands, an unknown option is named with the
# closest real one, a bad number names the option as typed and the value). No model needed:
# every one of these fails before a file is opened.
source "$(dirname "$0")/cli_test_lib.sh"

M="$WORK/never-opened.gguf"

# expect_message WHAT EXACT-LINE ARGS...: a clean failure whose one stderr line is EXACT-LINE.
expect_message() {
  local what=$1 want=$2; shift 2
  expect_clean_failure "$what" "$@"
  if [[ $(cat "$ERR") == "$want" ]]; then pass; else fail "$what: expected '$want', got '$(cat "$ERR")'"; fi
}

# The command list depends on the build (serve needs cpp-httplib), so take it from --help.
run_cli --help
commands=$(awk '/^Subcommands:/{on=1; next} on && NF {print $1}' "$OUT" | paste -sd, - | sed 's/,/, /g')
if [[ $commands == "info, tokenize, run, chat, fit, perplexity"* ]]; then pass; else fail "--help lists commands '$commands'"; fi

expect_message "unknown command" \
  "granule-cli: unknown command 'frobnicate'; commands: $commands" frobnicate
expect_message "unknown command after -v" \
  "granule-cli: unknown command 'frobnicate'; commands: $commands" -v frobnicate --temp 1
expect_message "no command" \
  "granule-cli: no command given; commands: $commands (see granule-cli --help)"
expect_message "misspelt option" \
  "granule-cli: unknown option --tmp (did you mean --temp?)" run "$M" -p hi --tmp 0.5
expect_message "unknown option, nothing close" \
  "granule-cli: unknown option --frobnicate" run "$M" -p hi --frobnicate
expect_message "unknown option written with =" \
  "granule-cli: unknown option --tmp (did you mean --temp?)" chat "$M" --tmp=0.5
expect_message "extra argument" \
  "granule-cli: unexpected argument 'extra'" info "$M" extra
expect_message "-c not a number" \
  "granule-cli: -c/--ctx-size expects an integer, got 'abc'" run "$M" -p hi -c abc
expect_message "--ctx-size not a number" \
  "granule-cli: -c/--ctx-size expects an integer, got '1.5'" chat "$M" --ctx-size 1.5
expect_message "context out of range" \
  "granule-cli: -c/--ctx-size must be from 1 to 1048576, got 0" run "$M" -p hi -c 0
expect_message "--temp not a number" \
  "granule-cli: --temp expects a number, got 'hot'" run "$M" -p hi --temp hot
expect_message "--top-p out of range" \
  "granule-cli: --top-p must be from 0 to 1, got 2" run "$M" -p hi --top-p 2
# Every sampling option's range is the engine's (kSamplingRanges in granule/sampling.h), as
# the server's and the window's are.
expect_message "--temp past the engine's range" \
  "granule-cli: --temp must be from 0 to 2, got 2.01" run "$M" -p hi --temp 2.01
expect_message "--top-k past the engine's range" \
  "granule-cli: --top-k must be from 0 to 1048576, got 1048577" run "$M" -p hi --top-k 1048577
expect_message "--min-p past the engine's range" \
  "granule-cli: --min-p must be from 0 to 1, got 1.5" run "$M" -p hi --min-p 1.5
expect_message "--repeat-penalty below the engine's range" \
  "granule-cli: --repeat-penalty must be from 0.01 to 100, got 0" run "$M" -p hi --repeat-penalty 0
expect_message "--repeat-last-n below the engine's range" \
  "granule-cli: --repeat-last-n must be from -1 to 1048576, got -2" run "$M" -p hi --repeat-last-n -2
expect_message "-n below the engine's range" \
  "granule-cli: -n/--max-tokens must be from 1 to 1048576, got 0" run "$M" -p hi -n 0
expect_message "-n not a number" \
  "granule-cli: -n/--max-tokens expects an integer, got 'ten'" run "$M" -p hi -n ten
expect_message "--seed negative" \
  "granule-cli: --seed expects an integer from 0 to 18446744073709551614, got '-1'" run "$M" -p hi --seed -1
expect_message "perplexity -c not a number" \
  "granule-cli: -c/--ctx-size expects an integer, got 'x'" perplexity "$M" -f "$M" -c x
expect_message "tokenize without text" \
  "granule-cli: tokenize needs the text, or -f FILE (- for standard input)" tokenize "$M"
expect_clean_failure "unknown preset" run "$M" -p hi --preset wild
if grep -q -- "--preset" "$ERR" && grep -q "balanced" "$ERR"; then pass; else fail "unknown preset: $(cat "$ERR")"; fi
# A schema keyword the constraint would not enforce is named (with the server's rules, when
# this build has the server).
if "$CLI" serve --help 2>/dev/null | grep -q -- "--api-key"; then
  echo '{"type": "object", "not": {"required": []}}' >"$WORK/not.json"
  expect_message "--json-schema with a keyword not enforced" \
    "granule-cli: the JSON Schema keyword 'not' (in '--json-schema') is not supported for structured output: leave it out" \
    run "$M" -p hi --json-schema "$WORK/not.json"
fi

finish
