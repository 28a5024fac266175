// The numpy reference's goldens (tests/data/reference/<case>.txt, written by
// tests/reference/llama_reference.py): the file's digest, the prompt, the greedy tokens and the
// teacher-forced logits; logits compared with them (expect_rows_near) or with each other
// (worst_relative); and the seeded values the CPU tests feed their ops.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace granule::test {

struct ReferenceGolden {
  std::string model_fnv1a64;  // hex digest of the file the reference ran
  std::vector<int32_t> tokens, greedy;
  int64_t rows = 0, vocab = 0;
  std::vector<float> logits;  // rows x vocab
};

ReferenceGolden read_reference_golden(const std::filesystem::path& path);

// Case `name`'s golden (tests/data/reference/NAME.txt) into `golden`, for `model`, a synthetic
// model run on `prompt`. With GRANULE_REFERENCE_EXPORT_DIR set, first copies the model (as
// NAME.gguf) and the prompt (NAME.tokens) there for tests/reference/make_cpu_goldens.sh. Fails
// fatally (ASSERT_NO_FATAL_FAILURE around it) when the golden is missing, is for another
// prompt, or was made from other bytes than `model`'s.
void load_reference_golden(const std::string& name, const std::filesystem::path& model,
                           const std::vector<int32_t>& prompt, ReferenceGolden& golden);

// Each row of `logits` (golden.rows x golden.vocab) against the golden's: its largest
// |logit - golden| at most `bound` times the row's largest |golden| (a failure names `what`
// and the position). Returns each row's largest |logit - golden|.
std::vector<double> expect_rows_near(const std::vector<float>& logits,
                                     const ReferenceGolden& golden, double bound,
                                     const std::string& what);

// The largest over rows (of `vocab` values) of max |a - b| / std(a): the error against the
// row's spread, without its mean offset.
double worst_relative(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab);

// FNV-1a 64 of the file's bytes, 16 hex digits (the goldens name their model by it).
std::string fnv1a64_hex(const std::filesystem::path& path);

// n values uniform in [-scale, scale] from std::mt19937(seed).
std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f);

}  // namespace granule::test
