#!/usr/bin/env bash
# One device call for the int8 mma products (kernels/matvec_mma.cu): build matvec_mma_kernel_test and
# granule-bench, run the test, then the 8B Q4_0 bench with GRANULE_MMA=0 and 1 (and EXTRA settings).
#   usage (on the H200, repository root): bash tests/gpu/run_mma_ab.sh [all|test|bench]
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p "$OUT"
b=build-gpu
what=${1:-all}
if [[ ! -f $b/build.ninja ]]; then
cmake -S . -B $b -G Ninja -DGRANULE_BUILD_APP=OFF -DGRANULE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_TYPE=Release -DGRANULE_DEPS_DIR=$PWD/.gpu-deps >/tmp/cfg.log 2>&1 || { tail -30 /tmp/cfg.log; exit 1; }
fi
t0=$(date +%s)
ninja -C $b -j16 ${TARGETS:-matvec_mma_kernel_test granule-bench} >/tmp/build.log 2>&1 || { grep -E "error" /tmp/build.log | head -30; cp /tmp/build.log $OUT/; exit 1; }
echo "build $(( $(date +%s)-t0 ))s"
if [[ $what == all || $what == test ]]; then
  (command -v cuobjdump >/dev/null && cuobjdump -sass $b/kernels/CMakeFiles/granule_kernels.dir/matvec_mma.cu.o | grep -oE "IMMA[.A-Z0-9]*" | sort | uniq -c)
  t0=$(date +%s)
  timeout ${TEST_TIMEOUT:-240} $b/tests/matvec_mma_kernel_test ${TEST_FILTER:-} >$OUT/mma_test.txt 2>&1; echo "test rc $? in $(( $(date +%s)-t0 ))s"
  grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|error" $OUT/mma_test.txt | head -40
fi
if [[ $what == all || $what == bench ]]; then
  for s in "GRANULE_MMA=0" "GRANULE_MMA=1" ${EXTRA:-}; do
    echo "-- $s"
    ( export $s; timeout 150 $b/app/bench/granule-bench --synthetic llama3-8b:Q4_0 ${BENCH_ARGS:--p 512 -n 0 -b 1,4,8,16,32,64} 2>&1 | tail -${TAIL:-14} )
  done
fi
