// `granule-cli tokenize MODEL TEXT` (or `-f FILE`, `-f -` for standard input): the token ids
// the model's tokenizer gives for a text, on one line (or one id and its piece per line with
// --pieces). Works on vocabulary-only GGUFs.
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
  std::string file;  // "" = the text argument; "-" = standard input
  bool no_bos = false;
  bool parse_special = false;
  bool pieces = false;
};

int run_tokenize(const TokenizeOptions& options) {
  // Read first: a file that cannot be read fails before the model is opened.
  const std::string text = options.file.empty() ? options.text : read_text_input(options.file);
  const std::unique_ptr<ModelFile> file = ModelFile::open(options.model);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(*file);
  const bool add_bos = !options.no_bos && tokenizer->add_bos_by_default();
  const std::vector<TokenId> ids = tokenizer->encode(text, add_bos, options.parse_special);
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
  CLI::Option* text = app->add_option("text", options->text, "Text to tokenize");
  CLI::Option* file = app->add_option("-f,--file", options->file,
                                      "Read the text from FILE (- reads standard input)");
  text->excludes(file);
  file->excludes(text);
  app->callback([text, file] {  // runs inside parse, so this is a usage line like the others
    if (text->count() == 0 && file->count() == 0)
      throw CLI::ValidationError("tokenize needs the text, or -f FILE (- for standard input)");
  });
  app->add_flag("--no-bos", options->no_bos,
                "Do not prepend BOS (by default the vocabulary decides)");
  app->add_flag("--parse-special", options->parse_special,
                "Read control tokens written as text (\"<|im_start|>\") as those tokens");
  app->add_flag("--pieces", options->pieces, "One token per line with the text it stands for");
  return {app, [options] { return run_tokenize(*options); }, &options->model};
}

}  // namespace granule::cli
