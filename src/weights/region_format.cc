// weights/region_format.cc — the layout of host floors and shared weight
// regions: where each tensor goes (ComputeLayout), the header and table a
// creator writes (WriteRegionHeader, MarkRegionReady), and the checks an
// attacher makes before it uses a region (ValidateSharedRegion). The format
// is documented in arbiter/weights/region_format.h; the stores that use it
// are in weight_store.cc.
//
// Note [Layout]
//   One computation, ComputeLayout(), places every tensor: a private floor
//   packs the tensors from offset 0, a shared region after its 64-byte
//   header and its {offset, nbytes} table; every tensor starts at a
//   kHostFloorAlignment-aligned offset and a mapping is page-aligned, so
//   every array is 64-byte aligned. The creator writes the layout it
//   computed; an attacher recomputes it from its own specs and demands that
//   the header and the table equal it (ValidateSharedRegion), so it never
//   trusts an offset or a size read from the region (docs/weights.md,
//   'Trusting a READY region'), and it maps only the bytes its own layout
//   needs, after checking the object is at least that long. Every read of
//   region bytes is bounds-checked first.
#include "arbiter/weights/region_format.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "arbiter/weights/weight_store.h"
#include "weights/internal/region_format.h"

namespace arbiter {
namespace {

constexpr char kMagic[8] = {'A', 'R', 'B', 'W', 'F', 'L', 'R', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kTableEntryBytes = 16;  // {offset u64, nbytes u64}
// Header field offsets, in bytes.
constexpr size_t kVersionAt = 8;
constexpr size_t kReadyAt = 12;
constexpr size_t kDigestAt = 16;
constexpr size_t kRegionBytesAt = 24;
constexpr size_t kNTensorsAt = 32;
constexpr size_t kTableOffsetAt = 40;
constexpr size_t kDataOffsetAt = 48;
constexpr size_t kReservedAt = 56;

uint64_t LoadLE(const uint8_t* p, int n_bytes) {
  uint64_t v = 0;
  for (int i = n_bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void StoreLE(uint8_t* p, uint64_t v, int n_bytes) {
  for (int i = 0; i < n_bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

bool AlignUp(uint64_t v, uint64_t alignment, uint64_t* out) {
  uint64_t bumped;
  if (__builtin_add_overflow(v, alignment - 1, &bumped)) return false;
  *out = bumped / alignment * alignment;
  return true;
}

}  // namespace

namespace weights_internal {

size_t PageBytes() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

std::string TensorLabel(const WeightSpec& spec, size_t index) {
  return "tensor '" + spec.name + "' (spec " + std::to_string(index) + ")";
}

namespace {

// CheckedSpecBytes for a ggml block type: rows × row bytes.
Result<size_t> CheckedGgmlSpecBytes(const WeightSpec& spec, size_t index) {
  const std::optional<GgmlTypeTraits> t = GgmlTypeTraitsOf(*spec.ggml_type);
  if (!t) {
    return InvalidArgumentError(TensorLabel(spec, index) + ": unknown ggml type " +
                                std::to_string(static_cast<uint32_t>(*spec.ggml_type)));
  }
  if (spec.shape.empty()) {
    return InvalidArgumentError(TensorLabel(spec, index) + ": a " + std::string(t->name) +
                                " tensor needs at least one dimension");
  }
  uint64_t rows = 1;
  for (size_t axis = 0; axis < spec.shape.size(); ++axis) {
    const int64_t d = spec.shape[axis];
    if (d < 0) {
      return InvalidArgumentError(TensorLabel(spec, index) + ": dimension " +
                                  std::to_string(axis) + " is " + std::to_string(d) +
                                  "; dimensions must be >= 0");
    }
    if (axis + 1 < spec.shape.size() &&
        __builtin_mul_overflow(rows, static_cast<uint64_t>(d), &rows)) {
      return InvalidArgumentError(TensorLabel(spec, index) + ": size overflows 64 bits");
    }
  }
  const std::optional<size_t> row_bytes = GgmlRowBytes(*spec.ggml_type, spec.shape.back());
  if (!row_bytes) {
    return InvalidArgumentError(TensorLabel(spec, index) + ": rows of " +
                                std::to_string(spec.shape.back()) + " elements are not whole " +
                                std::string(t->name) + " blocks of " +
                                std::to_string(t->block_elems));
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(rows, static_cast<uint64_t>(*row_bytes), &bytes)) {
    return InvalidArgumentError(TensorLabel(spec, index) + ": size overflows 64 bits");
  }
  return static_cast<size_t>(bytes);
}

}  // namespace

Result<size_t> CheckedSpecBytes(const WeightSpec& spec, size_t index) {
  if (spec.ggml_type) return CheckedGgmlSpecBytes(spec, index);
  const uint64_t elem = DTypeSize(spec.dtype);
  if (elem == 0) {
    return InvalidArgumentError(TensorLabel(spec, index) + ": unknown dtype " +
                                std::to_string(static_cast<int>(spec.dtype)));
  }
  bool has_zero = false;
  for (size_t axis = 0; axis < spec.shape.size(); ++axis) {
    if (spec.shape[axis] < 0) {
      return InvalidArgumentError(TensorLabel(spec, index) + ": dimension " +
                                  std::to_string(axis) + " is " +
                                  std::to_string(spec.shape[axis]) +
                                  "; dimensions must be >= 0");
    }
    if (spec.shape[axis] == 0) has_zero = true;
  }
  if (has_zero) return size_t{0};
  uint64_t bytes = elem;
  for (int64_t d : spec.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return InvalidArgumentError(TensorLabel(spec, index) +
                                  ": size overflows 64 bits; check the shape");
    }
  }
  return bytes;
}

Result<Layout> ComputeLayout(const std::vector<WeightSpec>& specs, bool with_header) {
  Layout layout;
  layout.offsets.reserve(specs.size());
  layout.nbytes.reserve(specs.size());
  uint64_t cursor = 0;
  if (with_header) {
    uint64_t table_bytes;
    if (__builtin_mul_overflow(static_cast<uint64_t>(specs.size()), kTableEntryBytes,
                               &table_bytes) ||
        __builtin_add_overflow(table_bytes, kHeaderBytes, &cursor) ||
        !AlignUp(cursor, kHostFloorAlignment, &cursor)) {
      return InvalidArgumentError(std::to_string(specs.size()) +
                                  " tensors overflow the region table");
    }
  }
  layout.data_offset = cursor;
  for (size_t i = 0; i < specs.size(); ++i) {
    ARBITER_ASSIGN_OR_RETURN(uint64_t bytes, CheckedSpecBytes(specs[i], i));
    uint64_t offset;
    if (!AlignUp(cursor, kHostFloorAlignment, &offset) ||
        __builtin_add_overflow(offset, bytes, &cursor) ||
        __builtin_add_overflow(layout.payload_bytes, bytes, &layout.payload_bytes)) {
      return InvalidArgumentError(TensorLabel(specs[i], i) +
                                  ": the floor's size overflows 64 bits");
    }
    layout.offsets.push_back(offset);
    layout.nbytes.push_back(bytes);
  }
  // Bounded so off_t (ftruncate), size_t and PageRound all hold it.
  if (cursor > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - PageBytes()) {
    return InvalidArgumentError("the floor's size (" + std::to_string(cursor) +
                                " bytes) overflows the address space");
  }
  layout.total_bytes = cursor;
  return layout;
}

std::string DigestHex(uint64_t digest) {
  char buf[kDigestHexChars + 1];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

void WriteRegionHeader(uint8_t* base, uint64_t digest, const Layout& layout) {
  std::memcpy(base, kMagic, sizeof(kMagic));
  StoreLE(base + kVersionAt, kFormatVersion, 4);
  StoreLE(base + kReadyAt, 0, 4);
  StoreLE(base + kDigestAt, digest, 8);
  StoreLE(base + kRegionBytesAt, layout.total_bytes, 8);
  StoreLE(base + kNTensorsAt, layout.offsets.size(), 8);
  StoreLE(base + kTableOffsetAt, kHeaderBytes, 8);
  StoreLE(base + kDataOffsetAt, layout.data_offset, 8);
  for (size_t i = 0; i < layout.offsets.size(); ++i) {
    uint8_t* entry = base + kHeaderBytes + i * kTableEntryBytes;
    StoreLE(entry, layout.offsets[i], 8);
    StoreLE(entry + 8, layout.nbytes[i], 8);
  }
}

void MarkRegionReady(uint8_t* base) { StoreLE(base + kReadyAt, 1, 4); }

}  // namespace weights_internal

using weights_internal::ComputeLayout;
using weights_internal::DigestHex;
using weights_internal::Layout;
using weights_internal::TensorLabel;

Result<std::vector<size_t>> ValidateSharedRegion(const uint8_t* data, size_t size,
                                                   uint64_t digest,
                                                   const std::vector<WeightSpec>& specs) {
  if (data == nullptr || size < kHeaderBytes) {
    return DataLossError("header: the region is " + std::to_string(size) +
                         " bytes, smaller than its " + std::to_string(kHeaderBytes) +
                         "-byte header (truncated)");
  }
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    return DataLossError("magic: not \"ARBWFLR1\" (not an arbiter weight region)");
  }
  const uint64_t version = LoadLE(data + kVersionAt, 4);
  if (version != kFormatVersion) {
    return DataLossError("version: " + std::to_string(version) + ", this build reads " +
                         std::to_string(kFormatVersion));
  }
  const uint64_t stored_digest = LoadLE(data + kDigestAt, 8);
  if (stored_digest != digest) {
    return DataLossError("digest: region has " + DigestHex(stored_digest) + ", expected " +
                         DigestHex(digest));
  }
  const uint64_t ready = LoadLE(data + kReadyAt, 4);
  if (ready != 1) {
    return DataLossError("not ready (ready = " + std::to_string(ready) +
                         "): the region is incomplete (being filled, or its filler died)");
  }
  ARBITER_ASSIGN_OR_RETURN(Layout layout, ComputeLayout(specs, /*with_header=*/true));
  const uint64_t region_bytes = LoadLE(data + kRegionBytesAt, 8);
  if (region_bytes > size) {
    return DataLossError("region_bytes: " + std::to_string(region_bytes) +
                         " but the mapping holds only " + std::to_string(size) + " (truncated)");
  }
  if (region_bytes != layout.total_bytes) {
    return DataLossError("region_bytes: " + std::to_string(region_bytes) +
                         ", the layout of the specs needs " + std::to_string(layout.total_bytes));
  }
  const uint64_t n_tensors = LoadLE(data + kNTensorsAt, 8);
  if (n_tensors != specs.size()) {
    return DataLossError("n_tensors: " + std::to_string(n_tensors) + ", expected " +
                         std::to_string(specs.size()));
  }
  const uint64_t table_offset = LoadLE(data + kTableOffsetAt, 8);
  if (table_offset != kHeaderBytes) {
    return DataLossError("table_offset: " + std::to_string(table_offset) + ", expected " +
                         std::to_string(kHeaderBytes));
  }
  const uint64_t data_offset = LoadLE(data + kDataOffsetAt, 8);
  if (data_offset != layout.data_offset) {
    return DataLossError("data_offset: " + std::to_string(data_offset) + ", expected " +
                         std::to_string(layout.data_offset));
  }
  for (size_t i = kReservedAt; i < kHeaderBytes; ++i) {
    if (data[i] != 0) return DataLossError("reserved header bytes are not zero");
  }
  // ComputeLayout bounded the table (data_offset ≥ 64 + 16n) and
  // region_bytes ≤ size, so the table is inside the mapping; checked again
  // so this function does not depend on that reasoning.
  const uint64_t table_end = kHeaderBytes + specs.size() * kTableEntryBytes;
  if (table_end > size) {
    return DataLossError("table: " + std::to_string(specs.size()) +
                         " entries end past the mapping of " + std::to_string(size) + " bytes");
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint8_t* entry = data + kHeaderBytes + i * kTableEntryBytes;
    const uint64_t offset = LoadLE(entry, 8);
    const uint64_t nbytes = LoadLE(entry + 8, 8);
    if (offset != layout.offsets[i]) {
      return DataLossError("table entry " + std::to_string(i) + " offset: " +
                           std::to_string(offset) + ", expected " +
                           std::to_string(layout.offsets[i]) + " (" + TensorLabel(specs[i], i) +
                           ")");
    }
    if (nbytes != layout.nbytes[i]) {
      return DataLossError("table entry " + std::to_string(i) + " nbytes: " +
                           std::to_string(nbytes) + ", expected " +
                           std::to_string(layout.nbytes[i]) + " (" + TensorLabel(specs[i], i) +
                           ")");
    }
  }
  return layout.offsets;
}

}  // namespace arbiter
