# What the window's screenshot scripts share, sourced by them: `screenshot_setup WHAT "$@"`
# checks the two arguments (an input file and OUTDIR), the built binary and xvfb-run, and sets
# $input, $outdir, $bin and $scratch: a throwaway folder holding the XDG dirs, so nothing
# touches the user's chats. Processes added to $pids are killed, and $scratch removed, at exit.
# GRANULE_BIN names the binary (default: build-cpu/app/gui/granule of this checkout).
screenshot_setup() {
  local what=$1
  shift
  if [[ $# -ne 2 ]]; then
    echo "usage: $0 $what OUTDIR" >&2
    exit 2
  fi
  input=$(realpath "$1")
  outdir=$2
  local root
  root=$(cd "$(dirname "$0")/../.." && pwd)
  bin=${GRANULE_BIN:-$root/build-cpu/app/gui/granule}
  [[ -x $bin ]] || { echo "$0: $bin is not built (cmake --build build-cpu --target granule)" >&2; exit 1; }
  [[ -r $input ]] || { echo "$0: cannot read $input" >&2; exit 1; }
  command -v xvfb-run >/dev/null || { echo "$0: xvfb-run is missing (apt-get install xvfb xauth)" >&2; exit 1; }
  mkdir -p "$outdir"
  outdir=$(realpath "$outdir")
  scratch=$(mktemp -d)
  pids=()
  trap screenshot_cleanup EXIT
  export XDG_CONFIG_HOME=$scratch/config XDG_DATA_HOME=$scratch/data XDG_CACHE_HOME=$scratch/cache
  export GRANULE_DEFAULT_MODEL=$scratch/no-model.gguf  # no model but the one a script names
}

screenshot_cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$scratch"
}
