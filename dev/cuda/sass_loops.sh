#!/usr/bin/env bash
# The size of each kernel's main loop, from the SASS (no GPU needed): compiles FILE (a .cu under
# kernels/) for sm_90 and prints, for every kernel whose mangled name contains PATTERN (all when
# empty), the instructions of its largest loop holding a tensor-core op (the longest backward
# branch whose body has an HMMA or IMMA: a stage loop), the kernel's instructions, registers and
# spill bytes. With --ops, each loop's opcode counts too. How the f16 products' and the tiled
# expert products' stage loops were counted before and after a change (kernels/README).
#   usage: bash dev/cuda/sass_loops.sh kernels/matvec_f16mma.cu [PATTERN] [--ops]
# (cuobjdump: sass_common.sh.)
set -euo pipefail
file=$1 pattern=${2:-} ops=${3:-}
source "$(dirname "$0")/sass_common.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sass_compile "$file" "$work"
"$cuobjdump" -res-usage "$work/k.cubin" >"$work/res.txt" 2>&1
python3 - "$work/k.sass" "$work/res.txt" "$pattern" "$ops" <<'PY'
import collections, re, sys
sass, res, pattern, ops = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "--ops"
usage, name = {}, None
for line in open(res):
    m = re.search(r"Function (\S+):", line)
    if m:
        name = m.group(1)
    m = re.search(r"REG:(\d+) STACK:(\d+)", line)
    if m and name:
        usage[name] = (int(m.group(1)), int(m.group(2)))
kernels, name = {}, None
for line in open(sass):
    m = re.search(r"Function : (\S+)", line)
    if m:
        name = m.group(1)
        kernels[name] = []
        continue
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
    if m and name:
        kernels[name].append((int(m.group(1), 16), m.group(2)))
print("loop\tinstr\tregs\tstack\tkernel")
for name, ins in kernels.items():
    if pattern not in name:
        continue
    at = {a: i for i, (a, _) in enumerate(ins)}
    best = []
    for i, (_, s) in enumerate(ins):
        m = re.search(r"\bBRA\b.*0x([0-9a-f]+)", s)
        if not m or int(m.group(1), 16) not in at or at[int(m.group(1), 16)] >= i:
            continue
        body = ins[at[int(m.group(1), 16)]:i + 1]
        if len(body) > len(best) and any(re.search(r"\b[HI]MMA", b) for _, b in body):
            best = body
    regs, stack = usage.get(name, ("-", "-"))
    print(f"{len(best) or '-'}\t{len(ins)}\t{regs}\t{stack}\t{name}")
    if ops and best:
        count = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", s).split()[0].split(".")[0] for _, s in best)
        print("\t" + " ".join(f"{op} {n}" for op, n in count.most_common()))
PY
