// Where tests find files they do not make: the real default model, and the escaping used
// by the committed golden text files.
#pragma once
#include <filesystem>
#include <string>

namespace granule::test {

// The default model (SmolLM2-135M-Instruct Q4_1) where the app looks for it:
// $GRANULE_DEFAULT_MODEL, then $XDG_DATA_HOME/granule/models/, then
// ~/.local/share/granule/models/. An empty path when it is in none of them; tests skip then.
std::filesystem::path default_model_path();

// Undoes the escapes the reference scripts write into golden files: \\ \n \t \r \xHH.
std::string unescape_golden(const std::string& text);

}  // namespace granule::test
