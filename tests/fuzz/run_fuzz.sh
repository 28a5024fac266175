#!/usr/bin/env bash
# Runs one libFuzzer harness for a given time from its seed corpus.
#   usage: tests/fuzz/run_fuzz.sh HARNESS SECONDS [libFuzzer options...]
#   HARNESS: gguf_open | tokenizer | chat_template
# The fuzz build (clang, -DGRANULE_FUZZ=ON) lives in $GRANULE_FUZZ_BUILD_DIR (default
# build-fuzz/ in the checkout) and is configured and built here when the target is missing.
# New corpus entries go to BUILD/fuzz-corpus/HARNESS (the seeds in tests/fuzz/corpus stay as
# they are); a crash, leak or timeout is written to BUILD/fuzz-artifacts/HARNESS/ and fails the
# run. Prints the executions and executions per second at the end.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
harness=${1:?usage: run_fuzz.sh HARNESS SECONDS [libFuzzer options...]}
seconds=${2:?usage: run_fuzz.sh HARNESS SECONDS [libFuzzer options...]}
shift 2
case $harness in
  gguf_open) max_len=65536 ;;
  tokenizer | chat_template) max_len=4096 ;;
  *) echo "run_fuzz.sh: unknown harness '$harness' (gguf_open, tokenizer, chat_template)" >&2; exit 2 ;;
esac
build=${GRANULE_FUZZ_BUILD_DIR:-$root/build-fuzz}
target=$build/tests/fuzz/fuzz_$harness
if [[ ! -x $target ]]; then
  command -v clang++ >/dev/null || { echo "run_fuzz.sh: clang++ is missing (apt-get install -y clang)" >&2; exit 2; }
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DGRANULE_FUZZ=ON -DGRANULE_WITH_CUDA=OFF -DGRANULE_BUILD_APP=OFF -DGRANULE_BUILD_TESTS=OFF \
    "${launcher[@]}" >/dev/null
  cmake --build "$build" --target "fuzz_$harness" -j "${GRANULE_FUZZ_JOBS:-2}"
fi
corpus=$build/fuzz-corpus/$harness
artifacts=$build/fuzz-artifacts/$harness
mkdir -p "$corpus" "$artifacts"
log=$build/fuzz-$harness.log
# Leaks are reported (detect_leaks); UBSan stops at the first report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
"$target" "$corpus" "$root/tests/fuzz/corpus/$harness" -max_total_time="$seconds" -max_len="$max_len" \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" \
  >"$log" 2>&1 || status=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
echo "fuzz_$harness: ${runs:-?} executions in ${seconds}s ($(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1) exec/s), corpus $(ls "$corpus" | wc -l) files"
if ((status != 0)); then
  tail -n 60 "$log"
  echo "fuzz_$harness: FAILED (status $status); reproducer in $artifacts/, log $log" >&2
fi
exit "$status"
