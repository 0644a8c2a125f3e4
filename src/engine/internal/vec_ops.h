// engine/internal/vec_ops.h — the engine's small vector kernels.
//
// Plain loops written so GCC auto-vectorizes them at -O3 without
// -ffast-math: reductions keep 16 independent partial sums (one AVX-512
// register, or two AVX2 registers), which is a legal reordering GCC can
// vectorize because the partial sums are separate variables in the source.
//
// Thread safety: pure functions.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace arbiter::engine_internal {

inline constexpr int kLanes = 16;

// Σ a[i]·b[i], i < n.
inline float Dot(const float* __restrict a, const float* __restrict b, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Σ a[i]², i < n.
inline float SumSquares(const float* __restrict a, int n) { return Dot(a, a, n); }

// Σ a[i], i < n.
inline float Sum(const float* __restrict a, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l];
  }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += a[i];
  return s;
}

// max_i a[i]. REQUIRES: n ≥ 1.
inline float Max(const float* __restrict a, int n) {
  float m = a[0];
  for (int i = 1; i < n; ++i) m = a[i] > m ? a[i] : m;
  return m;
}

// y[i] += a · x[i].
inline void Axpy(float a, const float* __restrict x, float* __restrict y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// out[i] = x[i] / sqrt(mean(x²) + eps) · w[i]  (HF LlamaRMSNorm). `out` may equal `x`.
inline void RmsNorm(const float* x, const float* __restrict w, float eps, int n, float* out) {
  const float inv = 1.0f / std::sqrt(SumSquares(x, n) / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

// e^x for f32, branch-free so loops calling it vectorize (glibc expf does
// not without -ffast-math). Cephes expf: x = n·ln2 + r with |r| ≤ ln2/2
// (ln2 split in two for an exact reduction), e^r by a degree-6 polynomial,
// 2^n built in the exponent bits. Max relative error ≈ 2 ulp on the clamped
// range [−87, 88]; below −87 it returns e^−87 ≈ 1.6e−38 instead of a smaller
// number or 0 (harmless for softmax and SiLU).
inline float ExpF(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// In-place softmax over a[0, n), numerically stable (max subtracted). REQUIRES: n ≥ 1.
inline void Softmax(float* a, int n) {
  const float m = Max(a, n);
  for (int i = 0; i < n; ++i) a[i] = ExpF(a[i] - m);
  const float inv = 1.0f / Sum(a, n);
  for (int i = 0; i < n; ++i) a[i] *= inv;
}

}  // namespace arbiter::engine_internal
