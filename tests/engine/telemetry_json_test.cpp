// granule/telemetry_json.h: telemetry frames written as JSON lines (every field of every
// section, through for_each_field) and read back by an independent JSON library
// (nlohmann-json), and TelemetryRecorder's file and throttling. The engine writes frames only;
// the window's replay reads them (its tests: tests/app/app_replay_test.cpp).
#include "granule/telemetry_json.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "granule/error.h"

namespace granule {
namespace {

// ---------------------------------------------------------------------------------------
// A snapshot flattened to "section.field" -> text, written independently of the code under
// test (doubles in hex, strings byte by byte), so two snapshots compare field by field.

template <class T>
inline constexpr bool kIsVector = false;
template <class T>
inline constexpr bool kIsVector<std::vector<T>> = true;

template <class T>
std::string show(const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else if constexpr (std::is_floating_point_v<T>) {
    char text[64];
    std::snprintf(text, sizeof text, "%a", static_cast<double>(value));
    return text;
  } else if constexpr (std::is_same_v<T, std::string>) {
    std::string text = "\"";
    for (unsigned char c : value) text += std::to_string(c) + " ";
    return text + "\"";
  } else {
    static_assert(kIsVector<T> || std::is_same_v<T, Ledger>);
    std::string text = "[";
    for (const auto& item : value) text += show(item) + ",";
    return text + "]";
  }
}

using Flat = std::vector<std::pair<std::string, std::string>>;

template <class Section>
void flatten_section(const Section& section, const std::string& prefix, Flat& flat) {
  for_each_field(section, [&](std::string_view name, const auto& field) {
    flat.emplace_back(prefix + "." + std::string(name), show(field));
  });
}

Flat flatten(const TelemetrySnapshot& s) {
  Flat flat;
  flatten_section(s.device, "device", flat);
  flatten_section(s.kv, "kv", flat);
  flatten_section(s.scheduler, "scheduler", flat);
  flatten_section(s.graphs, "graphs", flat);
  flatten_section(s.streaming, "streaming", flat);
  flatten_section(s.experts, "experts", flat);
  flatten_section(s.throughput, "throughput", flat);
  flat.emplace_back("sequences", std::to_string(s.sequences.size()));
  for (size_t i = 0; i < s.sequences.size(); ++i) {
    flatten_section(s.sequences[i], "sequences[" + std::to_string(i) + "]", flat);
  }
  return flat;
}

void expect_same(const TelemetrySnapshot& expected, const TelemetrySnapshot& actual) {
  const Flat a = flatten(expected), b = flatten(actual);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second, b[i].second) << "field " << a[i].first;
  }
}

// Strings that need every kind of escape, and multi-byte UTF-8 that must pass unchanged.
const std::string kAwkward =
    "q\"uote\\back\nnl\ttab\x01\x1f\r/ caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";

// Gives every field of a section a value of its own, unlike its default and unlike the
// other fields' (`n` counts the fields filled so far), without naming a field.
struct Filler {
  int n = 0;

  template <class T>
  void operator()(std::string_view, T& field) {
    ++n;
    fill(field);
  }
  template <class T>
  void fill(T& field) {
    if constexpr (std::is_same_v<T, bool>) {
      field = true;  // every bool defaults to false
    } else if constexpr (std::is_same_v<T, int32_t>) {
      field = (n % 2 ? -1 : 1) * (100000 + n);
    } else if constexpr (std::is_same_v<T, int64_t>) {
      field = (int64_t{1} << 62) + 7 * n;
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      field = (uint64_t{1} << 63) + 12345 + 2 * n;  // > 2^53: not exact in a double
    } else if constexpr (std::is_same_v<T, double>) {
      field = n / 3.0 + 1e-7;
    } else if constexpr (std::is_same_v<T, std::string>) {
      field = kAwkward + std::to_string(n);
    } else if constexpr (std::is_same_v<T, std::vector<int32_t>>) {
      field = {n, -n, 0, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
    } else if constexpr (std::is_same_v<T, std::vector<uint8_t>>) {
      field = {1, 0, static_cast<uint8_t>(n), 255};
    } else if constexpr (std::is_same_v<T, std::vector<uint32_t>>) {
      field = {static_cast<uint32_t>(n), 0, std::numeric_limits<uint32_t>::max()};
    } else if constexpr (std::is_same_v<T, Ledger>) {
      for (size_t c = 0; c < field.size(); ++c) field[c] = (uint64_t{1} << 60) + 1000 * n + c;
    } else {
      static_assert(!sizeof(T), "a field type this test does not fill");
    }
  }
};

TelemetrySnapshot filled_snapshot() {
  TelemetrySnapshot s;
  Filler filler;
  for_each_field(s.device, filler);
  for_each_field(s.kv, filler);
  for_each_field(s.scheduler, filler);
  for_each_field(s.graphs, filler);
  for_each_field(s.streaming, filler);
  for_each_field(s.experts, filler);
  for_each_field(s.throughput, filler);
  for (int i = 0; i < 3; ++i) {
    s.sequences.emplace_back();
    for_each_field(s.sequences.back(), filler);
  }
  return s;
}

// A frame read back with nlohmann-json: every field the writer wrote must be there, with the
// JSON type of its C++ type (at() and get<T>() throw otherwise). Integers stay exact (the
// library keeps 64-bit integers apart from doubles).
template <class Section>
void read_section(const nlohmann::json& object, Section& section) {
  for_each_field(section, [&](std::string_view name, auto& field) {
    using T = std::decay_t<decltype(field)>;
    const nlohmann::json& value = object.at(std::string(name));
    if constexpr (std::is_same_v<T, Ledger>) {
      ASSERT_EQ(value.size(), kMemoryCategoryCount) << name;
      for (size_t c = 0; c < kMemoryCategoryCount; ++c) {
        const nlohmann::json& bytes =
            value.at(std::string(memory_category_name(static_cast<MemoryCategory>(c))));
        ASSERT_TRUE(bytes.is_number_unsigned()) << name;
        field[c] = bytes.get<uint64_t>();
      }
    } else {
      if constexpr (std::is_same_v<T, bool>) ASSERT_TRUE(value.is_boolean()) << name;
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        ASSERT_TRUE(value.is_number_integer()) << name;
      if constexpr (std::is_same_v<T, std::string>) ASSERT_TRUE(value.is_string()) << name;
      field = value.get<T>();
    }
  });
  EXPECT_EQ(object.size(), [&] {
    size_t n = 0;
    for_each_field(section, [&](std::string_view, const auto&) { ++n; });
    return n;
  }()) << "keys the section does not have";
}

TelemetrySnapshot parse_frame(const std::string& line, double* t_seconds = nullptr) {
  const nlohmann::json frame = nlohmann::json::parse(line);  // throws on invalid JSON or UTF-8
  EXPECT_TRUE(frame.is_object());
  TelemetrySnapshot s;
  read_section(frame.at("device"), s.device);
  read_section(frame.at("kv"), s.kv);
  read_section(frame.at("scheduler"), s.scheduler);
  read_section(frame.at("graphs"), s.graphs);
  read_section(frame.at("streaming"), s.streaming);
  read_section(frame.at("experts"), s.experts);
  read_section(frame.at("throughput"), s.throughput);
  for (const nlohmann::json& item : frame.at("sequences")) {
    read_section(item, s.sequences.emplace_back());
  }
  EXPECT_EQ(frame.size(), 9u) << "t, seven sections and sequences";
  if (t_seconds != nullptr) *t_seconds = frame.at("t").get<double>();
  return s;
}

TEST(TelemetryJson, RoundTripKeepsEveryFieldOfEverySection) {
  const TelemetrySnapshot original = filled_snapshot();
  // The fill reaches every field: none is left at its default.
  TelemetrySnapshot defaults;
  defaults.sequences.resize(3);
  const Flat filled = flatten(original), untouched = flatten(defaults);
  ASSERT_EQ(filled.size(), untouched.size());
  for (size_t i = 0; i < filled.size(); ++i) {
    if (filled[i].first == "sequences") continue;
    EXPECT_NE(filled[i].second, untouched[i].second) << filled[i].first << " kept its default";
  }

  const std::string line = telemetry_to_json(original, 12.503);
  EXPECT_EQ(line.find('\n'), std::string::npos) << "a frame is one line";
  double t = 0;
  const TelemetrySnapshot back = parse_frame(line, &t);
  EXPECT_EQ(t, 12.503);
  expect_same(original, back);

  // A few fields by name, so a fault shared by the writer and this test's reading cannot hide.
  EXPECT_EQ(back.device.name, original.device.name);
  EXPECT_EQ(back.device.name.substr(0, kAwkward.size()), kAwkward);
  EXPECT_EQ(back.streaming.h2d_bytes, original.streaming.h2d_bytes);
  EXPECT_GT(back.streaming.h2d_bytes, uint64_t{1} << 53);
  EXPECT_EQ(back.graphs.buckets, original.graphs.buckets);
  EXPECT_EQ(back.device.ledger, original.device.ledger);
  EXPECT_EQ(back.experts.resident, original.experts.resident);
  EXPECT_EQ(back.experts.routed, original.experts.routed);
  EXPECT_EQ(back.experts.bytes_streamed, original.experts.bytes_streamed);
  ASSERT_EQ(back.sequences.size(), 3u);
  EXPECT_EQ(back.sequences[2].id, original.sequences[2].id);
  EXPECT_NE(back.sequences[1].id, back.sequences[2].id);
  // Writing what was read gives the same line.
  EXPECT_EQ(telemetry_to_json(back, t), line);
}

TEST(TelemetryJson, WritesTheContractsShape) {
  TelemetrySnapshot s;
  s.device.ledger[static_cast<size_t>(MemoryCategory::KvPool)] = 9007199254740993ull;  // 2^53 + 1
  s.kv.pool_bytes = 18446744073709551615ull;
  s.scheduler.running = -3;
  s.graphs.buckets = {1, 2, 4};
  s.device.name = "a\"b\\c\nd\te\x02";
  const std::string line = telemetry_to_json(s, 0.25);
  EXPECT_EQ(line.rfind("{\"t\":0.25,\"device\":{", 0), 0u) << line;
  for (const char* section : {"\"kv\":{", "\"scheduler\":{", "\"graphs\":{", "\"streaming\":{",
                              "\"experts\":{", "\"throughput\":{"}) {
    EXPECT_NE(line.find(section), std::string::npos) << section;
  }
  EXPECT_NE(line.find("\"sequences\":[]"), std::string::npos);
  EXPECT_NE(line.find("\"pool_bytes\":18446744073709551615"), std::string::npos);
  EXPECT_NE(line.find("\"kv_pool\":9007199254740993"), std::string::npos);
  EXPECT_NE(line.find("\"weights\":0,\"staging\":0,\"kv\":0"), std::string::npos);
  EXPECT_NE(line.find("\"running\":-3"), std::string::npos);
  EXPECT_NE(line.find("\"buckets\":[1,2,4]"), std::string::npos);
  EXPECT_NE(line.find(R"("name":"a\"b\\c\nd\te\u0002")"), std::string::npos) << line;
  EXPECT_EQ(line.back(), '}');
}

TEST(TelemetryJson, ExpertSectionOfAMixtureOfExperts) {
  TelemetrySnapshot s;
  s.experts.n_layer = 2;
  s.experts.n_expert = 3;
  s.experts.resident = {1, 0, 1, 0, 0, 1};
  s.experts.routed = {5, 2, 0, 1, 0, 9};
  s.experts.streamed = {0, 2, 0, 1, 0, 0};
  s.experts.hits = 14;
  s.experts.misses = 3;
  s.experts.bytes_streamed = 3 * 4718592;
  s.experts.host_computed = 1;  // one of the misses computed by the CPU
  s.experts.bytes_host = 4718592;
  s.experts.tokens = 2;
  const std::string line = telemetry_to_json(s, 1);
  EXPECT_NE(line.find(R"("experts":{"n_layer":2,"n_expert":3,"resident":[1,0,1,0,0,1],)"
                      R"("routed":[5,2,0,1,0,9],"streamed":[0,2,0,1,0,0],"hits":14,"misses":3,)"
                      R"("bytes_streamed":14155776,"host_computed":1,"bytes_host":4718592,)"
                      R"("tokens":2,)"),
            std::string::npos)
      << line;
  expect_same(s, parse_frame(line));
  // A dense model's frame carries the section empty.
  EXPECT_NE(telemetry_to_json(TelemetrySnapshot{}, 0)
                .find(R"("experts":{"n_layer":0,"n_expert":0,"resident":[],"routed":[])"),
            std::string::npos);
}

TEST(ExpertTelemetry, IntervalsAddUpToTotalsAndANewShapeStartsAgain) {
  ExpertTelemetry totals;
  ExpertTelemetry a;
  a.n_layer = 1;
  a.n_expert = 4;
  a.resident = {1, 1, 0, 0};
  a.routed = {3, 1, 0, 2};
  a.streamed = {0, 0, 0, 2};
  a.hits = 4;
  a.misses = 2;
  a.bytes_streamed = 200;
  a.host_computed = 1;
  a.bytes_host = 100;
  a.tokens = 3;
  a.expert_bytes = 100;
  totals.add_interval(a);
  ExpertTelemetry b = a;
  b.resident = {1, 0, 0, 1};
  b.routed = {1, 0, 0, 5};
  b.streamed = {0, 0, 0, 0};
  b.hits = 6;
  b.misses = 0;
  b.bytes_streamed = 0;
  b.promotions = 1;
  b.demotions = 1;
  totals.add_interval(b);
  EXPECT_EQ(totals.resident, b.resident) << "the placement is the latest one";
  EXPECT_EQ(totals.routed, (std::vector<uint32_t>{4, 1, 0, 7}));
  EXPECT_EQ(totals.streamed, (std::vector<uint32_t>{0, 0, 0, 2}));
  EXPECT_EQ(totals.hits, 10u);
  EXPECT_EQ(totals.misses, 2u);
  EXPECT_EQ(totals.bytes_streamed, 200u);
  EXPECT_EQ(totals.host_computed, 2u);
  EXPECT_EQ(totals.bytes_host, 200u);
  EXPECT_EQ(totals.tokens, 6u);
  EXPECT_EQ(totals.promotions, 1u);
  EXPECT_EQ(totals.resident_count(), 2);
  ExpertTelemetry other;
  other.n_layer = 2;
  other.n_expert = 2;
  other.resident = {1, 1, 1, 1};
  other.routed = {1, 1, 1, 1};
  other.hits = 4;
  totals.add_interval(other);
  EXPECT_EQ(totals.routed, other.routed);
  EXPECT_EQ(totals.streamed, (std::vector<uint32_t>{0, 0, 0, 0}));
  EXPECT_EQ(totals.hits, 4u);
  EXPECT_EQ(totals.bytes_streamed, 0u);
}

TEST(TelemetryJson, NonFiniteDoublesAreWrittenAsZero) {
  TelemetrySnapshot s;
  s.throughput.decode_tokens_per_second = std::numeric_limits<double>::quiet_NaN();
  s.throughput.prompt_tokens_per_second = std::numeric_limits<double>::infinity();
  s.streaming.staging_occupancy = 0.5;
  const std::string line = telemetry_to_json(s, std::numeric_limits<double>::infinity());
  EXPECT_EQ(line.rfind("{\"t\":0,", 0), 0u);
  const TelemetrySnapshot back = parse_frame(line);
  EXPECT_EQ(back.throughput.decode_tokens_per_second, 0);
  EXPECT_EQ(back.throughput.prompt_tokens_per_second, 0);
  EXPECT_EQ(back.streaming.staging_occupancy, 0.5);
}

TEST(TelemetryJson, InvalidUtf8IsReplacedSoTheLineStaysUtf8) {
  TelemetrySnapshot s;
  s.graphs.last_fallback_reason = "ok \xC3\xA9 bad \xFF \xC3 end";
  // nlohmann-json refuses invalid UTF-8, so reading the line proves it is valid.
  const TelemetrySnapshot back = parse_frame(telemetry_to_json(s, 0));
  EXPECT_EQ(back.graphs.last_fallback_reason, "ok \xC3\xA9 bad \xEF\xBF\xBD \xEF\xBF\xBD end");
}

// ---------------------------------------------------------------------------------------
// TelemetryRecorder

class TelemetryRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("granule-telemetry-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = dir_ / "frames.jsonl";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The file's lines, each read back; fails the test on a line that does not parse.
  std::vector<std::pair<double, TelemetrySnapshot>> frames() const {
    std::ifstream in(path_, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(text.empty() || text.back() == '\n') << "the last line is not whole";
    std::vector<std::pair<double, TelemetrySnapshot>> result;
    size_t start = 0;
    while (start < text.size()) {
      const size_t end = text.find('\n', start);
      double t = -1;
      TelemetrySnapshot s = parse_frame(text.substr(start, end - start), &t);
      result.emplace_back(t, std::move(s));
      start = end + 1;
    }
    return result;
  }

  static TelemetrySnapshot step_snapshot(uint64_t step) {
    TelemetrySnapshot s;
    s.throughput.steps = step;
    s.device.name = "CPU (2 threads)";
    return s;
  }

  std::filesystem::path dir_, path_;
};

TEST_F(TelemetryRecorderTest, EveryFrameIsOneParseableLineStampedFromTheStart) {
  {
    TelemetryRecorder recorder(path_, 0.0);
    for (uint64_t i = 0; i < 5; ++i) {
      EXPECT_TRUE(recorder.record(step_snapshot(i)));
      EXPECT_EQ(recorder.frames_written(), i + 1);
      // Written and flushed at once: readable while the recorder is open.
      EXPECT_EQ(frames().size(), i + 1);
    }
  }
  const auto read = frames();
  ASSERT_EQ(read.size(), 5u);
  double previous_t = 0;
  for (size_t i = 0; i < read.size(); ++i) {
    EXPECT_EQ(read[i].second.throughput.steps, i);
    EXPECT_EQ(read[i].second.device.name, "CPU (2 threads)");
    EXPECT_GE(read[i].first, previous_t);
    previous_t = read[i].first;
  }
  EXPECT_LT(previous_t, 60.0);
}

TEST_F(TelemetryRecorderTest, ThrottlesAndWritesTheLastSkippedFrameAtClose) {
  TelemetryRecorder recorder(path_, 3600.0);
  EXPECT_TRUE(recorder.due());
  EXPECT_TRUE(recorder.record(step_snapshot(0)));
  EXPECT_FALSE(recorder.due());
  for (uint64_t i = 1; i < 50; ++i) EXPECT_FALSE(recorder.record(step_snapshot(i)));
  EXPECT_EQ(recorder.frames_written(), 1u);
  EXPECT_EQ(frames().size(), 1u);
  recorder.close();
  const auto read = frames();
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].second.throughput.steps, 0u);
  EXPECT_EQ(read[1].second.throughput.steps, 49u) << "the final frame is the last recorded";
  EXPECT_GE(read[1].first, read[0].first);
  recorder.close();  // a second close does nothing
  EXPECT_EQ(frames().size(), 2u);
  EXPECT_THROW(recorder.record(step_snapshot(50)), UsageError);
}

TEST_F(TelemetryRecorderTest, RecordNowWritesWhateverTheInterval) {
  TelemetryRecorder recorder(path_, 3600.0);
  recorder.record(step_snapshot(1));
  recorder.record(step_snapshot(2));  // skipped, pending
  recorder.record_now(step_snapshot(3));
  recorder.close();  // the pending frame was superseded: nothing more
  const auto read = frames();
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[1].second.throughput.steps, 3u);
}

TEST_F(TelemetryRecorderTest, DestructionWritesTheFinalFrame) {
  {
    TelemetryRecorder recorder(path_, 3600.0);
    recorder.record(step_snapshot(1));
    recorder.record(step_snapshot(7));
  }
  const auto read = frames();
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[1].second.throughput.steps, 7u);
}

TEST_F(TelemetryRecorderTest, CallingEveryStepWritesAtMostOneFramePerInterval) {
  const double interval = 0.05;
  TelemetryRecorder recorder(path_, interval);
  const auto start = std::chrono::steady_clock::now();
  uint64_t calls = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(400)) {
    recorder.record(step_snapshot(calls++));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  recorder.close();
  const auto read = frames();
  EXPECT_GT(calls, read.size());
  EXPECT_GE(read.size(), 3u);
  EXPECT_LE(static_cast<double>(read.size()), elapsed / interval + 2) << calls << " calls";
  for (size_t i = 1; i + 1 < read.size(); ++i) {
    EXPECT_GE(read[i].first - read[i - 1].first, interval * 0.999)
        << "frames " << i - 1 << ", " << i;
  }
  EXPECT_EQ(read.back().second.throughput.steps, calls - 1);
}

TEST_F(TelemetryRecorderTest, AnUnwritablePathIsOneLineNamingIt) {
  for (const std::filesystem::path& bad : {dir_ / "missing" / "frames.jsonl", dir_}) {
    try {
      TelemetryRecorder recorder(bad);
      ADD_FAILURE() << "opened " << bad;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("cannot write telemetry to " + bad.string() + ": ", 0), 0u) << what;
      EXPECT_GT(what.size(), ("cannot write telemetry to " + bad.string() + ": ").size());
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  if (::geteuid() != 0) {  // root writes anywhere
    std::filesystem::permissions(
        dir_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    try {
      TelemetryRecorder recorder(dir_ / "frames.jsonl");
      ADD_FAILURE() << "wrote into a read-only folder";
    } catch (const Error& e) {
      EXPECT_EQ(
          std::string(e.what()),
          "cannot write telemetry to " + (dir_ / "frames.jsonl").string() + ": Permission denied");
    }
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
  }
}

}  // namespace
}  // namespace granule
