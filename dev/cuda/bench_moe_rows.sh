#!/usr/bin/env bash
# Issue 36's GPU rows: the qwen3-30b-a3b and gpt-oss-20b shapes, Granule against llama.cpp on the
# same GGUF files, all experts resident (batch 1 tg128, pp512, 32 chats) and at a budget holding
# about half of the experts (tg64, 16 chats, pp512 beside llama.cpp's --n-cpu-moe of half the
# layers, 16 host threads), uniform and skewed routers (`granule-write-model ... --router-skew
# 1`), with the expert panel's recording of each budget run (the window's --replay). Resumable on
# one warm device machine: each finished row leaves a marker in /tmp/moe-rows, so a call that
# runs out of time is followed by the same call, which goes on where it stopped (a model file is
# deleted once its rows are done: the four files take 60 GiB); every call prints the table of
# all results so far (also $OUT/bench-moe-rows.txt).
#   usage (repository root, after
#     `GRANULE_TARGETS="granule-bench granule-write-model" bash tests/gpu/run_on_h200.sh build`):
#     bash dev/cuda/bench_moe_rows.sh [SECTION...]
#   SECTION: SHAPE-resident or SHAPE-budget or SHAPE-skewed, SHAPE qwen3-30b-a3b or gpt-oss-20b
#     (default: all six, resident first)
#   LLAMA_BIN   llama.cpp's CUDA bin folder (llama-bench, llama-batched-bench; built by
#               dev/cuda/build_llama_cuda.sh); its rows are skipped without it
#   A baseline: where `run_on_h200.sh build` ran with GRANULE_BASELINE (build-base/), the 32 chats
#   also run on the baseline's granule-bench, before and after this tree's.
#   BUDGET      the budget's % of the weights (default 52: about half of the experts resident)
#   DEADLINE    seconds this call may take (default 570)
set -u
R=/tmp/moe-rows M=/tmp/moe-models
budget=${BUDGET:-52}
sections=("$@")
((${#sections[@]})) || sections=(qwen3-30b-a3b-resident gpt-oss-20b-resident
  qwen3-30b-a3b-budget gpt-oss-20b-budget qwen3-30b-a3b-skewed gpt-oss-20b-skewed)
summary() {
  python3 - "$R/results.txt" <<'PY'
import re, sys
blocks = open(sys.argv[1]).read().split("### ")
val = {}
for b in blocks:
    m = re.match(r"(\S+): ", b)
    if not m:
        continue
    key, lines = m.group(1), b.split("\n")
    cells = [[c.strip() for c in l.split("|")] for l in lines if l.startswith("|")]
    if key.startswith("g-") and key.endswith("-bench"):  # granule-bench: test, t/s
        for c in cells:
            if len(c) > 6 and re.match(r"(pp512|tg128)$", c[3]):
                val[(key[2:-6], c[3])] = c[5]
    elif "-chats" in key:  # granule-bench chats: 32 chats' decode t/s
        for c in cells:
            if len(c) > 4 and c[1] == "32":
                who = "Granule" if key[0] == "g" else "baseline"
                val[(key[2:].split("-chats")[0], f"{who} 32 chats{key.split('-chats')[1]}")] = c[3]
                break
    elif key.startswith("g-") and key.endswith("-stream"):  # stream: test, t/s, PCIe, hit, CPU
        for c in cells:
            if len(c) > 14 and re.match(r"(tg|decode|pp)", c[4]):
                val[(key[2:-7], c[4])] = f"{c[6]} (PCIe {c[7]}, hit {c[12]}, CPU {c[14]})"
    elif key.startswith("l-") and key.endswith("-bench"):  # llama-bench: test, t/s
        for c in cells:
            if len(c) > 3 and re.match(r"(pp512|tg\d+)$", c[-3]):
                val[(key[2:-6], "llama " + c[-3])] = c[-2]
    elif key.startswith("l-") and key.endswith("-batched"):  # llama-batched-bench: S_TG
        for c in cells:
            if len(c) > 9 and c[1] == "128" and c[3] in ("16", "32"):
                val[(key[2:-8], "llama " + c[3] + " chats S_TG")] = c[8]
print("| section | row | t/s |\n| --- | --- | --- |")
for (s, row), v in val.items():
    print(f"| {s} | {row} | {v} |")
PY
}
finish() {
  cp "$R/results.txt" "$OUT/bench-moe-rows.txt" 2>/dev/null
  summary 2>/dev/null
}
trap finish EXIT
source "$(dirname "$0")/bench_rows.sh"
[[ -n ${LLAMA_BIN:-} ]] && export LD_LIBRARY_PATH=$LLAMA_BIN:${LD_LIBRARY_PATH:-}
for section in "${sections[@]}"; do
  shape=${section%-*} kind=${section##*-}
  case $shape in
    qwen3-30b-a3b) half=24 ;;  # of 48 layers
    gpt-oss-20b) half=12 ;;    # of 24
    *) echo "unknown shape in $section"; continue ;;
  esac
  skew=()
  file=$M/$shape.gguf
  [[ $kind == skewed ]] && { skew=(--router-skew 1); file=$M/$shape-skewed.gguf; }
  [[ -f $R/$section.done ]] && continue
  [[ -f $file ]] || { rm -f "$R/w-${file##*/}.done"; row "w-${file##*/}" 300 "$WM" "$shape" "$file" "${skew[@]}"; }
  [[ -f $file ]] || continue
  if [[ $kind == resident ]]; then
    row "g-$section-bench" 240 "$GB" -m "$file" -p 512 -n 128 -b 1
    chats=(chats -m "$file" -n 32 -p 128 -g 128 --device cuda)
    [[ -x $GBASE ]] && row "b-$section-chats" 200 "$GBASE" "${chats[@]}"
    row "g-$section-chats" 200 "$GB" "${chats[@]}"
    [[ -x $GBASE ]] && row "b-$section-chats-again" 200 "$GBASE" "${chats[@]}"
    if [[ -n ${LLAMA_BIN:-} ]]; then
      row "l-$section-bench" 240 "$LLAMA_BIN/llama-bench" -m "$file" -ngl 99 -fa 1 -p 512 -n 128 -r 3
      row "l-$section-batched" 240 "$LLAMA_BIN/llama-batched-bench" -m "$file" -ngl 99 -fa on \
        -c 16384 -npp 128 -ntg 128 -npl 32
    fi
  else
    row "g-$section-stream" 300 "$GB" stream -m "$file" --budgets "$budget" -b 16 -p 512 -n 64 \
      --telemetry-out "$OUT/frames-$section.jsonl"
    if [[ -n ${LLAMA_BIN:-} ]]; then
      row "l-$section-bench" 240 "$LLAMA_BIN/llama-bench" -m "$file" -ngl 99 -fa 1 -p 512 -n 64 \
        --n-cpu-moe "$half" -t 16 -r 2
      row "l-$section-batched" 240 "$LLAMA_BIN/llama-batched-bench" -m "$file" -ngl 99 -fa on \
        -c 4096 -npp 128 -ntg 64 -npl 16 --n-cpu-moe "$half" -t 16
    fi
  fi
  touch "$R/$section.done"
  # The uniform file serves the resident and budget sections: kept until both are done.
  if [[ $kind == skewed || ( -f $R/$shape-resident.done && -f $R/$shape-budget.done ) ]]; then
    rm -f "$file"
  fi
done
