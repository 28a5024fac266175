#!/bin/sh
# Regenerates tests/data/reference/<case>.txt for the llama.cpp cases of
# tests/engine/cpu_moe_test.cpp, cpu_gptoss_test.cpp (mixtures of experts), cpu_gemma_test.cpp
# (Gemma 3 and 4) and cpu_qwen35_test.cpp (Qwen3.5 hybrids) from llama.cpp's CPU backend: the
# C++ tests write each synthetic model (fixed seeds) and its prompt, llama_cpp_logits.c (built
# here against libllama) runs them with an F32 KV cache and flash attention off. The files with
# quantised experts (cpu_moe_test's QuantisedExperts) are compared within the 8-bit activation
# rounding llama.cpp's CPU products apply.
#   sh tests/reference/make_llama_cpp_goldens.sh BUILD_DIR LLAMA_CPP_SOURCE LLAMA_CPP_LIB_DIR
# LLAMA_CPP_SOURCE: the llama.cpp tree (include/llama.h, ggml/include); LLAMA_CPP_LIB_DIR: the
# folder of its built libllama.so and libggml*.so (CPU build, GGML_NATIVE off).
set -eu
build=${1:?usage: make_llama_cpp_goldens.sh BUILD_DIR LLAMA_CPP_SOURCE LLAMA_CPP_LIB_DIR}
source_dir=${2:?usage: make_llama_cpp_goldens.sh BUILD_DIR LLAMA_CPP_SOURCE LLAMA_CPP_LIB_DIR}
lib_dir=${3:?usage: make_llama_cpp_goldens.sh BUILD_DIR LLAMA_CPP_SOURCE LLAMA_CPP_LIB_DIR}
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../data/reference"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -std=c11 -I"$source_dir/include" -I"$source_dir/ggml/include" \
  "$here/llama_cpp_logits.c" -L"$lib_dir" -lllama -lggml -lggml-base \
  -Wl,-rpath,"$lib_dir" -o "$work/llama_cpp_logits"
# The comparison fails for missing goldens; exporting the models is what matters here.
for test in cpu_moe_test cpu_gptoss_test cpu_gemma_test cpu_qwen35_test; do
  GRANULE_REFERENCE_EXPORT_DIR="$work" "$build/tests/$test" \
    --gtest_filter='Synthetic/LlamaCppGolden.*:Files/QuantisedExperts.WithinActivationRoundingOfLlamaCpp/*' \
    >/dev/null || true
done
for model in "$work"/*.gguf; do
  name=$(basename "$model" .gguf)
  "$work/llama_cpp_logits" "$model" "$(cat "$work/$name.tokens")" 8 "$out/$name.txt"
  echo "wrote $out/$name.txt"
done
