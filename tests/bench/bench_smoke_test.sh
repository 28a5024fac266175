#!/usr/bin/env bash
# granule-bench's subcommands that run without a GPU, end to end: `chats` on the CPU backend
# with a tiny synthetic model (exact token, KV and pool counts), `kv` on host memory (granules
# copy nothing and never move a chat's KV), `vmm` on host memory (every call timed), and
# `stream` on the CPU backend (nothing streams there: exact token counts, no PCIe bound, a
# budget too small for the weights reported in its row while the next budget still runs).
# Speed is not checked here.
#   usage: bench_smoke_test.sh <granule-bench>
set -euo pipefail
bench=$1
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$bench" chats --device cpu --synthetic tiny -n 1,3 -p 12 -g 6 --threads 2 --json 2>/dev/null) \
  || fail "granule-bench chats exited with $?"
grep -q '"chats": 1,' <<<"$out" || fail "no run with 1 chat"
grep -q '"chats": 3,' <<<"$out" || fail "no run with 3 chats"
# 6 answer tokens each: the first comes from the prefill step, 5 from full-batch decode steps.
grep -q '"decode_tokens": 15,' <<<"$out" || fail "3 chats should decode 15 tokens in full steps"
[[ $(grep -c '"errors": 0' <<<"$out") == 2 ]] || fail "a chat failed"
# One 2 MiB host granule per chat holds its 18 tokens of tiny-model KV.
grep -q '"peak_kv_committed_bytes": 6291456' <<<"$out" || fail "3 chats should peak at 3 granules"
# The engine's pool holds a prefill chunk's granules plus one per four slots: 2 here. The
# lone chat maps from it; the 3 chats starting in one step need 3, so one is created.
grep -q '"granules_created_in_steps": 0,' <<<"$out" || fail "1 chat: a step created a granule"
grep -q '"granules_created_in_steps": 1,' <<<"$out" || fail "3 chats: the pool should serve 2 of 3"
off=$("$bench" chats --device cpu --synthetic tiny -n 3 -p 12 -g 6 --threads 2 --kv-pool 0 --json \
  2>/dev/null) || fail "granule-bench chats --kv-pool 0 exited with $?"
grep -q '"granules_created_in_steps": 3' <<<"$off" || fail "without a pool, 3 chats create 3 granules"

table=$("$bench" kv --chats 4 --turns 3 --device host 2>/dev/null) || fail "granule-bench kv exited with $?"
granules=$(grep '^| granules ' <<<"$table") || fail "no granules row"
# Columns: policy | peak | mean | copied MiB | moves | ...
copied=$(awk -F'|' '{gsub(/ /, "", $5); print $5}' <<<"$granules")
moves=$(awk -F'|' '{gsub(/ /, "", $6); print $6}' <<<"$granules")
[[ $copied == 0.0 && $moves == 0 ]] || fail "granules copied $copied MiB and moved $moves times"
grep -q '^| bucket growth ' <<<"$table" || fail "no bucket growth row"

vmm=$("$bench" vmm --device host --granules 4 --rounds 2 --json 2>/dev/null) || fail "granule-bench vmm exited with $?"
for call in create "map + access" unmap destroy; do
  grep -q "\"call\": \"$call\"" <<<"$vmm" || fail "vmm: no $call timing"
done
[[ $(grep -c '"calls": 8' <<<"$vmm") == 4 ]] || fail "vmm: each call should be timed 8 times"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stream=$("$bench" stream --device cpu --synthetic tiny --budgets 100 -n 8 -b 3 -p 24 --threads 2 \
  --json --telemetry-out "$work/stream.jsonl" 2>/dev/null) || fail "granule-bench stream exited with $?"
# 8 tokens per chat: the first from the prompt's step, 7 from steps in which every chat decodes.
grep -A1 '"test": "tg8"' <<<"$stream" | grep -q '"tokens": 7,' || fail "stream: tg8 should decode 7 tokens"
grep -A1 '"test": "decode"' <<<"$stream" | grep -q '"tokens": 21,' || fail "stream: 3 chats decode 21"
grep -A1 '"test": "pp24"' <<<"$stream" | grep -q '"tokens": 24,' || fail "stream: pp24 is 24 tokens"
grep -q '"streamed_layers": 0' <<<"$stream" || fail "stream: the CPU streams no layer"
grep -q '"resident_layers": 2' <<<"$stream" || fail "stream: the tiny model's 2 layers are resident"
[[ $(grep -c '"pcie_roofline_tokens_per_second": null' <<<"$stream") == 3 ]] || fail "stream: a PCIe bound without streaming"
[[ $(grep -c '"errors": 0' <<<"$stream") == 3 ]] || fail "stream: a chat failed"
frames=$(wc -l <"$work/stream.jsonl")
[[ $frames -ge 2 && $(grep -c '^{"t":.*"streaming":{.*"sequences":\[' "$work/stream.jsonl") == "$frames" ]] \
  || fail "stream: $frames telemetry lines, not all frames"
table=$("$bench" stream --device cpu --synthetic smollm2-135m --budgets 10,100 -n 3 -b 2 -p 8 \
  --threads 2 2>/dev/null) || fail "granule-bench stream (too small a budget) exited with $?"
grep -Eq '^\| +10% \| .* \| error: .*weights' <<<"$table" || fail "stream: no error row for 10%"
[[ $(grep -Ec '^\| +100% \| +[0-9.]+ \| +30/0 \|' <<<"$table") == 3 ]] || fail "stream: 100% after the error should run 3 tests"
echo "bench smoke: chats, kv, vmm and stream OK"
