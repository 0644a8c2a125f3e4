// weights/internal/region_format.h — the byte layout of host floors and
// shared weight regions, shared by weight_store.cc (which creates and
// attaches regions) and region_format.cc (which computes and validates
// layouts). The layout itself is documented in
// arbiter/weights/region_format.h; Note [Layout] in region_format.cc says
// how it is computed and checked. Not thread-sensitive: pure functions over
// the caller's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/weights/weight_files.h"

namespace arbiter::weights_internal {

// Hex digits of a digest in a region's name and in error messages.
inline constexpr size_t kDigestHexChars = 16;

// Where tensors go, in bytes from the mapping's base (Note [Layout]).
struct Layout {
  std::vector<size_t> offsets;
  std::vector<size_t> nbytes;
  size_t payload_bytes = 0;
  size_t data_offset = 0;  // shared: first byte after header and table
  size_t total_bytes = 0;  // end of the last tensor (≥ data_offset)
};

// The system page size, in bytes.
size_t PageBytes();

// "tensor '<name>' (spec <index>)", for error messages.
std::string TensorLabel(const WeightSpec& spec, size_t index);

// prod(shape) × DTypeSize(dtype), in bytes. Errors: kInvalidArgument naming
// the tensor (negative dimension, unknown dtype, overflow).
Result<size_t> CheckedSpecBytes(const WeightSpec& spec, size_t index);

// The layout of `specs`: after a 64-byte header and the table when
// `with_header`, else from offset 0. total_bytes is bounded so that off_t,
// size_t and a page round-up all hold it. Errors: kInvalidArgument naming
// the tensor (negative dimension, unknown dtype, overflow) or the total.
Result<Layout> ComputeLayout(const std::vector<WeightSpec>& specs, bool with_header);

// The 16 lowercase hex digits of `digest`.
std::string DigestHex(uint64_t digest);

// Writes the header (ready = 0) and the table of `layout` at `base`.
// REQUIRES: `layout` came from ComputeLayout(specs, /*with_header=*/true)
// and [base, base + layout.total_bytes) is writable.
void WriteRegionHeader(uint8_t* base, uint64_t digest, const Layout& layout);

// Sets ready = 1 in the header at `base`. REQUIRES: WriteRegionHeader ran
// on `base` and the tensors are filled and synced (Note [Recovery],
// weight_store.cc).
void MarkRegionReady(uint8_t* base);

}  // namespace arbiter::weights_internal
