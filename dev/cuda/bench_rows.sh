# Sourced by dev/cuda's resumable bench scripts (bench_block_types.sh, bench_moe_rows.sh), which
# set R (the markers' folder on the warm machine) and M (the model files' folder) first, and their
# EXIT trap. It makes both folders and $OUT, takes DEADLINE (seconds this call may take, default
# 570) as deadline, finds this tree's and the baseline's granule-bench (GB, GBASE) and
# granule-write-model (WM), exiting where they are not built; then:
#   left                  seconds of the call left
#   row KEY SECONDS CMD   CMD once per machine (a marker R/KEY.done), under timeout cut to what is
#                         left less 15 s (the script exits where under 30 s would be left); its log
#                         in R/KEY.log, and the lines matching row_lines (an extended regex), the
#                         last row_tail of them, with the exit status in R/results.txt.
OUT=${OUT:-/tmp/granule-out}
mkdir -p "$R" "$M" "$OUT"
deadline=${DEADLINE:-570}
GB=build-gpu/app/bench/granule-bench
GBASE=build-base/app/bench/granule-bench
WM=$(find build-gpu -name granule-write-model -type f -executable | head -1)
[[ -x $GB && -n $WM ]] || { echo "no granule-bench or granule-write-model: build them first"; exit 1; }
row_lines=${row_lines:-'^\||t/s|error|Error'}
row_tail=${row_tail:-24}
left() { echo $((deadline - SECONDS)); }
row() {
  local key=$1 s=$2
  shift 2
  [[ -f $R/$key.done ]] && return 0
  local l=$(($(left) - 15))
  ((s > l)) && s=$l
  ((s >= 30)) || { echo "no time left for $key" >>"$R/results.txt"; exit 0; }
  echo "### $key: $*" >>"$R/results.txt"
  timeout "$s" "$@" >"$R/$key.log" 2>&1
  local rc=$?
  grep -E "$row_lines" "$R/$key.log" | grep -v '^|--' | tail -"$row_tail" >>"$R/results.txt"
  echo "(rc $rc)" >>"$R/results.txt"
  touch "$R/$key.done"
}
