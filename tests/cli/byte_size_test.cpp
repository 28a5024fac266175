// Tests of parse_byte_size (app/cli/byte_size.h), the reader of --vram-budget: each unit's
// multiplier, spaces, fractions, bare numbers as MiB, and one clear error for junk, zero,
// negative and overflowing sizes.
#include "byte_size.h"

#include <gtest/gtest.h>

#include <string>

#include "granule/error.h"

namespace granule::cli {
namespace {

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kTiB = 1ull << 40;

TEST(ByteSize, BinaryUnitsArePowersOf1024) {
  EXPECT_EQ(parse_byte_size("6GiB"), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("6144MiB"), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("512KiB"), 512 * kKiB);
  EXPECT_EQ(parse_byte_size("2TiB"), 2 * kTiB);
  EXPECT_EQ(parse_byte_size("4096B"), 4096u);
}

TEST(ByteSize, SingleLetterUnitsAreBinary) {
  EXPECT_EQ(parse_byte_size("6G"), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("300M"), 300 * kMiB);
  EXPECT_EQ(parse_byte_size("64K"), 64 * kKiB);
  EXPECT_EQ(parse_byte_size("1T"), kTiB);
}

TEST(ByteSize, TwoLetterUnitsAreDecimal) {
  EXPECT_EQ(parse_byte_size("6.5GB"), 6'500'000'000u);
  EXPECT_EQ(parse_byte_size("100MB"), 100'000'000u);
  EXPECT_EQ(parse_byte_size("3KB"), 3000u);
  EXPECT_EQ(parse_byte_size("1TB"), 1'000'000'000'000u);
}

TEST(ByteSize, UnitsIgnoreCase) {
  EXPECT_EQ(parse_byte_size("6gib"), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("6GIB"), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("6g"), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("2gb"), 2'000'000'000u);
}

TEST(ByteSize, SpacesAroundAndBetweenAreAllowed) {
  EXPECT_EQ(parse_byte_size("6 GiB"), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("  6GiB  "), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("6\tGiB"), 6 * kGiB);
}

TEST(ByteSize, BareNumbersAreMiB) {
  EXPECT_EQ(parse_byte_size("6144"), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("1"), kMiB);
  EXPECT_EQ(parse_byte_size("0.5"), kMiB / 2);
}

TEST(ByteSize, FractionsRoundToTheNearestByte) {
  EXPECT_EQ(parse_byte_size("1.5GiB"), kGiB + kGiB / 2);
  EXPECT_EQ(parse_byte_size(".5GiB"), kGiB / 2);
  EXPECT_EQ(parse_byte_size("6.GiB"), 6 * kGiB);
  EXPECT_EQ(parse_byte_size("1.0001KB"), 1000u);  // 1000.1 bytes
  EXPECT_EQ(parse_byte_size("0.0006KB"), 1u);     // 0.6 bytes
}

// The error message names the text and shows how to write a size.
void expect_rejected(const std::string& text, const std::string& why) {
  try {
    parse_byte_size(text);
    ADD_FAILURE() << "'" << text << "' was accepted";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'" + text + "' " + why), std::string::npos) << message;
    EXPECT_NE(message.find("write it like 6GiB or 6144MiB"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(ByteSize, JunkIsRejected) {
  for (const char* junk : {"", " ", "GiB", "12XB", "6GiBs", "6 G i B", "six", "6,5GB", "1.2.3G",
                           "1e9", "0x10M", "inf", "nan", "+6G", "6GiB 2", ".", "--6"})
    expect_rejected(junk, "is not a size");
}

TEST(ByteSize, NegativeSizesAreRejected) {
  expect_rejected("-6GiB", "is not a size");
  expect_rejected("-1", "is not a size");
}

TEST(ByteSize, ZeroIsRejected) {
  for (const char* zero : {"0", "0GiB", "0.0MiB", "000", "0.4B"})
    expect_rejected(zero, "is no memory at all");
}

TEST(ByteSize, SizesPastTheLargestIntegerAreRejected) {
  EXPECT_EQ(parse_byte_size("16777215TiB"), 16777215 * kTiB);   // below 2^64
  expect_rejected("16777216TiB", "is larger than any memory");  // 2^64
  expect_rejected("99999999999999999999999999999999999999GB", "is larger than any memory");
}

}  // namespace
}  // namespace granule::cli
