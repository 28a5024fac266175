#!/usr/bin/env bash
# llama.cpp's CUDA benchmarks for the device machine (which has no registry): builds
# llama-bench and llama-batched-bench from the llama-cpp-python source distribution that
# packaging/setup.sh pins (its vendor/llama.cpp, the reference of the issues; checksum checked),
# for sm_90 with flash attention and every CPU backend variant loaded at run time (the host's
# best, for --n-cpu-moe and -ngl rows), then packs bin/ as a tarball to carry with a device
# call. About 50 minutes on the development machine's 2 cores; start it early.
#   usage: bash dev/cuda/build_llama_cuda.sh [WORK_DIR] [TARBALL]
#          (defaults: /tmp/llama-cuda and .cache/llbin.tar.xz of the checkout)
#   on the device: mkdir -p /tmp/ll && tar xJf .cache/llbin.tar.xz -C /tmp/ll, then
#   LD_LIBRARY_PATH=/tmp/ll/bin:/usr/local/cuda/lib64 /tmp/ll/bin/llama-batched-bench ...
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/llama-cuda}
tarball=${2:-$root/.cache/llbin.tar.xz}
# The source distribution and its checksum as packaging/setup.sh pins them.
sdist=$(sed -n 's/^readonly LLAMACPP_SDIST=//p' "$root/packaging/setup.sh")
sha256=$(sed -n 's/^readonly LLAMACPP_SDIST_SHA256=//p' "$root/packaging/setup.sh")
name=${sdist//-/_}
name=${name/==/-}  # llama_cpp_python-0.3.36
mkdir -p "$work" "$(dirname "$tarball")"
cd "$work"
if [[ ! -d $name ]]; then
  [[ -f $name.tar.gz ]] || python3 -m pip download -q --no-deps --no-binary :all: -d . "$sdist"
  echo "$sha256  $name.tar.gz" | sha256sum --quiet --strict -c - ||
    { echo "checksum mismatch for $name.tar.gz (packaging/setup.sh pins $sha256)"; exit 1; }
  tar xzf "$name.tar.gz"
fi
src=$name/vendor/llama.cpp
cmake -S "$src" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
  -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_HTML=OFF >cmake.log
# The tools, the CUDA backend and the CPU variants (these targets bring every variant along).
ninja -C build -j"$(nproc)" llama-bench llama-batched-bench ggml-cuda ggml-cpu-x64 \
  ggml-cpu-haswell ggml-cpu-skylakex ggml-cpu-icelake ggml-cpu-sapphirerapids ggml-cpu-zen4 \
  ggml-cpu-alderlake >ninja.log
tar cf - -C build bin | xz -T"$(nproc)" -6 >"$tarball"
echo "packed $(du -h "$tarball" | cut -f1) in $tarball"
