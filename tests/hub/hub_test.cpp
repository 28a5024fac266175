// The Hub client against the fake hub (tests/hub/fake_hub.py): search, listings and quant
// labels, the fit from headers read by range (the same estimate as from the whole file),
// and downloads — cache hits, resume after a drop, a stall and a killed run, cancel, a wrong
// checksum, a token, 429 with Retry-After, 404, the disk-space check.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "granule/engine.h"
#include "granule/gguf.h"
#include "granule/testkit/synthetic_model.h"
#include "hub/downloader.h"
#include "hub/hub_cache.h"
#include "hub/model_files.h"
#include "hub/remote_fit.h"

namespace granule::hub {
namespace {
namespace fs = std::filesystem;

constexpr const char* kBig = "granule-test/Llama-3-8B-Shaped-GGUF";
constexpr const char* kTiny = "granule-test/Tiny-Chat-GGUF";
constexpr const char* kGated = "granule-test/Gated-Tiny-GGUF";

class FakeHub {
 public:
  explicit FakeHub(const fs::path& root) {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      execlp("python3", "python3", GRANULE_FAKE_HUB, "--root", root.c_str(), "--idle", "120",
             "--lifetime", "600", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    FILE* in = fdopen(out[0], "r");
    char line[64] = {};
    if (in != nullptr && std::fgets(line, sizeof line, in) != nullptr)
      std::sscanf(line, "PORT %d", &port_);
    if (in != nullptr) std::fclose(in);
  }
  ~FakeHub() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void control(const std::string& json) const {
    HttpRequest r;
    r.url = endpoint() + "/_control";
    // A POST through curl's command-line-free API: perform() does GET/HEAD only, so the
    // fault modes go through a tiny python call instead.
    const std::string cmd =
        "python3 -c \"import urllib.request,sys; urllib.request.urlopen(urllib.request.Request('" +
        r.url + "', data=sys.argv[1].encode(), method='POST'))\" '" + json + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  nlohmann::json stats() const {
    HttpRequest r;
    r.url = endpoint() + "/_stats";
    return nlohmann::json::parse(perform(r).response.body);
  }
  void reset() const { control(R"({"reset": true})"); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

class HubTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ =
        new fs::path(fs::temp_directory_path() / ("granule-hub-test-" + std::to_string(getpid())));
    fs::create_directories(*root_ / "repos");
    const std::string cmd = std::string(GRANULE_MAKE_HUB_REPOS) + " " + (*root_ / "repos").string();
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    hub_ = new FakeHub(*root_ / "repos");
    ASSERT_GT(hub_->port(), 0) << "the fake hub did not start";
  }
  static void TearDownTestSuite() {
    delete hub_;
    std::error_code ec;
    fs::remove_all(*root_, ec);
    delete root_;
  }
  void SetUp() override {
    hub_->reset();
    cache_ =
        *root_ /
        ("cache-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(cache_);
  }
  HubSettings settings(const std::string& token = "") const {
    HubSettings s;
    s.endpoint = hub_->endpoint();
    s.cache_dir = cache_;
    s.token = token;
    s.stall_timeout_seconds = 2;
    return s;
  }
  static fs::path repo_file(const std::string& repo, const std::string& file) {
    return *root_ / "repos" / repo / file;
  }

  static fs::path* root_;
  static FakeHub* hub_;
  fs::path cache_;
};
fs::path* HubTest::root_ = nullptr;
FakeHub* HubTest::hub_ = nullptr;

RepoFile file_named(const RepoListing& listing, const std::string& path) {
  for (const RepoFile& f : listing.files)
    if (f.path == path) return f;
  ADD_FAILURE() << "no " << path;
  return {};
}

TEST(QuantLabels, NamesAndSplitFilesGroupAsOneModel) {
  EXPECT_EQ(quant_label("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"), "Q4_K_M");
  EXPECT_EQ(quant_label("qwen2.5-7b-instruct-q5_0.gguf"), "Q5_0");
  EXPECT_EQ(quant_label("Model-IQ4_XS.gguf"), "IQ4_XS");
  EXPECT_EQ(quant_label("Model-UD-Q4_K_XL-00001-of-00002.gguf"), "UD-Q4_K_XL");
  EXPECT_EQ(quant_label("model-f16.gguf"), "F16");
  EXPECT_EQ(quant_label("Q8_0/Model-Q8_0-00002-of-00003.gguf"), "Q8_0");
  RepoListing listing{"o/r",
                      "main",
                      {{"README.md", 10, ""},
                       {"big/M-Q8_0-00002-of-00002.gguf", 200, "b"},
                       {"big/M-Q8_0-00001-of-00002.gguf", 300, "a"},
                       {"M-Q4_K_M.gguf", 100, "c"},
                       {"mmproj-M-f16.gguf", 50, "d"},
                       {"M-Q6_K-00001-of-00003.gguf", 100, "e"}}};
  const auto models = gguf_models(listing);
  ASSERT_EQ(models.size(), 4u);
  EXPECT_EQ(models[0].label, "Q4_K_M");
  EXPECT_EQ(models[1].label, "Q6_K");
  EXPECT_FALSE(models[1].split_complete);  // one of three shards listed
  EXPECT_EQ(models[2].label, "Q8_0");
  EXPECT_EQ(models[2].size_bytes, 500u);
  ASSERT_EQ(models[2].parts.size(), 2u);
  EXPECT_EQ(models[2].first().path, "big/M-Q8_0-00001-of-00002.gguf");
  EXPECT_TRUE(models[3].projector);
  EXPECT_EQ(&find_quant(models, "q4_k_m", "o/r"), &models[0]);
  EXPECT_THROW(find_quant(models, "Q3_K_S", "o/r"), UsageError);
}

TEST(HubSettingsTest, EnvironmentAsHuggingfaceHubReadsIt) {
  setenv("HF_HOME", "/tmp/hfhome", 1);
  unsetenv("HF_HUB_CACHE");
  unsetenv("HUGGINGFACE_HUB_CACHE");
  setenv("HF_ENDPOINT", "http://127.0.0.1:9/", 1);
  setenv("HF_TOKEN", " hf_abc \n", 1);
  HubSettings s = HubSettings::from_environment();
  EXPECT_EQ(s.endpoint, "http://127.0.0.1:9");
  EXPECT_EQ(s.cache_dir, fs::path("/tmp/hfhome/hub"));
  EXPECT_EQ(s.token, "hf_abc");
  setenv("HF_HUB_CACHE", "/tmp/elsewhere", 1);
  EXPECT_EQ(HubSettings::from_environment().cache_dir, fs::path("/tmp/elsewhere"));
  for (const char* v : {"HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN"}) unsetenv(v);
}

TEST_F(HubTest, SearchSortsByDownloadsOrRecencyWithArchitecture) {
  const HubClient client(settings());
  auto repos = client.search("shaped", SearchSort::Downloads);
  ASSERT_EQ(repos.size(), 2u);
  EXPECT_EQ(repos[0].id, kBig);  // 52000 downloads before 9000
  EXPECT_EQ(repos[0].architecture, "llama");
  EXPECT_EQ(repos[1].id, "other-org/Phi-Shaped-GGUF");
  EXPECT_EQ(repos[1].architecture, "phi3");
  EXPECT_FALSE(ModelConfig::architecture_supported(repos[1].architecture));
  EXPECT_TRUE(ModelConfig::architecture_supported(repos[0].architecture));
  repos = client.search("shaped", SearchSort::Recent);
  EXPECT_EQ(repos[0].id, "other-org/Phi-Shaped-GGUF");  // 2026-12-01 before 2026-10-02
  const auto gated = client.search("gated", SearchSort::Downloads);
  ASSERT_EQ(gated.size(), 1u);
  EXPECT_TRUE(gated[0].gated);
}

// The closing numbers: every quant of the 8B-shaped repository, fitted from its header
// alone, equals the estimate of the whole (local, sparse) file; the bytes fetched per file.
TEST_F(HubTest, FitOfEveryQuantFromHeadersAloneMatchesTheLocalFile) {
  const HubClient client(settings());
  const RepoListing listing = client.list_files(kBig);
  const auto models = gguf_models(listing);
  ASSERT_EQ(models.size(), 6u);
  EngineOptions options;
  options.device = DeviceKind::Cuda;  // a GPU's plan, no GPU needed with a budget
  options.vram_budget_bytes = 8ull << 30;
  options.context_length = 8192;
  options.max_sequences = 1;
  std::vector<QuantFit> fits;
  for (const GgufModel& m : models) {
    const QuantFit q = fit_remote(client, listing, m, options);
    ASSERT_TRUE(q.fit) << m.label << ": " << q.error;
    const FitEstimate local = Engine::estimate(repo_file(kBig, m.first().path), options);
    EXPECT_EQ(q.fit->weights_bytes, local.weights_bytes) << m.label;
    EXPECT_EQ(q.fit->resident_layers, local.resident_layers) << m.label;
    EXPECT_EQ(q.fit->streamed_bytes_per_pass, local.streamed_bytes_per_pass) << m.label;
    EXPECT_EQ(q.fit->kv_capacity_tokens, local.kv_capacity_tokens) << m.label;
    EXPECT_EQ(q.fit->block_type, local.block_type) << m.label;
    EXPECT_EQ(q.fit->file_bytes, m.size_bytes);
    // A few MB, never the file.
    EXPECT_LT(q.header_bytes_fetched, 16ull << 20) << m.label;
    EXPECT_LT(q.header_bytes_fetched, m.size_bytes / 100) << m.label;
    std::printf(
        "%-7s %9.2f GiB  %-22s header %5.2f MiB in %d requests  %s: %2d/%d layers resident, "
        "%5.2f GiB streamed/token, KV room %lld tokens, PCIe bound %.1f tok/s\n",
        m.label.c_str(), static_cast<double>(m.size_bytes) / (1ull << 30), q.block_mix.c_str(),
        static_cast<double>(q.header_bytes_fetched) / (1 << 20), q.header_requests,
        q.fit->fits    ? "fits"
        : q.fit->loads ? "streams"
                       : "no",
        q.fit->resident_layers, q.fit->resident_layers + q.fit->streamed_layers,
        static_cast<double>(q.fit->streamed_bytes_per_pass) / (1ull << 30),
        static_cast<long long>(q.fit->kv_capacity_tokens), q.fit->pcie_tokens_per_second);
    fits.push_back(q);
  }
  const int best = recommended_quant(fits);
  ASSERT_GE(best, 0);
  EXPECT_EQ(fits[static_cast<size_t>(best)].model.label, "Q6_K");  // Q8_0 streams 4 layers
  std::printf("recommended for an 8 GiB budget: %s\n",
              fits[static_cast<size_t>(best)].model.label.c_str());
  // Everything up to the recommendation fits; nothing larger fits.
  for (size_t i = 0; i < fits.size(); ++i)
    EXPECT_EQ(fits[i].fit->fits, i <= static_cast<size_t>(best)) << fits[i].model.label;
  const auto stats = hub_->stats();
  EXPECT_LT(stats["body_bytes"].get<uint64_t>(), 64ull << 20);
}

TEST_F(HubTest, UnsupportedArchitectureIsAnErrorNotAFit) {
  const HubClient client(settings());
  const RepoListing listing = client.list_files("other-org/Phi-Shaped-GGUF");
  const auto models = gguf_models(listing);
  ASSERT_EQ(models.size(), 1u);
  const QuantFit q = fit_remote(client, listing, models[0], {});
  EXPECT_FALSE(q.fit);
  EXPECT_NE(q.error.find("unsupported architecture 'phi3'"), std::string::npos) << q.error;
  EXPECT_EQ(q.architecture, "phi3");
}

TEST_F(HubTest, DownloadVerifiesAndLaysOutTheCacheLikeHuggingfaceHub) {
  const HubClient client(settings());
  const RepoListing listing = client.list_files(kTiny);
  const RepoFile f = file_named(listing, "Tiny-Chat-Q8_0.gguf");
  const Downloader d(client, HubCache(cache_));
  std::vector<DownloadProgress> seen;
  const fs::path path =
      d.download(kTiny, f, "main", [&](const DownloadProgress& p) { seen.push_back(p); });
  EXPECT_TRUE(fs::is_symlink(path));
  EXPECT_EQ(fs::read_symlink(path).string().substr(0, 9), "../../blo");
  EXPECT_EQ(sha256_file(path), f.sha256);
  EXPECT_EQ(sha256_file(path), sha256_file(repo_file(kTiny, f.path)));
  EXPECT_TRUE(fs::exists(cache_ / "models--granule-test--Tiny-Chat-GGUF" / "blobs" / f.sha256));
  EXPECT_TRUE(fs::exists(cache_ / "models--granule-test--Tiny-Chat-GGUF" / "refs" / "main"));
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().state, "verifying");
  EXPECT_EQ(seen.back().done_bytes, f.size);
  // The model in the cache loads.
  EXPECT_NO_THROW(Engine::estimate(path, {}));
  // A second pull is a cache hit without a request.
  hub_->reset();
  EXPECT_EQ(d.download(kTiny, f), path);
  EXPECT_EQ(hub_->stats()["requests"].get<int>(), 0);
  const auto cached = HubCache(cache_).list_gguf();
  ASSERT_EQ(cached.size(), 1u);
  EXPECT_EQ(cached[0].repo, kTiny);
  EXPECT_EQ(cached[0].file, f.path);
}

TEST_F(HubTest, DroppedConnectionsAreResumedWithRange) {
  const HubClient client(settings());
  const RepoFile f = file_named(client.list_files(kTiny), "Tiny-Chat-F32.gguf");
  hub_->control(R"({"drop_after": 300000, "drop_times": 2})");
  const Downloader d(client, HubCache(cache_));
  const fs::path path = d.download(kTiny, f);
  EXPECT_EQ(sha256_file(path), f.sha256);
  const auto stats = hub_->stats();
  EXPECT_GE(stats["range_requests"].get<int>(), 2);
  // Each byte crossed once: no restart from zero.
  EXPECT_EQ(stats["body_bytes"].get<uint64_t>(), f.size);
}

TEST_F(HubTest, AStallIsResumed) {
  const HubClient client(settings());
  const RepoFile f = file_named(client.list_files(kTiny), "Tiny-Chat-Q8_0.gguf");
  hub_->control(R"({"stall_after": 100000, "stall_seconds": 6, "stall_times": 1})");
  const Downloader d(client, HubCache(cache_));
  std::vector<std::string> states;
  const fs::path path =
      d.download(kTiny, f, "main", [&](const DownloadProgress& p) { states.push_back(p.state); });
  EXPECT_EQ(sha256_file(path), f.sha256);
  EXPECT_NE(std::find(states.begin(), states.end(), "resuming after a stall"), states.end());
}

TEST_F(HubTest, AKilledDownloadResumesFromItsPartialFile) {
  const HubClient client(settings());
  const RepoFile f = file_named(client.list_files(kTiny), "Tiny-Chat-F32.gguf");
  // What a killed run leaves: the first part in blobs/<sha>.incomplete.
  const HubCache cache(cache_);
  fs::create_directories(cache.incomplete_path(kTiny, f.sha256).parent_path());
  {
    std::ifstream in(repo_file(kTiny, f.path), std::ios::binary);
    std::vector<char> half(f.size / 2);
    in.read(half.data(), static_cast<std::streamsize>(half.size()));
    std::ofstream(cache.incomplete_path(kTiny, f.sha256), std::ios::binary)
        .write(half.data(), static_cast<std::streamsize>(half.size()));
  }
  const Downloader d(client, cache);
  const fs::path path = d.download(kTiny, f);
  EXPECT_EQ(sha256_file(path), f.sha256);
  EXPECT_EQ(hub_->stats()["body_bytes"].get<uint64_t>(), f.size - f.size / 2);
  EXPECT_FALSE(fs::exists(cache.incomplete_path(kTiny, f.sha256)));
}

TEST_F(HubTest, CancelKeepsThePartialFileAndTheNextRunResumes) {
  const HubClient client(settings());
  const RepoFile f = file_named(client.list_files(kTiny), "Tiny-Chat-F32.gguf");
  hub_->control(R"({"throttle": 2000000})");
  const Downloader d(client, HubCache(cache_));
  std::atomic<bool> cancel{false};
  EXPECT_THROW(d.download(
                   kTiny, f, "main",
                   [&](const DownloadProgress& p) {
                     if (p.done_bytes > 200000) cancel = true;
                   },
                   &cancel),
               DownloadStopped);
  const fs::path partial = HubCache(cache_).incomplete_path(kTiny, f.sha256);
  ASSERT_TRUE(fs::exists(partial));
  const auto kept = fs::file_size(partial);
  EXPECT_GT(kept, 200000u);
  hub_->reset();
  EXPECT_EQ(sha256_file(d.download(kTiny, f)), f.sha256);
  EXPECT_EQ(hub_->stats()["body_bytes"].get<uint64_t>(), f.size - kept);
  // Cancel (not pause) discards what was kept.
  d.discard_partial(kTiny, f);
}

TEST_F(HubTest, AWrongChecksumDeletesThePartialFileAndSaysSo) {
  hub_->control(R"({"wrong_checksum": true})");
  const HubClient client(settings());
  const RepoFile f = file_named(client.list_files(kTiny), "Tiny-Chat-Q8_0.gguf");
  const Downloader d(client, HubCache(cache_));
  try {
    d.download(kTiny, f);
    FAIL() << "no error";
  } catch (const HubError& e) {
    EXPECT_NE(std::string(e.what()).find("SHA-256 mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("partial file was deleted"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(HubCache(cache_).incomplete_path(kTiny, f.sha256)));
  EXPECT_FALSE(HubCache(cache_).find(kTiny, f.path));
}

TEST_F(HubTest, AGatedRepositoryWantsTheRightToken) {
  try {
    HubClient(settings()).list_files(kGated);
    FAIL() << "no error";
  } catch (const HubError& e) {
    EXPECT_EQ(e.http_status, 401);
    EXPECT_NE(std::string(e.what()).find("set HF_TOKEN"), std::string::npos) << e.what();
  }
  try {
    HubClient(settings("hf_wrong")).list_files(kGated);
    FAIL() << "no error";
  } catch (const HubError& e) {
    EXPECT_EQ(e.http_status, 403);
    EXPECT_NE(std::string(e.what()).find("accept its licence"), std::string::npos) << e.what();
  }
  const HubClient client(settings("hf_granule_test"));
  const RepoListing listing = client.list_files(kGated);
  const Downloader d(client, HubCache(cache_));
  const RepoFile f = file_named(listing, "Gated-Tiny-Q8_0.gguf");
  EXPECT_EQ(sha256_file(d.download(kGated, f)), f.sha256);
}

TEST_F(HubTest, RateLimitWaitsForRetryAfterOrSaysWhen) {
  hub_->control(R"({"rate_limit": 1, "retry_after": 1})");
  const HubClient client(settings());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(client.list_files(kTiny).files.size(), 3u);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(900));
  hub_->control(R"({"rate_limit": 5, "retry_after": 3600})");
  try {
    client.list_files(kTiny);
    FAIL() << "no error";
  } catch (const HubError& e) {
    EXPECT_EQ(e.http_status, 429);
    EXPECT_EQ(e.retry_after_seconds, 3600);
    EXPECT_NE(std::string(e.what()).find("retry in 3600 s"), std::string::npos) << e.what();
  }
  // A download waits out a short one too.
  hub_->reset();
  const RepoFile f = file_named(client.list_files(kTiny), "Tiny-Chat-Q8_0.gguf");
  hub_->control(R"({"rate_limit": 2, "retry_after": 1})");
  EXPECT_EQ(sha256_file(Downloader(client, HubCache(cache_)).download(kTiny, f)), f.sha256);
}

TEST_F(HubTest, MissingRepositoryOrFileIs404WithAClearMessage) {
  const HubClient client(settings());
  try {
    client.list_files("granule-test/No-Such-GGUF");
    FAIL() << "no error";
  } catch (const HubError& e) {
    EXPECT_EQ(e.http_status, 404);
    EXPECT_NE(std::string(e.what()).find("not found on the Hub"), std::string::npos) << e.what();
  }
  RepoFile missing{"Nope-Q4_0.gguf", 10, std::string(64, 'a')};
  EXPECT_THROW(Downloader(client, HubCache(cache_)).download(kTiny, missing), HubError);
  EXPECT_THROW(check_repo_id("no-slash"), UsageError);
  EXPECT_THROW(check_repo_id("a/../b"), UsageError);
}

TEST_F(HubTest, NotEnoughDiskSpaceIsRefusedBeforeTheTransfer) {
  const HubClient client(settings());
  const RepoFile f = file_named(client.list_files(kTiny), "Tiny-Chat-Q8_0.gguf");
  hub_->control(R"({"claim_size": 1125899906842624})");  // 1 PiB
  try {
    Downloader(client, HubCache(cache_)).download(kTiny, f);
    FAIL() << "no error";
  } catch (const HubError& e) {
    EXPECT_NE(std::string(e.what()).find("of disk space"), std::string::npos) << e.what();
  }
  EXPECT_EQ(hub_->stats()["body_bytes"].get<uint64_t>(), 0u);
}

// parse_header over a prefix: HeaderIncomplete with the bytes it needs, then the same table
// as ModelFile::open.
TEST(ParseHeader, AsksForMoreBytesThenMatchesOpen) {
  const fs::path path =
      fs::temp_directory_path() / ("granule-parse-header-" + std::to_string(getpid()) + ".gguf");
  write_synthetic_model(SyntheticModelSpec::preset("tiny"), path);
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  const auto full = ModelFile::open(path);
  std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + 100);
  uint64_t needed = 0;
  try {
    ModelFile::parse_header(prefix, bytes.size(), "tiny");
    FAIL() << "parsed from 100 bytes";
  } catch (const HeaderIncomplete& e) {
    needed = e.needed_bytes;
  }
  EXPECT_GT(needed, 100u);
  // Grow until it parses, as fetch_header does.
  std::unique_ptr<ModelFile> header;
  while (!header) {
    try {
      header = ModelFile::parse_header(
          std::vector<uint8_t>(bytes.begin(),
                               bytes.begin() + static_cast<std::ptrdiff_t>(prefix.size())),
          bytes.size(), "tiny");
    } catch (const HeaderIncomplete& e) {
      ASSERT_GT(e.needed_bytes, prefix.size());
      prefix.resize(
          std::min<size_t>(bytes.size(), std::max<size_t>(e.needed_bytes, prefix.size() * 2)));
    }
  }
  EXPECT_LT(full->data_offset(), bytes.size());
  EXPECT_EQ(header->data_offset(), full->data_offset());
  ASSERT_EQ(header->tensors().size(), full->tensors().size());
  for (size_t i = 0; i < full->tensors().size(); ++i) {
    EXPECT_EQ(header->tensors()[i].name, full->tensors()[i].name);
    EXPECT_EQ(header->tensors()[i].size_bytes, full->tensors()[i].size_bytes);
    EXPECT_EQ(header->tensors()[i].data, nullptr);
  }
  EXPECT_EQ(header->metadata().size(), full->metadata().size());
  std::vector<uint8_t> cut(bytes.begin(),
                           bytes.begin() + static_cast<std::ptrdiff_t>(full->data_offset()));
  try {
    ModelFile::parse_header(cut, full->data_offset(), "tiny");
    FAIL() << "a file too short for its tensors parsed";
  } catch (const HeaderIncomplete&) {
    FAIL() << "a truncated file reported as an incomplete header";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("past the end"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

}  // namespace
}  // namespace granule::hub
