// arbiter/kv/kv_file.h — the on-disk format of saved KV prefix state (the
// disk tier's files, "<kv dir>/<model hash>/<safe id>.<ttl class>.bin").
//
// Implements the KV file of docs/kv-precache.md "Persistence" ("missing or
// corrupt KV files always fall back to a cold prefill") and "Keys and
// names", and a fixed defect of the reference (docs/kv-precache.md "Defects
// of the reference, fixed": restores report their tokens — a restore says
// how many tokens it restored).
//
// Format v1 (all integers little-endian):
//   [0, 64)  header: magic "ARBKV001" (8 bytes), version u32 (1),
//            dtype u32 (the KV type as its ggml type number: 0 f32, 1 f16,
//            8 q8_0, 30 bf16 — kv_snapshot.h), model hash (16 ASCII bytes,
//            ModelHash()), n_layers u32, kv_dim u32, n_tokens u32,
//            reserved (zero) to 64
//   tokens   n_tokens × i32
//   K/V      per layer: K then V, each n_tokens rows of
//            R = KvRowBytes(dtype, kv_dim) bytes (ggml's row layout)
//   trailer  XXH3-64 (seed 0) of every byte before it, u64
// File size = 64 + 4·n_tokens + 2·n_layers·n_tokens·R + 8, exactly. (Files
// written before the KV types existed are dtype 0 and read as f32.)
// A reader given the model's KV type treats a file of another type as
// foreign (kFailedPrecondition): its K/V are other numbers, so the
// conversation is prefilled cold and the KvStore removes the file.
//
// Writing goes through WriteFileAtomicStreaming (temp file, fsync, rename,
// fsync of the directory): a crash never leaves a partial file where a good
// one was. Reading checks everything before returning anything, and never
// reads outside the file.
//
// Thread safety: free functions; thread-safe on distinct paths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/base/file.h"
#include "arbiter/base/status.h"
#include "arbiter/engine/kv_snapshot.h"

namespace arbiter {

inline constexpr uint32_t kKvFileVersion = 1;
inline constexpr size_t kKvFileHeaderBytes = 64;
// Bounds a reader accepts (a hostile header cannot make it allocate more).
inline constexpr uint32_t kKvFileMaxLayers = 4096;
inline constexpr uint32_t kKvFileMaxKvDim = 1 << 16;
inline constexpr uint32_t kKvFileMaxTokens = 1 << 22;

// Bytes of the file `snapshot` makes.
uint64_t KvFileBytes(const KvSnapshot& snapshot);

// Writes `snapshot` to `path` atomically, mode 0600 (the KV of a
// conversation is the user's data).
// Errors: kInvalidArgument when the snapshot is inconsistent (model hash not
// 16 chars, kv_type not a KV type for kv_dim, kv.size() ≠
// ExpectedKvBytes(), a dimension over the reader's bounds, a negative token
// id); the file-system error (the old file, if any, is kept).
Status WriteKvFile(const std::string& path, const KvSnapshot& snapshot);
// The same from rows viewed in place (Engine::VisitSlot: a slot written
// without a snapshot), with the file's `model_hash`; byte-identical to the
// snapshot's file. Errors as above (kInvalidArgument also when k or v does
// not have n_layers pointers).
Status WriteKvFile(const std::string& path, const std::string& model_hash,
                   const KvRowsView& rows);
// Bytes of the file `rows` make.
uint64_t KvFileBytes(const KvRowsView& rows);

// Reads and validates `path` as a file of model `expected_model_hash`
// ("" = any model) holding K/V of `expected_kv_type` (nullopt = any type).
// Errors (messages name the path and the field):
//   kNotFound           no such file
//   kDataLoss           too short, bad magic, unsupported version or dtype,
//                       kv_dim not a multiple of the dtype's block,
//                       dimensions over the bounds, size ≠ the computed
//                       size ("truncated" / "trailing bytes"), checksum
//                       mismatch, a negative token id
//   kFailedPrecondition the file belongs to another model hash or holds
//                       another KV type (foreign)
Result<KvSnapshot> ReadKvFile(const std::string& path, const std::string& expected_model_hash,
                              std::optional<GgmlType> expected_kv_type = std::nullopt);

// The same validation over bytes already in memory (tests, the fuzz target).
// `name` is used in messages.
Result<KvSnapshot> ParseKvFile(const uint8_t* data, size_t size, const std::string& name,
                               const std::string& expected_model_hash,
                               std::optional<GgmlType> expected_kv_type = std::nullopt);

// A validated KV file mapped read-only: its token ids and K/V are read in
// place (view()), so a restore from disk copies each byte once (file page
// cache → slot) instead of twice through a KvSnapshot. Move-only; unmaps on
// destruction. The files of a KvStore are only ever replaced by rename or
// removed, never changed in place, so a mapping stays valid (it keeps the
// old file's data) until it is destroyed.
class MappedKvFile {
 public:
  MappedKvFile() = default;
  // The file's model hash (16 chars).
  const std::string& model_hash() const { return model_hash_; }
  size_t n_tokens() const { return view_.n_tokens; }
  // tokens and kv point into the mapping: valid while this object lives.
  const KvSnapshotView& view() const { return view_; }
  const std::string& path() const { return file_.path(); }

 private:
  friend Result<MappedKvFile> MapKvFile(const std::string&, const std::string&,
                                        std::optional<GgmlType>);
  MappedFile file_;
  std::string model_hash_;
  KvSnapshotView view_;
};

// Maps `path` and validates it exactly as ReadKvFile does (same errors),
// without copying its arrays.
Result<MappedKvFile> MapKvFile(const std::string& path, const std::string& expected_model_hash,
                               std::optional<GgmlType> expected_kv_type = std::nullopt);

}  // namespace arbiter
