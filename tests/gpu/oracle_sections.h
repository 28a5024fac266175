// The sections every whole-model GPU test runs on its rigs (the CPU reference, the CPU oracle
// where there is one, the CUDA backend last), written once: a prefill of 64 rows and 16 decode
// steps replayed from graphs, a prefill of 150 (or 2 x 150) rows on the cuBLAS path and decode at
// 300, and six chats decoding together (and beside a prompt). Each section's rows go to the
// test's comparison (oracle_compare.h's rule, or a test's own bound), which names the model.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "oracle_compare.h"
#include "support/model_runtime.h"

namespace granule::gpu_test {

// What a comparison holds; section_name() is its name in the printed line.
enum class Section {
  Prefill64,      // 64 prompt rows on slot 0, every row's logits (the matvec path)
  GraphDecode,    // 16 decode steps past them (one row: replayed from CUDA graphs)
  Prefill150,     // 150 prompt rows on slot 1 (the cuBLAS path)
  Prefill2x150,   // the same, then 150 more on the same sequence
  DecodeAt300,    // 4 decode steps past those 300
  BatchedDecode,  // six chats at different lengths decoding together for 6 steps (a graph of
                  // 8 rows, 2 of them padding)
  BesideAPrompt,  // their next rows in one step beside 100 more prompt tokens of slot 1
};

inline std::string section_name(Section s) {  // the names in Section's order
  static constexpr const char* kNames[] = {"prefill 64",
                                           "decode (graphs)",
                                           "prefill 150",
                                           "prefill 2 x 150",
                                           "decode at 300",
                                           "batched decode of 6",
                                           "6 decode rows beside a prompt of 100"};
  return kNames[static_cast<int>(s)];
}

// A section's logits: every rig's rows, in the order of the rigs.
using SectionRows = std::vector<std::vector<float>>;
using CompareSection = std::function<void(Section, const SectionRows&)>;

// oracle_compare.h's rule for rigs {f32 reference, oracle, GPU}: each comparison named `name`
// and the section's name; rows past the bound allowed (rerouted tokens) where `reroutable` says.
inline CompareSection against_the_oracle(int64_t n_vocab, std::string name,
                                         std::function<bool(Section)> reroutable) {
  return [n_vocab, name = std::move(name), reroutable = std::move(reroutable)](
             Section s, const SectionRows& rows) {
    ASSERT_EQ(rows.size(), 3u);
    expect_close_to_oracle(rows[0], rows[1], rows[2], n_vocab, name + " " + section_name(s),
                           reroutable(s));
  };
}

class ModelSections {
 public:
  // `rigs` step in this order, the GPU's last (its graph counters are checked); `gpu_slides`:
  // the GPU's KV mapped as the engine maps it (ModelRuntime::step's `slide`), the others from 0.
  ModelSections(std::vector<test::ModelRuntime*> rigs, CompareSection compare,
                bool gpu_slides = false)
      : rigs_(std::move(rigs)),
        compare_(std::move(compare)),
        gpu_slides_(gpu_slides),
        vocab_(rigs_.back()->config.n_vocab) {}

  // Prefill64 on slot 0, then GraphDecode; the GPU replayed its decode graphs.
  void prefill_64_then_decode() {
    const std::vector<int32_t> prompt = test::random_tokens(64, vocab_, 1);
    compare_(Section::Prefill64, run({{0, prompt, 0, true}}));
    const std::vector<int32_t> next = test::random_tokens(16, vocab_, 2);
    SectionRows rows(rigs_.size());
    for (int i = 0; i < 16; ++i) step({{0, one(next, i), 64 + i, false}}, rows);
    compare_(Section::GraphDecode, rows);
    EXPECT_GT(rigs_.back()->graphs().replays, 0u);
  }

  // Prefill150 on slot 1; with `then_150_more` Prefill2x150 instead (both chunks' rows in one
  // comparison) and DecodeAt300.
  void prefill_150(bool then_150_more) {
    const std::vector<int32_t> prompt = test::random_tokens(then_150_more ? 300 : 150, vocab_, 3);
    SectionRows rows(rigs_.size());
    step({{1, std::span<const int32_t>(prompt.data(), 150), 0, true}}, rows);
    if (!then_150_more) {
      compare_(Section::Prefill150, rows);
      return;
    }
    step({{1, std::span<const int32_t>(prompt.data() + 150, 150), 150, true}}, rows);
    compare_(Section::Prefill2x150, rows);
    const std::vector<int32_t> next = test::random_tokens(4, vocab_, 4);
    SectionRows decode(rigs_.size());
    for (int i = 0; i < 4; ++i) step({{1, one(next, i), 300 + i, false}}, decode);
    compare_(Section::DecodeAt300, decode);
  }

  // Chats on slots 2-7 with prompts of 3, 3 + length_step, ... tokens, then BatchedDecode; with
  // `then_beside_a_prompt` BesideAPrompt too (slot 1 continued at 304: after prefill_150(true)).
  void decode_six_together(int length_step, bool then_beside_a_prompt) {
    std::vector<int64_t> lengths;
    for (int s = 0; s < 6; ++s) {
      const int n = 3 + length_step * s;
      const std::vector<int32_t> prompt = test::random_tokens(n, vocab_, 10 + s);
      for (test::ModelRuntime* rig : rigs_) rig->step({{2 + s, prompt, 0, false}}, slides(rig));
      lengths.push_back(n);
    }
    auto six = [&](const std::vector<int32_t>& next, int64_t past) {
      std::vector<BatchSequence> batch;
      for (int s = 0; s < 6; ++s)
        batch.push_back({2 + s, one(next, s), lengths[static_cast<size_t>(s)] + past, false});
      return batch;
    };
    SectionRows rows(rigs_.size());
    for (int past = 0; past < 6; ++past) {
      const std::vector<int32_t> next = test::random_tokens(6, vocab_, 100 + past);
      step(six(next, past), rows);
    }
    compare_(Section::BatchedDecode, rows);
    if (!then_beside_a_prompt) return;
    const std::vector<int32_t> next = test::random_tokens(6, vocab_, 200);
    const std::vector<int32_t> more = test::random_tokens(100, vocab_, 201);
    std::vector<BatchSequence> batch = six(next, 6);
    batch.push_back({1, more, 304, false});
    compare_(Section::BesideAPrompt, run(batch));
  }

 private:
  static std::span<const int32_t> one(const std::vector<int32_t>& tokens, int i) {
    return {&tokens[static_cast<size_t>(i)], 1};
  }
  bool slides(const test::ModelRuntime* rig) const { return gpu_slides_ && rig == rigs_.back(); }
  // One step on every rig, each one's logits appended to its rows.
  void step(const std::vector<BatchSequence>& batch, SectionRows& rows) {
    for (size_t i = 0; i < rigs_.size(); ++i) {
      const std::vector<float> logits = rigs_[i]->step(batch, slides(rigs_[i]));
      rows[i].insert(rows[i].end(), logits.begin(), logits.end());
    }
  }
  SectionRows run(const std::vector<BatchSequence>& batch) {
    SectionRows rows(rigs_.size());
    step(batch, rows);
    return rows;
  }

  std::vector<test::ModelRuntime*> rigs_;
  CompareSection compare_;
  bool gpu_slides_;
  int64_t vocab_;
};

}  // namespace granule::gpu_test
