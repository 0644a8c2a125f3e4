// engine/internal/aligned_buffer.h — a move-only, 64-byte-aligned float array.
//
// Every KV cache and scratch buffer of the engine lives in one of these so
// rows start on a cache line and the vector loops and OpenBLAS see aligned
// data. (Weights live in a WeightCache's arena, also 64-byte aligned.)
//
// Thread safety: thread-compatible (a plain owning array).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace arbiter::engine_internal {

inline constexpr size_t kBufferAlignmentBytes = 64;

class AlignedFloats {
 public:
  AlignedFloats() = default;
  // Zero-initialised array of `n` floats. Throws std::bad_alloc on failure
  // (callers at the library boundary catch it).
  explicit AlignedFloats(size_t n) { Resize(n); }
  AlignedFloats(AlignedFloats&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedFloats& operator=(AlignedFloats&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  ~AlignedFloats() { std::free(data_); }

  // Discards the contents; the new array is zeroed.
  void Resize(size_t n) {
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
    if (n == 0) return;
    size_t bytes = (n * sizeof(float) + kBufferAlignmentBytes - 1) / kBufferAlignmentBytes *
                   kBufferAlignmentBytes;
    void* p = std::aligned_alloc(kBufferAlignmentBytes, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    data_ = static_cast<float*>(p);
    size_ = n;
  }

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  size_t size_bytes() const { return size_ * sizeof(float); }
  bool empty() const { return size_ == 0; }
  float& operator[](size_t i) { return data_[i]; }
  float operator[](size_t i) const { return data_[i]; }

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace arbiter::engine_internal
