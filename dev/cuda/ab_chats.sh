#!/usr/bin/env bash
# One device call for a kernel experiment kept as a patch: builds main (build-A) and main + the
# patch (build-B, from a patched copy in build-srcB) side by side, runs B's tests, then 32 chats
# of the 8B shape A/B/A/B per type with llama.cpp's S_TG beside them (where its tools are
# carried), and prints one ROW line per type. Each step is cut to the call's time left.
#   usage (repository root, on the device):
#     PATCH=dev/patches/X.patch TYPES="Q5_K IQ4_XS" TESTS="matvec_f16mma_kernel_test:*Q5_K*" \
#       bash dev/cuda/ab_chats.sh
#   PATCH  a `git diff` of main (applied with patch -p1)
#   TYPES  llama3-8b block types (default: Q4_0)
#   TESTS  space-separated BINARY:GTEST_FILTER pairs of tests/ run on build B before the timings
#   LLBIN  a tarball of llama.cpp's bin/ (dev/cuda/build_llama_cuda.sh; default
#          .cache/llbin.tar.xz); llama.cpp's column is empty without it
#   DL     seconds the call may take (default 570)
set -uo pipefail
DL=${DL:-570}
root=$PWD
types=${TYPES:-Q4_0}
within() {
  local s=$(($1 < DL - SECONDS - 8 ? $1 : DL - SECONDS - 8))
  shift
  ((s >= 5)) || { echo "SKIP (time): $*"; return 124; }
  timeout "$s" "$@"
}
nvidia-smi --query-gpu=name --format=csv,noheader
[[ -f ${PATCH:-} ]] || { echo "PATCH is not a file: '${PATCH:-}'"; exit 1; }
patch_file=$(realpath "$PATCH")
rm -rf build-srcB && mkdir build-srcB
cp -a CMakeLists.txt CMakePresets.json engine kernels app tests dev packaging resources docs build-srcB/
(cd build-srcB && patch -s -p1 <"$patch_file") || { echo "the patch does not apply"; exit 1; }
configure() {
  cmake -S "$1" -B "$2" -G Ninja -DGRANULE_BUILD_APP=OFF -DGRANULE_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGRANULE_DEPS_DIR="$root/.gpu-deps" >"/tmp/cfg-$3.log" 2>&1 ||
    { echo "configure failed ($3)"; tail -20 "/tmp/cfg-$3.log"; }
}
configure . build-A A
configure build-srcB build-B B
test_targets=()
for t in ${TESTS:-}; do test_targets+=("${t%%:*}"); done
start=$SECONDS
within 330 ninja -C build-A -j16 granule-bench granule-write-model >/tmp/build-A.log 2>&1 &
pa=$!
within 330 ninja -C build-B -j16 granule-bench "${test_targets[@]}" >/tmp/build-B.log 2>&1 &
pb=$!
LL=
if [[ -f ${LLBIN:-.cache/llbin.tar.xz} ]]; then
  mkdir -p /tmp/ll && tar xJf "${LLBIN:-.cache/llbin.tar.xz}" -C /tmp/ll && LL=/tmp/ll/bin
  export LD_LIBRARY_PATH=$LL:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
fi
wait $pa; ra=$?
wait $pb; rb=$?
echo "builds: A rc $ra, B rc $rb, $((SECONDS - start)) s"
((ra == 0)) || grep -E 'error|FAILED' /tmp/build-A.log | head
((rb == 0)) || grep -E 'error|FAILED' /tmp/build-B.log | head
for t in ${TESTS:-}; do
  within 200 "build-B/tests/${t%%:*}" --gtest_filter="${t#*:}" >"/tmp/test.log" 2>&1
  echo "test ${t%%:*} '${t#*:}': rc $? $(grep -E '^\[  (PASSED|FAILED)  \]' /tmp/test.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] ' /tmp/test.log | head -5
done
writer=$(find build-A -name granule-write-model -type f | head -1)
chats() {
  within 60 "build-$1/app/bench/granule-bench" chats -m "$2" -n 32 -p 128 -g 128 --device cuda 2>&1 |
    grep -E '^\| +32 ' | head -1 | awk -F'|' '{print $4}' | tr -d ' '
}
llama() {
  [[ -n $LL ]] || return 0
  within 70 "$LL/llama-batched-bench" -m "$1" -ngl 99 -fa on -c 16384 -npp 128 -ntg 128 -npl 32 2>&1 |
    grep -E '^\| +128 ' | awk -F'|' '{print $(NF-3)}' | tr -d ' '
}
mkdir -p build-models
for T in $types; do
  f=build-models/l8-$T.gguf
  [[ -f $f ]] || within 90 "$writer" "llama3-8b:$T" "$f" >/dev/null 2>&1
  a=$(chats A "$f"); b=$(chats B "$f"); a2=$(chats A "$f"); b2=$(chats B "$f"); l=$(llama "$f")
  echo "ROW $T 32 chats: A $a $a2  B $b $b2  llama.cpp $l"
done
echo "done in $SECONDS s"
