#!/usr/bin/env bash
# What a kernel does after its PDL wait, from the SASS (no GPU needed): compiles FILE (a .cu under
# kernels/) for sm_90, disassembles it and prints, for every kernel whose mangled name contains
# PATTERN, the instructions from ACQBULK (griddepcontrol.wait) on that load, shuffle, reduce,
# synchronise, take a special function or store: the order in which a kernel's chain waits.
#   usage: bash dev/cuda/sass_after_wait.sh kernels/matvec_split.cu 'split_matvec_kernelILj3ELi1ELi1ELi2ELb1ELi32' [LINES]
# (cuobjdump: sass_common.sh.)
set -euo pipefail
file=$1 pattern=$2 lines=${3:-60}
source "$(dirname "$0")/sass_common.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sass_compile "$file" "$work"
awk -v pat="$pattern" -v max="$lines" '
  /Function :/ { inside = index($0, pat) > 0; if (inside) { print; after = 0; n = 0 } next }
  inside && /ACQBULK/ { after = 1 }
  inside && after && n < max && /ACQBULK|PREEXIT|LDG|LD\.|LDS|LDL|STL|STG|STS|SHFL|REDUX|BAR|MUFU|ATOM|MEMBAR|EXIT/ {
    line = $0; sub(/\/\* 0x[0-9a-f]+ \*\//, "", line); gsub(/ +/, " ", line); print line; n++ }
' "$work/k.sass"
