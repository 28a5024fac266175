// The model a granule-bench run opens: a GGUF file, or a synthetic model of a named preset
// and block type written once to the temp folder with the project's writer.
#pragma once
#include <filesystem>
#include <string>

namespace granule {

// "llama3-8b:Q4_0" -> the synthetic model's file (written on first use, then reused): the
// preset's shapes with layer weights and embeddings in the named type, the output head in
// Q6_K as llama.cpp's quantiser leaves it for 4-bit files (when the width allows). TYPE is
// any block type the engine runs, by its GGUF name: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1
// Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4. Without ":TYPE" the preset's own types.
// Throws UsageError for an unknown preset or type.
std::filesystem::path synthetic_bench_model(const std::string& spec_text);

// One of `model_path` (a GGUF file) and `synthetic` (PRESET[:TYPE]) must be given.
std::filesystem::path bench_model_path(const std::string& model_path, const std::string& synthetic);

}  // namespace granule
