// Reading tokenizer.ggml.* and the parts of tokenization both BPE kinds share: special
// tokens in text, BOS, and which tokens end generation. Semantics follow llama.cpp's
// llama-vocab.cpp unless a comment says otherwise.
#include "text/tokenizer_vocab.h"

#include <algorithm>
#include <cctype>
#include <span>

#include "granule/error.h"
#include "granule/log.h"
#include "text/tokenizer_utf8.h"

namespace granule::detail {

std::string spaces_from_marks(const std::string& text) {
  std::string piece;
  piece.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (std::string_view(text).substr(pos).starts_with(kSpaceMark)) {
      piece += ' ';
      pos += kSpaceMark.size();
    } else {
      piece += text[pos++];
    }
  }
  return piece;
}
namespace {

std::string where(const ModelFile& file) { return file.path().filename().string() + ": "; }

const std::vector<std::string>* string_array(const ModelFile& file, std::string_view key) {
  const GgufValue* value = file.find(key);
  if (value == nullptr) return nullptr;
  if (value->type != GgufType::ARRAY || value->array_type != GgufType::STRING) {
    throw FormatError(where(file) + std::string(key) + " is not an array of strings");
  }
  return &value->strings;
}

std::optional<TokenId> token_id(const ModelFile& file, std::string_view key, size_t n_tokens) {
  const std::optional<int64_t> id = file.get_int(key);
  if (!id) return std::nullopt;
  if (*id < 0 || static_cast<uint64_t>(*id) >= n_tokens) {
    logger("engine.tokenizer")
        ->warn("{}{} = {} is outside the vocabulary ({} tokens); ignoring it", where(file), key,
               *id, n_tokens);
    return std::nullopt;
  }
  return static_cast<TokenId>(*id);
}

// Token texts llama.cpp recognises as end-of-turn when the file names no EOT id, in the
// order they are preferred.
constexpr std::string_view kEndOfTurnTexts[] = {
    "<|eot_id|>",      "<|im_end|>", "<|end|>", "<end_of_turn>",         "<|endoftext|>",
    "<|end_of_text|>", "<EOT>",      "_<EOT>",  "<｜end▁of▁sentence｜>", "<end_of_utterance>",
};

constexpr std::string_view kEndOfMessageTexts[] = {"<|eom_id|>"};

// Fill-in-the-middle tokens llama.cpp recognises by text (the first found of each kind).
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                             "[PAD]"};
constexpr std::string_view kFimRepoTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                              "<REPO>", "<reponame>"};
constexpr std::string_view kFimSeparatorTexts[] = {"<|file_sep|>"};

// Token texts that end generation wherever they appear in a vocabulary.
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
    "<|return|>",        // gpt-oss harmony: the end of the final answer
    "<|call|>",          // gpt-oss harmony: the end of a tool call
    "<eos>",             // Gemma 4
    "<turn|>",           // Gemma 4
    "<|tool_response>",  // Gemma 4
};

// gpt-oss's harmony tokens, which structure a reply into channels: rendered as text so the
// reasoning parser sees them (as llama.cpp does), and matched in prompts.
constexpr std::string_view kHarmonyStructureTexts[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                       "<|constrain|>"};

}  // namespace

Vocabulary read_vocabulary(const ModelFile& file) {
  Vocabulary vocab;
  vocab.file_name = file.path().filename().string();
  vocab.model = file.get_string("tokenizer.ggml.model").value_or("");
  if (vocab.model.empty()) {
    throw FormatError(where(file) + "tokenizer.ggml.model is missing: the file has no tokenizer");
  }
  vocab.pre = file.get_string("tokenizer.ggml.pre").value_or("");
  vocab.general_name = file.get_string("general.name").value_or("");

  const auto* tokens = string_array(file, "tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->empty()) {
    throw FormatError(where(file) + "tokenizer.ggml.tokens is missing or empty");
  }
  vocab.tokens = *tokens;
  const size_t n_tokens = vocab.tokens.size();

  if (const GgufValue* scores = file.find("tokenizer.ggml.scores")) {
    // Float scores as written by the converters; llama.cpp also accepts integers.
    const bool floats = scores->floats.size() >= n_tokens;
    if (scores->type != GgufType::ARRAY || (!floats && scores->ints.size() < n_tokens)) {
      throw FormatError(where(file) + "tokenizer.ggml.scores is not an array of " +
                        std::to_string(n_tokens) + " numbers");
    }
    vocab.scores.resize(n_tokens);
    for (size_t i = 0; i < n_tokens; ++i) {
      vocab.scores[i] =
          floats ? static_cast<float>(scores->floats[i]) : static_cast<float>(scores->ints[i]);
    }
  }

  vocab.types.assign(n_tokens, static_cast<int32_t>(TokenAttr::Normal));
  if (const GgufValue* types = file.find("tokenizer.ggml.token_type")) {
    if (types->type != GgufType::ARRAY || types->ints.size() < n_tokens) {
      throw FormatError(where(file) + "tokenizer.ggml.token_type is not an array of " +
                        std::to_string(n_tokens) + " integers");
    }
    for (size_t i = 0; i < n_tokens; ++i) {
      const int64_t type = types->ints[i];
      // An unknown type renders and matches like Undefined, as in llama.cpp.
      vocab.types[i] = type >= 0 && type <= static_cast<int64_t>(TokenAttr::Byte)
                           ? static_cast<int32_t>(type)
                           : static_cast<int32_t>(TokenAttr::Undefined);
    }
  }

  if (const auto* merges = string_array(file, "tokenizer.ggml.merges")) vocab.merges = *merges;

  vocab.bos = token_id(file, "tokenizer.ggml.bos_token_id", n_tokens);
  vocab.eos = token_id(file, "tokenizer.ggml.eos_token_id", n_tokens);
  vocab.eot = token_id(file, "tokenizer.ggml.eot_token_id", n_tokens);
  vocab.eom = token_id(file, "tokenizer.ggml.eom_token_id", n_tokens);
  vocab.unk = token_id(file, "tokenizer.ggml.unknown_token_id", n_tokens);
  vocab.pad = token_id(file, "tokenizer.ggml.padding_token_id", n_tokens);
  vocab.add_bos = file.get_bool("tokenizer.ggml.add_bos_token");
  vocab.add_eos = file.get_bool("tokenizer.ggml.add_eos_token");
  vocab.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix");
  return vocab;
}

VocabTokenizer::VocabTokenizer(Vocabulary& vocab, bool default_add_bos) {
  model_ = vocab.model;
  pre_ = vocab.pre;
  tokens_ = std::move(vocab.tokens);
  attrs_ = std::move(vocab.types);
  bos_ = vocab.bos;
  eos_ = vocab.eos;
  eot_ = vocab.eot;
  eom_ = vocab.eom;
  unk_ = vocab.unk;
  pad_ = vocab.pad;
  add_bos_ = vocab.add_bos.value_or(default_add_bos);
  add_eos_ = vocab.add_eos.value_or(false);

  ids_by_text_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].empty()) continue;  // an empty token can never be matched
    const auto [it, inserted] = ids_by_text_.emplace(tokens_[i], static_cast<TokenId>(i));
    if (!inserted) {
      logger("engine.tokenizer")
          ->warn("token '{}' appears twice in the vocabulary (ids {} and {}); using {}", tokens_[i],
                 it->second, i, it->second);
    }
  }

  find_end_of_generation_tokens();

  // llama.cpp's special-token cache: control, user-defined and unknown tokens.
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto id = static_cast<TokenId>(i);
    if (tokens_[i].empty()) continue;
    if (has_attr(id, TokenAttr::Control) || has_attr(id, TokenAttr::UserDefined) ||
        has_attr(id, TokenAttr::Unknown)) {
      specials_by_first_byte_[static_cast<uint8_t>(tokens_[i][0])].push_back(id);
    }
  }
  for (auto& candidates : specials_by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](TokenId a, TokenId b) {
      return tokens_[static_cast<size_t>(a)].size() > tokens_[static_cast<size_t>(b)].size();
    });
  }
  set_strip_flags(vocab);
}

// Hugging Face's added tokens can take the whitespace on their left (lstrip) or right
// (rstrip); GGUF has no field for it. llama.cpp sets the flags from the model's name and
// pre-tokenizer (llama-vocab.cpp, "set attributes by model/tokenizer name"), and so does
// this, with the same names:
// - Phi-3 (general.name holds "phi-3" or "phi3"): every special token and </s> rstrip,
//   except <unk>, <s> and <|endoftext|> — what Phi-3's tokenizer_config.json declares.
// - Jina v2 (pre jina-v2-de/-es/-code): <mask> lstrip; ModernBERT: [MASK] lstrip.
void VocabTokenizer::set_strip_flags(const Vocabulary& vocab) {
  strip_.assign(tokens_.size(), 0);
  std::string name = vocab.general_name;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto set = [&](std::string_view text, uint8_t flags) {
    if (auto id = lookup(text)) strip_[static_cast<size_t>(*id)] = flags;
  };
  if (vocab.pre == "jina-v2-de" || vocab.pre == "jina-v2-es" || vocab.pre == "jina-v2-code") {
    set("<mask>", kStripLeft);
  } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (const auto& candidates : specials_by_first_byte_) {
      for (TokenId id : candidates) strip_[static_cast<size_t>(id)] = kStripRight;
    }
    set("</s>", kStripRight);
    for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) set(text, 0);
  } else if (name.find("modern-bert") != std::string::npos) {
    set("[MASK]", kStripLeft);
  }
}

namespace {

// Unicode White_Space (Rust's char::is_whitespace, which Hugging Face's lstrip/rstrip use;
// llama.cpp strips ASCII whitespace only, so "<|end|>\u3000" differs there).
bool is_unicode_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// The length of the whitespace that starts text at pos.
size_t whitespace_after(std::string_view text, size_t pos) {
  size_t end = pos;
  while (end < text.size()) {
    const utf8::Step step = utf8::scan(text, end);
    if (step.kind != utf8::Scan::Complete ||
        !is_unicode_whitespace(utf8::decode_codepoint(text, end, step.length))) {
      break;
    }
    end += step.length;
  }
  return end - pos;
}

// The length of the whitespace that ends text[begin, end).
size_t whitespace_before(std::string_view text, size_t begin, size_t end) {
  size_t start = end;
  while (start > begin) {
    size_t lead = start - 1;  // back to the lead byte of the character before `start`
    while (lead > begin && start - lead < 4 && (static_cast<uint8_t>(text[lead]) & 0xC0) == 0x80) {
      --lead;
    }
    const utf8::Step step = utf8::scan(text, lead);
    if (step.kind != utf8::Scan::Complete || lead + step.length != start ||
        !is_unicode_whitespace(utf8::decode_codepoint(text, lead, step.length))) {
      break;
    }
    start = lead;
  }
  return end - start;
}

}  // namespace

void VocabTokenizer::find_end_of_generation_tokens() {
  // End tokens the converter did not label are found by text, as llama.cpp does, and made
  // control tokens so that they never render as text and are matched only as specials.
  auto mark_control = [&](TokenId id) {
    if (!has_attr(id, TokenAttr::Control)) {
      logger("engine.tokenizer")
          ->debug("end token '{}' ({}) is not a control token; treating it as one",
                  tokens_[static_cast<size_t>(id)], id);
      attrs_[static_cast<size_t>(id)] = static_cast<int32_t>(TokenAttr::Control);
    }
  };
  auto first_present = [&](std::span<const std::string_view> texts) -> std::optional<TokenId> {
    for (std::string_view text : texts) {
      if (auto id = lookup(text)) {
        mark_control(*id);
        return id;
      }
    }
    return std::nullopt;
  };
  if (!eot_) eot_ = first_present(kEndOfTurnTexts);
  if (!eom_) eom_ = first_present(kEndOfMessageTexts);

  auto add = [&](std::optional<TokenId> id) {
    if (id && std::find(eog_.begin(), eog_.end(), *id) == eog_.end()) eog_.push_back(*id);
  };
  add(eos_);
  add(eot_);
  add(eom_);
  // Fill-in-the-middle padding and file / repository separators end generation too: a
  // code model that emits one has left the text it was asked for.
  add(first_present(kFimPadTexts));
  add(first_present(kFimRepoTexts));
  add(first_present(kFimSeparatorTexts));
  for (std::string_view text : kEndOfGenerationTexts) {
    if (auto id = lookup(text)) {
      mark_control(*id);
      add(id);
    }
  }
  // Harmony (<|return|> and <|call|> end a reply): <|end|> only closes one message, such as
  // the analysis before the final answer, so it neither ends generation nor stays hidden.
  const std::optional<TokenId> end = lookup("<|end|>");
  if (end && lookup("<|return|>") && lookup("<|call|>")) {
    eog_.erase(std::remove(eog_.begin(), eog_.end(), *end), eog_.end());
    if (eot_ == end) eot_.reset();
    attrs_[static_cast<size_t>(*end)] = static_cast<int32_t>(TokenAttr::UserDefined);
    for (std::string_view text : kHarmonyStructureTexts) {
      if (auto id = lookup(text))
        attrs_[static_cast<size_t>(*id)] = static_cast<int32_t>(TokenAttr::UserDefined);
    }
  }
  std::sort(eog_.begin(), eog_.end());
}

std::string VocabTokenizer::token_to_piece(TokenId id, bool render_special) const {
  check_id(id);
  const std::string& text = tokens_[static_cast<size_t>(id)];
  switch (static_cast<TokenAttr>(attrs_[static_cast<size_t>(id)])) {
    case TokenAttr::Normal:
      return normal_piece(text);
    case TokenAttr::UserDefined:
      return text;
    case TokenAttr::Control:
    case TokenAttr::Unknown:
      return render_special ? text : std::string();
    case TokenAttr::Byte:
      if (auto byte = byte_of_token(text)) return std::string(1, static_cast<char>(*byte));
      return std::string();
    default:  // unused and undefined tokens render nothing
      return std::string();
  }
}

void VocabTokenizer::check_id(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) {
    throw UsageError("token id " + std::to_string(id) + " is outside the vocabulary (" +
                     std::to_string(tokens_.size()) + " tokens)");
  }
}

std::optional<uint8_t> VocabTokenizer::byte_of_token(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return std::nullopt;
  auto hex_digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int high = hex_digit(text[3]);
  const int low = hex_digit(text[4]);
  if (high < 0 || low < 0) return std::nullopt;
  return static_cast<uint8_t>(high * 16 + low);
}

std::optional<TokenId> VocabTokenizer::special_at(std::string_view text, size_t pos,
                                                  bool parse_special) const {
  const std::string_view rest = text.substr(pos);
  for (TokenId id : specials_by_first_byte_[static_cast<uint8_t>(rest[0])]) {
    if (!parse_special && !has_attr(id, TokenAttr::UserDefined)) continue;
    if (rest.starts_with(tokens_[static_cast<size_t>(id)])) return id;
  }
  return std::nullopt;
}

std::vector<TokenId> VocabTokenizer::encode(std::string_view text, bool add_bos,
                                            bool parse_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_) out.push_back(*bos_);

  // Special tokens are cut out first (leftmost, longest), as Hugging Face's added-token
  // split does; user-defined tokens always, control and unknown ones only on request.
  // The text between them goes to the model's BPE.
  size_t plain_begin = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const std::optional<TokenId> special = special_at(text, pos, parse_special);
    if (!special) {
      ++pos;
      continue;
    }
    const uint8_t strip = strip_[static_cast<size_t>(*special)];
    size_t plain_end = pos;
    if (strip & kStripLeft) plain_end -= whitespace_before(text, plain_begin, pos);
    if (plain_end > plain_begin) {
      encode_plain(text.substr(plain_begin, plain_end - plain_begin), out);
    }
    out.push_back(*special);
    pos += tokens_[static_cast<size_t>(*special)].size();
    if (strip & kStripRight) pos += whitespace_after(text, pos);
    plain_begin = pos;
  }
  if (plain_begin < text.size()) encode_plain(text.substr(plain_begin), out);
  return out;
}

}  // namespace granule::detail
