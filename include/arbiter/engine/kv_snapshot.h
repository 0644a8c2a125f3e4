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
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "arbiter/base/buffer_memory.h"

namespace arbiter {

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

// K/V values of a snapshot; a std::vector whose resize() does not zero.
using KvFloats = std::vector<float, KvBufferAllocator<float>>;

// A snapshot's arrays read in place from memory someone else owns (a
// KvSnapshot, a mapped KV file: kv_file.h MapKvFile), so a restore from
// disk copies each K/V byte once. Same layout as KvSnapshot. The memory
// must outlive every use of the view.
struct KvSnapshotView {
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;
  const int32_t* tokens = nullptr;  // [n_tokens]
  size_t n_tokens = 0;
  const float* kv = nullptr;  // [n_layers, 2, n_tokens, kv_dim]
  size_t kv_floats = 0;       // values at `kv`
};

// A KV prefix viewed layer by layer in place: for every layer the K rows
// [0, n_tokens) and the V rows [0, n_tokens), each [n_tokens, kv_dim] f32
// and contiguous, wherever they live (a slot's KV cache — Engine::VisitSlot —
// or a snapshot's array, RowsOf). What a KV file is written from, so a slot
// can be saved without a copy. The memory must outlive every use.
struct KvRowsView {
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;
  const int32_t* tokens = nullptr;  // [n_tokens]
  size_t n_tokens = 0;
  std::vector<const float*> k;      // [n_layers] → [n_tokens, kv_dim]
  std::vector<const float*> v;      // [n_layers] → [n_tokens, kv_dim]
};

// One sequence's KV prefix: `tokens` and, for positions [0, n_tokens), the
// K and V rows of every layer.
struct KvSnapshot {
  std::string model_hash;       // 16 chars (ModelHash) once owned by a KvStore; the engine leaves it empty
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;          // n_kv_heads × head_dim
  std::vector<int32_t> tokens;  // [n_tokens]
  // [n_layers, 2, n_tokens, kv_dim] f32: layer l's K rows at
  // (2l)·n_tokens·kv_dim, its V rows at (2l + 1)·n_tokens·kv_dim.
  // resize() leaves new values uninitialized (KvBufferAllocator).
  KvFloats kv;

  size_t n_tokens() const { return tokens.size(); }
  // Bytes held in memory (tokens + K/V), what the prompt cache charges.
  uint64_t MemoryBytes() const {
    return tokens.size() * sizeof(int32_t) + kv.size() * sizeof(float);
  }
  // A view of this snapshot's arrays (valid while it is alive and unchanged).
  KvSnapshotView View() const {
    return {n_layers, kv_dim, tokens.data(), tokens.size(), kv.data(), kv.size()};
  }
  // Its rows layer by layer. REQUIRES: kv.size() = n_layers·2·n_tokens·kv_dim.
  KvRowsView Rows() const {
    KvRowsView r{n_layers, kv_dim, tokens.data(), tokens.size(), {}, {}};
    const size_t rows = tokens.size() * kv_dim;
    for (uint32_t l = 0; l < n_layers; ++l) {
      r.k.push_back(kv.data() + 2 * l * rows);
      r.v.push_back(kv.data() + (2 * l + 1) * rows);
    }
    return r;
  }
};

}  // namespace arbiter
