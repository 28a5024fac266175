// Reading the numpy reference's goldens; the digest that names their model; seeded values.
#include "support/reference_golden.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace granule::test {

ReferenceGolden read_reference_golden(const std::filesystem::path& path) {
  std::ifstream in(path);
  ReferenceGolden g;
  auto ints = [](const std::string& line) {
    std::istringstream s(line);
    std::string word;
    s >> word;
    std::vector<int32_t> v;
    for (int32_t x; s >> x;) v.push_back(x);
    return v;
  };
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model_fnv1a64 ", 0) == 0) g.model_fnv1a64 = line.substr(14);
    if (line.rfind("tokens ", 0) == 0) g.tokens = ints(line);
    if (line.rfind("greedy ", 0) == 0) g.greedy = ints(line);
    if (line.rfind("logits ", 0) == 0) {
      std::istringstream s(line.substr(7));
      s >> g.rows >> g.vocab;
      g.logits.resize(static_cast<size_t>(g.rows * g.vocab));
      for (auto& v : g.logits) in >> v;
    }
  }
  return g;
}

void load_reference_golden(const std::string& name, const std::filesystem::path& model,
                           const std::vector<int32_t>& prompt, ReferenceGolden& golden) {
  namespace fs = std::filesystem;
  if (const char* export_dir = std::getenv("GRANULE_REFERENCE_EXPORT_DIR")) {
    fs::copy_file(model, fs::path(export_dir) / (name + ".gguf"),
                  fs::copy_options::overwrite_existing);
    std::ofstream tokens(fs::path(export_dir) / (name + ".tokens"));
    for (size_t i = 0; i < prompt.size(); ++i) tokens << (i ? "," : "") << prompt[i];
  }
  const fs::path path = fs::path(GRANULE_SOURCE_DIR) / "tests/data/reference" / (name + ".txt");
  ASSERT_TRUE(fs::exists(path)) << "missing golden " << path
                                << "; run tests/reference/make_cpu_goldens.sh";
  golden = read_reference_golden(path);
  ASSERT_EQ(golden.tokens, prompt);
  // The golden is only meaningful for the same bytes: a changed writer or quantiser makes
  // a different model, and the goldens must be made again.
  ASSERT_EQ(fnv1a64_hex(model), golden.model_fnv1a64)
      << name << ": the synthetic model's bytes changed (GGUF writer, quantiser or spec); "
      << "regenerate the goldens with tests/reference/make_cpu_goldens.sh BUILD_DIR";
}

std::vector<double> expect_rows_near(const std::vector<float>& logits,
                                     const ReferenceGolden& golden, double bound,
                                     const std::string& what) {
  std::vector<double> diffs;
  EXPECT_EQ(logits.size(), golden.logits.size()) << what;
  if (logits.size() != golden.logits.size()) return diffs;
  for (int64_t r = 0; r < golden.rows; ++r) {
    double diff = 0, scale = 0;
    for (int64_t v = 0; v < golden.vocab; ++v) {
      const auto i = static_cast<size_t>(r * golden.vocab + v);
      diff = std::max(diff, static_cast<double>(std::fabs(logits[i] - golden.logits[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(golden.logits[i])));
    }
    diffs.push_back(diff);
    EXPECT_LE(diff / scale, bound) << what << " position " << r;
  }
  return diffs;
}

double worst_relative(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  double worst = 0;
  for (size_t r = 0; r * vocab < a.size(); ++r) {
    double sum = 0, sum_sq = 0, err = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double v = a[r * vocab + i];
      sum += v;
      sum_sq += v * v;
      err = std::max(err, std::fabs(v - b[r * vocab + i]));
    }
    const double mean = sum / vocab;
    worst = std::max(worst, err / std::sqrt(sum_sq / vocab - mean * mean));
  }
  return worst;
}

std::string fnv1a64_hex(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t h = 0xCBF29CE484222325ull;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0)
    for (std::streamsize i = 0; i < in.gcount(); ++i)
      h = (h ^ static_cast<uint8_t>(buffer[i])) * 0x100000001B3ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace granule::test
