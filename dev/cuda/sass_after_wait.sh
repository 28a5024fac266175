#!/usr/bin/env bash
# What a kernel does after its PDL wait, from the SASS (no GPU needed): compiles FILE (a .cu under
# kernels/) for sm_90, disassembles it and prints, for every kernel whose mangled name contains
# PATTERN, the instructions from ACQBULK (griddepcontrol.wait) on that load, shuffle, reduce,
# synchronise, take a special function or store: the order in which a kernel's chain waits.
#   usage: bash dev/cuda/sass_after_wait.sh kernels/matvec_split.cu 'split_matvec_kernelILj3ELi1ELi1ELi2ELb1ELi32' [LINES]
# cuobjdump (and the nvdisasm it calls) are not part of the CUDA toolkit installed here; the
# script takes them from the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels (pip
# download) into ~/.cache/granule-sass when they are missing.
set -euo pipefail
file=$1 pattern=$2 lines=${3:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
cuobjdump=$(command -v cuobjdump || true)
if [[ -z $cuobjdump ]]; then
  cache=$HOME/.cache/granule-sass
  cuobjdump=$(find "$cache" -name cuobjdump -type f 2>/dev/null | head -1 || true)
  if [[ -z $cuobjdump ]]; then
    mkdir -p "$cache"
    (cd "$cache" && pip download -q --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm &&
      for w in ./*.whl; do unzip -q -o "$w" -d x; done)
    cuobjdump=$(find "$cache" -name cuobjdump -type f | head -1)
  fi
  chmod +x "$(dirname "$cuobjdump")"/*
  export PATH="$(dirname "$cuobjdump"):$PATH"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvcc -I "$root/kernels" -I "$root/engine/include" -O3 -DNDEBUG -arch=sm_90 --expt-relaxed-constexpr \
  -std=c++17 -cubin "$root/$file" -o "$work/k.cubin"
"$cuobjdump" -sass "$work/k.cubin" >"$work/k.sass"
awk -v pat="$pattern" -v max="$lines" '
  /Function :/ { inside = index($0, pat) > 0; if (inside) { print; after = 0; n = 0 } next }
  inside && /ACQBULK/ { after = 1 }
  inside && after && n < max && /ACQBULK|PREEXIT|LDG|LD\.|LDS|LDL|STL|STG|STS|SHFL|REDUX|BAR|MUFU|ATOM|MEMBAR|EXIT/ {
    line = $0; sub(/\/\* 0x[0-9a-f]+ \*\//, "", line); gsub(/ +/, " ", line); print line; n++ }
' "$work/k.sass"
