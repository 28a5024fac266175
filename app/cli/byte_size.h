// Sizes typed by a user ("6GiB", "6 GiB", "6144MiB", "6G", "6.5GB") read into bytes, for
// --vram-budget. Kept apart from CLI11 so the parser is tested on its own.
#pragma once
#include <cstdint>
#include <string_view>

namespace granule::cli {

// A positive number (digits, at most one '.') and an optional unit, case-insensitive, with
// spaces allowed around and between them:
//   B; KiB MiB GiB TiB and K M G T (powers of 1024); KB MB GB TB (powers of 1000).
// A bare number is MiB. The result is rounded to the nearest byte. Throws UsageError
// ("'12XB' is not a size; write it like 6GiB or 6144MiB") for anything else, for zero and
// for sizes past 2^64 - 1 bytes.
uint64_t parse_byte_size(std::string_view text);

}  // namespace granule::cli
