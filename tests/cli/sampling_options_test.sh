# granule-cli run/chat sampling options: --help shows every sampling option with its default
# and the presets; without --seed every reply gets a new random seed (printed with -v) that
# --seed repeats exactly; seed 0 is a fixed seed like any other; a preset changes the text.
source "$(dirname "$0")/cli_test_lib.sh"

for command in run chat; do
  run_cli "$command" --help
  for option in "--temp FLOAT=0.7" "--top-k INT=40" "--top-p FLOAT=0.95" "--min-p FLOAT=0.05" \
                "--repeat-penalty FLOAT=1.1" "--repeat-last-n INT=64" "--seed UINT=random" \
                "--preset TEXT:{precise,balanced,creative,greedy}=balanced" "-n,--max-tokens INT=512" \
                "-c,--ctx-size,--ctx INT=4096"; do
    if grep -qF -- "$option" "$OUT"; then pass; else fail "$command --help lacks '$option'"; fi
  done
  if grep -q "creative: temp 1, top-k 100" "$OUT"; then pass; else fail "$command --help does not describe the presets"; fi
done

MODEL=$(default_model)
if [[ -z $MODEL ]]; then
  skip_all "the default model is absent (\`bash packaging/setup.sh model\`): seed checks skipped"
fi
PROMPT="Tell me a story about a cat."
seed_of() { sed -nE 's/.*sampling: .* seed ([0-9]+)$/\1/p' "$1"; }

# Two runs without a seed: different seeds, printed at -v.
run_cli run "$MODEL" -p "$PROMPT" -n 16 --device cpu --no-stats -v
first_text=$(cat "$OUT"); first_seed=$(seed_of "$ERR")
run_cli run "$MODEL" -p "$PROMPT" -n 16 --device cpu --no-stats -v
second_seed=$(seed_of "$ERR")
if [[ -n $first_seed && -n $second_seed && $first_seed != "$second_seed" ]]; then
  pass
else
  fail "seeds without --seed: '$first_seed' and '$second_seed' ($(head -c 300 "$ERR"))"
fi
# The printed seed reproduces the first run.
run_cli run "$MODEL" -p "$PROMPT" -n 16 --device cpu --no-stats --seed "$first_seed"
if [[ $RC -eq 0 && -n $first_text && $(cat "$OUT") == "$first_text" ]]; then pass; else fail "--seed $first_seed gave '$(cat "$OUT")', the run that printed it '$first_text'"; fi

# Seed 0 is a fixed seed: two runs agree, and -v says 0.
run_cli run "$MODEL" -p "$PROMPT" -n 16 --device cpu --no-stats --seed 0 -v
zero_text=$(cat "$OUT"); zero_seed=$(seed_of "$ERR")
run_cli run "$MODEL" -p "$PROMPT" -n 16 --device cpu --no-stats --seed 0
if [[ $zero_seed == 0 && -n $zero_text && $(cat "$OUT") == "$zero_text" ]]; then pass; else fail "--seed 0: seed '$zero_seed', '$zero_text' vs '$(cat "$OUT")'"; fi

# The greedy preset needs no seed: two runs agree; -v names the preset.
run_cli run "$MODEL" -p "$PROMPT" -n 16 --device cpu --no-stats --preset greedy -v
greedy_text=$(cat "$OUT")
if grep -q "sampling: preset greedy, temp 0," "$ERR"; then pass; else fail "-v with --preset greedy: $(head -c 300 "$ERR")"; fi
run_cli run "$MODEL" -p "$PROMPT" -n 16 --device cpu --no-stats --preset greedy
if [[ -n $greedy_text && $(cat "$OUT") == "$greedy_text" ]]; then pass; else fail "greedy preset runs differ: '$greedy_text' vs '$(cat "$OUT")'"; fi
# An option given beside a preset overrides it.
run_cli run "$MODEL" -p "$PROMPT" -n 4 --device cpu --no-stats --preset creative --temp 0.25 -v
if grep -q "sampling: preset creative, temp 0.25, top-k 100," "$ERR"; then pass; else fail "--temp over --preset creative: $(head -c 300 "$ERR")"; fi

finish
