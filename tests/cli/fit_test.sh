# granule-cli fit: the fit preview for a VRAM budget. Sizes it cannot read are one-line
# errors; on the default model (skipped when absent) a huge budget keeps every layer
# resident, one between the minimum and the full size streams a trailing run of layers
# (budgets computed from `fit --json`, not hard-coded), the minimum itself loads with every
# layer streamed, a byte less or 1MiB does not load (exit 1, one stderr line naming the
# minimum), and the PCIe bound is the bandwidth over the bytes streamed per token.
source "$(dirname "$0")/cli_test_lib.sh"

# json_field NAME: the value of "NAME" in the JSON object in $OUT (one field per line).
json_field() { sed -n -E "s/^  \"$1\": (.*)\$/\\1/p" "$OUT" | sed -E 's/,$//; s/^"(.*)"$/\1/'; }
# expect_json NAME VALUE
expect_json() {
  local v
  v=$(json_field "$1")
  if [[ $v == "$2" ]]; then pass; else fail "$3: \"$1\" is '$v', not '$2'"; fi
}
# expect_line REGEX WHAT: a line of $OUT matches.
expect_line() {
  if grep -Eq "$1" "$OUT"; then pass; else fail "$2: no line matching '$1' in: $(cat "$OUT")"; fi
}

# Sizes the option cannot read: one line, the message says what to write (no model needed).
for size in 12XB 0 -6GiB six 6,5GB; do
  expect_clean_failure "fit --vram-budget '$size'" fit "$WORK/any.gguf" --vram-budget "$size"
  if grep -Fq -- "--vram-budget: '$size' is" "$ERR" && grep -q "write it like 6GiB or 6144MiB" "$ERR"
  then pass; else fail "the message for '$size': $(cat "$ERR")"; fi
done
expect_clean_failure "run --vram-budget 12XB" run "$WORK/any.gguf" -p hi --vram-budget 12XB
grep -Fq -- "--vram-budget: '12XB' is not a size" "$ERR" && pass || fail "run: $(cat "$ERR")"
expect_clean_failure "chat --vram-budget 12XB" chat "$WORK/any.gguf" --vram-budget 12XB
grep -Fq -- "--vram-budget: '12XB' is not a size" "$ERR" && pass || fail "chat: $(cat "$ERR")"
expect_clean_failure "fit on a missing file" fit "$WORK/no-such-model.gguf" --vram-budget 6GiB
grep -q "no-such-model.gguf" "$ERR" && pass || fail "the error does not name the file: $(cat "$ERR")"

MODEL=$(default_model)
if [[ -z $MODEL ]]; then
  skip_note "the checks on the default model: it is absent (\`bash packaging/setup.sh model\`)"
  finish
fi

# A huge budget: every layer resident, nothing streams, no PCIe bound.
run_cli fit "$MODEL" --vram-budget 64GiB --json
if [[ $RC -eq 0 && ! -s $ERR ]]; then pass; else fail "fit 64GiB --json: exit $RC: $(cat "$ERR")"; fi
LAYERS=$(json_field layers)
[[ $LAYERS -eq 30 ]] && pass || fail "the default model has 30 layers, fit says '$LAYERS'"
expect_json gpu true "64GiB"
expect_json loads true "64GiB"
expect_json budget_bytes $((64 << 30)) "64GiB"
expect_json budget_source --vram-budget "64GiB"
expect_json resident_layers 30 "64GiB"
expect_json streamed_layers 0 "64GiB"
expect_json staging_bytes 0 "64GiB"
expect_json streamed_bytes_per_token 0 "64GiB"
expect_json pcie_tokens_per_second 0.0 "64GiB"
expect_json layer_map "$(printf 'R%.0s' $(seq 1 30))" "64GiB"
expect_json verdict "fits: all layers resident" "64GiB"
MINIMUM=$(json_field minimum_budget_bytes)
# Every layer resident beside the workspace and the KV the plan keeps free.
FULL=$(($(json_field resident_weight_bytes) + $(json_field workspace_bytes) + $(json_field kv_reserve_bytes)))
PLANNING=$(json_field planning_without_gpu)
if [[ $MINIMUM -gt 0 && $FULL -gt $MINIMUM ]]; then pass; else fail "minimum $MINIMUM, full $FULL"; fi

run_cli fit "$MODEL" --vram-budget 64GiB
if [[ $RC -eq 0 ]]; then pass; else fail "fit 64GiB: exit $RC: $(cat "$ERR")"; fi
expect_line '^verdict: +fits: all layers resident$' "64GiB"
expect_line '^layers: +30 of 30 resident: layers 0-29 resident$' "64GiB"
expect_line '^ +R{30}$' "64GiB"
expect_line '^budget: +64\.0 GiB \(--vram-budget\)$' "64GiB"
if [[ $PLANNING == true ]]; then
  expect_line '^device: +CUDA \(planning for a GPU: no GPU is usable here\)$' "no GPU here"
fi

# Between the minimum and the full size: a trailing run of layers streams.
MIDDLE=$(((MINIMUM + FULL) / 2))
run_cli fit "$MODEL" --vram-budget "${MIDDLE}B" --json
if [[ $RC -eq 0 && ! -s $ERR ]]; then pass; else fail "fit ${MIDDLE}B: exit $RC: $(cat "$ERR")"; fi
expect_json loads true "middle budget"
RESIDENT=$(json_field resident_layers)
STREAMED=$(json_field streamed_layers)
if [[ $STREAMED -gt 0 && $STREAMED -lt 30 && $((RESIDENT + STREAMED)) -eq 30 ]]; then pass
else fail "middle budget: $RESIDENT resident, $STREAMED streamed"; fi
MAP=$(json_field layer_map)
if [[ $MAP =~ ^R*S+$ && ${#MAP} -eq 30 && $(tr -cd S <<<"$MAP" | wc -c) -eq $STREAMED ]]; then pass
else fail "middle budget: layer map '$MAP' is not R...RS...S with $STREAMED S"; fi
STREAMED_BYTES=$(json_field streamed_bytes_per_token)
[[ $(json_field staging_bytes) -gt 0 && $STREAMED_BYTES -gt 0 ]] && pass || fail "middle budget: nothing staged or streamed"
# The PCIe bound is the host-to-device bandwidth over the bytes each token streams.
H2D=$(json_field h2d_bytes_per_second)
BOUND=$(json_field pcie_tokens_per_second)
if awk -v h="$H2D" -v s="$STREAMED_BYTES" -v b="$BOUND" 'BEGIN { e = h / s; exit !(b > 0 && (b - e) ^ 2 < (e * 1e-6) ^ 2) }'
then pass; else fail "pcie bound $BOUND is not $H2D / $STREAMED_BYTES"; fi
expect_json verdict "fits with streaming: $STREAMED of 30 layers streamed" "middle budget"

run_cli fit "$MODEL" --vram-budget "${MIDDLE}B"
if [[ $RC -eq 0 ]]; then pass; else fail "fit ${MIDDLE}B: exit $RC: $(cat "$ERR")"; fi
expect_line "^layers: +$RESIDENT of 30 resident: layers 0-$((RESIDENT - 1)) resident, $RESIDENT-29 streamed\$" "middle budget"
expect_line "^ +$MAP\$" "middle budget"
expect_line "^verdict: +fits with streaming: $STREAMED of 30 layers streamed\$" "middle budget"
expect_line '^pcie bound: +[0-9.]+ tokens/s at batch 1 \(host-to-device [0-9.]+ GB/s, (measured|assumed: PCIe 4\.0 x16)\)$' "middle budget"
expect_line '^staging: +[0-9.]+ (KiB|MiB)$' "middle budget"

# Exactly the minimum loads with every layer streamed; a byte less does not.
run_cli fit "$MODEL" --vram-budget "${MINIMUM}B" --json
expect_json loads true "the minimum"
expect_json streamed_layers 30 "the minimum"
run_cli fit "$MODEL" --vram-budget "$((MINIMUM - 1))B" --json
if [[ $RC -eq 1 && $(wc -l <"$ERR") -eq 1 ]]; then pass; else fail "a byte below the minimum: exit $RC: $(cat "$ERR")"; fi
expect_json loads false "a byte below the minimum"

# 1MiB: the preview still prints, then one error line naming the minimum, exit 1.
MINIMUM_MIB=$(((MINIMUM + (1 << 20) - 1) >> 20))
expect_clean_failure "fit 1MiB" fit "$MODEL" --vram-budget 1MiB
if grep -q "does not load: the VRAM budget of 1.0 MiB (--vram-budget) is below the minimum of [0-9.]* MiB" "$ERR" &&
   grep -q "give --vram-budget ${MINIMUM_MIB}MiB or more" "$ERR"
then pass; else fail "fit 1MiB message: $(cat "$ERR")"; fi
expect_line '^minimum budget: +[0-9.]+ MiB \(every layer streamed\)$' "1MiB"
if grep -q '^verdict:' "$OUT"; then fail "1MiB: a verdict on stdout besides the error"; else pass; fi

# Four chats share the KV the middle budget leaves: it loads, with a note on the context.
run_cli fit "$MODEL" --vram-budget "${MIDDLE}B" --chats 4
if [[ $RC -eq 0 ]]; then pass; else fail "--chats 4: exit $RC: $(cat "$ERR")"; fi
expect_line '^note: +the budget leaves KV for [0-9]+ tokens per chat, less than the 4096 asked \(--ctx\)' "--chats 4"
expect_line "^verdict: +fits with streaming: [0-9]+ of 30 layers streamed\$" "--chats 4"

# A shorter context keeps less KV free, so the same budget keeps more layers resident.
run_cli fit "$MODEL" --vram-budget "${MIDDLE}B" --ctx 512 --json
if [[ $RC -eq 0 && $(json_field resident_layers) -gt $RESIDENT ]]; then pass
else fail "--ctx 512: $(json_field resident_layers) resident, not more than $RESIDENT"; fi
expect_json context_per_chat 512 "--ctx 512"

# The CPU: every weight in host memory, KV in f32; --chats divides the KV among chats.
run_cli fit "$MODEL" --device cpu --vram-budget 1GiB --chats 4 --json
if [[ $RC -eq 0 ]]; then pass; else fail "fit --device cpu: exit $RC: $(cat "$ERR")"; fi
expect_json gpu false "cpu"
expect_json planning_without_gpu false "cpu"
expect_json resident_layers 30 "cpu"
expect_json chats 4 "cpu"
CAPACITY=$(json_field kv_capacity_tokens)
PER_CHAT=$(json_field max_context_per_chat)
if [[ $CAPACITY -gt 0 && $PER_CHAT -eq $((CAPACITY / 4 < 8192 ? CAPACITY / 4 : 8192)) ]]; then pass
else fail "cpu: $PER_CHAT per chat from $CAPACITY tokens over 4 chats"; fi

# run takes the budget (the CPU backend's memory budget here).
run_cli run "$MODEL" -p "Hi" -n 1 --temp 0 --device cpu --vram-budget 1GiB --no-stats
if [[ $RC -eq 0 ]]; then pass; else fail "run --vram-budget 1GiB: exit $RC: $(cat "$ERR")"; fi

finish
