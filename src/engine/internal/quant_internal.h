// engine/internal/quant_internal.h — what the files of the quantized kernels
// (quant.cc, quant_reference.cc, quant_kquants.cc, quant_scalar.cc, the AVX2
// files) share: the ggml block layouts as byte offsets, f16/bf16 decoding,
// the quantizer helpers, and the per-path kernel tables that quant.cc
// dispatches through.
//
// Blocks are read through byte pointers (every struct here has alignment 1):
// a row of 18-byte Q4_0 blocks or 292-byte Q8_K blocks is not aligned for
// its u16/f32 fields, so multi-byte fields are read with memcpy (LoadU16,
// LoadF32), never through a cast pointer.
//
// Thread safety: constants and pure functions.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "arbiter/formats/ggml_type.h"

namespace arbiter::engine_internal::quant {

// ggml-common.h's block structs, field for field (all fields bytes).
inline constexpr int kQK = 32;    // elements of the 32-element block types
inline constexpr int kQKK = 256;  // elements of a K-quant super-block

struct BlockQ4_0 {
  uint8_t d[2];    // f16 scale
  uint8_t qs[16];  // element j: low nibble of qs[j]; element j + 16: high nibble
};
struct BlockQ4_1 {
  uint8_t d[2], m[2];  // f16 scale, f16 min: x = d·q + m
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint8_t d[2];
  uint8_t qh[4];  // u32 little-endian: bit j = 5th bit of element j
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint8_t d[2], m[2];
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint8_t d[2];
  int8_t qs[32];
};
struct BlockQ8_1 {
  uint8_t d[2], s[2];  // f16 scale, f16 d·Σqs
  int8_t qs[32];
};
// Q4_K / Q5_K: 8 sub-blocks of 32, each with a 6-bit scale sc and 6-bit min
// m packed in `scales` (UnpackScalesMinsK4); x = d·sc·q − dmin·m. In each
// 64-element chunk c, qs[32c + l] holds element 64c + l (low nibble) and
// 64c + 32 + l (high nibble); Q5_K's 5th bits: qh[l] bit 2c (element
// 64c + l) and bit 2c + 1 (element 64c + 32 + l).
struct BlockQ4_K {
  uint8_t d[2], dmin[2];
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint8_t d[2], dmin[2];
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// Q6_K: 16 sub-blocks of 16 with int8 scales; x = d·sc·(q − 32), q 6 bits.
// Half h (128 elements) uses ql[64h ..], qh[32h ..], scales[8h ..]; for
// l < 32 its elements l, l + 32, l + 64, l + 96 are the low nibble of ql[l],
// low of ql[l + 32], high of ql[l], high of ql[l + 32], with qh[l] bits
// 0-1, 2-3, 4-5, 6-7 on top; element e of the half has scale 8h + e / 16.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint8_t d[2];
};
// Q8_K: f32 d; bsums[i] = Σ qs[16i .. 16i + 15].
struct BlockQ8_K {
  uint8_t d[4];
  int8_t qs[256];
  uint8_t bsums[32];  // 16 × i16 little-endian
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36 &&
              sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 &&
              sizeof(BlockQ8_K) == 292);

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// IEEE binary16 → f32, exact (subnormals, inf and NaN included).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}
inline float HalfToFloat(const uint8_t* p) { return HalfToFloat(LoadU16(p)); }
// The same without branches, for loops the compiler should vectorize (the
// scalar path's f16 dot): the f16 exponent and mantissa are placed in an
// f32 and scaled by 2^112, which rebiases the exponent (15 → 127) and turns
// f16 subnormals (f32 subnormals here) into exact f32 normals; inf/NaN are
// selected apart. Equal to HalfToFloat for every input (quant_test.cc), as
// long as subnormal inputs are not flushed (no DAZ; the engine never sets it).
inline float HalfToFloatBranchless(uint16_t h) {
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t finite = std::bit_cast<uint32_t>(std::bit_cast<float>(em) * 0x1p112f);
  const uint32_t special = 0u - static_cast<uint32_t>(em >= (0x7c00u << 13));  // all ones: inf/NaN
  const uint32_t bits = ((em | 0x7f800000u) & special) | (finite & ~special);
  return std::bit_cast<float>(bits | sign);
}
inline float Bf16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block (ggml's
// get_scale_min_k4, for all j at once): sub-blocks 0-3 keep their scale and
// min in the low 6 bits of bytes 0-3 and 4-7; sub-blocks 4-7 keep the low 4
// bits in the nibbles of bytes 8-11 and the high 2 bits in the top bits of
// bytes 0-3 (scales) and 4-7 (mins).
inline void UnpackScalesMinsK4(const uint8_t* packed, uint8_t sc[8], uint8_t m[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = packed[j] & 63;
    m[j] = packed[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((packed[j + 8] & 0xF) | ((packed[j] >> 6) << 4));
    m[j + 4] = static_cast<uint8_t>((packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4));
  }
}
// The inverse. REQUIRES: every sc[j], m[j] < 64.
inline void PackScalesMinsK4(const uint8_t sc[8], const uint8_t m[8], uint8_t* packed) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

// ---------------------------------------------------------------------------
// Quantizer helpers (quant_reference.cc, quant_kquants.cc).

// v rounded half to even and clamped to [lo, hi] — clamped as a float
// first, so a huge quotient (a tiny scale) never overflows the int.
inline int RoundClamp(double v, int lo, int hi) {
  if (!(v > lo)) return lo;  // also NaN
  if (v >= hi) return hi;
  return static_cast<int>(std::nearbyint(v));
}

// The value of largest magnitude (the first, on ties) and its magnitude.
inline void SignedAbsMax(const float* x, int n, float* max, float* amax) {
  *max = 0;
  *amax = 0;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > *amax) {
      *amax = std::fabs(x[j]);
      *max = x[j];
    }
  }
}

// min and max of x[0, n). REQUIRES: n ≥ 1.
inline void MinMax(const float* x, int n, float* min, float* max) {
  *min = x[0];
  *max = x[0];
  for (int j = 1; j < n; ++j) {
    *min = std::min(*min, x[j]);
    *max = std::max(*max, x[j]);
  }
}

// The K-quant reference quantizers (quant_kquants.cc): n floats → one row.
void QuantizeRowQ4_K(const float* x, int64_t n, uint8_t* out);
void QuantizeRowQ5_K(const float* x, int64_t n, uint8_t* out);
void QuantizeRowQ6_K(const float* x, int64_t n, uint8_t* out);

// ---------------------------------------------------------------------------
// Kernel tables. One per path; quant.cc picks the active one.

// y[i] = dot(row i, xa) (or += when `accumulate`) for i < rows, row i at
// w + i·row_bytes; xa as PrepareActivation wrote it for the row's type.
using DotRowsFn = void (*)(const uint8_t* w, size_t row_bytes, int64_t n, const void* xa,
                           int64_t rows, float* y, bool accumulate);
// One row of n elements → n floats, bit-identical to DequantizeRowReference.
using DequantizeRowFn = void (*)(const uint8_t* row, int64_t n, float* out);
// x[n] → one activation row (Q8_0, Q8_1 or Q8_K): each block's d =
// amax / 127 and q = round-half-even(x · 127 / amax) (0 for an all-zero
// block), identical on every path.
using QuantizeActivationFn = void (*)(const float* x, int64_t n, uint8_t* out);

inline constexpr int kTypeSlots = 40;  // > every GgmlType value

struct KernelTable {
  DotRowsFn dot_rows[kTypeSlots] = {};
  DequantizeRowFn dequantize_row[kTypeSlots] = {};
  QuantizeActivationFn quantize_q8_0 = nullptr;
  QuantizeActivationFn quantize_q8_1 = nullptr;
  QuantizeActivationFn quantize_q8_K = nullptr;
};

inline int Slot(GgmlType t) { return static_cast<int>(t); }

// Fills every entry (quant_scalar.cc; the dequantizers are the reference ones).
void FillScalarKernels(KernelTable* table);
// Overrides the entries the AVX2 path implements (quant_avx2.cc); the table
// starts as a copy of the scalar one. Only on x86-64.
void FillAvx2Kernels(KernelTable* table);

// Prefill's tile kernels (quant_gemm.h): y[t·ldy + r] (or +=) for t < nt,
// r < rows, row r at w + r·row_bytes; xa as PrepareGemmActivations wrote it.
using GemmRowsFn = void (*)(const uint8_t* w, size_t row_bytes, int64_t n, const uint8_t* xa,
                            int nt, int64_t rows, float* y, int64_t ldy, bool accumulate);
// The AVX2 tile kernel of `type` (quant_gemm_avx2.cc), or nullptr. Only on x86-64.
GemmRowsFn Avx2GemmKernel(GgmlType type);

// The reference dequantizer of `type` (quant_reference.cc), or nullptr.
DequantizeRowFn ReferenceDequantizer(GgmlType type);

}  // namespace arbiter::engine_internal::quant
