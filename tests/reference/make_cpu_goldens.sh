#!/bin/sh
# Regenerates tests/data/reference/<case>.txt, the CPU backend's goldens: the C++ test writes
# each synthetic model (fixed seeds) and its prompt, the numpy reference runs them.
#   pip install numpy gguf
#   sh tests/reference/make_cpu_goldens.sh /path/to/build
set -eu
build=${1:?usage: make_cpu_goldens.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../data/reference"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The comparison fails for missing goldens; exporting the models is what matters here.
GRANULE_REFERENCE_EXPORT_DIR="$work" "$build/tests/cpu_backend_test" \
  --gtest_filter='Synthetic/ReferenceGoldenTest.*' >/dev/null || true
GRANULE_REFERENCE_EXPORT_DIR="$work" "$build/tests/mixed_types_test" \
  --gtest_filter='Files/MixedTypes.LogitsAndGreedyMatchNumpyReference/*' >/dev/null || true
for model in "$work"/*.gguf; do
  name=$(basename "$model" .gguf)
  python3 "$here/llama_reference.py" "$model" --tokens "$(cat "$work/$name.tokens")" \
    --greedy 8 --out "$out/$name.txt"
  echo "wrote $out/$name.txt"
done
