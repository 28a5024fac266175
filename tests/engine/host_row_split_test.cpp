// The split of a streamed layer's rows between the device and the host (memory/host_row_split.h):
// the measured share balances the host's time against PCIe's, the host's first row is a whole
// granule of the device's rows, and what a split pass copies of a layer's blob is exactly the
// device layout of each matrix's first rows, in the split and the GGUF layouts.
#include "memory/host_row_split.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "granule/gguf.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/weight_layout.h"
#include "support/temp_model.h"

namespace granule {
namespace {

TEST(HostRowShare, EqualBandwidthsSplitInHalves) { EXPECT_EQ(host_row_share_for(50e9, 50e9), 128); }

TEST(HostRowShare, TheHostTakesWhatItReadsInPciesTime) {
  // PCIe 55 GB/s, host 27.5 GB/s: the host reads a third while PCIe carries two thirds, both in
  // the same time.
  const int share = host_row_share_for(55e9, 27.5e9);
  EXPECT_EQ(share, 85);  // 256 / 3 = 85.3
  const double host_seconds = share / 256.0 / 27.5e9;
  const double pcie_seconds = (256 - share) / 256.0 / 55e9;
  EXPECT_NEAR(host_seconds / pcie_seconds, 1.0, 0.02);
  // A faster host takes more, never more than everything.
  EXPECT_GT(host_row_share_for(55e9, 100e9), share);
  EXPECT_LE(host_row_share_for(1e9, 1e15), kHostRowShareUnits);
}

TEST(HostRowShare, AnUnmeasuredSideGivesTheHostNothing) {
  EXPECT_EQ(host_row_share_for(55e9, 0), 0);
  EXPECT_EQ(host_row_share_for(0, 30e9), 0);
  EXPECT_EQ(host_row_share_for(-1, -1), 0);
}

TEST(HostRowBegin, HalfOfAnEightBModelsMatricesStartsAtTheMiddle) {
  EXPECT_EQ(host_row_begin(4096, 128), 2048);   // wq, wo, w_down
  EXPECT_EQ(host_row_begin(1024, 128), 512);    // wk, wv (8 KV heads of 128)
  EXPECT_EQ(host_row_begin(14336, 128), 7168);  // w_gate, w_up
}

TEST(HostRowBegin, TheDevicesRowsAreWholeGranules) {
  for (const int64_t rows : {256, 1000, 1024, 4096, 14336})
    for (int share = 1; share < kHostRowShareUnits; ++share) {
      const int64_t begin = host_row_begin(rows, share);
      // (begin == rows: the host takes none of it, whatever the rows)
      if (begin < rows) EXPECT_EQ(begin % kHostRowGranule, 0) << rows << " rows at " << share;
      EXPECT_GE(begin, 0);
      EXPECT_LE(begin, rows);
      // Within a granule of the exact split.
      const double exact = static_cast<double>(rows) * (256 - share) / 256.0;
      EXPECT_LE(std::abs(static_cast<double>(begin) - exact), kHostRowGranule / 2.0 + 1e-9)
          << rows << " rows at " << share;
    }
}

TEST(HostRowBegin, ShareZeroKeepsEveryRowOnTheDeviceAndAllGivesThemToTheHost) {
  EXPECT_EQ(host_row_begin(4096, 0), 4096);
  EXPECT_EQ(host_row_begin(4096, -1), 4096);
  EXPECT_EQ(host_row_begin(4096, 256), 0);
  // A host part that rounds away leaves the matrix whole on the device.
  EXPECT_EQ(host_row_begin(256, 8), 256);
  EXPECT_EQ(host_row_begin(64, 64), 64);
}

TEST(HostRowBegin, ALargerShareNeverGivesTheDeviceMoreRows) {
  for (const int64_t rows : {512, 4096, 14336}) {
    int64_t previous = rows;
    for (int share = 0; share <= kHostRowShareUnits; ++share) {
      const int64_t begin = host_row_begin(rows, share);
      EXPECT_LE(begin, previous) << rows << " rows at " << share;
      previous = begin;
    }
  }
}

// Two layers of small-256's shapes (256 wide, ff 1024) in Q4_0 and Q4_K: every matrix has 256 or
// more rows, so a share of 128 splits each at a whole granule.
struct SmallModel {
  explicit SmallModel(TensorType type) : file(spec(type), "host-row-split") {}
  test::TempModel file;
  std::unique_ptr<ModelFile> gguf = ModelFile::open(file.path);
  ModelConfig config = ModelConfig::from_gguf(*gguf);
  WeightTable weights = WeightTable::from_gguf(*gguf, config);

  static SyntheticModelSpec spec(TensorType type) {
    SyntheticModelSpec s = SyntheticModelSpec::preset("small-256");
    s.n_layer = 2;
    s.n_ff = 1024;
    s.weight_type = type;
    return s;
  }
};

TEST(DeviceRowRanges, APrefixOfEachMatrixIsItsFirstRowsInTheDeviceLayout) {
  for (const TensorType type : {TensorType::Q4_0, TensorType::Q4_K}) {
    const SmallModel m(type);
    for (const bool split : {true, false}) {
      const WeightLayout layout = weight_layout(m.config, m.weights, split);
      const LayerWeightLayout& layer = layout.layers[1];
      std::vector<uint8_t> blob(layer.bytes);
      layer.write(blob.data());
      std::array<int64_t, kDenseMatrices> first{};
      for (size_t i = 0; i < first.size(); ++i)
        first[i] = host_row_begin(layer.matrices[i].rows, 128);
      const std::vector<BlobRange> ranges = device_row_ranges(layer, first);
      ASSERT_EQ(ranges.size(), static_cast<size_t>(kDenseMatrices));
      uint64_t copied = 0;
      for (size_t i = 0; i < ranges.size(); ++i) {
        const MatrixLayout& ml = layer.matrices[i];
        const std::string what = std::string(split ? "split " : "GGUF ") +
                                 std::to_string(static_cast<int>(type)) + " matrix " +
                                 std::to_string(i);
        ASSERT_EQ(split, ml.split) << what;  // both types have the split layout
        ASSERT_GT(first[i], 0) << what;
        ASSERT_LT(first[i], ml.rows) << what << ": the host takes part of every matrix";
        EXPECT_EQ(ranges[i].offset, ml.offset) << what;
        EXPECT_EQ(ranges[i].bytes, static_cast<uint64_t>(first[i] * ml.row_bytes)) << what;
        EXPECT_LT(ranges[i].offset + ranges[i].bytes, ml.offset + ml.bytes) << what;
        // The range holds the device layout of the GGUF's first rows alone: a matrix of those
        // rows (a sub-tensor: GGUF rows are contiguous) writes the same bytes.
        TensorInfo prefix = *ml.tensor;
        prefix.dims = {ml.cols, first[i]};
        prefix.size_bytes = static_cast<uint64_t>(first[i] * ml.gguf_row_bytes);
        MatrixLayout head = ml;
        head.tensor = &prefix;
        head.rows = first[i];
        head.bytes = split ? ranges[i].bytes : prefix.size_bytes;
        std::vector<uint8_t> rows(head.bytes);
        head.write(rows.data());
        ASSERT_EQ(rows.size(), ranges[i].bytes) << what;
        EXPECT_EQ(std::memcmp(rows.data(), blob.data() + ranges[i].offset, rows.size()), 0) << what;
        copied += ranges[i].bytes;
      }
      EXPECT_LT(copied, layer.bytes);
      // Every row on the device: the whole matrices.
      std::array<int64_t, kDenseMatrices> all{};
      for (size_t i = 0; i < all.size(); ++i) all[i] = layer.matrices[i].rows;
      const std::vector<BlobRange> whole = device_row_ranges(layer, all);
      for (size_t i = 0; i < whole.size(); ++i)
        EXPECT_EQ(whole[i].bytes, layer.matrices[i].bytes) << "matrix " << i;
    }
  }
}

}  // namespace
}  // namespace granule
