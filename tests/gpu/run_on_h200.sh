#!/usr/bin/env bash
# One device-machine call: configure and build the engine, tests and granule-bench with CUDA
# (arch 90), run the GPU tests and the engine tests, then granule-bench on the default
# model's shapes and on 8B-shaped Q4_0. Logs go under $OUT; a short summary is printed last.
#   usage (on the H200): bash tests/gpu/run_on_h200.sh [tests|gpu|quick|bench|sweep|profile|contention|stream|all]
#   (default all). GRANULE_TARGETS limits what is built (default: everything).
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/granule-out}
mkdir -p "$OUT"
root=$(pwd)
src=${GRANULE_SRC:-$root}   # another source tree to build (e.g. an extracted snapshot)
build=$root/build-gpu
export GRANULE_LOG_LEVEL=warn

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv >"$OUT/gpu.txt" 2>&1

cmake -S "$src" -B "$build" -G Ninja -DGRANULE_BUILD_APP=OFF -DGRANULE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DGRANULE_DEPS_DIR="$root/.gpu-deps" >/tmp/configure.log 2>&1 || { tail -40 /tmp/configure.log; exit 1; }
start=$(date +%s)
# At most 8 files come back: build logs stay in /tmp unless the build fails.
if ! ninja -C "$build" -j16 -k 0 ${GRANULE_TARGETS:-} >/tmp/build.log 2>&1; then
  cp /tmp/build.log "$OUT/build.log"
  echo "BUILD FAILED (continuing with what built):"
  grep -E "error|FAILED" /tmp/build.log | head -30
fi
echo "build: $(( $(date +%s) - start )) s"

# granule-bench on both shapes; the 8B shape also as JSON. Everything for one model goes to
# one file (at most 8 files come back).
bench_all() {
  local b="$build/app/bench/granule-bench"
  timeout 120 "$b" --synthetic smollm2-135m:Q4_1 >"$OUT/bench-smollm2-135m-Q4_1.txt" 2>&1
  if [[ -f ${GRANULE_DEFAULT_MODEL:-} ]]; then
    timeout 120 "$b" -m "$GRANULE_DEFAULT_MODEL" >"$OUT/bench-real-default-model.txt" 2>&1
  fi
  { timeout 300 "$b" --synthetic llama3-8b:Q4_0
    echo; echo "-- JSON"
    timeout 60 "$b" --synthetic llama3-8b:Q4_0 --json -p 0 -n 0 -b 1; } >"$OUT/bench-llama3-8b-Q4_0.txt" 2>&1
}

gpu_tests() {
  local start=$(date +%s)
  timeout 400 ctest --test-dir "$build" -L '_kernel_test|model_gpu_test|kernels_test|chats_test' -j4 --timeout 380 \
    --output-on-failure >"$OUT/ctest-gpu.log" 2>&1
  grep -hE "\[(gpu-vs-oracle|per-type|matvec-vs-oracle|concurrent-chats)\]" \
    "$build"/Testing/Temporary/LastTest.log 2>/dev/null | sort -u >"$OUT/gpu-vs-cpu.txt"
  echo "gpu tests: $(( $(date +%s) - start )) s"
}

engine_tests() {
  local start=$(date +%s)
  timeout "$1" ctest --test-dir "$build" -LE '_kernel_test|model_gpu_test|kernels_test' -j12 --timeout 200 \
    --output-on-failure >"$OUT/ctest-engine.log" 2>&1
  echo "engine/cli tests: $(( $(date +%s) - start )) s"
}

# Concurrent chats through the engine (scheduler, KV space, graphs): aggregate decode tokens/s
# at 1, 8 and 32 chats, SmolLM2 shapes and 8B shapes.
chats() {
  local b="$build/app/bench/granule-bench"
  { timeout 120 "$b" chats --synthetic smollm2-135m:Q4_1 -n 1,8,32 -p 128 -g 128 --device cuda
    timeout 180 "$b" chats --synthetic llama3-8b:Q4_0 -n 1 -p 128 -g 128 --device cuda; } \
    >"$OUT/bench-chats.txt" 2>&1
}

# Per-kernel device time of the first decode steps of the 8B shape (Nsight Compute, clocks
# left as they are), to split a step into kernel time and launch gaps.
profile() {
  timeout 200 ncu --clock-control none --launch-count 800 --print-summary per-kernel \
    --metrics gpu__time_duration.sum "$build/app/bench/granule-bench" --synthetic llama3-8b:Q4_0 -p 0 -n 4 -b 1 \
    >/tmp/ncu-8b.txt 2>&1
  head -c 4000000 /tmp/ncu-8b.txt >"$OUT/ncu-8b.txt"
}

# Batch-1 decode on the 8B shape: the split-layout shapes (GRANULE_SPLIT_SHAPE), then the
# default with programmatic dependent launch off and with GGUF-layout weights, each after
# the matvec kernel tests under the same setting. The overrides are the README's table (one
# parser, engine/src/kernel_config_env.cpp: a bad value warns and keeps the default); the
# kernel tests also run every shape explicitly whatever the setting.
sweep() {
  local b="$build/app/bench/granule-bench"
  for setting in default ${GRANULE_SWEEP:-GRANULE_SPLIT_SHAPE=1x4 GRANULE_SPLIT_SHAPE=2x4 \
                 GRANULE_PDL=0 GRANULE_SPLIT_WEIGHTS=0}; do
    echo "-- $setting"
    ( [[ $setting != default ]] && export "$setting"
      timeout 60 "$build/tests/matvec_kernel_test" 2>&1 | grep -E "PASSED|FAILED" | head -3
      timeout 120 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -b 1 2>&1 | tail -1 )
  done
}

# Another process that keeps the GPU busy (fp16 matmuls for $1 seconds): queued work then
# waits its turn, far longer than alone, which is when an unmap under queued work shows.
gpu_busy() {
  python3 -c "
import time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.float16)
end = time.time() + $1
while time.time() < end:
    a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()" >/dev/null 2>&1 &
  busy_pid=$!
  sleep 4  # let it start (CUDA context, first kernels)
}

# Issue 19's runs: kv_space_gpu_test in 6 processes at once, 3 rounds, alone and beside a
# GPU-busy process; the engine churn test (chats that end, cancel, regenerate) beside a busy
# process, 3 at once, and under compute-sanitizer. One summary file, failing logs appended.
contention() {
  kv_contention
  churn_contention
}

kv_contention() {
  local report=$OUT/contention.txt t=$build/tests/kv_space_gpu_test
  : >"$report"
  for mode in alone busy; do
    [[ $mode == busy ]] && gpu_busy 150
    for round in 1 2 3; do
      local pids=() pass=0 i
      for i in 1 2 3 4 5 6; do
        timeout 300 "$t" >/tmp/kv-$mode-$round-$i.log 2>&1 &
        pids+=($!)
      done
      for i in 0 1 2 3 4 5; do
        if wait "${pids[$i]}"; then pass=$((pass + 1)); else
          { echo "--- FAILED kv_space_gpu_test $mode round $round process $((i + 1))"; tail -30 /tmp/kv-$mode-$round-$((i + 1)).log; } >>"$report.fail"
        fi
      done
      grep -h "\[kv-gpu\]" /tmp/kv-$mode-$round-*.log | head -2 >>"$report.detail"
      echo "kv_space_gpu_test x6, $mode, round $round: $pass/6 passed" | tee -a "$report"
    done
    [[ $mode == busy ]] && kill "$busy_pid" 2>/dev/null
  done
  { echo; cat "$report.detail" 2>/dev/null; cat "$report.fail" 2>/dev/null; } >>"$report"
  rm -f "$report.detail" "$report.fail"
}

churn_contention() {
  local report=$OUT/contention.txt t=$build/tests/kv_space_gpu_test c=$build/tests/engine_churn_gpu_test
  gpu_busy 400
  local pids=() pass=0 i
  for i in 1 2 3; do
    timeout 300 "$c" >/tmp/churn-$i.log 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2; do
    if wait "${pids[$i]}"; then pass=$((pass + 1)); else
      { echo "--- FAILED engine_churn_gpu_test process $((i + 1))"; tail -40 /tmp/churn-$((i + 1)).log; } >>"$report.fail"
    fi
  done
  grep -h "^\[churn\]\|^\[fault\]" /tmp/churn-*.log | head -4 >>"$report.detail"
  echo "engine_churn_gpu_test x3 beside a busy GPU: $pass/3 passed" | tee -a "$report"
  GRANULE_CHURN_ROUNDS=2 timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$c" --gtest_filter='*Regenerate*' >/tmp/sanitizer.log 2>&1
  echo "compute-sanitizer memcheck, engine churn beside a busy GPU: exit $? ($(grep -h 'ERROR SUMMARY' /tmp/sanitizer.log))" | tee -a "$report"
  GRANULE_CHURN_ROUNDS=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$t" >/tmp/sanitizer-kv.log 2>&1
  echo "compute-sanitizer memcheck, kv_space_gpu_test beside a busy GPU: exit $? ($(grep -h 'ERROR SUMMARY' /tmp/sanitizer-kv.log))" | tee -a "$report"
  kill "$busy_pid" 2>/dev/null
  { echo; cat "$report.detail" 2>/dev/null; cat "$report.fail" 2>/dev/null; tail -20 /tmp/sanitizer.log; } >>"$report"
  rm -f "$report.detail" "$report.fail"
}

# Weight streaming (issue 13): the streaming GPU tests, then granule-bench stream on the 8B
# shape at 100/75/50/25% budgets with its telemetry recorded for the window's replay.
stream() {
  local start=$(date +%s)
  GRANULE_GPU_8B=1 timeout 300 "$build/tests/streaming_gpu_test" >"$OUT/streaming-gpu-test.txt" 2>&1
  echo "streaming_gpu_test: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/streaming-gpu-test.txt" | tr '\n' ' ') ($(( $(date +%s) - start )) s)"
  grep -E "budget|streamed|driver|pressure|FAILED|Failure" -A2 "$OUT/streaming-gpu-test.txt" | head -40
  timeout 420 "$build/app/bench/granule-bench" stream --synthetic llama3-8b:Q4_0 \
    --telemetry-out "$OUT/stream-frames.jsonl" >"$OUT/bench-stream-llama3-8b-Q4_0.txt" 2>&1
  echo "bench stream: rc=$? ($(( $(date +%s) - start )) s)"
}

# Issue 18: the OpenAI server against `granule-bench chats` on the same model and shapes: the
# bench first (it writes the synthetic GGUF to the temp folder), then `granule-cli serve` on
# that file with tests/server/loadgen.py at 8 and 32 concurrent streaming requests. Needs
# cpp-httplib's single header staged in .gpu-deps/include (header-only build).
serve_bench() {
  local b="$build/app/bench/granule-bench" cli="$build/app/cli/granule-cli" spec=${1:-llama3-8b:Q4_0}
  local file=/tmp/granule-bench-${spec/:/-}.gguf port=18080 vocab
  timeout 240 "$b" chats --synthetic "$spec" -n 8,32 -p 128 -g 128 --device cuda >"$OUT/serve-vs-bench.txt" 2>&1
  vocab=$("$cli" info "$file" 2>/dev/null | grep -ioE "vocab[^0-9]*[0-9]+" | grep -oE "[0-9]+" | head -1)
  "$cli" serve "$file" --port $port --chats 32 -c 512 --device cuda -n 128 >/tmp/serve.log 2>&1 &
  local pid=$!
  python3 -c "import time,urllib.request as u
for _ in range(90):
  try: u.urlopen(\"http://127.0.0.1:$port/health\"); break
  except Exception: time.sleep(1)"
  { echo; echo "-- server (vocab ${vocab:-?}):"; head -2 /tmp/serve.log
    echo "-- cold: the fresh server's first 8 requests, no warm-up"
    timeout 120 python3 "$src/tests/server/loadgen.py" --port $port --vocab "${vocab:-32000}" \
      --concurrency 8 --prompt-tokens 128 --max-tokens 128 --no-warmup --timeline
    echo "-- warm (one short untimed round per concurrency first, as the bench warms up)"
    timeout 240 python3 "$src/tests/server/loadgen.py" --port $port --vocab "${vocab:-32000}" \
      --concurrency 8,32,64 --prompt-tokens 128 --max-tokens 128 --timeline
    echo "-- metrics after the load:"; python3 -c "import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:$port/metrics\").read().decode())" | grep -E "^granule_(kv|chats|sequences)" ; } \
    >>"$OUT/serve-vs-bench.txt" 2>&1
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  cat "$OUT/serve-vs-bench.txt" | grep -vE "^(mapped|  )"
}

# Every test built from tests/gpu (its binaries are its ctest labels), with each failure's log.
gpu_all_tests() {
  local start=$(date +%s) labels
  labels=$(ls "$src"/tests/gpu/*_test.cpp | xargs -n1 basename | sed 's/\.cpp$//' | paste -sd'|')
  timeout 420 ctest --test-dir "$build" -L "$labels" -j4 --timeout 400 --output-on-failure \
    >"$OUT/ctest-gpu.log" 2>&1
  grep -h "\[gpu-vs-cpu\]\|\[oracle\]\|\[mma\]\|\[blocks\]" "$build"/Testing/Temporary/LastTest.log 2>/dev/null | sort -u >"$OUT/gpu-vs-cpu.txt"
  echo "all gpu tests: $(( $(date +%s) - start )) s: $(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log")"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)" "$OUT/ctest-gpu.log" | head -20
}

# Issue 15: batched decode and prefill with the tensor-core path on and off (GRANULE_MMA).
mma_bench() {
  local b="$build/app/bench/granule-bench"
  for mma in 1 0; do
    echo "-- GRANULE_MMA=$mma"
    GRANULE_MMA=$mma timeout 200 "$b" --synthetic ${1:-llama3-8b:Q4_0} -p 512 -n 64 -b 1,4,8,16,32,64
  done
  echo "-- GRANULE_MMA=1 GRANULE_MMA_PREFILL=1"
  GRANULE_MMA_PREFILL=1 timeout 100 "$b" --synthetic ${1:-llama3-8b:Q4_0} -p 512 -n 0 -b 1
}

# Issue 17: decode and prefill speed per block type on the 8B shape (each type's synthetic
# file is written first, then benched; one line per type appended as it finishes so that a
# timeout still returns the types done).
types_bench() {
  local b="$build/app/bench/granule-bench" t
  for t in ${GRANULE_TYPES:-Q5_0 Q5_1 Q2_K Q3_K IQ4_NL IQ4_XS MXFP4}; do
    local s=$(date +%s)
    timeout 200 "$b" --synthetic llama3-8b:$t -p 512 -n 32 -b 1,8 >"/tmp/types-$t.txt" 2>&1
    { echo "-- llama3-8b:$t (rc $?, $(( $(date +%s) - s )) s)"; grep -E "^\|" "/tmp/types-$t.txt"; } >>"$OUT/bench-types.txt"
    rm -f /tmp/granule-bench-llama3-8b-$t.gguf
  done
}

# Where a 512-token prefill of the 8B shape goes: per-kernel device time (Nsight Compute, clocks
# left alone), summed by kernel name, largest first.
profile_prefill() {
  timeout 300 ncu --clock-control none --print-summary per-kernel --metrics gpu__time_duration.sum \
    "$build/app/bench/granule-bench" --synthetic llama3-8b:Q4_0 -p 512 -n 0 -b 1 -r 1 >/tmp/ncu-prefill.txt 2>&1
  echo "ncu rc=$?"
  python3 - /tmp/ncu-prefill.txt <<'PY' | tee "$OUT/prefill-profile.txt"
import re, sys
rows, name = [], None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^\s{2}(\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
    if m: name = m.group(1); calls = None; continue
    m = re.match(r"^\s+Section: .*", line)
    m2 = re.search(r"gpu__time_duration\.sum\s+(\S+)\s+\d+\s+\S+\s+\S+\s+(\S+)", line)
    if name and m2:
        unit = m2.group(1); total = float(m2.group(2).replace(",", ""))
        scale = {"ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3}.get(unit, 1)
        rows.append((total * scale, name[:110])); name = None
rows.sort(reverse=True)
print(f"total {sum(r[0] for r in rows)/1e3:.2f} ms over {len(rows)} kernel names")
for t, n in rows[:25]: print(f"{t/1e3:9.3f} ms  {n}")
PY
  grep -m3 -iE "error|==PROF==" /tmp/ncu-prefill.txt
  head -c 3000000 /tmp/ncu-prefill.txt >"$OUT/ncu-prefill.txt"
}

# Issue 15's new kernels: the flash-attention prefill and the mma v2 kernel tests, the model
# tests against the oracle (flash prefill on), then decode A/B (GRANULE_MMA=1 vs 2), pp512 and
# an 8,000-token prompt with the flash prefill on and off.
wave3() {
  local b="$build/app/bench/granule-bench" t
  for t in attention_prefill_test matvec_mma_kernel_test; do
    timeout 120 "$build/tests/$t" >"$OUT/$t.txt" 2>&1
    echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.txt" | tr '\n' ' ')"
    grep -E "^\[  FAILED|Failure|error" "$OUT/$t.txt" | head -6
  done
  timeout 150 "$build/tests/model_gpu_test" >"$OUT/model_gpu_test.txt" 2>&1
  echo "model_gpu_test: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/model_gpu_test.txt" | tr '\n' ' ')"
  grep -E "^\[  FAILED" "$OUT/model_gpu_test.txt" | head -8
  { for mma in 2 1; do
      echo "-- GRANULE_MMA=$mma"
      GRANULE_MMA=$mma timeout 120 "$b" --synthetic llama3-8b:Q4_0 -p 512 -n 0 -b 1,8,16,32,64 | grep "^|"
    done
    for fl in 1 0; do
      echo "-- GRANULE_FLASH_PREFILL=$fl, 8000-token prompt"
      GRANULE_FLASH_PREFILL=$fl timeout 100 "$b" chats --synthetic llama3-8b:Q4_0 -n 1 -p 8000 -g 32 --device cuda | grep "^|"
    done
    echo "-- chats 8,32 (GRANULE_MMA=2)"
    GRANULE_MMA=2 timeout 100 "$b" chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda | grep "^|" | head -4
  } >"$OUT/bench-wave3.txt" 2>&1
  cat "$OUT/bench-wave3.txt"
}

# With the new defaults (mma v2, flash prefill): the model tests against the oracle, the kernel
# tests under compute-sanitizer memcheck (a subset: sanitized kernels run ~100x slower), then
# the server against the bench (serve_bench).
# The int8 mma and model tests, then memcheck/racecheck on the mma and flash-prefill kernels
# (wave5-tests); wave4 adds the server against granule-bench chats.
mma_model_tests() {
  local t
  for t in matvec_mma_kernel_test model_gpu_test; do
    timeout 150 "$build/tests/$t" >"$OUT/$t.txt" 2>&1; gtest_line $t $?
  done
  { timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/attention_prefill_test" \
      --gtest_filter='*HandMadeTiles*:*MixedBatch*hd64_h8_kv1:*hd128_group4_len65'
    echo "attention_prefill_test under memcheck: exit $?"
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/matvec_mma_kernel_test" \
      --gtest_filter='MatvecMmaTasks.*:*33x32:*77x608:*16x160:*50x64:*Q6_K_333x256*'
    echo "matvec_mma_kernel_test under memcheck: exit $?"
    timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$build/tests/matvec_mma_kernel_test" \
      --gtest_filter='*Q4_0_77x608*:*Q6_K_333x256*:MatvecMmaTasks.*'
    echo "matvec_mma_kernel_test under racecheck: exit $?"
    timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$build/tests/attention_prefill_test" \
      --gtest_filter='*HandMadeTiles*:*hd128_group4_len65'
    echo "attention_prefill_test under racecheck: exit $?"; } >"$OUT/memcheck.txt" 2>&1
  grep -E "under (memcheck|racecheck)|ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED)" "$OUT/memcheck.txt"
}
wave4() {
  mma_model_tests
  serve_bench
}

# Speed after the tests: decode by batch and pp512 on 8B, SmolLM2 batch 1 and 32 chats, then
# the server against granule-bench chats at 8 and 32 (issue 18).
wave5_bench() {
  local b="$build/app/bench/granule-bench"
  { timeout 150 "$b" --synthetic llama3-8b:Q4_0 -p 512 -n 64 -b 1,8,16,32,64
    timeout 90 "$b" --synthetic smollm2-135m:Q4_1 -p 512 -n 64 -b 1,32
    timeout 90 "$b" chats --synthetic smollm2-135m:Q4_1 -n 1,32 -p 128 -g 128 --device cuda; } >"$OUT/bench-wave5.txt" 2>&1
  grep -E "^\|" "$OUT/bench-wave5.txt"
  serve_bench
}

# Per-kernel device time (Nsight Compute, gpu__time_duration only, clocks as they are) of
# runs that each isolate one question; ncu_sum prints count, total and mean per kernel name.
ncu_sum() {
  python3 - "$1" <<'PY'
import re, sys
rows, name = {}, None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^\s{2}(\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\).*Invocations (\d+)", line)
    if m: name = m.group(1); n = int(m.group(2)); continue
    m2 = re.search(r"gpu__time_duration\.sum\s+(\S+)\s+\S+\s+\S+\s+(\S+)\s*$", line)
    if name and m2:
        unit = m2.group(1); avg = float(m2.group(2).replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}.get(unit, 1)
        short = re.sub(r"\(.*", "", name)[:100]
        r = rows.setdefault(short, [0, 0.0]); r[0] += n; r[1] += n * avg * scale; name = None
out = sorted(rows.items(), key=lambda kv: -kv[1][1])
print(f"total {sum(v[1] for _, v in out)/1e3:.3f} ms over {sum(v[0] for _, v in out)} launches")
for k, (n, t) in out[:18]: print(f"{t/1e3:9.3f} ms {n:6d} x {t/max(n,1):8.1f} us  {k}")
PY
}
profile_wave5() {
  local b="$build/app/bench/granule-bench" n
  for n in 32 8; do
    timeout 150 ncu --clock-control none --launch-skip 1500 --launch-count 1000 --print-summary per-kernel \
      --metrics gpu__time_duration.sum "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -b $n >/tmp/ncu-b$n.txt 2>&1
    echo "-- decode batch $n (launches 1500-2500 of the run; per step = total / steps)"; ncu_sum /tmp/ncu-b$n.txt
  done
  timeout 150 ncu --clock-control none --print-summary per-kernel --metrics gpu__time_duration.sum \
    "$b" --synthetic llama3-8b:Q4_0 -p 512 -n 0 -r 1 >/tmp/ncu-pp.txt 2>&1
  echo "-- pp512 (two prefills: warm-up + 1)"; ncu_sum /tmp/ncu-pp.txt
  timeout 200 ncu --clock-control none --print-summary per-kernel --metrics gpu__time_duration.sum \
    -k regex:'attention|flash|prefill' "$b" chats --synthetic llama3-8b:Q4_0 -n 1 -p 8000 -g 16 --device cuda >/tmp/ncu-8k.txt 2>&1
  echo "-- attention kernels, 1 chat: 8000-token prompt (16 chunks) + 16 decode steps"; ncu_sum /tmp/ncu-8k.txt
  timeout 200 "$b" chats --synthetic llama3-8b:Q4_0 -n 1,8 -p 8000 -g 128 --device cuda >"$OUT/bench-8k.txt" 2>&1
  grep -E "^\|" "$OUT/bench-8k.txt" | head -5
  for f in /tmp/ncu-b32.txt /tmp/ncu-b8.txt /tmp/ncu-pp.txt /tmp/ncu-8k.txt; do head -c 1500000 $f >"$OUT/$(basename $f)"; done
}

# 8,000-token prompts: 1 and 8 chats with the default chunk (per-step CSV), then 1 chat with
# 1024- and 2048-token chunks.
long_prompts() {
  local b="$build/app/bench/granule-bench"
  { timeout 200 "$b" chats --synthetic llama3-8b:Q4_0 -n 1,8 -p 8000 -g 128 --device cuda --steps-out "$OUT/steps-8k.csv"
    for c in 1024 2048; do
      echo "-- prefill chunk $c"
      timeout 100 "$b" chats --synthetic llama3-8b:Q4_0 -n 1 -p 8000 -g 32 --device cuda --prefill-chunk $c
    done; } >"$OUT/bench-long.txt" 2>&1
  grep -E "^\| +[0-9]|^-- " "$OUT/bench-long.txt"
  python3 - "$OUT/steps-8k.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for n in sorted({r["chats"] for r in rows}, key=int):
    rs = [r for r in rows if r["chats"] == n]
    pre = [r for r in rs if int(r["started"]) < int(n)] + [next(r for r in rs if int(r["started"]) == int(n))]
    print(f"chats {n}: {len(pre)} steps to the last first token, {sum(float(r['ms']) for r in pre):.1f} ms; "
          f"first 3 steps ms {[round(float(r['ms']),1) for r in pre[:3]]}, later median "
          f"{sorted(float(r['ms']) for r in pre[3:])[len(pre[3:])//2] if len(pre) > 3 else 0:.1f}, mapping us sum "
          f"{sum(float(r['mapping_us']) for r in pre):.0f}")
PY
}

# Nsight Compute sections for the four int8 mma products of one 8B layer at 32 rows, and the
# per-kernel time of SmolLM2 batch-1 decode steps (kernel time against the step's 0.59 ms).
profile_mma32() {
  local b="$build/app/bench/granule-bench"
  timeout 150 ncu --clock-control none -k regex:mma_matvec --launch-skip 300 --launch-count 4 \
    --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
    --section ComputeWorkloadAnalysis --section LaunchStats \
    "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -b 32 >"$OUT/ncu-mma32.txt" 2>&1
  grep -E "mma_matvec_kernel|Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Stall|Warp Cycles Per Issued|L2 Cache Throughput|L1/TEX Cache Throughput|Mem Busy|Max Bandwidth|Executed Ipc A" "$OUT/ncu-mma32.txt" | head -90
  timeout 100 ncu --clock-control none --launch-skip 3000 --launch-count 620 --print-summary per-kernel \
    --metrics gpu__time_duration.sum "$b" --synthetic smollm2-135m:Q4_1 -p 0 -n 0 -b 1 >/tmp/ncu-smol.txt 2>&1
  echo "-- SmolLM2 batch 1, 620 launches (about 2 steps)"; ncu_sum /tmp/ncu-smol.txt
}

# Session 3's helpers' kernels: tests and sanitizers (wave6-tests), then the benches (wave6-bench).
gtest_line() { echo "$1: rc=$2 $(grep -E '^\[  (PASSED|FAILED)|tests? ran' "$OUT/$1.txt" | tail -2 | tr '\n' ' ')"; grep -E "^\[  FAILED" "$OUT/$1.txt" | head -8; }
# gtest_lines SECONDS TEST...: each test binary in turn (log in $OUT/TEST.txt), one gtest_line each.
gtest_lines() {
  local seconds=$1 t
  shift
  for t in "$@"; do
    timeout "$seconds" "$build/tests/$t" >"$OUT/$t.txt" 2>&1
    gtest_line "$t" $?
  done
}
wave6_tests() {
  local t
  for t in attention_kernels_test matvec_mma_kernel_test matvec_kernel_test elementwise_kernels_test attention_prefill_test streaming_gpu_test; do
    [[ -x $build/tests/$t ]] || { echo "$t: not built"; continue; }
    timeout 120 "$build/tests/$t" >"$OUT/$t.txt" 2>&1; gtest_line $t $?
  done
  timeout 200 "$build/tests/model_gpu_test" >"$OUT/model_gpu_test.txt" 2>&1; gtest_line model_gpu_test $?
  { timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/attention_kernels_test" ${WAVE6_ATTN_FILTER:+--gtest_filter=$WAVE6_ATTN_FILTER}
    echo "attention_kernels_test under memcheck: exit $?"
    timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$build/tests/attention_kernels_test" ${WAVE6_ATTN_FILTER:+--gtest_filter=$WAVE6_ATTN_FILTER}
    echo "attention_kernels_test under racecheck: exit $?"
    if [[ -n ${WAVE6_MMA_FILTER:-} ]]; then
      timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/matvec_mma_kernel_test" --gtest_filter="$WAVE6_MMA_FILTER"
      echo "matvec_mma_kernel_test under memcheck: exit $?"
    fi
    if [[ -n ${WAVE6_SPLIT_FILTER:-} ]]; then
      timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/matvec_kernel_test" --gtest_filter="$WAVE6_SPLIT_FILTER"
      echo "matvec_kernel_test under memcheck: exit $?"
    fi; } >"$OUT/memcheck.txt" 2>&1
  grep -E "under (memcheck|racecheck)|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/memcheck.txt"
}
wave6_bench() {
  local b="$build/app/bench/granule-bench" o t
  timeout 60 "$build/tests/matvec_kernel_test" >"$OUT/matvec_kernel_test.txt" 2>&1; gtest_line matvec_kernel_test $?
  GRANULE_PREFILL_OVERLAP=0 timeout 100 "$build/tests/streaming_gpu_test" >/tmp/st0.txt 2>&1
  echo "streaming_gpu_test with GRANULE_PREFILL_OVERLAP=0: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/st0.txt | tr '\n' ' ')"
  timeout 60 "$build/tests/streaming_gpu_test" --gtest_filter='*ABudgetChanged*' >/tmp/st1.txt 2>&1
  grep -B2 -A6 "Failure" /tmp/st1.txt | head -30
  { for o in ${WAVE6_OCC:-1 2}; do
      echo "-- GRANULE_MMA_OCC=$o"
      GRANULE_MMA_OCC=$o timeout 90 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -b 8,16,32,64
      GRANULE_MMA_OCC=$o timeout 90 "$b" chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda
    done
    for o in 0 1; do
      echo "-- GRANULE_PREFILL_OVERLAP=$o"
      GRANULE_PREFILL_OVERLAP=$o timeout 90 "$b" --synthetic llama3-8b:Q4_0 -p 512 -n 32 -b 1 -r 5
    done
    echo "-- 8,000-token prompts"
    timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 1,8 -p 8000 -g 128 --device cuda
    for t in ${WAVE6_TYPES:-Q4_K Q5_K}; do
      echo "-- $t"; timeout 120 "$b" --synthetic llama3-8b:$t -p 512 -n 32 -b 1,8
    done; } >"$OUT/bench-wave6.txt" 2>&1
  grep -E "^\| +(synthetic|[0-9])|^-- " "$OUT/bench-wave6.txt"
}

# This session's f16 tensor-core products (matvec_f16mma.cu, GRANULE_F16MMA_MIN_ROWS): kernel
# test, memcheck, the model tests against the oracle, then decode by batch and the chats bench
# with the int8 products against f16 from WAVE7_MIN (default 16).
wave7_f16() {
  local b="$build/app/bench/granule-bench" r t
  for t in matvec_f16mma_kernel_test attention_kernels_test; do
    timeout 150 "$build/tests/$t" --gtest_filter='-*Timing*' >"$OUT/$t.txt" 2>&1; gtest_line $t $?
    grep -B3 -A10 "Failure" "$OUT/$t.txt" | head -30
  done
  timeout 60 "$build/tests/matvec_f16mma_kernel_test" --gtest_filter='*Timing*' 2>&1 | grep -E "timing" | head -24
  timeout 200 "$build/tests/model_gpu_test" --gtest_filter='*F16Mma*' >"$OUT/model_gpu_f16.txt" 2>&1
  gtest_line model_gpu_f16 $?
  grep "\[gpu-vs-oracle\]" "$OUT/model_gpu_f16.txt" | cut -c1-200 | head -12
  if [[ ${WAVE7_MEMCHECK:-1} == 1 ]]; then
    for tool in memcheck racecheck; do
      timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/matvec_f16mma_kernel_test" --gtest_filter="${WAVE7_MC_FILTER:--*Timing*}" >"/tmp/$tool-f16.txt" 2>&1
      echo "matvec_f16mma_kernel_test under $tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/$tool-f16.txt | head -2 | tr '\n' ' ')"
    done
  fi
  { for r in 0 ${WAVE7_MIN:-1}; do
      echo "-- GRANULE_F16MMA_MIN_ROWS=$r"
      GRANULE_F16MMA_MIN_ROWS=$r timeout 120 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 64 -b ${WAVE7_BATCHES:-8,16,20,24,28,32,48,64}
      GRANULE_F16MMA_MIN_ROWS=$r timeout 120 "$b" chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda
    done
    echo "-- SmolLM2 32 chats, GRANULE_F16MMA_MIN_ROWS=${WAVE7_MIN:-1}"
    GRANULE_F16MMA_MIN_ROWS=${WAVE7_MIN:-1} timeout 90 "$b" chats --synthetic smollm2-135m:Q4_1 -n 32 -p 128 -g 128 --device cuda; } >"$OUT/bench-f16.txt" 2>&1
  grep -E "^\| +synthetic|^\| +(8|32) +\||^-- " "$OUT/bench-f16.txt"
}

# The f16 products' final round: kernel/attention tests and sanitizers, the GPU test suites
# with the defaults, decode by batch, the chats bench (per-step CSV) and per-kernel times at 32
# rows. Everything short goes to summary.txt as well.
wave7_final() {
  local b="$build/app/bench/granule-bench" t tool f=MatvecF16MmaClusters.*:MatvecF16MmaTasks.*
  {
  for t in matvec_f16mma_kernel_test attention_kernels_test; do
    timeout 150 "$build/tests/$t" --gtest_filter='-*Timing*' >"/tmp/$t.txt" 2>&1; echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/$t.txt | tr '\n' ' ')"
    grep -E "^\[  FAILED" /tmp/$t.txt | head -5
  done
  timeout 60 "$build/tests/matvec_f16mma_kernel_test" --gtest_filter='*Timing*' 2>&1 | grep -E "timing" | head -24
  for tool in memcheck racecheck synccheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/matvec_f16mma_kernel_test" --gtest_filter="$f" >"/tmp/$tool.txt" 2>&1
    echo "matvec_f16mma_kernel_test ($f) under $tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/$tool.txt | head -1)"
  done
  start=$(date +%s)
  timeout 260 ctest --test-dir "$build" -j3 --timeout 250 -L 'model_gpu_test|concurrent_chats_test|streaming_gpu_test|engine_churn_gpu_test|kv_space_gpu_test|sampling_kernel_test|elementwise_kernels_test|matvec_kernel_test|matvec_mma_kernel_test' >/tmp/ctest.log 2>&1
  echo "GPU suites ($(( $(date +%s) - start )) s): $(grep -E 'tests passed|tests failed' /tmp/ctest.log)"
  grep -E "^\s+[0-9]+ - .*\(" /tmp/ctest.log | head -12
  grep -h "\[gpu-vs-oracle\].*f16 mma" "$build"/Testing/Temporary/LastTest.log 2>/dev/null | cut -c1-160 | head -4
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/ctest.log "$OUT/ctest.log"
  { timeout 120 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 64 -b ${WAVE7_BATCHES:-1,8,16,17,24,32,64}
    timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda --steps-out "$OUT/steps-chats.csv"
    echo "-- SmolLM2"; timeout 90 "$b" chats --synthetic smollm2-135m:Q4_1 -n 32 -p 128 -g 128 --device cuda
    timeout 90 "$b" --synthetic smollm2-135m:Q4_1 -p 0 -n 64 -b 1,32; } >"$OUT/bench-final.txt" 2>&1
  grep -E "^\| +synthetic|^\| +(8|32) +\||^-- " "$OUT/bench-final.txt" | tee -a "$OUT/summary.txt"
  python3 - "$OUT/steps-chats.csv" <<'PY' | tee -a "$OUT/summary.txt"
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["chats"] == "32" and int(r["started"]) == 32 and int(r["produced"]) == 32]
ms = sorted(float(r["ms"]) for r in rows)
if ms: print(f"chats 32 full-batch steps: {len(ms)}, median {ms[len(ms)//2]:.3f} ms, min {ms[0]:.3f}, max {ms[-1]:.3f}, mapping us mean {sum(float(r['mapping_us']) for r in rows)/len(rows):.1f}")
PY
  timeout 150 ncu --clock-control none --launch-skip 1500 --launch-count 1000 --print-summary per-kernel --metrics gpu__time_duration.sum "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -b 32 >/tmp/ncu32.txt 2>&1
  echo "-- ncu, decode batch 32 (launches 1500-2500)" | tee -a "$OUT/summary.txt"; ncu_sum /tmp/ncu32.txt | tee -a "$OUT/summary.txt"
}

# Session 5: the f16 products from 17 rows (GRANULE_F16MMA_MIN_ROWS=17, what the default would
# be) through the kernel test, memcheck and the GPU suites whose oracles read the same variable
# (one test process at a time where the ledger is compared with the driver), then the decode
# sweep at depth 0 and 160 and the chats bench with the host phases of every step.
wave8() {
  local b="$build/app/bench/granule-bench" min=${WAVE8_MIN:-17}
  {
  timeout 150 "$build/tests/matvec_f16mma_kernel_test" --gtest_filter='-*Timing*' >/tmp/f16.txt 2>&1
  echo "matvec_f16mma_kernel_test: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/f16.txt | tr '\n' ' ')"
  grep -E "^\[  FAILED" /tmp/f16.txt | head -5
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/matvec_f16mma_kernel_test" \
    --gtest_filter='MatvecF16MmaTasks.*:MatvecF16MmaBound.*' >/tmp/memcheck.txt 2>&1
  echo "memcheck (MatvecF16MmaTasks.*, Bound): exit $? $(grep -E 'ERROR SUMMARY' /tmp/memcheck.txt | head -1)"
  start=$(date +%s)
  GRANULE_F16MMA_MIN_ROWS=$min timeout 300 ctest --test-dir "$build" -j2 --timeout 250 \
    -L 'model_gpu_test|concurrent_chats_test|engine_churn_gpu_test' >/tmp/ctest.log 2>&1
  echo "GPU suites, min rows $min, -j2 ($(( $(date +%s) - start )) s): $(grep -E 'tests passed|tests failed' /tmp/ctest.log)"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" /tmp/ctest.log | head -12
  GRANULE_F16MMA_MIN_ROWS=$min timeout 200 ctest --test-dir "$build" -j1 --timeout 190 -L 'streaming_gpu_test' >/tmp/ctest-stream.log 2>&1
  echo "streaming_gpu_test, min rows $min, -j1: $(grep -E 'tests passed|tests failed' /tmp/ctest-stream.log)"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" /tmp/ctest-stream.log | head -6
  grep -h "\[gpu-vs-oracle\]" "$build"/Testing/Temporary/LastTest.log 2>/dev/null | cut -c1-170 | head -3
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
  { for d in 0 160; do
      GRANULE_F16MMA_MIN_ROWS=$min timeout 120 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -d $d -b 1,16,17,32,64
    done
    GRANULE_F16MMA_MIN_ROWS=$min timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda --steps-out "$OUT/steps-chats.csv"
    echo "-- SmolLM2"; GRANULE_F16MMA_MIN_ROWS=$min timeout 90 "$b" chats --synthetic smollm2-135m:Q4_1 -n 32 -p 128 -g 128 --device cuda
  } >"$OUT/bench.txt" 2>&1
  grep -E "^\| +synthetic|^\| +(8|32) +\||^-- " "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
  python3 - "$OUT/steps-chats.csv" <<'PY' | tee -a "$OUT/summary.txt"
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["chats"] == "32" and int(r["started"]) == 32 and int(r["produced"]) == 32]
if rows:
    med = lambda k: sorted(float(r[k]) for r in rows)[len(rows) // 2]
    print(f"chats 32 full-batch steps: {len(rows)}; medians ms {med('ms'):.3f}; host us: plan {med('plan_us'):.1f}, launch {med('launch_us'):.1f}, "
          f"overlap {med('overlap_us'):.1f}, wait {med('wait_us'):.1f}, results {med('results_us'):.1f}; mapping {med('mapping_us'):.1f}")
PY
  GRANULE_F16MMA_MIN_ROWS=$min timeout 150 ncu --clock-control none -k regex:attention --launch-skip 2000 --launch-count 64 --print-summary per-kernel \
    --metrics gpu__time_duration.sum "$b" chats --synthetic llama3-8b:Q4_0 -n 32 -p 128 -g 64 --device cuda >/tmp/ncu-attn.txt 2>&1
  echo "-- ncu, attention in chats 32 (launches 2000-2064 of the attention kernels)" | tee -a "$OUT/summary.txt"; ncu_sum /tmp/ncu-attn.txt | tee -a "$OUT/summary.txt"
}

# What the GPU suites say where they fail with the f16 products from 17 rows.
wave8_diag() {
  local min=${WAVE8_MIN:-17} t
  export GRANULE_F16MMA_MIN_ROWS=$min
  {
  timeout 120 "$build/tests/engine_churn_gpu_test" --gtest_filter='*ChatsThatEnd*' >/tmp/churn.txt 2>&1
  echo "churn: rc=$?"; grep -E "Failure|Expected|Which is|error|Error|  Actual|FAILED" /tmp/churn.txt | head -20
  timeout 200 "$build/tests/model_gpu_test" --gtest_filter='ModelGpuBatch.*:*VsCpu*Q4_0*:*VsCpu*Q4_1*:*SmolLM2Shapes*:*F16Mma*' >/tmp/model.txt 2>&1
  echo "model_gpu_test: rc=$?"; grep -E "\[gpu-vs-oracle\]|FAILED|Failure" /tmp/model.txt | cut -c1-260 | head -40
  timeout 200 "$build/tests/concurrent_chats_test" --gtest_filter='*EightChats*' >/tmp/chats.txt 2>&1
  echo "concurrent_chats_test (8): rc=$?"; grep -E "\[concurrent-chats\]|FAILED|Failure" /tmp/chats.txt | cut -c1-220 | head -30
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/churn.txt /tmp/model.txt /tmp/chats.txt "$OUT/"
  local b="$build/app/bench/granule-bench" a
  {
  timeout 150 "$build/tests/attention_kernels_test" >/tmp/attn.txt 2>&1
  echo "attention_kernels_test: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/attn.txt | tr '\n' ' ')"
  grep -E "^\[  FAILED|attention-timing" /tmp/attn.txt | head -12
  for a in 3 6 12; do
    echo "-- GRANULE_ATTN_BLOCKS_PER_SM=$a"
    GRANULE_ATTN_BLOCKS_PER_SM=$a timeout 120 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -d 160 -b 1,8,32 | grep -E "^\| +synthetic"
  done
  timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 32 -p 128 -g 128 --device cuda | grep -E "^\| +32 +\|"
  } 2>&1 | tee -a "$OUT/summary.txt"
}

# The engine suites against the CPU oracle, two at a time (model, concurrent chats, churn;
# log /tmp/ctest.log), and the ones that read the driver's memory figures one at a time
# (streaming, KV space; /tmp/ctest-stream.log). $1: seconds for the ctest run, $2 for each test.
model_suites() {
  local start=$(date +%s)
  timeout "$1" ctest --test-dir "$build" -j2 --timeout "$2" --output-on-failure \
    -L 'model_gpu_test|concurrent_chats_test|engine_churn_gpu_test' >/tmp/ctest.log 2>&1
  echo "model, chats, churn suites -j2 ($(( $(date +%s) - start )) s): $(grep -E 'tests passed|tests failed' /tmp/ctest.log)"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" /tmp/ctest.log | head -12
  grep -E "^\[concurrent-chats\] [0-9]+ chats|^\[churn\]" /tmp/ctest.log | cut -c1-200
}
memory_suites() {
  local start=$(date +%s)
  timeout "$1" ctest --test-dir "$build" -j1 --timeout "$2" --output-on-failure \
    -L 'streaming_gpu_test|kv_space_gpu_test' >/tmp/ctest-stream.log 2>&1
  echo "streaming + kv space suites -j1 ($(( $(date +%s) - start )) s): $(grep -E 'tests passed|tests failed' /tmp/ctest-stream.log)"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" /tmp/ctest-stream.log | head -6
}

# Issue 15's numbers: 8 and 32 chats (with the full-batch steps of the CSV), decode by batch and
# pp512, the SmolLM2 shapes, 8,000-token prompts.
issue15_numbers() {
  local b="$build/app/bench/granule-bench"
  timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda --steps-out "$OUT/steps-chats.csv" | grep -E "^\| +(8|32) +\|"
  python3 - "$OUT/steps-chats.csv" <<'PY'
import csv, sys
for n in ("8", "32"):
    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["chats"] == n and r["started"] == n and r["produced"] == n]
    ms = sorted(float(r["ms"]) for r in rows)
    print(f"chats {n}: {len(ms)} full-batch steps, median {ms[len(ms)//2]:.3f} ms, max {ms[-1]:.3f}, graph captures {rows[0]['graph_captures']} -> {rows[-1]['graph_captures']}")
PY
  timeout 100 "$b" --synthetic llama3-8b:Q4_0 -p 512 -n 64 -b 1,8,16,32,64 | grep -E "^\| +synthetic"
  echo "-- SmolLM2"
  timeout 60 "$b" chats --synthetic smollm2-135m:Q4_1 -n 32 -p 128 -g 128 --device cuda | grep -E "^\| +32 +\|"
  timeout 60 "$b" --synthetic smollm2-135m:Q4_1 -p 512 -n 64 -b 1,32 | grep -E "^\| +synthetic"
  echo "-- 8,000-token prompts"
  timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 1,8 -p 8000 -g 128 --device cuda | grep -E "^\| +(1|8) +\|"
}

# Session 5, the defaults (f16 products from 17 rows): the GPU suites (the ledger-reading ones
# one process at a time), the attention split sweep at depth 160 and the chats bench.
wave8_final() {
  local b="$build/app/bench/granule-bench" a t
  {
  for t in attention_kernels_test matvec_f16mma_kernel_test; do
    timeout 150 "$build/tests/$t" --gtest_filter='-*Timing*' >"/tmp/$t.txt" 2>&1; echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/$t.txt | tr '\n' ' ')"
  done
  model_suites 300 250
  memory_suites 200 190
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
  {
  for a in 3 6 12; do
    echo "-- GRANULE_ATTN_BLOCKS_PER_SM=$a"
    GRANULE_ATTN_BLOCKS_PER_SM=$a timeout 120 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -d 160 -b 1,8,32 | grep -E "^\| +synthetic"
  done
  echo "-- defaults"
  timeout 120 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 64 -b 1,8,16,17,32,64 | grep -E "^\| +synthetic"
  timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda --steps-out "$OUT/steps-chats.csv" | grep -E "^\| +(8|32) +\|"
  echo "-- SmolLM2"
  timeout 90 "$b" chats --synthetic smollm2-135m:Q4_1 -n 32 -p 128 -g 128 --device cuda | grep -E "^\| +32 +\|"
  timeout 90 "$b" --synthetic smollm2-135m:Q4_1 -p 0 -n 64 -b 1,32 | grep -E "^\| +synthetic"
  } 2>&1 | tee -a "$OUT/summary.txt"
}

# Session 5: 8-warp decode attention blocks (GRANULE_ATTN_WARPS=8) against 4, and the chats
# bench with its graphs captured in the warm-up.
wave8_attn() {
  local b="$build/app/bench/granule-bench" w
  {
  GRANULE_ATTN_WARPS=8 timeout 150 "$build/tests/attention_kernels_test" >/tmp/attn8.txt 2>&1
  echo "attention_kernels_test, 8 warps: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/attn8.txt | tr '\n' ' ')"
  grep -E "^\[  FAILED|attention-timing" /tmp/attn8.txt | head -8
  GRANULE_ATTN_WARPS=8 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/attention_kernels_test" \
    --gtest_filter='-*Timing*' >/tmp/memcheck.txt 2>&1
  echo "attention_kernels_test under memcheck, 8 warps: exit $? $(grep -E 'ERROR SUMMARY' /tmp/memcheck.txt | head -1)"
  for w in 4 8; do
    echo "-- GRANULE_ATTN_WARPS=$w"
    GRANULE_ATTN_WARPS=$w timeout 120 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -d 160 -b 1,8,32 | grep -E "^\| +synthetic"
    GRANULE_ATTN_WARPS=$w timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda --steps-out "$OUT/steps-w$w.csv" | grep -E "^\| +(8|32) +\|"
  done
  GRANULE_ATTN_WARPS=8 timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 1,8 -p 8000 -g 64 --device cuda | grep -E "^\| +(1|8) +\|"
  timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 1,8 -p 8000 -g 64 --device cuda | grep -E "^\| +(1|8) +\|"
  } 2>&1 | tee "$OUT/summary.txt"
}

# Session 5, last call: the defaults through every bench of issue 15, then the int8 mma
# threshold below 8 rows and the decode attention's stall reasons at 32 rows x 160 tokens.
wave8_last() {
  local b="$build/app/bench/granule-bench"
  {
  issue15_numbers
  echo "-- GRANULE_MMA_MIN_ROWS=1"
  GRANULE_MMA_MIN_ROWS=1 timeout 60 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -b 1,2,4 | grep -E "^\| +synthetic"
  timeout 60 ncu --clock-control none --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
    -k regex:attention_split --launch-skip 40 --launch-count 1 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -d 160 -b 32 >/tmp/ncu-attn.txt 2>&1
  grep -E "attention_split|Duration|Stall|Warp Cycles Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Block Limit" /tmp/ncu-attn.txt | head -40
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/ncu-attn.txt "$OUT/" 2>/dev/null
}

# Session 5: 8-warp decode attention blocks with one tile each and two blocks per SM, against
# the 4-warp default (GRANULE_ATTN_WARPS=auto takes them where the pairs fill the SMs).
wave8_warps() {
  local b="$build/app/bench/granule-bench" w
  GRANULE_ATTN_WARPS=8 timeout 60 "$build/tests/attention_kernels_test" >/tmp/attn8.txt 2>&1
  echo "attention_kernels_test, 8 warps: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/attn8.txt | tr '\n' ' ')"
  grep -E "^\[  FAILED|attention-timing" /tmp/attn8.txt | head -6
  for w in 4 auto; do
    echo "-- GRANULE_ATTN_WARPS=$w"
    GRANULE_ATTN_WARPS=$w timeout 60 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -d 160 -b 1,8,32 | grep -E "^\| +synthetic"
    GRANULE_ATTN_WARPS=$w timeout 60 "$b" chats --synthetic llama3-8b:Q4_0 -n 32 -p 128 -g 128 --device cuda | grep -E "^\| +32 +\|" | head -1
  done
}

# Session 6, first call: the 8-warp attention (wave8_warps), the f16 products' timing probe, and
# Nsight Compute on the f16 kernel at 32 columns (QKV, wo, gate+up, down: launches 424, 477,
# 530, 583 of the probe's f16mma launches) to see whether L2 -> SM activation bytes bind.
wave9_probe() {
  wave8_warps
  local t="$build/tests/matvec_f16mma_kernel_test" skip name
  timeout 60 "$t" --gtest_filter='MatvecF16MmaTiming.*' >"$OUT/f16-timing.txt" 2>&1
  grep "f16mma-timing" "$OUT/f16-timing.txt"
  for skip in 424:qkv 477:wo 530:gateup 583:down; do
    name=${skip#*:}
    timeout 120 ncu --clock-control none --kernel-name regex:f16mma_matvec --launch-skip ${skip%:*} --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
      --section LaunchStats --section ComputeWorkloadAnalysis "$t" --gtest_filter='MatvecF16MmaTiming.*' >/tmp/ncu-$name.txt 2>&1
    cat /tmp/ncu-$name.txt >>"$OUT/ncu-f16-32.txt"
    echo "-- $name: $(grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Achieved Occupancy" /tmp/ncu-$name.txt | sed -E 's/ +/ /g' | tr '\n' ';')"
  done
}

# Session 6, second call: the shared-activation f16 shapes (KernelConfig::f16_mma_shared_*):
# correctness (kernel test, memcheck on the new test), the timing sweep, then the engine with
# the fastest gate+up and plain shapes at 32 columns (model tests against the oracle, benches).
wave9_shared() {
  local t="$build/tests/matvec_f16mma_kernel_test" b="$build/app/bench/granule-bench"
  timeout 150 "$t" >"$OUT/f16-test.txt" 2>&1
  echo "matvec_f16mma_kernel_test: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/f16-test.txt" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure" "$OUT/f16-test.txt" | head -8
  grep "f16mma-timing.*32 columns" "$OUT/f16-test.txt"
  grep "f16mma-shared.*32 columns" "$OUT/f16-test.txt"
  read -r G P < <(python3 - "$OUT/f16-test.txt" <<'PY'
import re, sys
base, shared = {}, {}
for line in open(sys.argv[1]):
    m = re.search(r"\[f16mma-timing\] (\S+)\s+32 columns: f16 mma\s+([\d.]+)", line)
    if m: base[m.group(1)] = float(m.group(2))
    m = re.search(r"\[f16mma-shared\] shape (\d) (\S+)\s+32 columns:\s+([\d.]+)", line)
    if m: shared.setdefault(int(m.group(1)), {})[m.group(2)] = float(m.group(3))
plain = lambda d: sum(d.get(k, 1e9) for k in ("qkv", "wo", "down"))
# The probe's default line runs the default shapes (gate+up: shape 5 since session 6), so the
# pick is among the shapes themselves, with round 1 (0) for the plain products only.
g = min(shared, key=lambda v: shared[v].get("gate+up", 1e9)) if shared else 5
p = min([0] + list(shared), key=lambda v: plain(base) if v == 0 else plain(shared[v]))
print(g, p)
PY
)
  echo "fastest at 32 columns: gate+up shape ${G:-0}, plain shape ${P:-0}"
  timeout 150 compute-sanitizer --tool memcheck "$t" --gtest_filter='*MatvecF16MmaShared*shape7:*MatvecF16MmaShared*shape8:*MatvecF16MmaShared*shape9' >/tmp/memcheck.txt 2>&1
  echo "memcheck MatvecF16MmaShared shapes 7-9: rc=$? $(grep -E 'ERROR SUMMARY' /tmp/memcheck.txt | tail -1)"
  export GRANULE_F16MMA_SHARED_GATEUP=${G:-0} GRANULE_F16MMA_SHARED_PLAIN=${P:-0}
  timeout 200 "$build/tests/model_gpu_test" --gtest_filter='*F16Mma*:*Batch*' >"$OUT/model-f16.txt" 2>&1
  echo "model_gpu_test F16/Batch with shapes $G/$P: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/model-f16.txt" | tr '\n' ' ')"
  grep -E "^\[  FAILED" "$OUT/model-f16.txt" | head -5
  for gp in "5 0" "$G $P"; do
    read -r g p <<<"$gp"
    echo "-- shapes gate+up $g, plain $p"
    GRANULE_F16MMA_SHARED_GATEUP=$g GRANULE_F16MMA_SHARED_PLAIN=$p timeout 60 "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -d 160 -b 32,64 | grep -E "^\| +synthetic"
    GRANULE_F16MMA_SHARED_GATEUP=$g GRANULE_F16MMA_SHARED_PLAIN=$p timeout 60 "$b" chats --synthetic llama3-8b:Q4_0 -n 32 -p 128 -g 128 --device cuda | grep -E "^\| +32 +\|" | head -1
  done
  GRANULE_F16MMA_SHARED_GATEUP=$G GRANULE_F16MMA_SHARED_PLAIN=$P timeout 60 "$b" chats --synthetic smollm2-135m:Q4_1 -n 32 -p 128 -g 128 --device cuda | grep -E "^\| +32 +\|" | head -1
}

# Session 6, the defaults at the end (gate+up in shared shape 5, attention warps auto): the
# kernel tests, memcheck on the new shapes and on the 8-warp attention, the engine suites
# against the CPU oracle (wave9-tests); issue 15's numbers (wave9-bench).
wave9_tests() {
  local t
  {
  for t in attention_kernels_test matvec_f16mma_kernel_test; do
    timeout 100 "$build/tests/$t" --gtest_filter='-*Timing*' >"/tmp/$t.txt" 2>&1; echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/$t.txt | tr '\n' ' ')"
    grep -E "^\[  FAILED" /tmp/$t.txt | head -5
  done
  GRANULE_ATTN_WARPS=8 timeout 90 compute-sanitizer --tool memcheck "$build/tests/attention_kernels_test" \
    --gtest_filter='-*Timing*' >/tmp/memcheck-attn.txt 2>&1
  echo "memcheck attention, 8 warps: rc=$? $(grep -E 'ERROR SUMMARY' /tmp/memcheck-attn.txt | tail -1)"
  model_suites 230 220
  memory_suites 150 140
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log" 2>/dev/null
}

wave9_bench() {
  issue15_numbers 2>&1 | tee "$OUT/summary.txt"
}

# Session 6: where the f16 products at 32 rows stall (bench step, 4 consecutive f16 launches:
# QKV, wo, gate+up in shape 5, down), for the next round.
wave9_stalls() {
  local b="$build/app/bench/granule-bench"
  timeout 200 ncu --clock-control none -k regex:f16mma --launch-skip 400 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    "$b" --synthetic llama3-8b:Q4_0 -p 0 -n 0 -b 32 >/tmp/ncu-stalls.txt 2>&1
  echo "ncu rc=$?"
  cp /tmp/ncu-stalls.txt "$OUT/"
  python3 - /tmp/ncu-stalls.txt <<'PY'
import re, sys
name = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^\s{2}(?:void )?(\S.*?)\((?:granule|unnamed|\w).*\) \((\d+), (\d+), (\d+)\)x\((\d+)", line)
    if m: print("==", m.group(1)[-80:], "grid", m.group(2), "block", m.group(5)); continue
    m = re.search(r"(Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy)\s+\S+\s+([\d.,]+)$", line)
    if m: print("  ", m.group(1), m.group(2)); continue
    m = re.search(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio\s+\S*\s+([\d.]+)$", line)
    if m and float(m.group(2)) >= 0.1: print("   stall", m.group(1), m.group(2))
PY
}

# Session 6, last call: memcheck on the default shared shape (5) and a cluster shape (8), the
# engine suites against the CPU oracle with the defaults, and the 32-chat number once more.
wave9_check() {
  local t="$build/tests/matvec_f16mma_kernel_test" b="$build/app/bench/granule-bench"
  {
  timeout 200 compute-sanitizer --tool memcheck "$t" \
    --gtest_filter='*MatvecF16MmaShared*shape5:*MatvecF16MmaShared*shape8' >/tmp/memcheck.txt 2>&1
  echo "memcheck MatvecF16MmaShared shapes 5, 8: rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' /tmp/memcheck.txt | tr '\n' ' ')"
  model_suites 150 140
  timeout 60 "$b" chats --synthetic llama3-8b:Q4_0 -n 32 -p 128 -g 128 --device cuda | grep -E "^\| +32 +\|" | head -1
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/ctest.log "$OUT/"
}

# Session 6, after the copy helpers were shared between the kernels: the f16 kernel test, its
# timing probe, the 32-chat number.
wave9_recheck() {
  local t="$build/tests/matvec_f16mma_kernel_test" b="$build/app/bench/granule-bench"
  {
  timeout 200 "$t" >/tmp/f16-test.txt 2>&1
  echo "matvec_f16mma_kernel_test: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/f16-test.txt | tr '\n' ' ')"
  grep -E "^\[  FAILED" /tmp/f16-test.txt | head -5
  grep -E "f16mma-timing.*32 columns|f16mma-shared\] shape 5 .*32 columns" /tmp/f16-test.txt
  timeout 60 "$b" chats --synthetic llama3-8b:Q4_0 -n 32 -p 128 -g 128 --device cuda | grep -E "^\| +32 +\|" | head -1
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/f16-test.txt "$OUT/"
}

# Session 7's experiments (wave10-wave13) measured settings that were since removed or
# renumbered (RoPE in attention, 16-warp attention, two steps before the PDL wait, fusion levels
# 0-2 of that time); they are in this script at commit 269e59a. The modes below run the code as
# it stands.
# Session 7, with the final defaults (batch-1 fusion 2): the matvec kernel test (the norm
# hand-over included) and memcheck on the hand-over, the engine suites against the CPU oracle
# (wave14-tests); issue 15's numbers (wave14-bench).
wave14_tests() {
  local t="$build/tests/matvec_kernel_test"
  {
  timeout 120 "$t" >"$OUT/matvec_kernel_test.txt" 2>&1; gtest_line matvec_kernel_test $?
  timeout 120 compute-sanitizer --tool memcheck "$t" --gtest_filter='*HandOver*' >/tmp/memcheck.txt 2>&1
  echo "memcheck hand-over: rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' /tmp/memcheck.txt | tr '\n' ' ')"
  model_suites 210 200
  memory_suites 130 120
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
}

# Session 7, last call: RoPE and the K/V write in the batch-1 Q/K/V epilogue (fusion 3): the
# matvec kernel test (against rope_kv, the norm hand-over), the model tests per fusion level,
# the engine suites with the defaults, batch-1 decode at fusion 2 and 3, issue 15's numbers.
wave15() {
  local b="$build/app/bench/granule-bench" m f
  {
  timeout 120 "$build/tests/matvec_kernel_test" >"$OUT/matvec_kernel_test.txt" 2>&1
  gtest_line matvec_kernel_test $?
  grep -E "rope-epilogue" "$OUT/matvec_kernel_test.txt"
  timeout 120 compute-sanitizer --tool memcheck "$build/tests/matvec_kernel_test" --gtest_filter='*RopeEpilogue*' >/tmp/memcheck.txt 2>&1
  echo "memcheck rope epilogue: rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' /tmp/memcheck.txt | tr '\n' ' ')"
  timeout 200 "$build/tests/model_gpu_test" --gtest_filter='*DecodeFusion*' >/tmp/model-test.txt 2>&1
  echo "model_gpu_test fusion: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/model-test.txt | tr '\n' ' ')"
  grep -E "^\[  FAILED|^\[fusion\].*fusion 3" /tmp/model-test.txt | head -8
  model_suites 200 190
  memory_suites 100 90
  for m in llama3-8b:Q4_0 smollm2-135m:Q4_1; do
    for f in 2 3 2 3; do
      echo "-- $m fusion $f: $(GRANULE_DECODE_FUSION=$f timeout 60 "$b" --synthetic $m -p 512 -n 64 -b 1 | grep -E "^\| +synthetic" | grep -v pp512 | awk -F'|' '{printf "%s %s t/s %s ms (device %s ms); ", $4, $6, $7, $9}')"
    done
  done
  issue15_numbers
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
  cp /tmp/model-test.txt "$OUT/"
}

# Session 7, after the split kernels' tasks took consecutive blocks (no block launched past K's
# and V's rows): the matvec kernel test, the model tests, the engine suites, batch 1 and 4.
wave16() {
  local b="$build/app/bench/granule-bench" m
  {
  timeout 120 "$build/tests/matvec_kernel_test" >"$OUT/matvec_kernel_test.txt" 2>&1
  gtest_line matvec_kernel_test $?
  grep -E "rope-epilogue" "$OUT/matvec_kernel_test.txt"
  model_suites 200 190
  for m in llama3-8b:Q4_0 smollm2-135m:Q4_1 llama3-8b:Q4_0 smollm2-135m:Q4_1; do
    echo "-- $m: $(timeout 60 "$b" --synthetic $m -p 512 -n 64 -b 1,4 | grep -E "^\| +synthetic" | grep -v pp512 | awk -F'|' '{printf "%s b%s %s t/s %s ms; ", $4, $5, $6, $7}')"
  done
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/ctest.log "$OUT/"
}

# Session 8: batch-1 products in warps that stay (GRANULE_SPLIT_ROWS). wave17: the matvec
# kernel test (bitwise against the block kernels), memcheck on it, the fusion model tests
# (bitwise per split_rows). Its first call also benched a split_rows 2 (32-row blocks meeting
# through counters), and a second call (wave18, on a tree with the norm sums loaded beside the
# first activations and a fusion level 4) alternated those with ab-old/; both were measured
# slower and removed before any commit (kernels/PERF_NOTES.md, session 8).
wave17() {
  {
  timeout 150 "$build/tests/matvec_kernel_test" >"$OUT/matvec_kernel_test.txt" 2>&1
  gtest_line matvec_kernel_test $?
  memcheck_line "staying warps + hand-over" /tmp/memcheck.txt 150 matvec_kernel_test '*StayingWarps*:*HandOver*'
  fusion_line 200
  grep -E "^\[  FAILED|split_rows" /tmp/model-test.txt | head -8
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/model-test.txt /tmp/memcheck.txt "$OUT/"
}
b1_line() {  # b1_line BENCH MODEL: the decode and tg64 rows of a batch-1 run
  timeout 60 "$1" --synthetic "$2" -p 512 -n 64 -b 1 | grep -E "^\| +synthetic" | grep -v pp512 | awk -F'|' '{printf "%s %s t/s %s ms (device %s ms); ", $4, $6, $7, $9}'
}
# memcheck_line LABEL LOG SECONDS TEST [FILTER]: the test binary under compute-sanitizer
# memcheck (log in LOG), summarised in one line.
memcheck_line() {
  timeout "$3" compute-sanitizer --tool memcheck "$build/tests/$4" ${5:+--gtest_filter="$5"} >"$2" 2>&1
  echo "memcheck $1: rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$2" | tr '\n' ' ')"
}
# fusion_line SECONDS: the batch-1 fusion model tests (log in /tmp/model-test.txt), one line.
fusion_line() {
  timeout "$1" "$build/tests/model_gpu_test" --gtest_filter='*DecodeFusion*' >/tmp/model-test.txt 2>&1
  echo "model_gpu_test fusion: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/model-test.txt | tr '\n' ' ')"
}
# ab_b1 REPS OLD_BENCH OLD_LABEL NEW_BENCH: batch 1 of both shapes, old and new alternated.
ab_b1() {
  local rep m
  for rep in $(seq "$1"); do
    for m in llama3-8b:Q4_0 smollm2-135m:Q4_1; do
      echo "-- $m old ($3): $(b1_line "$2" $m)"
      echo "-- $m new: $(b1_line "$4" $m)"
    done
  done
}
# granule-bench of ab-old/ (an untracked snapshot of an earlier head, `git archive REV`), for
# an A/B within one call.
build_old_bench() { build_snapshot_bench ab-old build-gpu-old; }
# build_snapshot_bench DIR BUILD: granule-bench of the snapshot in $root/DIR into $root/BUILD.
build_snapshot_bench() {
  cmake -S "$root/$1" -B "$root/$2" -G Ninja -DGRANULE_BUILD_APP=OFF -DGRANULE_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGRANULE_DEPS_DIR="$root/.gpu-deps" >/tmp/configure-$1.log 2>&1
  ninja -C "$root/$2" -j16 granule-bench >/tmp/build-$1.log 2>&1 || tail -20 /tmp/build-$1.log
}

# Session 8, split_rows 1 by default: the matvec and fusion tests, batch 1 against ab-old/
# (2f28505), the model, chats, churn, streaming and KV-space suites.
wave19() {
  local b="$build/app/bench/granule-bench" ob="$root/build-gpu-old/app/bench/granule-bench" m rep
  build_old_bench
  wave17
  {
  for rep in 1 2; do
    for m in llama3-8b:Q4_0 smollm2-135m:Q4_1; do
      echo "-- $m old (2f28505): $(b1_line "$ob" $m)"
      echo "-- $m rows 0: $(GRANULE_SPLIT_ROWS=0 b1_line "$b" $m)"
      echo "-- $m rows 1 (default): $(b1_line "$b" $m)"
    done
  done
  model_suites 200 190
  memory_suites 100 90
  } 2>&1 | tee -a "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
}

# Session 8, last call: wave19 found the staying warps taking the one-column group of a larger
# batch (first_column ignored); with them kept to runs of one row: the kernel and fusion tests,
# the engine suites, then issue 15's numbers with the final defaults.
wave20() {
  wave17
  {
  model_suites 200 190
  memory_suites 100 90
  issue15_numbers
  } 2>&1 | tee -a "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
}

# Session 8: blocks that own a 32-row block (the 8B model's SwiGLU product quantises its own
# result) against GRANULE_SPLIT_ROWS=1: the kernel and fusion tests, batch 1 three times each,
# then the engine suites with whichever gave the lowest median 8B step. When it ran, 2 named
# 4-warp owner blocks (since removed: slower) and 3 the 8-warp ones that are now 2.
wave21() {
  local b="$build/app/bench/granule-bench" rep r best
  wave17
  {
  for rep in 1 2 3; do
    for r in 1 2; do
      echo "-- llama3-8b:Q4_0 rows $r: $(GRANULE_SPLIT_ROWS=$r b1_line "$b" llama3-8b:Q4_0)"
    done
  done
  for r in 1 2; do echo "-- smollm2-135m:Q4_1 rows $r: $(GRANULE_SPLIT_ROWS=$r b1_line "$b" smollm2-135m:Q4_1)"; done
  } 2>&1 | tee -a "$OUT/summary.txt"
  best=$(python3 - "$OUT/summary.txt" <<'PY'
import re, sys, statistics
ms = {}
for line in open(sys.argv[1]):
    m = re.match(r"-- llama3-8b:Q4_0 rows (\d): .*decode\s+[\d.]+\s+t/s\s+([\d.]+)\s+ms", line)
    if m: ms.setdefault(m.group(1), []).append(float(m.group(2)))
print(min(ms, key=lambda k: statistics.median(ms[k])) if ms else "1")
PY
)
  {
  echo "engine suites with GRANULE_SPLIT_ROWS=$best"
  GRANULE_SPLIT_ROWS=$best model_suites 200 190
  GRANULE_SPLIT_ROWS=$best memory_suites 100 90
  } 2>&1 | tee -a "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
}

# Session 9: what a phase boundary costs (granule-bench sync: kernels in a graph with and without
# PDL against a grid barrier), beside batch 1 with and without PDL on the same machine.
wave22() {
  local b="$build/app/bench/granule-bench" m
  {
  timeout 120 "$b" sync
  for m in llama3-8b:Q4_0 smollm2-135m:Q4_1; do
    echo "-- $m: $(b1_line "$b" $m)"
    echo "-- $m PDL off: $(GRANULE_PDL=0 b1_line "$b" $m)"
  done
  } 2>&1 | tee "$OUT/summary.txt"
}

# Session 9: the L2 prefetch of the next product's weights (GRANULE_L2_PREFETCH): the kernel test
# (bitwise, refusals) and memcheck on it, the fusion model tests, batch 1 alternated 0 / 1.
wave23() {
  local b="$build/app/bench/granule-bench" rep p m
  {
  timeout 150 "$build/tests/matvec_kernel_test" >"$OUT/matvec_kernel_test.txt" 2>&1
  gtest_line matvec_kernel_test $?
  memcheck_line "L2 prefetch" /tmp/memcheck.txt 150 matvec_kernel_test '*L2Prefetch*'
  fusion_line 200
  grep -E "^\[  FAILED|l2_prefetch" /tmp/model-test.txt | head -8
  for rep in 1 2 3; do
    for m in llama3-8b:Q4_0 smollm2-135m:Q4_1; do
      for p in 0 1; do echo "-- $m prefetch $p: $(GRANULE_L2_PREFETCH=$p b1_line "$b" $m)"; done
    done
  done
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/model-test.txt /tmp/memcheck.txt "$OUT/"
}

# Session 9: the prefetch before the warps' own loads (2) beside after their rows (1) and none.
wave24() {
  local b="$build/app/bench/granule-bench" rep p m
  for rep in 1 2; do
    for m in llama3-8b:Q4_0 smollm2-135m:Q4_1; do
      for p in 0 1 2; do echo "-- $m prefetch $p: $(GRANULE_L2_PREFETCH=$p b1_line "$b" $m)"; done
    done
  done 2>&1 | tee "$OUT/summary.txt"
}

# Session 9: the RoPE epilogue's rotation formed before the PDL wait. The RoPE kernel tests and
# memcheck on them, the fusion model tests, batch 1 alternated with ab-old/ (7df4bc6), then the
# model, chats, churn, streaming and KV-space suites.
wave25() {
  local b="$build/app/bench/granule-bench" ob="$root/build-gpu-old/app/bench/granule-bench"
  build_old_bench
  {
  timeout 150 "$build/tests/matvec_kernel_test" >"$OUT/matvec_kernel_test.txt" 2>&1
  gtest_line matvec_kernel_test $?
  memcheck_line "RoPE epilogue" /tmp/memcheck.txt 150 matvec_kernel_test '*Rope*'
  fusion_line 200
  ab_b1 3 "$ob" 7df4bc6 "$b"
  model_suites 200 190
  memory_suites 100 90
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/model-test.txt /tmp/memcheck.txt "$OUT/"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
}

# Session 9, last call: also the RoPE epilogue's KV address and the decode attention's plan and
# KV address formed before the PDL wait. Kernel tests (matvec, attention, flash prefill) and
# memcheck, the fusion model tests, batch 1 alternated with ab-old/ (7df4bc6), the engine
# suites, then issue 15's numbers.
wave26() {
  local b="$build/app/bench/granule-bench" ob="$root/build-gpu-old/app/bench/granule-bench"
  build_old_bench
  {
  gtest_lines 150 matvec_kernel_test attention_kernels_test attention_prefill_test
  memcheck_line "RoPE epilogue" /tmp/memcheck.txt 200 matvec_kernel_test '*Rope*'
  memcheck_line attention /tmp/memcheck-attn.txt 200 attention_kernels_test
  fusion_line 200
  ab_b1 2 "$ob" 7df4bc6 "$b"
  model_suites 200 190
  memory_suites 100 90
  issue15_numbers
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
}

# Session 9: also the hand-over's norm weights requested before the PDL wait and the residual
# right after it. The hand-over, staying-warp and RoPE kernel tests, the fusion model tests,
# batch 1 alternated with ab-old/ (c5f6e90). (The last device seconds of the session.)
wave27() {
  local b="$build/app/bench/granule-bench" ob="$root/build-gpu-old/app/bench/granule-bench"
  ninja -C "$root/build-gpu-old" -j16 granule-bench >/dev/null 2>&1 || build_old_bench
  {
  timeout 100 "$build/tests/matvec_kernel_test" --gtest_filter='*HandOver*:*StayingWarps*:*Rope*:*Tasks*' >"$OUT/matvec_kernel_test.txt" 2>&1
  gtest_line matvec_kernel_test $?
  fusion_line 120
  ab_b1 2 "$ob" c5f6e90 "$b"
  } 2>&1 | tee "$OUT/summary.txt"
}

# Session 10, first call: the full kernel and engine tests at a9803f5 (9c011a1 and 64fc232 had
# only the hand-over and fusion tests on the device), batch 1 with the device's own step time
# beside the wall time (granule-bench's new column), and where a SmolLM2 batch-1 step goes per
# kernel (Nsight Compute, caches as they are: 4 steps after 1,500 launches of warm-up).
wave28() {
  local b="$build/app/bench/granule-bench" rep m
  {
  gtest_lines 150 matvec_kernel_test attention_kernels_test attention_prefill_test
  memcheck_line "RoPE, hand-over" /tmp/memcheck.txt 200 matvec_kernel_test '*Rope*:*HandOver*:*StayingWarps*'
  memcheck_line attention /tmp/memcheck-attn.txt 200 attention_kernels_test
  fusion_line 200
  for rep in 1 2; do
    for m in llama3-8b:Q4_0 smollm2-135m:Q4_1; do echo "-- $m: $(b1_line "$b" $m)"; done
  done
  timeout 150 ncu --clock-control none --cache-control none --launch-skip 1500 --launch-count 616 \
    --print-summary per-kernel --metrics gpu__time_duration.sum "$b" --synthetic smollm2-135m:Q4_1 \
    -p 0 -n 0 -b 1 >/tmp/ncu-smol.txt 2>&1
  echo "-- SmolLM2 batch 1, 4 steps (ncu rc=$?)"; ncu_sum /tmp/ncu-smol.txt
  model_suites 200 190
  memory_suites 100 90
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
  head -c 2000000 /tmp/ncu-smol.txt >"$OUT/ncu-smol.txt"
}

# Session 10: the quantisation's reductions as redux.sync, split_rows 3 (the output head's rows
# of one step with 4 rows in flight per warp), the attention merge of up to 8 splits in one
# round trip and decode_fusion 4 (the first and output norms handed over): the kernel tests (new: short rows bitwise against the block kernels), memcheck,
# the fusion model tests (which also run split_rows 0-2 against 3), batch 1 alternated with
# ab-old/ (9add70f) at depth 0 and after 448 tokens (7-8 splits: the quick merge) and 1,024 (the
# general merge), split_rows 2 against 3, fusion 3 against 4; then where a SmolLM2 step goes:
# GRANULE_ABLATE, a bit mask of kernels that return right after their PDL wait (1 Q/K/V, 2
# attention, 4 output and down projections, 8 gate/up, 16 the head and the last down; results
# wrong, the times tell each kernel's share of the chain). The ablation hooks were in that
# call's tree only (they are not committed), so here the variable does nothing.
bd_line() {  # bd_line BENCH MODEL DEPTH: the batch-1 decode row after DEPTH tokens
  timeout 60 "$1" --synthetic "$2" -p 0 -n 0 -b 1 -d "$3" | grep -E "^\| +synthetic" | awk -F'|' '{printf "%s %s t/s %s ms (device %s ms); ", $4, $6, $7, $9}'
}
wave29() {
  local b="$build/app/bench/granule-bench" ob="$root/build-gpu-old/app/bench/granule-bench"
  local mask rep m d
  build_old_bench
  {
  gtest_lines 200 matvec_kernel_test attention_kernels_test
  memcheck_line "short rows, hand-over" /tmp/memcheck.txt 200 matvec_kernel_test '*ShortRows*:*HandOver*'
  memcheck_line attention /tmp/memcheck-attn.txt 200 attention_kernels_test
  fusion_line 200
  ab_b1 2 "$ob" 9add70f "$b"
  for m in smollm2-135m:Q4_1 llama3-8b:Q4_0; do
    for d in 448 1024; do
      echo "-- $m depth $d old: $(bd_line "$ob" $m $d)"
      echo "-- $m depth $d new: $(bd_line "$b" $m $d)"
    done
  done
  for rep in 1 2; do
    echo "-- smollm2-135m:Q4_1 split_rows 2: $(GRANULE_SPLIT_ROWS=2 bd_line "$b" smollm2-135m:Q4_1 0)"
    echo "-- smollm2-135m:Q4_1 split_rows 3: $(bd_line "$b" smollm2-135m:Q4_1 0)"
    for m in smollm2-135m:Q4_1 llama3-8b:Q4_0; do
      echo "-- $m fusion 3: $(GRANULE_DECODE_FUSION=3 bd_line "$b" $m 0)"
      echo "-- $m fusion 4: $(bd_line "$b" $m 0)"
    done
  done
  for mask in 0 1 2 4 8 16 31 0; do
    echo "-- smollm2-135m:Q4_1 ablate $mask: $(GRANULE_ABLATE=$mask bd_line "$b" smollm2-135m:Q4_1 0)"
  done
  for mask in 0 2 31; do
    echo "-- llama3-8b:Q4_0 ablate $mask: $(GRANULE_ABLATE=$mask bd_line "$b" llama3-8b:Q4_0 0)"
  done
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/model-test.txt /tmp/memcheck.txt "$OUT/"
}

# Session 10's last call (the machine stopped answering; nothing came back, so this is what the
# next session should run first): split_rows 4 runs the one-row products of at most 32
# sub-blocks at U = 1 (no spill in the 32-warp SwiGLU kernel): the staying-warp, short-row,
# hand-over and RoPE kernel tests and the fusion model tests, batch 1 with split_rows 3 against
# 4 and decode attention in 4 (auto) against 8 warps, the engine suites, issue 15's numbers.
wave30() {
  local b="$build/app/bench/granule-bench" rep d
  {
  timeout 100 "$build/tests/matvec_kernel_test" --gtest_filter='*HandOver*:*StayingWarps*:*ShortRows*:*Rope*:*Tasks*' >"$OUT/matvec_kernel_test.txt" 2>&1
  gtest_line matvec_kernel_test $?
  fusion_line 150
  for rep in 1 2; do
    echo "-- smollm2-135m:Q4_1 split_rows 3: $(bd_line "$b" smollm2-135m:Q4_1 0)"
    echo "-- smollm2-135m:Q4_1 split_rows 4: $(GRANULE_SPLIT_ROWS=4 bd_line "$b" smollm2-135m:Q4_1 0)"
  done
  for d in 0 448; do
    echo "-- smollm2-135m:Q4_1 depth $d attention warps 8: $(GRANULE_ATTN_WARPS=8 bd_line "$b" smollm2-135m:Q4_1 $d)"
    echo "-- smollm2-135m:Q4_1 depth $d attention warps auto: $(bd_line "$b" smollm2-135m:Q4_1 $d)"
  done
  model_suites 150 140
  memory_suites 60 50
  issue15_numbers
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
  cp /tmp/model-test.txt "$OUT/"
}

# Session 11 had no device (none was lent): four knobs built and tested here only, each off by
# default and each bitwise-neutral by construction, measured here first (the first call of the
# next session; wave30's split_rows 4 and 8-warp attention are in it too):
#   GRANULE_SPLIT_ROWS=4     one sub-block per lane and step for rows of at most 32 (no spill)
#   GRANULE_LATE_NORM=1      the input norm's sums requested beside the activations, reduced
#                            after the products (ptxas: one L2 round trip after the wait, not two)
#   GRANULE_ATTN_EARLY=3     idle attention blocks leave at once; earlier steps' K/V before the wait
#   GRANULE_EARLY_TRIGGER=1|2  the next kernel may start before this one's wait
# wave31: the kernel tests with every knob on (bitwise against the defaults where the tests
# compare), the fused Q/K/V + attention kernel's test (GRANULE_QKV_ATTENTION, experimental) and
# memcheck on it and on the late-writer attention test, the fusion model tests with every knob
# on (and the fused kernel's against the oracle), and batch 1 with and without them. Build with
# GRANULE_TARGETS="attention_kernels_test matvec_kernel_test qkv_attention_test model_gpu_test
# granule-bench". wave31b sweeps the knobs one by one; wave32 runs the engine suites and issue
# 15's numbers.
knob_all="GRANULE_SPLIT_ROWS=4 GRANULE_LATE_NORM=1 GRANULE_ATTN_EARLY=3 GRANULE_EARLY_TRIGGER=2"
# knob_line LABEL "VAR=VALUE ..." MODEL DEPTH: bd_line under those variables (empty: defaults).
knob_line() {
  echo "-- $3 depth $4 $1: $( [[ -n $2 ]] && export $2; bd_line "$b" "$3" "$4")"
}
wave31() {
  local b="$build/app/bench/granule-bench" rep
  {
  env $knob_all timeout 120 "$build/tests/attention_kernels_test" --gtest_filter='-*Timing*' \
    >"$OUT/attention_kernels_test.txt" 2>&1
  gtest_line attention_kernels_test $?
  env $knob_all timeout 150 "$build/tests/matvec_kernel_test" \
    --gtest_filter='*HandOver*:*StayingWarps*:*ShortRows*:*Rope*:*Tasks*:*LateNorm*' \
    >"$OUT/matvec_kernel_test.txt" 2>&1
  gtest_line matvec_kernel_test $?
  ( export $knob_all
    memcheck_line "attention, late writer" /tmp/memcheck.txt 60 attention_kernels_test \
      '*AttentionEarlyRequests*' )
  env $knob_all timeout 200 "$build/tests/model_gpu_test" --gtest_filter='*DecodeFusion*' \
    >/tmp/model-test.txt 2>&1
  echo "model_gpu_test fusion, every knob on: rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/model-test.txt | tr '\n' ' ')"
  grep -E "^\[  FAILED" /tmp/model-test.txt | head -8
  for rep in 1 2; do
    knob_line defaults "" smollm2-135m:Q4_1 0
    knob_line "all four" "$knob_all" smollm2-135m:Q4_1 0
  done
  } 2>&1 | tee "$OUT/summary.txt"
  cp /tmp/model-test.txt /tmp/memcheck.txt "$OUT/" 2>/dev/null
}
# The knob sweep (after wave31): batch 1 per knob on the SmolLM2 shapes, alternated; the 8B with
# all four; after 300 tokens (the fused kernel's shared memory holds about 380 for SmolLM2) and
# 448 (past it: the two kernels again, in their own graph).
wave31b() {
  local b="$build/app/bench/granule-bench" rep
  {
  for rep in 1 2; do
    knob_line defaults "" smollm2-135m:Q4_1 0
    knob_line "split_rows 4" "GRANULE_SPLIT_ROWS=4" smollm2-135m:Q4_1 0
    knob_line "late norm" "GRANULE_LATE_NORM=1" smollm2-135m:Q4_1 0
    knob_line "attention early 3" "GRANULE_ATTN_EARLY=3" smollm2-135m:Q4_1 0
    knob_line "early trigger 1" "GRANULE_EARLY_TRIGGER=1" smollm2-135m:Q4_1 0
    knob_line "early trigger 2" "GRANULE_EARLY_TRIGGER=2" smollm2-135m:Q4_1 0
    knob_line "attention warps 8" "GRANULE_ATTN_WARPS=8" smollm2-135m:Q4_1 0
    knob_line "all four" "$knob_all" smollm2-135m:Q4_1 0
    knob_line "all four, attention warps 8" "$knob_all GRANULE_ATTN_WARPS=8" smollm2-135m:Q4_1 0
  done
  for rep in 1 2; do
    knob_line defaults "" llama3-8b:Q4_0 0
    knob_line "all four" "$knob_all" llama3-8b:Q4_0 0
  done
  for d in 300 448; do
    knob_line defaults "" smollm2-135m:Q4_1 $d
    knob_line "attention early 3" "GRANULE_ATTN_EARLY=3" smollm2-135m:Q4_1 $d
    knob_line "attention warps 8" "GRANULE_ATTN_WARPS=8" smollm2-135m:Q4_1 $d
  done
  } 2>&1 | tee "$OUT/summary.txt"
}
# The second call: the engine suites and issue 15's numbers under the caller's GRANULE_* variables
# (or the defaults once the winners of wave31 are made the defaults).
wave32() {
  local b="$build/app/bench/granule-bench" rep
  {
  # WAVE32_PART=suites or numbers: one half (both do not fit one 600 s call with the build).
  if [[ ${WAVE32_PART:-all} != numbers ]]; then model_suites 200 190; memory_suites 80 70; fi
  if [[ ${WAVE32_PART:-all} != suites ]]; then issue15_numbers; fi
  # Session 12's defaults (split rows 4, late norm, attention early 3, step copies in the graph)
  # against session 11's and against themselves without the graph's copies, alternated.
  for rep in 1 2 3; do
    [[ ${WAVE32_PART:-all} == suites ]] && break
    knob_line "defaults (session 12)" "" smollm2-135m:Q4_1 0
    knob_line "session 11 defaults" "GRANULE_SPLIT_ROWS=3 GRANULE_LATE_NORM=0 GRANULE_ATTN_EARLY=0 GRANULE_GRAPH_IO=0" smollm2-135m:Q4_1 0
    knob_line "graph io off" "GRANULE_GRAPH_IO=0" smollm2-135m:Q4_1 0
  done
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log"
}

# Session 12. wave31 (all tests passed, memcheck and racecheck clean): the four knobs together
# 2,963-2,970 t/s against 2,855-2,866 for the defaults; the fused Q/K/V + attention kernel
# 2,219-2,243 (1,716 alone). wave31b: each knob alone within noise of the defaults, the early
# trigger alone slower (2,767-2,825). wave33: the step's copies inside the decode graph
# (GRANULE_GRAPH_IO=1) with and without the knobs, the knobs without the early trigger, and the
# model and chats suites with the step copies in the graph. Build with GRANULE_TARGETS=
# "model_gpu_test concurrent_chats_test granule-bench".
knob3="GRANULE_SPLIT_ROWS=4 GRANULE_LATE_NORM=1 GRANULE_ATTN_EARLY=3"
wave33() {
  local b="$build/app/bench/granule-bench" rep
  {
  env $knob_all GRANULE_GRAPH_IO=1 timeout 200 "$build/tests/model_gpu_test" \
    --gtest_filter='*Sampling*:*Engine*:*Batch*:*DecodeFusion.One*:*DefaultShapes*' \
    >"$OUT/model_gpu_test.txt" 2>&1
  gtest_line model_gpu_test $?
  env $knob_all GRANULE_GRAPH_IO=1 timeout 200 "$build/tests/concurrent_chats_test" \
    >"$OUT/concurrent_chats_test.txt" 2>&1
  gtest_line concurrent_chats_test $?
  for rep in 1 2; do
    knob_line defaults "" smollm2-135m:Q4_1 0
    knob_line "graph io" "GRANULE_GRAPH_IO=1" smollm2-135m:Q4_1 0
    knob_line "three (no early trigger)" "$knob3" smollm2-135m:Q4_1 0
    knob_line "three + early trigger 1" "$knob3 GRANULE_EARLY_TRIGGER=1" smollm2-135m:Q4_1 0
    knob_line "all four" "$knob_all" smollm2-135m:Q4_1 0
    knob_line "three + graph io" "$knob3 GRANULE_GRAPH_IO=1" smollm2-135m:Q4_1 0
    knob_line "all four + graph io" "$knob_all GRANULE_GRAPH_IO=1" smollm2-135m:Q4_1 0
  done
  for rep in 1 2; do
    knob_line defaults "" llama3-8b:Q4_0 0
    knob_line "all four + graph io" "$knob_all GRANULE_GRAPH_IO=1" llama3-8b:Q4_0 0
  done
  for rep in 1 2; do
    echo "-- chats smollm2 32, defaults: $(timeout 60 "$b" chats --synthetic smollm2-135m:Q4_1 -n 1,32 -p 128 -g 128 --device cuda | grep -E '^\| +(1|32) +\|' | tr '\n' ' ')"
    echo "-- chats smollm2 32, all four + graph io: $(export $knob_all GRANULE_GRAPH_IO=1; timeout 60 "$b" chats --synthetic smollm2-135m:Q4_1 -n 1,32 -p 128 -g 128 --device cuda | grep -E '^\| +(1|32) +\|' | tr '\n' ' ')"
  done
  } 2>&1 | tee "$OUT/summary.txt"
}

# Session 12's last call (the device time left held one): issue 15's numbers at the new
# defaults without the 8,000-token prompts (not changed by them), the before/after lines, then
# the engine suites. Build with GRANULE_TARGETS="model_gpu_test concurrent_chats_test
# engine_churn_gpu_test streaming_gpu_test kv_space_gpu_test granule-bench".
wave34() {
  local b="$build/app/bench/granule-bench" rep
  {
  timeout 150 "$b" chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda | grep -E "^\| +(8|32) +\|"
  timeout 100 "$b" --synthetic llama3-8b:Q4_0 -p 512 -n 64 -b 1,8,32 | grep -E "^\| +synthetic"
  echo "-- SmolLM2"
  timeout 60 "$b" chats --synthetic smollm2-135m:Q4_1 -n 1,32 -p 128 -g 128 --device cuda | grep -E "^\| +(1|32) +\|"
  timeout 60 "$b" --synthetic smollm2-135m:Q4_1 -p 512 -n 64 -b 1,32 | grep -E "^\| +synthetic"
  for rep in 1 2; do
    knob_line "defaults (session 12)" "" smollm2-135m:Q4_1 0
    knob_line "session 11 defaults" "GRANULE_SPLIT_ROWS=3 GRANULE_LATE_NORM=0 GRANULE_ATTN_EARLY=0 GRANULE_GRAPH_IO=0" smollm2-135m:Q4_1 0
  done
  knob_line "defaults (session 12)" "" smollm2-135m:Q4_1 448
  knob_line "session 11 defaults" "GRANULE_SPLIT_ROWS=3 GRANULE_LATE_NORM=0 GRANULE_ATTN_EARLY=0 GRANULE_GRAPH_IO=0" smollm2-135m:Q4_1 448
  model_suites 170 160
  memory_suites 70 60
  } 2>&1 | tee "$OUT/summary.txt"
  cat /tmp/ctest.log /tmp/ctest-stream.log >"$OUT/ctest.log" 2>/dev/null
}

# wave35: the one-row attention split size (GRANULE_ATTN_SPLIT_ONE_ROW) at the session-12
# defaults: the model tests against the oracle with wide splits, then batch 1 by depth. Build
# with GRANULE_TARGETS="model_gpu_test granule-bench".
wave35() {
  local b="$build/app/bench/granule-bench" d t
  {
  for d in 0 100 300; do
    for t in 64 256; do
      knob_line "split $t" "GRANULE_ATTN_SPLIT_ONE_ROW=$t" smollm2-135m:Q4_1 $d
    done
  done
  GRANULE_ATTN_SPLIT_ONE_ROW=256 timeout 60 "$build/tests/model_gpu_test" \
    --gtest_filter='*DecodeFusion.One*:*Batch*' >"$OUT/model_gpu_test-256.txt" 2>&1
  gtest_line "model_gpu_test-256" $?
  } 2>&1 | tee "$OUT/summary.txt"
}

case $what in
  wave35) wave35 ;;
  wave34) wave34 ;;
  wave33) wave33 ;;
  wave32) wave32 ;;
  wave31b) wave31b ;;
  wave31) wave31 ;;
  wave30) wave30 ;;
  wave29) wave29 ;;
  wave28) wave28 ;;
  wave27) wave27 ;;
  wave26) wave26 ;;
  wave25) wave25 ;;
  wave24) wave24 ;;
  wave23) wave23 ;;
  wave22) wave22 ;;
  wave21) wave21 ;;
  wave20) wave20 ;;
  wave19) wave19 ;;
  wave17) wave17 ;;
  wave16) wave16 ;;
  wave15) wave15 ;;
  wave14-tests) wave14_tests ;;
  wave14-bench) issue15_numbers 2>&1 | tee "$OUT/summary.txt" ;;
  wave9-recheck) wave9_recheck ;;
  wave9-check) wave9_check ;;
  wave9-stalls) wave9_stalls ;;
  wave9-tests) wave9_tests ;;
  wave9-bench) wave9_bench ;;
  wave9-shared) wave9_shared ;;
  wave9-probe) wave9_probe ;;
  wave8-warps) wave8_warps ;;
  wave8-last) wave8_last ;;
  wave8-attn) wave8_attn ;;
  wave8-final) wave8_final ;;
  wave8-diag) wave8_diag ;;
  wave8) wave8 ;;
  wave7-final) wave7_final ;;
  wave7-f16) wave7_f16 ;;
  wave6-tests) wave6_tests ;;
  wave6-bench) wave6_bench ;;
  profile-mma32) profile_mma32 ;;
  long) long_prompts ;;
  profile-wave5) profile_wave5 ;;
  wave5-tests) mma_model_tests ;;
  wave5-bench) wave5_bench ;;
  wave4) wave4 ;;
  wave3) wave3 ;;
  types) types_bench ;;
  profile-prefill) profile_prefill ;;
  wave1)
    t=$build/tests/matvec_mma_kernel_test
    timeout 120 "$t" >"$OUT/mma-test.txt" 2>&1
    echo "matvec_mma_kernel_test: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/mma-test.txt" | tr '\n' ' ')"
    grep -E "FAILED|Failure" "$OUT/mma-test.txt" | head -8
    start=$(date +%s)
    timeout ${GPU_TEST_TIMEOUT:-230} ctest --test-dir "$build" -j4 --timeout 220 --output-on-failure \
      -L 'model_gpu_test|matvec_kernel_test|elementwise_kernels_test|attention_kernels_test|sampling_kernel_test|concurrent_chats_test' \
      >"$OUT/ctest-gpu.log" 2>&1
    echo "gpu tests ($(( $(date +%s) - start )) s): $(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log")"
    grep -E "^\s+[0-9]+ - .*\(" "$OUT/ctest-gpu.log" | head -24
    grep -h "\[per-type\]\|\[gpu-vs-oracle\]" "$build"/Testing/Temporary/LastTest.log 2>/dev/null | sort -u >"$OUT/gpu-vs-oracle.txt"
    mma_bench >"$OUT/bench-mma-llama3-8b.txt" 2>&1
    grep -E "^--|^\|" "$OUT/bench-mma-llama3-8b.txt" | head -40 ;;
  wave2)
    start=$(date +%s)
    timeout 150 ctest --test-dir "$build" -j4 --timeout 140 -L 'model_gpu_test|matvec_kernel_test' \
      >"$OUT/ctest-gpu.log" 2>&1
    echo "model + matvec tests ($(( $(date +%s) - start )) s): $(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log")"
    grep -E "^\s+[0-9]+ - .*\(" "$OUT/ctest-gpu.log" | head -12
    grep -h "\[per-type\]" "$build"/Testing/Temporary/LastTest.log 2>/dev/null | sort -u >"$OUT/per-type.txt"
    chats; grep -E "^\||^chats|^model" "$OUT/bench-chats.txt"
    { timeout 150 "$build/app/bench/granule-bench" chats --synthetic llama3-8b:Q4_0 -n 1,8 -p 8000 -g 128 --device cuda; } \
      >"$OUT/bench-long.txt" 2>&1
    grep -E "^\|" "$OUT/bench-long.txt"
    serve_bench ;;
  serve) serve_bench "${2:-llama3-8b:Q4_0}" ;;
  stream) stream ;;
  contention) contention ;;
  kv-contention) kv_contention ;;
  build) ;;
  profile) profile ;;
  sweep)
    gpu_tests
    sweep >"$OUT/sweep.txt" 2>&1 ;;
  tests) gpu_tests; engine_tests 240 ;;
  gpu) gpu_tests; bench_all; chats; profile ;;
  quick)
    gpu_tests
    sweep >"$OUT/sweep.txt" 2>&1
    chats ;;
  bench) bench_all ;;
  all)
    gpu_tests
    bench_all
    engine_tests 120
    profile ;;
esac

echo "== summary"
grep -hE "tests passed|tests failed" "$OUT"/ctest-*.log 2>/dev/null
grep -hE "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)" "$OUT"/ctest-*.log 2>/dev/null | head -30
grep -E "^\[per-type\]|\[concurrent-chats\] [0-9]+ chats" "$OUT/gpu-vs-cpu.txt" 2>/dev/null | cut -c1-200
cat "$OUT/sweep.txt" 2>/dev/null
for f in "$OUT"/bench-*.txt; do echo; echo "== $(basename "$f")"; grep -vE "^\s*[{}\"\]]|^\s+\"|writing|done in" "$f"; done
