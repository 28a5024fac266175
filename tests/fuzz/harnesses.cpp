// The fuzz harness bodies (see harnesses.h): GGUF opening from bytes, tokenizer encode and
// decode over every pre-tokenizer family, and chat-template rendering for every family.
#include "harnesses.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "granule/chat_template.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/log.h"
#include "granule/model_config.h"
#include "granule/reasoning.h"
#include "granule/testkit/byte_level.h"
#include "granule/testkit/gguf_writer.h"
#include "granule/tokenizer.h"

namespace granule::fuzz {
namespace {

namespace fs = std::filesystem;

// A bug the harness itself detects (a broken round trip): crash so the fuzzer keeps the input.
[[noreturn]] void fail(const char* what) {
  (void)!write(2, what, std::string_view(what).size());
  (void)!write(2, "\n", 1);
  __builtin_trap();
}

// One memory file reused for every input; ModelFile::open reads it by its /proc path.
class MemoryFile {
 public:
  MemoryFile() : fd_(memfd_create("granule-fuzz.gguf", 0)) {
    if (fd_ < 0) fail("memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const fs::path& fill(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) fail("ftruncate failed");
    for (size_t done = 0; done < size;) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) fail("pwrite failed");
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  fs::path path_;
};

}  // namespace

void quiet_logs() { set_log_level(spdlog::level::off); }

void open_gguf(const uint8_t* data, size_t size) {
  static MemoryFile memory_file;
  const fs::path& path = memory_file.fill(data, size);
  try {
    const auto file = ModelFile::open(path);
    for (const auto& [key, value] : file->metadata()) {
      (void)value;
      try {
        (void)file->get_int(key);
      } catch (const Error&) {
      }
      try {
        (void)file->get_string(key);
      } catch (const Error&) {
      }
    }
    for (const TensorInfo& tensor : file->tensors()) {
      (void)tensor.elements();
      (void)tensor.rows();
    }
    try {
      const ModelConfig config = ModelConfig::from_gguf(*file);
      (void)WeightTable::from_gguf(*file, config);
    } catch (const Error&) {
    }
    try {
      const auto tokenizer = Tokenizer::from_gguf(*file);
      const auto ids = tokenizer->encode("Hello <|im_start|> world\n\n 123", true, true);
      (void)tokenizer->decode(ids, true);
    } catch (const Error&) {
    }
    if (auto source = file->get_string("tokenizer.chat_template")) {
      (void)ChatTemplate::detect(*source).render({{"user", "hi"}}, true, "<s>");
    }
  } catch (const Error&) {
    // The clean outcome for a bad file.
  }
}

// --- tokenizers ---------------------------------------------------------------------------

namespace {

struct FuzzTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  bool byte_level = false;
};

std::vector<FuzzTokenizer>& tokenizers() {
  static std::vector<FuzzTokenizer> all;
  return all;
}

// One name per distinct pre-tokenizer in tokenizer_pretokenize.cpp.
constexpr const char* kPreTokenizers[] = {
    "default",      "gpt2",           "llama-bpe", "dbrx",   "qwen2", "smollm", "falcon",
    "deepseek-llm", "deepseek-coder", "gpt-4o",    "tekken", "bloom", "viking",
};

// Without the test data: 256 byte tokens, a few merges and two special tokens.
GgufWriter small_byte_vocab() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(gpt2_byte_symbol(b));
  std::vector<std::string> merges = {"h e", "l l", "he ll", "Ġ w", "o r", "Ġw or", "1 2"};
  for (const std::string& merge : merges) {
    std::string merged = merge;
    merged.erase(merged.find(' '), 1);
    tokens.push_back(merged);
  }
  std::vector<int64_t> types(tokens.size(), 1);
  tokens.push_back("<|endoftext|>");
  types.push_back(3);
  tokens.push_back("<|im_start|>");
  types.push_back(4);
  GgufWriter writer;
  writer.set("general.architecture", GgufValue::string("llama"));
  writer.set("tokenizer.ggml.model", GgufValue::string("gpt2"));
  writer.set("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  writer.set("tokenizer.ggml.token_type", GgufValue::int_array(GgufType::INT32, types));
  writer.set("tokenizer.ggml.merges", GgufValue::string_array(merges));
  writer.set("tokenizer.ggml.eos_token_id", GgufValue::u32(256 + 7));
  return writer;
}

std::unique_ptr<Tokenizer> load(const GgufWriter& writer, const fs::path& path) {
  writer.write(path);
  auto file = ModelFile::open(path);
  auto tokenizer = Tokenizer::from_gguf(*file);
  fs::remove(path);
  return tokenizer;
}

}  // namespace

void init_tokenizers(const char* testdata_dir) {
  auto& all = tokenizers();
  if (!all.empty()) return;
  const fs::path dir = fs::path(testdata_dir) / "tokenizer";
  const fs::path scratch = fs::temp_directory_path() / ("granule-fuzz-" + std::to_string(getpid()));
  fs::create_directories(scratch);

  // GPT-2's vocabulary and merges under every pre-tokenizer name.
  GgufWriter base = small_byte_vocab();
  const fs::path gpt2 = dir / "ggml-vocab-gpt-2.gguf";
  std::unique_ptr<ModelFile> gpt2_file;
  if (fs::exists(gpt2)) gpt2_file = ModelFile::open(gpt2);
  for (const char* pre : kPreTokenizers) {
    GgufWriter writer;
    if (gpt2_file) {
      for (const auto& [key, value] : gpt2_file->metadata()) {
        if (key != "tokenizer.ggml.pre") writer.set(key, value);
      }
    } else {
      writer = base;
    }
    writer.set("tokenizer.ggml.pre", GgufValue::string(pre));
    all.push_back({load(writer, scratch / (std::string(pre) + ".gguf")), true});
  }
  // SentencePiece: Llama 2 and Phi-3.
  for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"}) {
    if (!fs::exists(dir / name)) continue;
    const auto file = ModelFile::open(dir / name);
    all.push_back({Tokenizer::from_gguf(*file), false});
  }
  fs::remove_all(scratch);
}

void tokenize(const uint8_t* data, size_t size) {
  auto& all = tokenizers();
  if (all.empty() || size == 0) return;
  const uint8_t selector = data[0];
  const FuzzTokenizer& chosen = all[selector % all.size()];
  const Tokenizer& tokenizer = *chosen.tokenizer;
  const bool parse_special = (selector & 0x40) != 0;
  const bool add_bos = (selector & 0x80) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  try {
    const std::vector<TokenId> ids = tokenizer.encode(text, add_bos, parse_special);
    for (TokenId id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= tokenizer.vocab_size()) fail("id out of range");
    }
    const std::string decoded = tokenizer.decode(ids, /*render_special=*/true);
    // Byte-level BPE loses nothing: without special parsing (and BOS), the ids give the
    // text back byte for byte.
    if (chosen.byte_level && !parse_special && !add_bos && decoded != text) {
      fail("byte-level BPE round trip lost bytes");
    }
    IncrementalDetokenizer detokenizer(tokenizer, true);
    std::string streamed;
    for (TokenId id : ids) streamed += detokenizer.push(id);
    streamed += detokenizer.flush();
  } catch (const Error&) {
  }

  // The same bytes read as token ids, some out of range: decoding refuses those cleanly.
  std::vector<TokenId> ids;
  for (size_t i = 1; i + 2 <= size && ids.size() < 64; i += 2) {
    const int32_t raw = data[i] | (data[i + 1] << 8);
    ids.push_back(static_cast<TokenId>(raw * 2) - 1000);
  }
  try {
    (void)tokenizer.decode(ids, (selector & 1) != 0);
  } catch (const Error&) {
  }
  try {
    IncrementalDetokenizer detokenizer(tokenizer, (selector & 2) != 0);
    for (TokenId id : ids) (void)detokenizer.push(id);
    (void)detokenizer.flush();
  } catch (const Error&) {
  }
}

// --- chat templates -----------------------------------------------------------------------

void render_chat(const uint8_t* data, size_t size) {
  if (size == 0) return;
  static const std::vector<std::string> families = ChatTemplate::family_names();
  static const char* const roles[] = {"system", "user", "assistant", "tool"};
  const uint8_t selector = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  std::vector<ChatMessage> messages;
  for (size_t pos = 0; pos <= rest.size() && messages.size() < 32;) {
    size_t end = rest.find('\0', pos);
    if (end == std::string_view::npos) end = rest.size();
    const std::string_view part = rest.substr(pos, end - pos);
    if (!part.empty()) {
      messages.push_back({roles[static_cast<uint8_t>(part[0]) % 4], std::string(part.substr(1))});
    }
    pos = end + 1;
  }
  try {
    // Detection reads any text: the whole input as a template source.
    std::optional<ChatTemplate> chat;
    try {
      chat = ChatTemplate::detect(rest);
    } catch (const Error&) {
    }
    const size_t pick = selector % (families.size() + 1);
    if (pick < families.size() || !chat) {
      chat = ChatTemplate::from_name(families[pick % families.size()]);
    }
    chat->set_today_date("26 Jul 2024");
    const bool add_generation_prompt = (selector & 0x80) != 0;
    const std::string_view bos = (selector & 0x40) != 0 ? "<s>" : "";
    (void)chat->render(messages, add_generation_prompt, bos);
    (void)chat->stop_strings();
  } catch (const Error&) {
  }
  // The reasoning parser over the same bytes, cut into pieces at the selector's stride: it
  // only ever drops tags, so it never releases more bytes than it took.
  const ReasoningFormat format = static_cast<ReasoningFormat>(selector % 3);
  ReasoningParser parser(format, (selector & 0x20) != 0);
  const size_t stride = 1 + (selector >> 3) % 7;
  size_t released = 0;
  for (size_t at = 0; at < rest.size(); at += stride) {
    const ReasoningDelta d = parser.push(rest.substr(at, stride));
    released += d.reasoning.size() + d.content.size();
  }
  const ReasoningDelta last = parser.finish();
  released += last.reasoning.size() + last.content.size();
  if (released > rest.size()) fail("the reasoning parser released more bytes than it took");
  if (format == ReasoningFormat::None && released != rest.size())
    fail("the reasoning parser lost text with no reasoning format");
}

}  // namespace granule::fuzz
