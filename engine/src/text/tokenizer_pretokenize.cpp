// Pre-tokenizer regexes by tokenizer.ggml.pre name, and their PCRE2 matcher. The
// families and which names share a regex follow llama.cpp's llama-vocab.cpp; the regexes
// are the models' own (tokenizer.json), which PCRE2 runs as written.
#include "text/tokenizer_pretokenize.h"

#include <pcre2.h>

#include <array>

#include "granule/error.h"
#include "granule/log.h"
#include "text/tokenizer_utf8.h"

namespace granule::detail {
namespace {

// GPT-2's own split (Hugging Face ByteLevel with use_regex).
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3 (tiktoken cl100k style). The tokenizer.json writes the contractions as
// (?i:'s|'t|...); spelled out as ASCII classes here, because PCRE2's Unicode case folding
// would also let "'ſ" (long s) and the Kelvin sign match.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen 2: like Llama 3, but every digit is a word of its own.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen 3.5: Qwen 2's split with combining marks (\p{M}) inside letter runs, as its
// tokenizer.json writes it (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35).
constexpr const char* kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|)"
    R"(\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-4o (o200k): words split at case changes, contractions attached.
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Mistral's Tekken: GPT-4o's split without the contractions, single digits.
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// BLOOM-style: everything up to a space or punctuation mark.
constexpr const char* kBloom =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";

// Single digits first (StarCoder, SmolLM, Command-R: Hugging Face's Digits pre-tokenizer
// with individual_digits before ByteLevel).
constexpr const char* kEachDigit = R"(\p{N})";

// DeepSeek LLM's Split sequence (its tokenizer.json): newlines, Latin/Greek/Cyrillic/...
// letter runs, ASCII and full-width punctuation, trailing whitespace, CJK runs, numbers.
// Code points are written as \x{...} so that no editor's Unicode normalization can turn
// one (U+1F7D, U+212A, ...) into another and break a range.
constexpr const char* kDeepseekNewline = R"([\r\n])";
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF})"
    R"(\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F})"
    R"(\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481})"
    R"(\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD})"
    R"(\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77})"
    R"(\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45})"
    R"(\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})"
    R"(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
    R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
    R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
    R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06})"
    R"(\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F})"
    R"(\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr const char* kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
constexpr const char* kDeepseekTrailingSpace = R"(\s+$)";
// The CJK range U+0800-U+4E00 is the tokenizer.json's as written: it also takes U+2029,
// U+3000, arrows, ... out of a word. Hugging Face does so, and this follows it: for
// "мир→\u2029 \n" DeepSeek LLM gives 23665 14728 350 102 207 185, where llama.cpp, whose
// \s+$ keeps "\u2029 " whole, gives 23665 14728 350 20535 185 (deepseek_llm_goldens.txt).
constexpr const char* kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

// llama.cpp's "default" set, used when a GGUF names no pre-tokenizer.
constexpr const char* kDefaultPunct = R"([\p{P}\$\+<=>\^~\|]+)";
constexpr const char* kFalconPunct = R"([\p{P}\$\+<=>\^~\|`]+)";
constexpr const char* kThreeAsciiDigits = R"([0-9][0-9][0-9])";

bool is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  for (std::string_view candidate : names) {
    if (name == candidate) return true;
  }
  return false;
}

}  // namespace

PreTokenizerSpec pre_tokenizer_spec(std::string_view name) {
  if (name.empty()) {
    logger("engine.tokenizer")
        ->warn(
            "model names no pre-tokenizer (tokenizer.ggml.pre); using llama.cpp's default "
            "split, tokens may differ from the model's own tokenizer");
    name = "default";
  }
  if (name == "default") {
    return {{kDefaultPunct, kGpt2, R"(\p{N}+)", kThreeAsciiDigits}};
  }
  if (is_one_of(name, {"gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de",
                       "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe",
                       "gigachat", "exaone4", "mellum", "trillion", "granite-docling"})) {
    return {{kGpt2}};
  }
  if (is_one_of(name, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                       "midm-2.0", "lfm2"})) {
    return {{kLlama3}, /*ignore_merges=*/true, /*add_bos=*/true};
  }
  if (is_one_of(name, {"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"})) return {{kLlama3}};
  if (is_one_of(name, {"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"})) {
    return {{kQwen2}};
  }
  if (name == "qwen35") return {{kQwen35}};
  if (is_one_of(name, {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                       "minerva-7b"})) {
    return {{kEachDigit, kGpt2}};
  }
  if (name == "falcon") return {{kFalconPunct, kGpt2, kThreeAsciiDigits}};
  if (name == "deepseek-llm") {
    return {{kDeepseekNewline, kDeepseekLetters, kDeepseekPunct, kDeepseekTrailingSpace,
             kDeepseekCjk, R"(\p{N}+)"}};
  }
  if (name == "deepseek-coder") {
    return {{kDeepseekNewline, R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, kEachDigit}};
  }
  if (is_one_of(name, {"gpt-4o", "llama4"})) return {{kGpt4o}};
  if (name == "tekken") return {{kTekken}, /*ignore_merges=*/true, /*add_bos=*/true};
  if (is_one_of(name, {"poro-chat", "bloom", "gpt3-finnish"})) return {{kBloom}};
  if (name == "viking") return {{kBloom, kEachDigit}};
  throw UnsupportedError("unsupported tokenizer pre-tokenizer '" + std::string(name) +
                         "' (tokenizer.ggml.pre); this model's tokenizer is not supported yet");
}

// One compiled regex. PCRE2_MATCH_INVALID_UTF lets text with invalid UTF-8 through: such
// bytes match nothing and end up in the words between matches, where byte-level BPE still
// encodes them.
class PreTokenizer::CompiledRegex {
 public:
  explicit CompiledRegex(const std::string& pattern) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                          &error_offset, nullptr);
    if (code_ == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error_code, message.data(), message.size());
      throw Error("tokenizer: cannot compile pre-tokenizer regex at offset " +
                  std::to_string(error_offset) + ": " +
                  reinterpret_cast<const char*>(message.data()));
    }
    // Without JIT (a platform PCRE2 lacks it for) the interpreter gives the same result.
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
  }
  ~CompiledRegex() { pcre2_code_free(code_); }
  CompiledRegex(const CompiledRegex&) = delete;
  CompiledRegex& operator=(const CompiledRegex&) = delete;

  // Appends the words of `word` to `out`: matches and the text between them.
  void split(std::string_view word, std::vector<std::string_view>& out) const {
    if (word.empty()) return;
    MatchState state;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(word.data());
    size_t last_end = 0;
    size_t search_from = 0;
    while (search_from < word.size()) {
      const int rc = match(state, subject, word.size(), search_from);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
      const size_t begin = ovector[0];
      const size_t end = ovector[1];
      if (end == begin) {  // an empty match splits nothing; look again one character on
        search_from = begin + utf8::char_length(word, begin);
        continue;
      }
      if (begin > last_end) out.push_back(word.substr(last_end, begin - last_end));
      out.push_back(word.substr(begin, end - begin));
      last_end = search_from = end;
    }
    if (last_end < word.size()) out.push_back(word.substr(last_end));
  }

 private:
  // Per-call match buffers, so one tokenizer serves several threads.
  struct MatchState {
    MatchState() : data(pcre2_match_data_create(16, nullptr)) {}
    ~MatchState() {
      pcre2_match_context_free(context);
      pcre2_jit_stack_free(jit_stack);
      pcre2_match_data_free(data);
    }
    pcre2_match_data* data;
    pcre2_match_context* context = nullptr;
    pcre2_jit_stack* jit_stack = nullptr;
  };

  // Runs one match. The JIT's default 32 KiB stack can run out on a very long word; then
  // the match is retried with a larger stack (up to 64 MiB) before giving up.
  int match(MatchState& state, PCRE2_SPTR subject, size_t length, size_t start) const {
    int rc = pcre2_match(code_, subject, length, start, 0, state.data, state.context);
    for (size_t stack_bytes = size_t{1} << 20;
         rc == PCRE2_ERROR_JIT_STACKLIMIT && stack_bytes <= (size_t{64} << 20); stack_bytes *= 4) {
      pcre2_jit_stack_free(state.jit_stack);
      state.jit_stack = pcre2_jit_stack_create(32 * 1024, stack_bytes, nullptr);
      if (state.context == nullptr) state.context = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(state.context, nullptr, state.jit_stack);
      rc = pcre2_match(code_, subject, length, start, 0, state.data, state.context);
    }
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      throw Error(std::string("tokenizer: pre-tokenizer regex failed on this text: ") +
                  reinterpret_cast<const char*>(message.data()));
    }
    return rc;
  }

  pcre2_code* code_ = nullptr;
};

PreTokenizer::PreTokenizer(const PreTokenizerSpec& spec) {
  chain_.reserve(spec.regexes.size());
  for (const std::string& pattern : spec.regexes) {
    chain_.push_back(std::make_unique<CompiledRegex>(pattern));
  }
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> words;
  if (!text.empty()) words.push_back(text);
  std::vector<std::string_view> next;
  for (const auto& regex : chain_) {
    next.clear();
    next.reserve(words.size() * 2);
    for (std::string_view word : words) regex->split(word, next);
    words.swap(next);
  }
  return words;
}

}  // namespace granule::detail
