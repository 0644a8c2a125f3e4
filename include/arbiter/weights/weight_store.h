// arbiter/weights/weight_store.h — host-RAM floors of model weights: one
// materialized copy of a model's compute-ready tensors kept in RAM, so an
// on-demand device load is a pure host→device copy instead of a re-read and
// re-conversion of the model file.
//
// The reference weight runtime's host weight stores (WeightStore,
// PrivateWeightStore, SharedWeightStore; its materialize and release), with
// its store defects fixed: docs/weights.md lists them ('Permissions of
// shared regions' through 'Trusting a READY region').
//
// Concepts:
//   - A floor is described by `specs` (arbiter/weights/weight_files.h
//     WeightSpec: name, dtype, shape, in the order the tensors are laid out)
//     and named by (key, digest): `key` is the model name, `digest` the
//     WeightsDigest of that layout and the model file's token.
//   - Materialize() returns a HostFloor: one host array per spec, each
//     kHostFloorAlignment-aligned and WeightSpecBytes(spec) long. When this
//     process must fill them, `fill` is called once with the writable arrays;
//     when an identical floor already exists (the shared store: made by
//     another process, or left READY by an earlier run) `fill` is not called.
//   - The floor lives as long as the HostFloor object. Destroying it
//     releases it: a private floor is freed; a shared floor is detached and,
//     when this was its last holder on the node, unlinked.
//
// PrivateWeightStore: anonymous private memory per process (mmap), freed on
// release. The default.
//
// SharedWeightStore: one POSIX shared-memory region per (key, digest) per
// node, shared by every process that materializes the same floor.
//   Names: region "/<prefix>-<sanitized key>-<16 hex digits of digest>"
//   (shm_open; /dev/shm/<prefix>-... on Linux), lock file beside it:
//   "<shm dir>/<prefix>-<sanitized key>-<digest hex>.lock". The sanitized key
//   keeps [A-Za-z0-9._-], maps every other byte to '_' and is cut to 64
//   bytes (the digest, which hashes the whole key, keeps names unique).
//   Layout: header, table and tensors, documented and validated in
//   arbiter/weights/region_format.h. An attacher uses a region only when it
//   is READY for its own `specs` (ValidateSharedRegion there).
//   Protocol (flock on the lock file; the reference's, with the fixes;
//   every flock is non-blocking, so a filler holding the exclusive lock is
//   "refused", never an unbounded wait):
//     loop {
//       shared flock; attach; READY → keep the shared lock, done;
//       unlock; try an exclusive non-blocking flock;
//       won → re-check READY (someone may have finished meanwhile); else
//             unlink any remnant (zero-length, truncated, foreign, corrupt:
//             docs/weights.md 'Zero-length remnants'), create exclusively with `mode`, ftruncate,
//             write the header with ready 0 and the table, fill, msync,
//             set ready = 1 last, msync, downgrade to shared; done;
//       refused → another process is filling (or holds a non-READY region):
//             sleep poll_interval_ms and retry, but give up after
//             ready_wait_ms with kDeadlineExceeded naming the region
//             (docs/weights.md 'Unbounded wait for a stuck filler').
//     }
//   A fill or allocation error unlinks the region and its lock file before
//   Materialize returns. A crash leaves ready = 0: the next creator rebuilds
//   it (the kernel drops a dead process's flocks).
//   Holders keep the shared flock while they use the region. Release:
//   unmap; try an exclusive non-blocking flock: success → last holder →
//   unlink the region. After every successful attach, holder-free regions of
//   the same sanitized key with another digest (stale versions) are
//   unlinked (two keys that sanitize alike share this sweep; it only costs
//   the other a rebuild).
//   Lock files: unlinked together with their region while the exclusive
//   flock is held; every locker re-checks after each flock that its fd is
//   still the file at the path (fstat vs lstat: same device and inode) and
//   reopens otherwise, so unlinking a lock file never lets two processes
//   hold "exclusive" locks on different inodes.
//   Permissions: `mode` (default 0600, owner only; 0660 for a group of
//   workers) applies to the region and its lock file (fchmod after create,
//   so the umask does not widen or narrow it); never 0666 by default
//   (docs/weights.md 'Permissions of shared regions'). /dev/shm is sticky:
//   only a region's owner (or root) can unlink it, so with 0660 and several
//   users a region outlives a last holder who is not its owner until
//   SweepOrphans runs as the owner.
//   Region creation reserves its pages (fallocate), so a full /dev/shm is
//   kResourceExhausted, not a SIGBUS during fill.
//
// Thread safety: both stores are thread-safe. Materialize of the same key
// from two threads of one process returns two independent HostFloors (the
// shared store attaches the region twice); the WeightCache materializes a
// model at most once at a time. HostFloor is thread-compatible; its arrays
// are read-only for everyone but the fill callback (enforced: the mapping is
// made PROT_READ after the fill, and attachers map the region read-only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/weights/weight_files.h"

namespace arbiter {

// Alignment of every host array of a floor and of every tensor in a shared
// region, in bytes.
inline constexpr size_t kHostFloorAlignment = 64;

// prod(shape) × DTypeSize(dtype), in bytes (0 for a tensor with a 0 dim).
// SIZE_MAX for a spec Materialize rejects (a negative dimension, an
// unknown dtype, or a size that overflows 64 bits).
size_t WeightSpecBytes(const WeightSpec& spec);

// Writes the floor: `arrays[i]` points at WeightSpecBytes(specs[i])
// writable, kHostFloorAlignment-aligned bytes (zeroed), in spec order. A
// non-OK status aborts the materialization (nothing is kept) and is returned
// by Materialize with the key prefixed. An exception propagates out of
// Materialize, also keeping nothing.
using WeightFill = std::function<Status(const std::vector<void*>& arrays)>;

// One materialized floor. Destroying it releases it (see the file comment).
class HostFloor {
 public:
  virtual ~HostFloor() = default;
  // Read-only host arrays, in spec order; arrays_[i] is tensor_bytes()[i]
  // long. A 0-byte tensor has a non-null, unique-enough pointer that must not
  // be dereferenced.
  const std::vector<const void*>& arrays() const { return arrays_; }
  const std::vector<size_t>& tensor_bytes() const { return tensor_bytes_; }
  // Σ tensor_bytes(): the payload.
  size_t payload_bytes() const { return payload_bytes_; }
  // Bytes of RAM the floor occupies: the mapping (header, table, padding
  // and payload, page-rounded). What the weight cache charges as kHostFloor.
  size_t mapped_bytes() const { return mapped_bytes_; }
  // True when this Materialize call ran `fill`; false when it attached an
  // existing READY region.
  bool filled_here() const { return filled_here_; }
  // The shared region's name ("/arbiter-demo-chat-0123456789abcdef"); empty
  // for a private floor.
  const std::string& region_name() const { return region_name_; }

 protected:
  std::vector<const void*> arrays_;
  std::vector<size_t> tensor_bytes_;
  size_t payload_bytes_ = 0;
  size_t mapped_bytes_ = 0;
  bool filled_here_ = false;
  std::string region_name_;
};

// Host-RAM residency backend for materialized weights (seed: WeightStore).
class WeightStore {
 public:
  virtual ~WeightStore() = default;
  // "private" | "shared".
  virtual std::string_view kind() const = 0;

  // The floor of `key` with layout `specs` and digest `digest`, filled by
  // `fill` when this process must materialize it (see the file comment).
  // Errors:
  //   kInvalidArgument   empty key, an empty `fill`, or a spec with a
  //                      negative dimension, an unknown dtype or an
  //                      overflowing size (names the tensor)
  //   kResourceExhausted the memory or the region cannot be allocated
  //                      (names the key and the size; shared: also a full
  //                      /dev/shm)
  //   kDeadlineExceeded  (shared) another process holds the region
  //                      non-READY past ready_wait_ms (names the region and
  //                      says what to do: stop the stuck process or remove
  //                      the region)
  //   kPermissionDenied  (shared) the region or its lock file is not
  //                      accessible (names it and the mode)
  //   the fill's error, prefixed "<key>: "
  // Nothing partial is kept on error: a private floor is freed; a shared
  // region this call was building is unlinked with its lock file. A region
  // whose filler died is left ready = 0 (never READY) and is rebuilt by the
  // next creator.
  virtual Result<std::unique_ptr<HostFloor>> Materialize(std::string_view key, uint64_t digest,
                                                         const std::vector<WeightSpec>& specs,
                                                         const WeightFill& fill) = 0;
};

// Fresh anonymous memory per process.
class PrivateWeightStore final : public WeightStore {
 public:
  std::string_view kind() const override { return "private"; }
  Result<std::unique_ptr<HostFloor>> Materialize(std::string_view key, uint64_t digest,
                                                 const std::vector<WeightSpec>& specs,
                                                 const WeightFill& fill) override;
};

struct SharedWeightStoreOptions {
  // Region name prefix (no '/'): regions are "/<prefix>-...". Tests use a
  // unique prefix so they never touch a real server's regions.
  std::string prefix = "arbiter";
  // Permission bits of regions and lock files. Default owner-only.
  uint32_t mode = 0600;
  // Where the regions appear in the file system (for lock files, listing and
  // sweeps); shm_open names map here on Linux.
  std::string shm_dir = "/dev/shm";
  // Bound on waiting for a region another process holds non-READY
  // (docs/weights.md 'Unbounded wait for a stuck filler'), in ms.
  int64_t ready_wait_ms = 30000;
  // Sleep between retries while waiting, in ms (reference: 5).
  int64_t poll_interval_ms = 5;
};

class SharedWeightStore final : public WeightStore {
 public:
  // Errors: kInvalidArgument for a prefix that is empty, longer than 64
  // bytes or has a byte outside [A-Za-z0-9._-] (so no '/' and no NUL), a
  // mode with bits outside 0777, a shm_dir that is not a directory, a
  // negative ready_wait_ms or a poll_interval_ms below 1.
  static Result<std::unique_ptr<SharedWeightStore>> Create(SharedWeightStoreOptions options = {});

  std::string_view kind() const override { return "shared"; }
  Result<std::unique_ptr<HostFloor>> Materialize(std::string_view key, uint64_t digest,
                                                 const std::vector<WeightSpec>& specs,
                                                 const WeightFill& fill) override;

  // Unlinks every holder-free region (and its lock file) with this
  // store's prefix whose key is not in `live_keys` (sanitized the same way)
  // — leftovers of models removed from the configuration. Regions in use by
  // any process, and holder-free regions of live keys (kept so a restart
  // reuses them without reading the file), are left alone. Also removes
  // holder-free lock files of such keys whose region is gone. Returns the
  // region names unlinked. Names are parsed as "<prefix>-<key>-<16 hex>",
  // so a store whose prefix is this one's plus "-..." looks like keys of
  // this one: give concurrent stores prefixes that do not extend each other.
  // Errors: kPermissionDenied / kInternal when shm_dir cannot be listed;
  // regions it cannot lock (another user's) are skipped.
  Result<std::vector<std::string>> SweepOrphans(const std::set<std::string>& live_keys);

  // The region name of (key, digest) under this store's prefix.
  std::string RegionName(std::string_view key, uint64_t digest) const;

  const SharedWeightStoreOptions& options() const { return options_; }

 private:
  explicit SharedWeightStore(SharedWeightStoreOptions options) : options_(std::move(options)) {}
  const SharedWeightStoreOptions options_;
};

}  // namespace arbiter
