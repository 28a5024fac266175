// Where tests find files they do not make: the real default model, its first layers (the
// real-weights model), and the escaping used by the committed golden text files.
#pragma once
#include <filesystem>
#include <string>

namespace granule::test {

// The default model (SmolLM2-135M-Instruct Q4_1) where the app looks for it:
// $GRANULE_DEFAULT_MODEL, then $XDG_DATA_HOME/granule/models/, then
// ~/.local/share/granule/models/. An empty path when it is in none of them; tests skip then.
std::filesystem::path default_model_path();
// What a test that needs it says when it skips.
inline constexpr const char* kNoDefaultModel =
    "the default model (SmolLM2-135M-Instruct Q4_1) is absent: `bash packaging/setup.sh model` "
    "fetches it";

// The default model's first kRealWeightsLayers layers with its real embeddings, head and
// tokenizer, which `setup.sh realweights` (part of `setup.sh test`) writes into the test data
// folder (GRANULE_TESTDATA_DIR): under 40 MB, so it travels to a GPU machine. An empty path
// when it was not written; tests skip then.
constexpr int kRealWeightsLayers = 3;
std::filesystem::path real_weights_model_path();

// Undoes the escapes the reference scripts write into golden files: \\ \n \t \r \xHH.
std::string unescape_golden(const std::string& text);

}  // namespace granule::test
