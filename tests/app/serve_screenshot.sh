#!/usr/bin/env bash
# The window serving the OpenAI API under Xvfb, one streamed API request running, saved as a
# PNG of the window (and one of the settings dialog's server section):
#   tests/app/serve_screenshot.sh MODEL.gguf OUTDIR
# GRANULE_BIN names the binary (screenshot_lib.sh). A throwaway database and XDG dirs are
# used; the server listens on a free loopback port.
set -euo pipefail

source "$(dirname "$0")/screenshot_lib.sh"
screenshot_setup MODEL.gguf "$@"
model=$input
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

shoot() {  # shoot NAME [--screenshot-open settings]
  local name=$1
  shift
  local db=$scratch/$name.sqlite
  # A first start creates the database; then the server's settings go into it.
  QT_QPA_PLATFORM=offscreen "$bin" --database "$db" --screenshot "$scratch/first.png" \
    --screenshot-after-ms 200 >/dev/null 2>&1
  python3 - "$db" "$port" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
# A tall window, so the settings dialog shows its server section without scrolling.
for key, value in (("server/enabled", "1"), ("server/port", sys.argv[2]),
                   ("window/geometry", "0 0 1400 1340")):
    db.execute("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, value))
db.commit()
EOF
  xvfb-run -a -s "-screen 0 1600x1400x24" \
    "$bin" --database "$db" --model "$model" --theme light \
    --screenshot "$outdir/$name.png" --screenshot-after-ms 9000 "$@" &
  pids+=($!)
  local app=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.1
  done
  curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"Tell me a long story about a lighthouse."}],
         "max_tokens":4000,"ignore_eos":true,"stream":true}' >/dev/null &
  pids+=($!)
  wait "$app"
  echo "saved $outdir/$name.png"
}

shoot serving-window
shoot serving-settings --screenshot-open settings
