// The split of a streamed layer's rows between the device and the host (memory/host_row_split.h):
// the measured share balances the host's time against PCIe's, and the host's first row is a
// whole granule of the device's rows.
#include "memory/host_row_split.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace granule
