// gguf_models: file names to quantisation labels and split shards to one model.
#include "hub/model_files.h"

#include <algorithm>
#include <map>
#include <regex>

namespace granule::hub {
namespace {

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string quant_label(const std::string& file_name) {
  // The last quantisation-looking word: Q4_K_M, Q5_0, IQ4_XS, IQ2_XXS, F16, BF16, F32,
  // MXFP4, TQ1_0, UD-Q4_K_XL.
  static const std::regex pattern(
      R"(((?:UD-)?(?:I?Q[0-9](?:_[0-9])?(?:_K)?(?:_(?:XXS|XS|S|M|L|XL|NL))?|TQ[12]_0|MXFP4(?:_MOE)?|BF16|F16|F32))(?=[-._]|$))",
      std::regex::icase);
  std::string name = base_name(file_name);
  if (name.size() > 5 && upper(name.substr(name.size() - 5)) == ".GGUF")
    name.resize(name.size() - 5);
  static const std::regex split(R"(-\d{5}-of-\d{5}$)");
  name = std::regex_replace(name, split, "");
  std::string label;
  for (auto it = std::sregex_iterator(name.begin(), name.end(), pattern);
       it != std::sregex_iterator(); ++it)
    label = (*it)[1].str();
  return upper(label);
}

std::vector<GgufModel> gguf_models(const RepoListing& listing) {
  static const std::regex split(R"((.*)-(\d{5})-of-(\d{5})\.gguf$)", std::regex::icase);
  std::map<std::string, GgufModel> by_key;
  std::map<std::string, int> announced;
  for (const RepoFile& f : listing.files) {
    if (f.path.size() < 5 || upper(f.path.substr(f.path.size() - 5)) != ".GGUF") continue;
    std::smatch m;
    std::string key = f.path;
    if (std::regex_match(f.path, m, split)) {
      key = m[1].str();
      announced[key] = std::stoi(m[3].str());
    }
    GgufModel& model = by_key[key];
    model.parts.push_back(f);
    model.size_bytes += f.size;
  }
  std::vector<GgufModel> models;
  for (auto& [key, model] : by_key) {
    std::sort(model.parts.begin(), model.parts.end(),
              [](const RepoFile& a, const RepoFile& b) { return a.path < b.path; });
    if (const auto it = announced.find(key); it != announced.end())
      model.split_complete = static_cast<int>(model.parts.size()) == it->second;
    const std::string name = base_name(key);
    model.projector = upper(name).starts_with("MMPROJ");
    model.label = quant_label(model.first().path);
    if (model.label.empty())
      model.label = name.ends_with(".gguf") ? name.substr(0, name.size() - 5) : name;
    models.push_back(std::move(model));
  }
  std::sort(models.begin(), models.end(), [](const GgufModel& a, const GgufModel& b) {
    if (a.projector != b.projector) return !a.projector;
    return a.size_bytes < b.size_bytes;
  });
  return models;
}

const GgufModel& find_quant(const std::vector<GgufModel>& models, const std::string& quant,
                            const std::string& repo) {
  std::string labels;
  for (const GgufModel& m : models) {
    if (m.projector) continue;
    if (upper(m.label) == upper(quant)) return m;
    labels += (labels.empty() ? "" : ", ") + m.label;
  }
  for (const GgufModel& m : models)  // a file name works too
    if (!m.projector && base_name(m.first().path) == quant) return m;
  throw UsageError(repo + " has no " + quant + " GGUF" +
                   (labels.empty() ? " (it has no GGUF files)" : "; it has " + labels));
}

}  // namespace granule::hub
