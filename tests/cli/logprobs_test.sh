# granule-cli run --logprobs N: stdout is one JSON document whose tokens spell the text, each
# with a log-probability <= 0 and N alternatives, most likely first; greedy picks the most
# likely (without penalties: log-probs are the raw model's); the greedy text is the one run without --logprobs prints; N past 20 is one clean line.
source "$(dirname "$0")/cli_test_lib.sh"

MODEL=$(loadable_model)
if [[ -z $MODEL ]]; then skip_all "neither the default model nor granule-test-model (third argument)"; fi

run_cli run "$MODEL" --raw -p "Once upon a time" -n 12 --temp 0 --repeat-penalty 1 --logprobs 3 --no-stats
if [[ $RC -eq 0 ]] && python3 - "$OUT" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
toks = doc["tokens"]
assert doc["finish_reason"] in ("length", "eos", "stop"), doc["finish_reason"]
assert len(toks) >= 1 and (doc["finish_reason"] != "length" or len(toks) == 12), len(toks)
for t in toks:
    assert t["logprob"] <= 0 and len(t["top_logprobs"]) == 3, t
    assert t["top_logprobs"][0]["id"] == t["id"], ("greedy is not the most likely", t)
    lps = [a["logprob"] for a in t["top_logprobs"]]
    assert lps == sorted(lps, reverse=True), lps
spelled = b"".join(bytes(t["bytes"]) for t in toks).decode("utf-8", "replace")
assert spelled == doc["text"], (spelled, doc["text"])
open(sys.argv[1] + ".text", "w").write(doc["text"])
PY
then pass; else fail "--logprobs 3: exit $RC: $(head -c 400 "$OUT" "$ERR")"; fi
logprob_text=$(cat "$OUT.text" 2>/dev/null)
run_cli run "$MODEL" --raw -p "Once upon a time" -n 12 --temp 0 --repeat-penalty 1 --no-stats
if [[ $RC -eq 0 && $(cat "$OUT") == "$logprob_text" ]]; then pass; else fail "text without --logprobs differs: '$(head -c 200 "$OUT")' vs '$logprob_text'"; fi
expect_clean_failure "--logprobs 21" run "$MODEL" -p "hi" --logprobs 21

finish
