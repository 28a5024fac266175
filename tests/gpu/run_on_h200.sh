#!/usr/bin/env bash
# One device-machine call: configure and build the engine, tests and granule-bench with CUDA
# (arch 90), run the GPU tests and the engine tests, then granule-bench on the default
# model's shapes and on 8B-shaped Q4_0. Logs go under $OUT; a short summary is printed last.
#   usage (on the H200): bash tests/gpu/run_on_h200.sh [tests|bench|all]   (default all)
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/granule-out}
mkdir -p "$OUT"
root=$(pwd)
build=$root/build-gpu
export GRANULE_LOG_LEVEL=warn

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv >"$OUT/gpu.txt" 2>&1

cmake -S . -B "$build" -G Ninja -DGRANULE_BUILD_APP=OFF -DGRANULE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DGRANULE_DEPS_DIR="$root/.gpu-deps" >"$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
start=$(date +%s)
if ! ninja -C "$build" -j16 -k 0 >"$OUT/build.log" 2>&1; then
  echo "BUILD FAILED (continuing with what built):"
  grep -E "error|FAILED" "$OUT/build.log" | head -30
fi
echo "build: $(( $(date +%s) - start )) s"

bench_8b() {
  "$build/app/bench/granule-bench" --synthetic llama3-8b:Q4_0 >"$OUT/bench-llama3-8b-Q4_0.txt" 2>&1
  "$build/app/bench/granule-bench" --synthetic llama3-8b:Q4_0 --json -p 0 -n 0 -b 1 >"$OUT/bench-llama3-8b-Q4_0.json" 2>&1
}

if [[ $what == all || $what == tests ]]; then
  start=$(date +%s)
  ctest --test-dir "$build" -L '_kernel_test|model_gpu_test|kernels_test' -j4 --timeout 400 --output-on-failure \
    >"$OUT/ctest-gpu.log" 2>&1
  echo "gpu tests: $(( $(date +%s) - start )) s"
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/ctest-gpu.log" | head -30
  grep -h "\[gpu-vs-cpu\]" "$build"/Testing/Temporary/LastTest.log 2>/dev/null | sort -u >"$OUT/gpu-vs-cpu.txt"
  start=$(date +%s)
  ctest --test-dir "$build" -LE '_kernel_test|model_gpu_test|kernels_test' -j8 --timeout 300 --output-on-failure \
    >"$OUT/ctest-engine.log" 2>&1
  echo "engine/cli tests: $(( $(date +%s) - start )) s"
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/ctest-engine.log" | head -30
fi

if [[ $what == all || $what == bench ]]; then
  start=$(date +%s)
  "$build/app/bench/granule-bench" --synthetic smollm2-135m:Q4_1 >"$OUT/bench-smollm2-135m-Q4_1.txt" 2>&1
  bench_8b
  echo "bench: $(( $(date +%s) - start )) s"
  echo; cat "$OUT/gpu-vs-cpu.txt" 2>/dev/null | cut -c1-160
  echo; cat "$OUT/bench-smollm2-135m-Q4_1.txt"; echo; cat "$OUT/bench-llama3-8b-Q4_0.txt"
fi
