#!/usr/bin/env bash
# Replays recorded telemetry frames (JSON lines, see the notes' TELEMETRY_JSON) in the built
# window under Xvfb and saves PNGs of the window and of the memory dock, light and dark:
#   tests/app/replay_screenshot.sh FRAMES OUTDIR
# The replay is sped up so the whole recording plays in about 4 s (REPLAY_SPEED overrides),
# and the shot is taken once it has ended (held on its last frame; SCREENSHOT_AFTER_MS
# overrides). GRANULE_BIN names the binary (default: build-cpu/app/gui/granule of this
# checkout). Nothing touches the user's chats: a throwaway database and XDG dirs are used.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 FRAMES.jsonl OUTDIR" >&2
  exit 2
fi
frames=$(realpath "$1")
outdir=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${GRANULE_BIN:-$root/build-cpu/app/gui/granule}
[[ -x $bin ]] || { echo "$0: $bin is not built (cmake --build build-cpu --target granule)" >&2; exit 1; }
[[ -r $frames ]] || { echo "$0: cannot read $frames" >&2; exit 1; }
command -v xvfb-run >/dev/null || { echo "$0: xvfb-run is missing (apt-get install xvfb xauth)" >&2; exit 1; }
mkdir -p "$outdir"
outdir=$(realpath "$outdir")

# The recording's length from its last frame's "t", for a speed that plays it in ~4 s.
last_t=$(grep -v '^\s*$' "$frames" | tail -n 1 | grep -o '"t": *[0-9.eE+-]*' | head -n 1 | sed 's/.*: *//' || true)
speed=${REPLAY_SPEED:-$(awk -v t="${last_t:-0}" 'BEGIN { s = t / 4; if (s < 1) s = 1; printf "%.3f", s }')}
after_ms=${SCREENSHOT_AFTER_MS:-6000}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export XDG_CONFIG_HOME=$scratch/config XDG_DATA_HOME=$scratch/data XDG_CACHE_HOME=$scratch/cache
export GRANULE_DEFAULT_MODEL=$scratch/no-model.gguf  # a replay loads no model

status=0
for theme in light dark; do
  echo "replaying $(basename "$frames") (${last_t:-?} s at ${speed}x), $theme theme"
  if ! xvfb-run -a -s "-screen 0 1600x1000x24" \
      "$bin" --database "$scratch/granule-$theme.sqlite" --theme "$theme" \
      --replay "$frames" --replay-speed "$speed" \
      --screenshot "$outdir/replay-window-$theme.png" \
      --screenshot-dock "$outdir/replay-dock-$theme.png" \
      --screenshot-after-ms "$after_ms"; then
    echo "$0: the window exited with an error ($theme)" >&2
    status=1
  fi
  for shot in window dock; do
    [[ -s $outdir/replay-$shot-$theme.png ]] || { echo "$0: no replay-$shot-$theme.png" >&2; status=1; }
  done
done
ls -l "$outdir"/replay-*.png 2>/dev/null || true
exit $status
