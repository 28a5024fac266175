#!/usr/bin/env bash
# Replays recorded telemetry frames (JSON lines, see the notes' TELEMETRY_JSON) in the built
# window under Xvfb and saves PNGs of the window and of the memory dock, light and dark:
#   tests/app/replay_screenshot.sh FRAMES OUTDIR
# The replay is sped up so the whole recording plays in about 4 s (REPLAY_SPEED overrides),
# and the shot is taken once it has ended (held on its last frame; SCREENSHOT_AFTER_MS
# overrides). GRANULE_BIN names the binary (screenshot_lib.sh); nothing touches the user's
# chats: a throwaway database and XDG dirs are used, and a replay loads no model.
set -euo pipefail

source "$(dirname "$0")/screenshot_lib.sh"
screenshot_setup FRAMES.jsonl "$@"
frames=$input

# The recording's length from its last frame's "t", for a speed that plays it in ~4 s.
last_t=$(grep -v '^\s*$' "$frames" | tail -n 1 | grep -o '"t": *[0-9.eE+-]*' | head -n 1 | sed 's/.*: *//' || true)
speed=${REPLAY_SPEED:-$(awk -v t="${last_t:-0}" 'BEGIN { s = t / 4; if (s < 1) s = 1; printf "%.3f", s }')}
after_ms=${SCREENSHOT_AFTER_MS:-6000}

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
