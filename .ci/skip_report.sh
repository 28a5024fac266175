#!/usr/bin/env bash
# Prints what the last ctest run in BUILD_DIR skipped, and why, from ctest's own log
# (Testing/Temporary/LastTest.log): every GoogleTest case that ended SKIPPED with the message
# it gave, and every "SKIP: ..." line a test printed (the CLI scripts' convention: a whole
# script that exits 77, or a part of one; the GPU tests of a build without CUDA). Ends with the
# counts. Exit status 0 unless the log is missing.
set -euo pipefail
build=${1:-build}
log="$build/Testing/Temporary/LastTest.log"
if [[ ! -f $log ]]; then
  echo "skip report: no ctest log at $log" >&2
  exit 1
fi
awk '
  # A test block starts with "N/M Test: NAME" and ends with its "end time" line.
  /^[0-9]+\/[0-9]+ Test: / { name = $3; in_skip = 0; next }
  # GoogleTest: "file:line: Skipped", then the message lines, up to the SKIPPED marker.
  / Skipped$/ && name != "" { in_skip = 1; reason = ""; next }
  in_skip && /^\[  SKIPPED \]/ {
    printf "  %s: %s\n", name, (reason == "" ? "(no reason given)" : reason)
    gtest++; in_skip = 0; next
  }
  in_skip { reason = (reason == "" ? $0 : reason " " $0); next }
  /^SKIP: / && name != "" {
    sub(/^SKIP: /, "")
    printf "  %s: %s\n", name, $0
    if (!(name in scripts)) { scripts[name] = 1; script_tests++ }
    lines++
    next
  }
  END {
    printf "skip report: %d GoogleTest cases skipped; %d SKIP lines from %d other tests (each skipped in full or in part)\n",
      gtest, lines, script_tests
  }
' "$log"
