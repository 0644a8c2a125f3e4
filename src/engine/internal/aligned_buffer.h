// engine/internal/aligned_buffer.h — a move-only, 64-byte-aligned array of
// floats (activations, scratch) or bytes (a KV cache in a stored type).
//
// Every KV cache and scratch buffer of the engine lives in one of these so
// rows start on a cache line and the vector loops and OpenBLAS see aligned
// data. (Weights live in a WeightCache's arena, also 64-byte aligned.) The
// memory comes from AllocateBuffer: what the ledger charges for these
// buffers (kv_slot, scratch) is pre-faulted when allocated and returned to
// the OS when freed (Note [Where freed memory goes], Note [Charged memory is
// resident] in base/buffer_memory.cc).
//
// Thread safety: thread-compatible (a plain owning array).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "arbiter/base/buffer_memory.h"

namespace arbiter::engine_internal {

// T: a trivially copyable element type (float, uint8_t).
template <typename T>
class AlignedArray {
 public:
  AlignedArray() = default;
  // Zero-initialised array of `n` elements, every page resident. Throws
  // std::bad_alloc on failure (callers at the library boundary catch it).
  explicit AlignedArray(size_t n) { Resize(n); }
  AlignedArray(AlignedArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedArray& operator=(AlignedArray&& o) noexcept {
    if (this != &o) {
      FreeBuffer(data_, size_bytes());
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedArray(const AlignedArray&) = delete;
  AlignedArray& operator=(const AlignedArray&) = delete;
  ~AlignedArray() { FreeBuffer(data_, size_bytes()); }

  // Discards the contents; the new array is zeroed.
  void Resize(size_t n) {
    FreeBuffer(data_, size_bytes());
    data_ = nullptr;
    size_ = 0;
    if (n == 0) return;
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    void* p = AllocateBuffer(n * sizeof(T));
    ZeroAndPrefault(p, n * sizeof(T));
    data_ = static_cast<T*>(p);
    size_ = n;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t size_bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  T operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

using AlignedFloats = AlignedArray<float>;
using AlignedBytes = AlignedArray<uint8_t>;

}  // namespace arbiter::engine_internal
