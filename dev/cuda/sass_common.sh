# Sourced by the dev/cuda SASS tools: sass_compile FILE OUT_DIR compiles FILE (a .cu under
# kernels/) for sm_90 into OUT_DIR/k.cubin and disassembles it into OUT_DIR/k.sass (no GPU needed);
# extra nvcc flags in SASS_NVCC_FLAGS. cuobjdump (and the nvdisasm it calls) are not part of the
# CUDA toolkit installed here: they come from the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm
# wheels (pip download) into ~/.cache/granule-sass when they are missing; $cuobjdump names it.
sass_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cuobjdump=$(command -v cuobjdump || true)
if [[ -z $cuobjdump ]]; then
  cache=$HOME/.cache/granule-sass
  cuobjdump=$(find "$cache" -name cuobjdump -type f 2>/dev/null | head -1 || true)
  if [[ -z $cuobjdump ]]; then
    mkdir -p "$cache"
    (cd "$cache" && pip download -q --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm &&
      for w in ./*.whl; do unzip -q -o "$w" -d x; done)
    cuobjdump=$(find "$cache" -name cuobjdump -type f | head -1)
  fi
  chmod +x "$(dirname "$cuobjdump")"/*
  export PATH="$(dirname "$cuobjdump"):$PATH"
fi
sass_compile() {
  nvcc -I "$sass_root/kernels" -I "$sass_root/engine/include" -O3 -DNDEBUG -arch=sm_90 \
    --expt-relaxed-constexpr -std=c++17 ${SASS_NVCC_FLAGS:-} -cubin "$sass_root/$1" -o "$2/k.cubin"
  "$cuobjdump" -sass "$2/k.cubin" >"$2/k.sass"
}
