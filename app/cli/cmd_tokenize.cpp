// `granule-cli tokenize MODEL TEXT`: the token ids the model's tokenizer gives for a text,
// on one line (or one id and its piece per line with --pieces). Works on vocabulary-only GGUFs.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "granule/gguf.h"
#include "granule/tokenizer.h"

namespace granule::cli {
namespace {

struct TokenizeOptions {
  std::filesystem::path model;
  std::string text;
  bool no_bos = false;
  bool parse_special = false;
  bool pieces = false;
};

int run_tokenize(const TokenizeOptions& options) {
  const std::unique_ptr<ModelFile> file = ModelFile::open(options.model);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(*file);
  const bool add_bos = !options.no_bos && tokenizer->add_bos_by_default();
  const std::vector<TokenId> ids = tokenizer->encode(options.text, add_bos, options.parse_special);
  if (options.pieces) {
    for (TokenId id : ids) {
      std::printf("%d\t'%s'\n", id, tokenizer->token_to_piece(id, /*render_special=*/true).c_str());
    }
    return 0;
  }
  std::string line;
  for (TokenId id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& parent) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* app = parent.add_subcommand("tokenize", "Print the token ids of a text");
  app->add_option("model", options->model, "GGUF file (a vocabulary-only file is enough)")
      ->required();
  app->add_option("text", options->text, "Text to tokenize")->required();
  app->add_flag("--no-bos", options->no_bos,
                "Do not prepend BOS (by default the vocabulary decides)");
  app->add_flag("--parse-special", options->parse_special,
                "Read control tokens written as text (\"<|im_start|>\") as those tokens");
  app->add_flag("--pieces", options->pieces, "One token per line with the text it stands for");
  return {app, [options] { return run_tokenize(*options); }, &options->model};
}

}  // namespace granule::cli
