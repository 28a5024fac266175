// Where tests find the default model and its first layers, and the golden files' escaping.
#include "support/test_files.h"

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace granule::test {

std::filesystem::path default_model_path() {
  namespace fs = std::filesystem;
  const fs::path relative = "granule/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("GRANULE_DEFAULT_MODEL")) candidates.emplace_back(env);
  if (const char* xdg = std::getenv("XDG_DATA_HOME")) candidates.push_back(xdg / relative);
  if (const char* home = std::getenv("HOME"))
    candidates.push_back(fs::path(home) / ".local/share" / relative);
  for (const auto& path : candidates) {
    if (fs::is_regular_file(path)) return path;
  }
  return {};
}

std::filesystem::path real_weights_model_path() {
  const std::filesystem::path path =
      std::filesystem::path(GRANULE_TESTDATA_DIR) /
      ("smollm2-135m-first-" + std::to_string(kRealWeightsLayers) + ".gguf");
  return std::filesystem::is_regular_file(path) ? path : std::filesystem::path();
}

std::string unescape_golden(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 >= text.size()) {
      out += text[i];
      continue;
    }
    const char kind = text[++i];
    if (kind == 'x') {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
      continue;
    }
    // \n \t \r name their characters; \\ and any other escaped character stands for itself.
    const size_t named = std::string_view("ntr").find(kind);
    out += named == std::string_view::npos ? kind : "\n\t\r"[named];
  }
  return out;
}

}  // namespace granule::test
