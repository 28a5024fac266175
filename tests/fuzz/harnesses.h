// The fuzz harness bodies, shared by the libFuzzer targets (fuzz_*.cpp, GRANULE_FUZZ builds)
// and by fuzz_regression_test.cpp, which feeds every kept reproducer and seed through the
// normal build. Each body returns normally for any input: a granule::Error is the clean
// outcome for bad input; anything else (another exception, a crash, a sanitizer report) is a bug.
#pragma once
#include <cstddef>
#include <cstdint>

namespace granule::fuzz {

// Turns the engine's log off: a warning per input ("model names no pre-tokenizer") costs
// the fuzzers time and buries their output.
void quiet_logs();

// Writes the bytes to a memory file and opens it as a GGUF (ModelFile::open), then reads
// what loading a model reads from it: typed metadata, ModelConfig, the tokenizer, the chat
// template.
void open_gguf(const uint8_t* data, size_t size);

// The first byte picks a tokenizer (every pre-tokenizer family over GPT-2's vocabulary,
// Llama 2 and Phi-3 SentencePiece) and the flags; the rest is text to encode, whose ids are
// decoded again (byte-level BPE must give the text back), and token ids to decode.
// init_tokenizers() builds them once (from the test data folder when present, else from a
// small generated vocabulary); it takes the data folder to look in.
void init_tokenizers(const char* testdata_dir);
void tokenize(const uint8_t* data, size_t size);

// The first byte picks a chat template family (or detection from the input), the rest is
// a conversation: messages separated by NUL bytes, each with a role byte in front.
void render_chat(const uint8_t* data, size_t size);

}  // namespace granule::fuzz

// A libFuzzer target (fuzz_*.cpp) that quiets the log once and hands every input to
// `harness`, one of the bodies above.
#define GRANULE_FUZZ_TARGET(harness)                                        \
  extern "C" int LLVMFuzzerInitialize(int*, char***) {                      \
    granule::fuzz::quiet_logs();                                            \
    return 0;                                                               \
  }                                                                         \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    harness(data, size);                                                    \
    return 0;                                                               \
  }
