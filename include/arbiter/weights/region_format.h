// arbiter/weights/region_format.h — the byte layout of a shared weight
// region (a SharedWeightStore's POSIX shared-memory object, see
// arbiter/weights/weight_store.h) and its validation. This is a file format
// shared between processes (and between builds that agree on its format
// version): its sized integers are part of it and do not change without a
// version bump.
//
// Layout (all integers little-endian):
//   [0, 64)   header: magic "ARBWFLR1" (8 bytes), format version u32 (1),
//             ready u32 (1 when complete), digest u64, region_bytes u64,
//             n_tensors u64, table_offset u64 (64), data_offset u64,
//             reserved to 64 bytes (zero)
//   [64, data_offset)  table: n_tensors × {offset u64, nbytes u64}
//   [data_offset, region_bytes)  tensors, each at a 64-byte-aligned
//             offset, in spec order
// A region is READY when its mapping is ≥ region_bytes, the magic,
// version and digest match, ready == 1, and its table equals the layout
// computed from `specs` (so nothing is ever read past the mapping).
//
// Thread safety: ValidateSharedRegion is a pure function of its arguments
// (thread-safe); it reads the caller's bytes and never writes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/weights/weight_files.h"

namespace arbiter {

// Validates a shared region's bytes against the layout of `specs`
// (everything "READY" means above except the mapping itself): `data` is the
// mapping, `size` its length. Returns the tensors' offsets from `data` in
// spec order. Never reads outside [data, data + size).
// Errors: kDataLoss naming the first mismatch, checked in this order:
// "header" (size < 64), "magic", "version", "digest", "not ready",
// "region_bytes", "n_tensors", "table_offset", "data_offset", "reserved",
// "table entry 3 offset", "table entry 3 nbytes"; kInvalidArgument when
// `specs` itself is invalid (as Materialize).
// Used by SharedWeightStore before every attach; exposed for tests and the
// fuzz target (fuzz/weight_region_fuzz.cc).
Result<std::vector<size_t>> ValidateSharedRegion(const uint8_t* data, size_t size,
                                                 uint64_t digest,
                                                 const std::vector<WeightSpec>& specs);

}  // namespace arbiter
