#!/usr/bin/env bash
# Issue 41's GPU rows: the 8B shape in each block type, Granule against llama.cpp on the same
# GGUF file, batch 1 (decode, with the bench's roofline fraction) and 32 chats. Resumable on one
# warm device machine: each finished row leaves a marker in /tmp/bt, so a call that runs out of
# time is followed by the same call, which goes on where it stopped; every call prints all
# results so far (also $OUT/bench-block-types.txt).
#   usage (repository root, after
#     `GRANULE_TARGETS="granule-bench granule-write-model" bash tests/gpu/run_on_h200.sh build`):
#     bash dev/cuda/bench_block_types.sh [TYPE...]      (default: Q4_0 Q2_K Q3_K IQ4_NL IQ4_XS MXFP4)
#   LLAMA_BIN   llama.cpp's CUDA bin folder (llama-bench, llama-batched-bench; built by
#               dev/cuda/build_llama_cuda.sh); rows skipped without it
#   A baseline: where `run_on_h200.sh build` ran with GRANULE_BASELINE (build-base/), each type's
#   32 chats also run on the baseline's granule-bench, before and after this tree's (an A/B of a
#   dev patch applied to this tree).
#   DEADLINE    seconds this call may take (default 570)
set -u
R=/tmp/bt M=/tmp/bt-models
types=("$@")
((${#types[@]})) || types=(Q4_0 Q2_K Q3_K IQ4_NL IQ4_XS MXFP4)
finish() { cp "$R/results.txt" "$OUT/bench-block-types.txt" 2>/dev/null; cat "$R/results.txt" 2>/dev/null; }
trap finish EXIT
row_lines='^\||t/s|roofline|error|Error|^main' row_tail=20
source "$(dirname "$0")/bench_rows.sh"
for t in "${types[@]}"; do
  # The model from pools of valid blocks (granule-write-model: seconds, where granule-bench
  # --synthetic quantises 8B values one by one: ~1-2 M values/s per thread for Q2_K, Q3_K,
  # IQ4_NL, IQ4_XS); Granule and llama.cpp read the same file.
  model=$M/llama3-8b-$t.gguf
  row "w-$t" 300 "$WM" "llama3-8b:$t" "$model"
  [[ -f $model ]] || continue
  row "g-$t" 300 "$GB" -m "$model" -p 512 -n 64 -b 1,32
  chats=(chats -m "$model" -n 32 -p 128 -g 128 --device cuda)
  [[ -x $GBASE ]] && row "b-$t-chats" 200 "$GBASE" "${chats[@]}"
  row "g-$t-chats" 200 "$GB" "${chats[@]}"
  [[ -x $GBASE ]] && row "b-$t-chats-again" 200 "$GBASE" "${chats[@]}"
  [[ -n ${LLAMA_BIN:-} ]] || continue
  export LD_LIBRARY_PATH=$LLAMA_BIN:${LD_LIBRARY_PATH:-}
  row "l-$t" 200 "$LLAMA_BIN/llama-bench" -m "$model" -ngl 99 -fa 1 -p 512 -n 128 -r 3
  row "l-$t-batched" 200 "$LLAMA_BIN/llama-batched-bench" -m "$model" -ngl 99 -fa on -c 8448 \
    -b 2048 -ub 512 -npp 128 -ntg 128 -npl 32
done
