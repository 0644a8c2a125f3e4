// arbiter/engine/kv_snapshot.h — one slot's KV prefix state, in memory: the
// unit the engine saves from and restores into a slot (Engine::SaveSlot /
// RestoreSlot), the host prompt cache holds, and the disk tier serializes
// (arbiter/kv/kv_file.h): the KV that moves between the slot, host and disk
// tiers of docs/kv-precache.md "Tiers".
//
// Thread safety: a plain value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "arbiter/base/buffer_memory.h"
#include "arbiter/formats/ggml_type.h"

namespace arbiter {

// KV cache types (issue 13 point 6; `[[models]] kv_type`): the element type
// of every K/V row, in a slot, a snapshot and a KV file alike. A row of
// kv_dim values is GgmlRowBytes(type, kv_dim) bytes, ggml's layouts:
//   kF32   4 bytes per value
//   kF16   IEEE half, 2 bytes (the default: what llama.cpp keeps too)
//   kBF16  bfloat16, 2 bytes
//   kQ8_0  blocks of 32 values: f16 scale d + 32 int8, 34 bytes (q = x/d,
//          d = max|x|/127 per block), ~1.06 bytes per value
// The K/V stored in a type is what attention reads: a KV cache of another
// type holds different numbers, so it is never restored into this one.
inline constexpr GgmlType kDefaultKvType = GgmlType::kF16;
// Whether `type` is one of the four above.
bool IsKvType(GgmlType type);
// "f32" | "f16" | "bf16" | "q8_0" (the config's spelling); "type ?" otherwise.
std::string_view KvTypeName(GgmlType type);
// The inverse of KvTypeName; nullopt for any other string.
std::optional<GgmlType> ParseKvType(std::string_view name);
// Bytes of one K or V row of kv_dim values of `type`, or 0 when `type` is
// not a KV type or kv_dim is not a multiple of its block (32 for q8_0).
size_t KvRowBytes(GgmlType type, uint64_t kv_dim);

// The allocator of KvSnapshot::kv (Note [KV buffers] in kv_snapshot.cc):
//   - value-less construction default-initializes: resize(n) and the count
//     constructor leave new floats UNINITIALIZED, so a buffer about to be
//     overwritten (SaveSlot's copy out of the slot, a KV file's parse) is
//     written once, not zeroed first. Use assign(n, 0.0f) for zeros;
//   - memory comes from AllocateBuffer (base/buffer_memory.h): buffers of
//     ≥ 64 KiB are their own mapping, returned to the OS when freed, and
//     those of ≥ 2 MiB live on transparent huge pages when the kernel allows
//     it, so a fresh snapshot costs a few faults, not one per 4 KiB.
// Stateless: all instances are equal.
template <typename T>
struct KvBufferAllocator {
  using value_type = T;
  KvBufferAllocator() = default;
  template <typename U>
  KvBufferAllocator(const KvBufferAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(AllocateBuffer(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept { FreeBuffer(p, n * sizeof(T)); }
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  friend bool operator==(const KvBufferAllocator&, const KvBufferAllocator&) { return true; }
};

// K/V bytes of a snapshot; a std::vector whose resize() does not zero.
using KvBytes = std::vector<uint8_t, KvBufferAllocator<uint8_t>>;

// A snapshot's arrays read in place from memory someone else owns (a
// KvSnapshot, a mapped KV file: kv_file.h MapKvFile), so a restore from
// disk copies each K/V byte once. Same layout as KvSnapshot. The memory
// must outlive every use of the view.
struct KvSnapshotView {
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;
  GgmlType kv_type = GgmlType::kF32;
  const int32_t* tokens = nullptr;  // [n_tokens]
  size_t n_tokens = 0;
  const uint8_t* kv = nullptr;  // [n_layers, 2, n_tokens] rows of KvRowBytes(kv_type, kv_dim)
  size_t kv_bytes = 0;          // bytes at `kv`
};

// A KV prefix viewed layer by layer in place: for every layer the K rows
// [0, n_tokens) and the V rows [0, n_tokens), each n_tokens contiguous rows
// of KvRowBytes(kv_type, kv_dim) bytes, wherever they live (a slot's KV
// cache — Engine::VisitSlot — or a snapshot's array, Rows()). What a KV
// file is written from, so a slot can be saved without a copy. The memory
// must outlive every use.
struct KvRowsView {
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;
  GgmlType kv_type = GgmlType::kF32;
  const int32_t* tokens = nullptr;  // [n_tokens]
  size_t n_tokens = 0;
  std::vector<const uint8_t*> k;    // [n_layers] → n_tokens rows
  std::vector<const uint8_t*> v;    // [n_layers] → n_tokens rows

  size_t row_bytes() const { return KvRowBytes(kv_type, kv_dim); }
};

// One sequence's KV prefix: `tokens` and, for positions [0, n_tokens), the
// K and V rows of every layer, in `kv_type`.
struct KvSnapshot {
  std::string model_hash;       // 16 chars (ModelHash) once owned by a KvStore; the engine leaves it empty
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;          // n_kv_heads × head_dim
  GgmlType kv_type = GgmlType::kF32;  // IsKvType
  std::vector<int32_t> tokens;  // [n_tokens]
  // [n_layers, 2, n_tokens] rows of row_bytes(): layer l's K rows at byte
  // (2l)·n_tokens·row_bytes(), its V rows at (2l + 1)·n_tokens·row_bytes().
  // resize() leaves new bytes uninitialized (KvBufferAllocator).
  KvBytes kv;

  size_t n_tokens() const { return tokens.size(); }
  // Bytes of one K or V row (0 for an invalid kv_type / kv_dim pair).
  size_t row_bytes() const { return KvRowBytes(kv_type, kv_dim); }
  // The kv.size() a consistent snapshot has: n_layers · 2 · n_tokens · row_bytes().
  size_t ExpectedKvBytes() const { return size_t{2} * n_layers * tokens.size() * row_bytes(); }
  // Bytes held in memory (tokens + K/V), what the prompt cache charges.
  uint64_t MemoryBytes() const { return tokens.size() * sizeof(int32_t) + kv.size(); }
  // A view of this snapshot's arrays (valid while it is alive and unchanged).
  KvSnapshotView View() const {
    return {n_layers, kv_dim, kv_type, tokens.data(), tokens.size(), kv.data(), kv.size()};
  }
  // Its rows layer by layer. REQUIRES: kv.size() == ExpectedKvBytes().
  KvRowsView Rows() const {
    KvRowsView r{n_layers, kv_dim, kv_type, tokens.data(), tokens.size(), {}, {}};
    const size_t block = tokens.size() * row_bytes();
    for (uint32_t l = 0; l < n_layers; ++l) {
      r.k.push_back(kv.data() + 2 * l * block);
      r.v.push_back(kv.data() + (2 * l + 1) * block);
    }
    return r;
  }
};

}  // namespace arbiter
