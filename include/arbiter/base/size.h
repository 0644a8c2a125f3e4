// arbiter/base/size.h — human byte sizes (ARCHITECTURE.md "SIZE").
//
// Accepted forms (case-insensitive units, optional space before the unit):
//   "1048576"          bytes
//   "512KiB" "512MiB" "2GiB" "1TiB"   powers of 1024
//   "512KB"  "2GB"  "1TB" "10MB"      powers of 1000
//   "512K" "512M" "2G"                powers of 1024 (as in `ulimit`, Ollama)
//   "1.5GiB"                          fractions allowed with a unit
//   "75%"                             a percentage of `percent_base_bytes`
//
// Errors: kInvalidArgument naming the text and what is wrong; a percentage
// when `percent_base_bytes` is 0 ("percent not allowed here"); overflow.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "arbiter/base/status.h"

namespace arbiter {

// Parses `text`. `percent_base_bytes` is what 100% means (0: % rejected).
Result<uint64_t> ParseSize(std::string_view text, uint64_t percent_base_bytes = 0);

// "1.50 GiB", "512.00 MiB", "123 B".
std::string FormatSize(uint64_t size_bytes);

}  // namespace arbiter
