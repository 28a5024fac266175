#!/usr/bin/env bash
# One device-machine call: build the engine, its tests and granule-bench with CUDA for sm_90
# (Ninja, no Qt, PCRE2 from .gpu-deps/), then run one mode; logs under $OUT (at most 8 files come
# back), a short summary last (also $OUT/summary.txt). How to use it: docs/gpu-testing.md.
#   usage (repository root): bash tests/gpu/run_on_h200.sh build|tests|bench|stream|contention|profile
#   GRANULE_TARGETS       what ninja builds (default: everything)
#   GRANULE_TESTDATA_DIR  the tests' data folder (real-weights model, tokenizer goldens); default:
#                         the checkout's .cache/granule/testdata when it exists
#   GRANULE_BASELINE      another source tree (e.g. an older commit's `git archive`): `build` and
#                         `bench` build its granule-bench into build-base/; `bench` runs each line
#                         on it and on this tree in turn and prints both with the ratio
#   GRANULE_BENCH_REPS    rounds of the bench lines (default 1; the table shows medians)
#   GRANULE_DEADLINE_S    seconds this call may take (default 570, under the device's 600)
set -uo pipefail
mode=${1:-}
OUT=${OUT:-/tmp/granule-out}
mkdir -p "$OUT"
root=$(pwd)
build=$root/build-gpu
bench=$build/app/bench/granule-bench
baseline=${GRANULE_BASELINE:+$(realpath "$GRANULE_BASELINE")}
testdata=${GRANULE_TESTDATA_DIR:-}
[[ -z $testdata && -d $root/.cache/granule/testdata ]] && testdata=$root/.cache/granule/testdata
testdata=${testdata:+$(realpath "$testdata")}
deadline=${GRANULE_DEADLINE_S:-570}
# within SECONDS CMD...: CMD under `timeout`, cut to the call's time left (less 20 s for the
# summary); skipped, status 124, when under 5 s are left.
within() {
  local s=$(($1 < deadline - SECONDS - 20 ? $1 : deadline - SECONDS - 20))
  shift
  ((s >= 5)) || { echo "skipped, the call's time is spent: $*" >&2; return 124; }
  timeout "$s" "$@"
}
# build_tree SOURCE BUILD NAME CMAKE-FLAGS TARGET...: configure (CUDA arch 90, no Qt) and build;
# the log comes back only when the build fails.
build_tree() {
  local src=$1 dir=$2 name=$3 flags=$4 start=$SECONDS
  shift 4
  cmake -S "$src" -B "$dir" -G Ninja -DGRANULE_BUILD_APP=OFF -DGRANULE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGRANULE_DEPS_DIR="$root/.gpu-deps" ${testdata:+-DGRANULE_TESTDATA_DIR="$testdata"} $flags >"/tmp/configure-$name.log" 2>&1 ||
    { echo "CONFIGURE FAILED ($name):"; tail -30 "/tmp/configure-$name.log"; return 1; }
  if ! within 560 ninja -C "$dir" -j16 -k 0 "$@" >"/tmp/build-$name.log" 2>&1; then
    cp "/tmp/build-$name.log" "$OUT/build-$name.log"
    echo "BUILD FAILED or out of time ($name; continuing with what built, a next call resumes it):"
    grep -E "error|FAILED" "/tmp/build-$name.log" | head -20
  fi
  echo "build $name: $((SECONDS - start)) s"
}
build_all() {
  build_tree "$root" "$build" new "" ${GRANULE_TARGETS:-}
  # The baseline needs only CMakeLists.txt, engine/, kernels/ and app/ (no tests).
  [[ -n $baseline && $mode =~ ^(build|bench)$ ]] &&
    build_tree "$baseline" "$root/build-base" base -DGRANULE_BUILD_TESTS=OFF granule-bench
}
# ctest_part NAME JOBS SECONDS CTEST-ARGS...: one ctest run (log appended to $OUT/ctest.log),
# its oracle comparison lines kept, one line of result.
ctest_part() {
  local name=$1 jobs=$2 seconds=$3 start=$SECONDS rc
  shift 3
  within "$seconds" ctest --test-dir "$build" -j"$jobs" --timeout 300 --output-on-failure "$@" \
    >/tmp/ctest-part.log 2>&1
  rc=$?
  { echo "==== $name"; cat /tmp/ctest-part.log; } >>"$OUT/ctest.log"
  grep -hE "\[(gpu-vs-oracle|per-type|matvec-vs-oracle|concurrent-chats)\]" \
    "$build/Testing/Temporary/LastTest.log" >>/tmp/oracle.txt 2>/dev/null
  echo "$name ($((SECONDS - start)) s, rc $rc): $(grep -E 'tests passed|tests failed' /tmp/ctest-part.log)"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception|Not Run)" /tmp/ctest-part.log | head -15
  grep -E "Test +#[0-9]+: \S*Real" /tmp/ctest-part.log | sed 's/^ */  real weights: /'
  bash "$root/.ci/skip_report.sh" "$build" 2>/dev/null | grep -E "Real|^skip report" | sed 's/^ */  /'
}
# The GPU tests (one label per tests/gpu binary): those that read the driver's free memory or
# size a budget from it one process at a time, the others four at once; then every other test.
tests() {
  local all serial='streaming_gpu_test|kv_space_gpu_test|ledger_estimate_gpu_test' model
  all=$(find "$root/tests/gpu" -name '*_test.cpp' -printf '%f\n' | sed 's/\.cpp$//' | sort | paste -sd'|')
  model=$(find "${testdata:-/nonexistent}" -maxdepth 2 -name '*.gguf' ! -path '*/tokenizer/*' 2>/dev/null | paste -sd' ')
  echo "test data: ${testdata:-the CMake default, no .cache/granule/testdata}; models there: ${model:-none}"
  : >/tmp/oracle.txt
  ctest_part "GPU tests -j4" 4 420 -L "^($all)$" -LE "^($serial)$"
  ctest_part "GPU memory suites -j1" 1 200 -L "^($serial)$"
  ctest_part "engine, CLI and bench tests -j12" 12 200 -LE "^($all)$"
  sort -u /tmp/oracle.txt >"$OUT/gpu-vs-oracle.txt"
  awk '/\[gpu-vs-oracle\]/ { n++; if (match($0, /worst err\/bound [-0-9.e+]+/)) {
         v = substr($0, RSTART + 16, RLENGTH - 16) + 0; if (v >= worst) { worst = v; at = $0 } } }
       /\[matvec-vs-oracle\]/ { m++; if (match($0, /f32 bound [-0-9.e+]+/)) {
         v = substr($0, RSTART + 10, RLENGTH - 10) + 0; if (v >= mworst) mworst = v } }
       END { printf "gpu-vs-oracle: %d comparisons, worst err/bound %s\n  (%s)\n", n, worst + 0, substr(at, 1, 180)
             printf "matvec-vs-oracle: %d products, worst err / f32 bound %s\n", m, mworst + 0 }' "$OUT/gpu-vs-oracle.txt"
  grep -iE "\[gpu-vs-oracle\] .*real|\[concurrent-chats\] [0-9]+ chats" "$OUT/gpu-vs-oracle.txt" | cut -c1-200
}
# The issue-15 table, one "LABEL|COLUMNS|ARGUMENTS" per granule-bench line; COLUMNS all keeps a
# chats row's prefill t/s beside its decode t/s.
bench_lines=(
  "8B|all|--synthetic llama3-8b:Q4_0 -p 512 -n 64 -b 1,8,32"
  "8B chats|decode|chats --synthetic llama3-8b:Q4_0 -n 8,32 -p 128 -g 128 --device cuda"
  "8B 8k prompt|all|chats --synthetic llama3-8b:Q4_0 -n 1 -p 8000 -g 128 --device cuda"
  "SmolLM2 chats|decode|chats --synthetic smollm2-135m:Q4_1 -n 1,32 -p 128 -g 128 --device cuda"
  "SmolLM2|all|--synthetic smollm2-135m:Q4_1 -p 0 -n 0 -b 1"
)
# rows LABEL COLUMNS < OUTPUT: "LABEL ROW<TAB>t/s" per row of granule-bench's table (model, size,
# test, batch, t/s, ...) or of the chats table (chats, prefill t/s, decode t/s, ...).
rows() {
  awk -F'|' -v label="$1" -v cols="$2" 'NF == 10 {
    for (i = 2; i <= 9; i++) gsub(/^ +| +$|\*/, "", $i)
    if ($2 ~ /^[0-9]+$/) {
      if (cols == "all") printf "%s x%s prefill\t%s\n", label, $2, $3
      printf "%s x%s decode\t%s\n", label, $2, $4
    } else if ($5 ~ /^[0-9]+$/) printf "%s %s%s\t%s\n", label, $4, ($4 ~ /^decode/ ? " b" $5 : ""), $6 }'
}
# table < "TAG<TAB>ROW<TAB>t/s" lines: one row per bench row, the median over rounds per tag.
table() {
  awk -F'\t' -v base="${baseline:+1}" '
    function med(t, k,   n, i, j, x, a) {
      n = cnt[t, k]; if (!n) return "-"
      for (i = 1; i <= n; i++) a[i] = val[t, k, i]
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { x = a[j]; a[j] = a[j - 1]; a[j - 1] = x }
      return sprintf("%.1f", n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) }
    !($2 in seen) { seen[$2] = 1; order[++rows] = $2 }
    { val[$1, $2, ++cnt[$1, $2]] = $3 }
    END {
      if (base) { printf "| %-26s | %10s | %10s | %8s |\n|---|---|---|---|\n", "t/s", "base", "new", "new/base" }
      else printf "| %-26s | %10s |\n|---|---|\n", "t/s", "new"
      for (r = 1; r <= rows; r++) {
        k = order[r]; n = med("new", k)
        if (!base) { printf "| %-26s | %10s |\n", k, n; continue }
        b = med("base", k); ratio = (b + 0 > 0 && n != "-") ? sprintf("%.3f", n / b) : "-"
        printf "| %-26s | %10s | %10s | %8s |%s\n", k, b, n, ratio, (ratio != "-" && ratio < 0.97) ? " below 0.97" : "" } }'
}
# Each bench line on the baseline (when given) and on this tree in turn, GRANULE_BENCH_REPS
# rounds; full outputs in $OUT/bench-{base,new}.txt, the table last.
bench() {
  local rep line label cols args tag dir
  : >/tmp/bench-rows.tsv
  for ((rep = 1; rep <= ${GRANULE_BENCH_REPS:-1}; rep++)); do
    for line in "${bench_lines[@]}"; do
      IFS='|' read -r label cols args <<<"$line"
      for tag in ${baseline:+base} new; do
        [[ $tag == new ]] && dir=$build || dir=$root/build-base
        { echo "-- $label, round $rep: granule-bench $args"
          within 240 "$dir/app/bench/granule-bench" $args 2>&1
          echo "(exit $?)"; } >/tmp/bench-line.txt
        cat /tmp/bench-line.txt >>"$OUT/bench-$tag.txt"
        rows "$label" "$cols" </tmp/bench-line.txt | sed "s/^/$tag\t/" >>/tmp/bench-rows.tsv
      done
    done
  done
  grep -hE "^device:|^chats benchmark on" "$OUT/bench-new.txt" | sort -u
  table </tmp/bench-rows.tsv
}
# Weight streaming: the streaming GPU tests with the 8B shape, then granule-bench stream at
# 100/75/50/25 % budgets with its telemetry recorded for the window's replay.
stream() {
  GRANULE_GPU_8B=1 within 300 "$build/tests/streaming_gpu_test" >"$OUT/streaming-gpu-test.txt" 2>&1
  echo "streaming_gpu_test: rc $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/streaming-gpu-test.txt" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure" "$OUT/streaming-gpu-test.txt" | head -10
  within 420 "$bench" stream --synthetic llama3-8b:Q4_0 --telemetry-out "$OUT/stream-frames.jsonl" \
    >"$OUT/bench-stream.txt" 2>&1
  echo "granule-bench stream: rc $?"
  grep -E "^\|" "$OUT/bench-stream.txt"
}
# gpu_busy SECONDS: another process keeps the GPU busy (fp16 matmuls), so that queued work waits
# its turn far longer than alone, which is when an unmap under queued work would show.
gpu_busy() {
  python3 -c "import time, torch; a = torch.randn(8192, 8192, device='cuda', dtype=torch.float16)
while time.time() < $(($(date +%s) + $1)): a = (a @ a).clamp_(-1, 1)" >/dev/null 2>&1 &
  busy_pid=$!
  sleep 4
}
# at_once LABEL N SECONDS CMD...: N processes of CMD at once; one line with how many passed,
# the failures' log tails kept for contention.txt.
at_once() {
  local label=$1 n=$2 seconds=$3 pass=0 i pids=()
  shift 3
  for ((i = 1; i <= n; i++)); do within "$seconds" "$@" >"/tmp/at-once-$i.log" 2>&1 & pids+=($!); done
  for ((i = 1; i <= n; i++)); do
    wait "${pids[i - 1]}" && pass=$((pass + 1)) ||
      { echo "--- FAILED: $label, process $i"; tail -30 "/tmp/at-once-$i.log"; } >>/tmp/contention-fail.txt
  done
  grep -h "^\[kv-gpu\]\|^\[churn\]\|^\[fault\]" /tmp/at-once-*.log | head -2 >>/tmp/contention-detail.txt
  rm -f /tmp/at-once-*.log
  echo "$label: $pass/$n passed"
}
# memcheck LABEL SECONDS CMD...: CMD under compute-sanitizer memcheck, one line.
memcheck() {
  within "$2" compute-sanitizer --tool memcheck --error-exitcode 9 "${@:3}" >/tmp/memcheck.log 2>&1
  echo "memcheck, $1: exit $? ($(grep -h 'ERROR SUMMARY' /tmp/memcheck.log))"
  tail -20 /tmp/memcheck.log >>/tmp/contention-detail.txt
}
# KV space and the engine under contention: kv_space_gpu_test in 6 processes at once, 3 rounds
# alone and 3 beside a busy GPU; the churn test (chats that end, cancel, regenerate) 3 at once
# beside a busy GPU; both under compute-sanitizer beside a busy GPU.
contention() {
  local kv=$build/tests/kv_space_gpu_test churn=$build/tests/engine_churn_gpu_test r
  rm -f /tmp/contention-fail.txt /tmp/contention-detail.txt
  for r in 1 2 3; do at_once "kv_space_gpu_test x6 alone, round $r" 6 120 "$kv"; done
  gpu_busy 150
  for r in 1 2 3; do at_once "kv_space_gpu_test x6 beside a busy GPU, round $r" 6 120 "$kv"; done
  kill "$busy_pid" 2>/dev/null
  gpu_busy 400
  at_once "engine_churn_gpu_test x3 beside a busy GPU" 3 200 "$churn"
  GRANULE_CHURN_ROUNDS=2 memcheck "engine churn (regenerate) beside a busy GPU" 200 "$churn" --gtest_filter='*Regenerate*'
  GRANULE_CHURN_ROUNDS=1 memcheck "kv_space_gpu_test beside a busy GPU" 150 "$kv"
  kill "$busy_pid" 2>/dev/null
  cat /tmp/contention-detail.txt /tmp/contention-fail.txt >"$OUT/contention.txt" 2>/dev/null
}
# ncu_sum FILE: Nsight Compute's per-kernel summary as count, total and mean per kernel name.
ncu_sum() {
  python3 - "$1" <<'PY'
import re, sys; rows, name = {}, None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^\s{2}(\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\).*Invocations (\d+)", line)
    if m: name = m.group(1); n = int(m.group(2)); continue
    m = re.search(r"gpu__time_duration\.sum\s+(\S+)\s+\S+\s+\S+\s+(\S+)\s*$", line)
    if name and m:
        r = rows.setdefault(re.sub(r"\(.*", "", name)[:100], [0, 0.0]); name = None
        r[0] += n; r[1] += n * float(m.group(2).replace(",", "")) * {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(m.group(1), 1)
out = sorted(rows.items(), key=lambda kv: -kv[1][1])
print(f"total {sum(v[1] for _, v in out)/1e3:.3f} ms over {sum(v[0] for _, v in out)} launches")
for k, (n, t) in out[:15]: print(f"{t/1e3:9.3f} ms {n:6d} x {t/max(n,1):8.1f} us  {k}")
PY
}
# Per-kernel device time (Nsight Compute, gpu__time_duration only, clocks as they are) of decode
# steps (a window of launches past the warm-up) and of a 512-token prefill.
profile() {
  local spec label ncu_args args
  for spec in "8B decode, batch 1|--launch-skip 1500 --launch-count 1000|--synthetic llama3-8b:Q4_0 -p 0 -n 0 -b 1" \
    "8B decode, batch 32|--launch-skip 1500 --launch-count 1000|--synthetic llama3-8b:Q4_0 -p 0 -n 0 -b 32" \
    "8B pp512 (warm-up + 1, then batch 1)||--synthetic llama3-8b:Q4_0 -p 512 -n 0 -b 1 -r 1" \
    "SmolLM2 decode, batch 1|--launch-skip 3000 --launch-count 620|--synthetic smollm2-135m:Q4_1 -p 0 -n 0 -b 1"; do
    IFS='|' read -r label ncu_args args <<<"$spec"
    within 150 ncu --clock-control none $ncu_args --print-summary per-kernel \
      --metrics gpu__time_duration.sum "$bench" $args >/tmp/ncu.txt 2>&1
    echo "-- $label (ncu exit $?)"
    ncu_sum /tmp/ncu.txt
    { echo "==== $label"; head -c 1000000 /tmp/ncu.txt; } >>"$OUT/ncu.txt"
  done
}
main() {
  [[ $mode =~ ^(build|tests|bench|stream|contention|profile)$ ]] ||
    { echo "usage: bash tests/gpu/run_on_h200.sh build|tests|bench|stream|contention|profile"; return 2; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1
  build_all
  [[ $mode == build ]] || "$mode"
  echo "call: $SECONDS s"
}
rm -f "$OUT"/summary.txt "$OUT"/ctest.log "$OUT"/bench-*.txt "$OUT"/ncu.txt
main 2>&1 | tee "$OUT/summary.txt"
