// engine/internal/quant_avx2.cc — the AVX2+FMA+F16C path of the quantized
// kernels (quant_internal.h's KernelTable; Note [Activation quantization]
// in quant.cc).
//
// Every function here carries ARBITER_AVX2 (function-level target
// attributes), so the file compiles in a portable build and quant.cc
// installs this table only when CPUID reports AVX2, FMA and F16C. There is
// no AVX-512 path: the machines this was written and measured on have none,
// and a path that cannot be tested here is not shipped.
//
// Integer dot products: weights are unpacked to bytes (nibbles by a
// shift-and-mask; 5th/6th bits or'ed in), multiplied with the 8-bit
// activations by maddubs (u8 × i8 → i16 pairs) and madd (→ i32). Signed
// weights (Q4_0, Q5_0, Q8_0, Q8_K) go through the sign trick: |w| as the
// unsigned operand and x·sign(w) as the signed one. Ranges: |w| ≤ 128 and
// |x| ≤ 127 (activations never hold −128) keep every i16 pair sum below
// 2·128·127 = 32512, so maddubs never saturates. K-quant sub-block scales
// are applied in the integer domain (madd by the scale), so a 256-element
// super-block needs one int→float conversion and one FMA.
//
// Dequantizers compute each value with the reference's float operations in
// the reference's order (no FMA contraction: the quant files build with
// -ffp-contract=off), so their output is bit-identical.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>

#include "engine/internal/quant_internal.h"

#define ARBITER_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace arbiter::engine_internal::quant {
namespace {

// --- Helpers -----------------------------------------------------------------

ARBITER_AVX2 inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

ARBITER_AVX2 inline float Hsum128(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

ARBITER_AVX2 inline float Half(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

ARBITER_AVX2 inline __m256i Load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
ARBITER_AVX2 inline __m128i Load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// Σ over groups of 4 of x·y, x and y signed bytes (|x| ≤ 128, |y| ≤ 127).
ARBITER_AVX2 inline __m256i MulSumI8(__m256i x, __m256i y) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
// The same with x unsigned (≤ 255 and pair sums within i16).
ARBITER_AVX2 inline __m256i MulSumU8I8(__m256i x, __m256i y) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
}

// The 32 nibbles of a 32-element block's 16 bytes, in element order: lane 0
// the low nibbles (elements 0-15), lane 1 the high nibbles (16-31).
ARBITER_AVX2 inline __m256i Nibbles32(const uint8_t* qs) {
  const __m256i v = _mm256_broadcastsi128_si256(Load128(qs));
  const __m256i shifted = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

// Byte j = 0xFF when bit j of `bits` is set, else 0.
ARBITER_AVX2 inline __m256i BitsToBytes(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask);
}

// vpshufb controls: kBroadcast16.b[k] copies i16 lane k to every lane of
// both halves; kPairQ6.b[k] copies lane 2k to the low half and lane 2k + 1
// to the high half.
struct alignas(32) ShuffleTable {
  uint8_t b[8][32];
};
constexpr ShuffleTable MakeBroadcast16() {
  ShuffleTable t{};
  for (int k = 0; k < 8; ++k) {
    for (int j = 0; j < 32; ++j) t.b[k][j] = static_cast<uint8_t>(2 * k + (j & 1));
  }
  return t;
}
constexpr ShuffleTable MakePairQ6() {
  ShuffleTable t{};
  for (int k = 0; k < 4; ++k) {
    for (int j = 0; j < 32; ++j) {
      t.b[k][j] = static_cast<uint8_t>(4 * k + (j >= 16 ? 2 : 0) + (j & 1));
    }
  }
  return t;
}
constexpr ShuffleTable kBroadcast16 = MakeBroadcast16();
constexpr ShuffleTable kPairQ6 = MakePairQ6();

ARBITER_AVX2 inline __m256i Shuffle(const ShuffleTable& t, int k) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(t.b[k]));
}

// --- Activation quantizers (quant_internal.h: identical to the scalar ones) ---

// max |x| over n floats (n a multiple of 32).
ARBITER_AVX2 inline float AbsMax(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 32 floats × id → 32 bytes (round half to even, as nearbyint), in order.
ARBITER_AVX2 inline __m256i QuantizeBlock32(const float* x, __m256 id) {
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
  const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
  const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  // packs interleave per 128-bit lane: dwords hold elements 0-3, 8-11,
  // 16-19, 24-27, 4-7, 12-15, 20-23, 28-31.
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

ARBITER_AVX2 inline int SumBytes(__m256i q) {
  const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
                                      _mm256_set1_epi16(1));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}

ARBITER_AVX2 void ActQ8_0(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const float amax = AbsMax(x, kQK);
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    StoreU16(b[i].d, _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs), QuantizeBlock32(x, _mm256_set1_ps(id)));
  }
}

ARBITER_AVX2 void ActQ8_1(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ8_1*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const float amax = AbsMax(x, kQK);
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    const uint16_t d_half = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
    StoreU16(b[i].d, d_half);
    const __m256i q = QuantizeBlock32(x, _mm256_set1_ps(id));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs), q);
    const float s = _cvtsh_ss(d_half) * static_cast<float>(SumBytes(q));
    StoreU16(b[i].s, _cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT));
  }
}

ARBITER_AVX2 void ActQ8_K(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ8_K*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    const float amax = AbsMax(x, kQKK);
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    const float d = amax / 127.0f;
    std::memcpy(b[i].d, &d, 4);
    const __m256 vid = _mm256_set1_ps(id);
    for (int c = 0; c < 8; ++c) {
      const __m256i q = QuantizeBlock32(x + 32 * c, vid);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs + 32 * c), q);
      // Sums of 16: maddubs by 1 → i16 pairs, then hadd within each lane.
      const __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
      __m128i s = _mm_hadd_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
      s = _mm_hadd_epi16(s, s);
      s = _mm_hadd_epi16(s, s);  // lanes 0, 1: Σ elements 0-15, 16-31
      const uint32_t two = static_cast<uint32_t>(_mm_cvtsi128_si32(s));
      std::memcpy(b[i].bsums + 4 * c, &two, 4);
    }
  }
}

// --- Dot products of one row -------------------------------------------------

ARBITER_AVX2 float DotF32(const uint8_t* w8, const uint8_t* xa, int64_t n) {
  const auto* w = reinterpret_cast<const float*>(w8);
  const auto* x = reinterpret_cast<const float*>(xa);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
  float s = Hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}

ARBITER_AVX2 inline __m256 LoadF16x8(const uint8_t* p) { return _mm256_cvtph_ps(Load128(p)); }

ARBITER_AVX2 float DotF16(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* x = reinterpret_cast<const float*>(xa);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(LoadF16x8(w + 2 * i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(LoadF16x8(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(LoadF16x8(w + 2 * i + 32), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(LoadF16x8(w + 2 * i + 48), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LoadF16x8(w + 2 * i), _mm256_loadu_ps(x + i), a0);
  float s = Hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += _cvtsh_ss(LoadU16(w + 2 * i)) * x[i];
  return s;
}

// 8 bf16 → 8 f32: widen to 32 bits, shift into the high half.
ARBITER_AVX2 inline __m256 LoadBf16x8(const uint8_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(Load128(p)), 16));
}

ARBITER_AVX2 float DotBF16(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* x = reinterpret_cast<const float*>(xa);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(LoadBf16x8(w + 2 * i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(LoadBf16x8(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(LoadBf16x8(w + 2 * i + 32), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(LoadBf16x8(w + 2 * i + 48), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LoadBf16x8(w + 2 * i), _mm256_loadu_ps(x + i), a0);
  float s = Hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += Bf16ToFloat(LoadU16(w + 2 * i)) * x[i];
  return s;
}

// The 32-element types: per block an i32×8 partial sum, scaled by d_w·d_x.
// Two blocks per iteration into two accumulators.
ARBITER_AVX2 inline __m256i BlockQ4_0Sum(const BlockQ4_0& b, const BlockQ8_0& y) {
  const __m256i q = _mm256_sub_epi8(Nibbles32(b.qs), _mm256_set1_epi8(8));
  return MulSumI8(q, Load256(y.qs));
}
ARBITER_AVX2 inline __m256i BlockQ5_0Sum(const BlockQ5_0& b, const BlockQ8_0& y) {
  // A clear 5th bit makes the byte 0xF0 | nibble = nibble − 16; a set one
  // leaves nibble + 16 − 16.
  const __m256i high = _mm256_andnot_si256(BitsToBytes(LoadU32(b.qh)), _mm256_set1_epi8(static_cast<char>(0xF0)));
  return MulSumI8(_mm256_or_si256(Nibbles32(b.qs), high), Load256(y.qs));
}
ARBITER_AVX2 inline __m256i BlockQ8_0Sum(const BlockQ8_0& b, const BlockQ8_0& y) {
  return MulSumI8(Load256(b.qs), Load256(y.qs));
}

template <typename Block, __m256i (*Sum)(const Block&, const BlockQ8_0&)>
ARBITER_AVX2 inline float DotSymmetric32(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const Block*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_0*>(xa);
  const int64_t nb = n / kQK;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m256 s0 = _mm256_cvtepi32_ps(Sum(b[i], y[i]));
    const __m256 s1 = _mm256_cvtepi32_ps(Sum(b[i + 1], y[i + 1]));
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b[i].d) * Half(y[i].d)), s0, a0);
    a1 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b[i + 1].d) * Half(y[i + 1].d)), s1, a1);
  }
  if (i < nb) {
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b[i].d) * Half(y[i].d)),
                         _mm256_cvtepi32_ps(Sum(b[i], y[i])), a0);
  }
  return Hsum(_mm256_add_ps(a0, a1));
}

ARBITER_AVX2 float DotQ4_0(const uint8_t* w, const uint8_t* xa, int64_t n) {
  return DotSymmetric32<BlockQ4_0, BlockQ4_0Sum>(w, xa, n);
}
ARBITER_AVX2 float DotQ5_0(const uint8_t* w, const uint8_t* xa, int64_t n) {
  return DotSymmetric32<BlockQ5_0, BlockQ5_0Sum>(w, xa, n);
}
ARBITER_AVX2 float DotQ8_0(const uint8_t* w, const uint8_t* xa, int64_t n) {
  return DotSymmetric32<BlockQ8_0, BlockQ8_0Sum>(w, xa, n);
}

// Q4_1/Q5_1 × Q8_1: d_w·d_x·Σ q_w·q_x + m_w·s_x (s_x = d_x·Σ q_x).
ARBITER_AVX2 inline __m256i BlockQ4_1Sum(const BlockQ4_1& b, const BlockQ8_1& y) {
  return MulSumU8I8(Nibbles32(b.qs), Load256(y.qs));
}
ARBITER_AVX2 inline __m256i BlockQ5_1Sum(const BlockQ5_1& b, const BlockQ8_1& y) {
  const __m256i high = _mm256_and_si256(BitsToBytes(LoadU32(b.qh)), _mm256_set1_epi8(0x10));
  return MulSumU8I8(_mm256_or_si256(Nibbles32(b.qs), high), Load256(y.qs));
}

template <typename Block, __m256i (*Sum)(const Block&, const BlockQ8_1&)>
ARBITER_AVX2 inline float DotWithMin32(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const Block*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_1*>(xa);
  const int64_t nb = n / kQK;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  float mins = 0;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m256 s0 = _mm256_cvtepi32_ps(Sum(b[i], y[i]));
    const __m256 s1 = _mm256_cvtepi32_ps(Sum(b[i + 1], y[i + 1]));
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b[i].d) * Half(y[i].d)), s0, a0);
    a1 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b[i + 1].d) * Half(y[i + 1].d)), s1, a1);
    mins += Half(b[i].m) * Half(y[i].s) + Half(b[i + 1].m) * Half(y[i + 1].s);
  }
  if (i < nb) {
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b[i].d) * Half(y[i].d)),
                         _mm256_cvtepi32_ps(Sum(b[i], y[i])), a0);
    mins += Half(b[i].m) * Half(y[i].s);
  }
  return Hsum(_mm256_add_ps(a0, a1)) + mins;
}

ARBITER_AVX2 float DotQ4_1(const uint8_t* w, const uint8_t* xa, int64_t n) {
  return DotWithMin32<BlockQ4_1, BlockQ4_1Sum>(w, xa, n);
}
ARBITER_AVX2 float DotQ5_1(const uint8_t* w, const uint8_t* xa, int64_t n) {
  return DotWithMin32<BlockQ5_1, BlockQ5_1Sum>(w, xa, n);
}

// Q4_K/Q5_K: unpacks the 6-bit scales and mins (UnpackScalesMinsK4 on
// 32-bit words) to i16: lanes 0-7 the scales, 8-15 the mins.
ARBITER_AVX2 inline __m256i ScalesMinsK4(const uint8_t* packed) {
  const uint32_t u0 = LoadU32(packed), u1 = LoadU32(packed + 4), u2 = LoadU32(packed + 8);
  const uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
  const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
  return _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi),
                                             static_cast<int>(m_lo), static_cast<int>(m_hi)));
}

// Σ_j m_j·(bsum_2j + bsum_2j+1), as 4 × i32.
ARBITER_AVX2 inline __m128i MinsTerm(__m256i scales_mins, const BlockQ8_K& y) {
  const __m256i bs = Load256(y.bsums);
  const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
  return _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), pairs);
}

template <bool kFiveBits>
ARBITER_AVX2 inline float DotK4(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* y = reinterpret_cast<const BlockQ8_K*>(xa);
  constexpr size_t kBlockBytes = kFiveBits ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i, w += kBlockBytes) {
    // Q4_K and Q5_K share d, dmin and scales at the same offsets.
    const auto& b = *reinterpret_cast<const BlockQ4_K*>(w);
    const uint8_t* qs = kFiveBits ? reinterpret_cast<const BlockQ5_K*>(w)->qs : b.qs;
    const float dy = LoadF32(y[i].d);
    const __m256i sm = ScalesMinsK4(b.scales);
    acc_m = _mm_fmadd_ps(_mm_set1_ps(Half(b.dmin) * dy), _mm_cvtepi32_ps(MinsTerm(sm, y[i])), acc_m);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
    __m256i hbits = kFiveBits ? Load256(reinterpret_cast<const BlockQ5_K*>(w)->qh) : __m256i{};
    __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i q = Load256(qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFiveBits) {
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), bit4));
        hbits = _mm256_srli_epi16(hbits, 2);
      }
      const __m256i p0 = _mm256_maddubs_epi16(lo, Load256(y[i].qs + 64 * c));
      const __m256i p1 = _mm256_maddubs_epi16(hi, Load256(y[i].qs + 64 * c + 32));
      sum0 = _mm256_add_epi32(sum0, _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, Shuffle(kBroadcast16, 2 * c))));
      sum1 = _mm256_add_epi32(sum1, _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc, Shuffle(kBroadcast16, 2 * c + 1))));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(Half(b.d) * dy),
                          _mm256_cvtepi32_ps(_mm256_add_epi32(sum0, sum1)), acc);
  }
  return Hsum(acc) - Hsum128(acc_m);
}

ARBITER_AVX2 float DotQ4_K(const uint8_t* w, const uint8_t* xa, int64_t n) {
  return DotK4<false>(w, xa, n);
}
ARBITER_AVX2 float DotQ5_K(const uint8_t* w, const uint8_t* xa, int64_t n) {
  return DotK4<true>(w, xa, n);
}

// Q6_K: q ∈ [0, 63] unsigned through maddubs, the −32 offset as
// 32·Σ_j sc_j·bsum_j subtracted once per super-block.
ARBITER_AVX2 float DotQ6_K(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ6_K*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_K*>(xa);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(Load128(b[i].scales));
    const __m256i offset = _mm256_madd_epi16(sc16, Load256(y[i].bsums));
    __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i sc = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                                : _mm256_permute2x128_si256(sc16, sc16, 0x11);
      const __m256i qla = Load256(b[i].ql + 64 * h);
      const __m256i qlb = Load256(b[i].ql + 64 * h + 32);
      const __m256i qh = Load256(b[i].qh + 32 * h);
      const int8_t* yq = y[i].qs + 128 * h;
      const __m256i q0 = _mm256_or_si256(_mm256_and_si256(qla, low4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
      const __m256i q1 = _mm256_or_si256(_mm256_and_si256(qlb, low4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
      const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qla, 4), low4),
                                         _mm256_and_si256(qh, bits45));
      const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qlb, 4), low4),
                                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
      const __m256i p0 = _mm256_maddubs_epi16(q0, Load256(yq));
      const __m256i p1 = _mm256_maddubs_epi16(q1, Load256(yq + 32));
      const __m256i p2 = _mm256_maddubs_epi16(q2, Load256(yq + 64));
      const __m256i p3 = _mm256_maddubs_epi16(q3, Load256(yq + 96));
      sum0 = _mm256_add_epi32(sum0, _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 0))));
      sum1 = _mm256_add_epi32(sum1, _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 1))));
      sum0 = _mm256_add_epi32(sum0, _mm256_madd_epi16(p2, _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 2))));
      sum1 = _mm256_add_epi32(sum1, _mm256_madd_epi16(p3, _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 3))));
    }
    const __m256i total = _mm256_sub_epi32(_mm256_add_epi32(sum0, sum1), _mm256_slli_epi32(offset, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(Half(b[i].d) * LoadF32(y[i].d)), _mm256_cvtepi32_ps(total), acc);
  }
  return Hsum(acc);
}

ARBITER_AVX2 float DotQ8_K(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ8_K*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_K*>(xa);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
    for (int c = 0; c < 8; c += 2) {
      sum0 = _mm256_add_epi32(sum0, MulSumI8(Load256(b[i].qs + 32 * c), Load256(y[i].qs + 32 * c)));
      sum1 = _mm256_add_epi32(sum1, MulSumI8(Load256(b[i].qs + 32 * c + 32), Load256(y[i].qs + 32 * c + 32)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(LoadF32(b[i].d) * LoadF32(y[i].d)),
                          _mm256_cvtepi32_ps(_mm256_add_epi32(sum0, sum1)), acc);
  }
  return Hsum(acc);
}

template <float (*RowDot)(const uint8_t*, const uint8_t*, int64_t)>
ARBITER_AVX2 void Rows(const uint8_t* w, size_t row_bytes, int64_t n, const void* xa, int64_t rows,
                       float* y, bool accumulate) {
  const auto* x = static_cast<const uint8_t*>(xa);
  for (int64_t r = 0; r < rows; ++r, w += row_bytes) {
    const float dot = RowDot(w, x, n);
    y[r] = accumulate ? y[r] + dot : dot;
  }
}

// --- Dequantizers (bit-identical to quant_reference.cc) ------------------------

// out[0..32) = float(q_j) · d for 32 signed bytes q.
ARBITER_AVX2 inline void StoreScaled32(__m256i q, __m256 d, float* out) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
  _mm256_storeu_ps(out + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
  _mm256_storeu_ps(out + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
}
// out[0..32) = float(q_j) · d + m.
ARBITER_AVX2 inline void StoreScaledPlus32(__m256i q, __m256 d, __m256 m, float* out) {
  StoreScaled32(q, d, out);
  for (int k = 0; k < 32; k += 8) _mm256_storeu_ps(out + k, _mm256_add_ps(_mm256_loadu_ps(out + k), m));
}
// out[0..32) = float(q_j) · d − m (the K-quants' order: d·q first).
ARBITER_AVX2 inline void StoreScaledMinus32(__m256i q, __m256 d, __m256 m, float* out) {
  StoreScaled32(q, d, out);
  for (int k = 0; k < 32; k += 8) _mm256_storeu_ps(out + k, _mm256_sub_ps(_mm256_loadu_ps(out + k), m));
}

ARBITER_AVX2 void DequantF16(const uint8_t* row, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, LoadF16x8(row + 2 * i));
  for (; i < n; ++i) out[i] = _cvtsh_ss(LoadU16(row + 2 * i));
}
ARBITER_AVX2 void DequantBF16(const uint8_t* row, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, LoadBf16x8(row + 2 * i));
  for (; i < n; ++i) out[i] = Bf16ToFloat(LoadU16(row + 2 * i));
}
ARBITER_AVX2 void DequantQ4_0(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    StoreScaled32(_mm256_sub_epi8(Nibbles32(b[i].qs), _mm256_set1_epi8(8)), _mm256_set1_ps(Half(b[i].d)), out);
  }
}
ARBITER_AVX2 void DequantQ4_1(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    StoreScaledPlus32(Nibbles32(b[i].qs), _mm256_set1_ps(Half(b[i].d)), _mm256_set1_ps(Half(b[i].m)), out);
  }
}
ARBITER_AVX2 void DequantQ5_0(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ5_0*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    const __m256i high = _mm256_andnot_si256(BitsToBytes(LoadU32(b[i].qh)), _mm256_set1_epi8(static_cast<char>(0xF0)));
    StoreScaled32(_mm256_or_si256(Nibbles32(b[i].qs), high), _mm256_set1_ps(Half(b[i].d)), out);
  }
}
ARBITER_AVX2 void DequantQ5_1(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ5_1*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    const __m256i high = _mm256_and_si256(BitsToBytes(LoadU32(b[i].qh)), _mm256_set1_epi8(0x10));
    StoreScaledPlus32(_mm256_or_si256(Nibbles32(b[i].qs), high), _mm256_set1_ps(Half(b[i].d)),
                      _mm256_set1_ps(Half(b[i].m)), out);
  }
}
ARBITER_AVX2 void DequantQ8_0(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    StoreScaled32(Load256(b[i].qs), _mm256_set1_ps(Half(b[i].d)), out);
  }
}

template <bool kFiveBits>
ARBITER_AVX2 inline void DequantK4(const uint8_t* row, int64_t n, float* out) {
  constexpr size_t kBlockBytes = kFiveBits ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  for (int64_t i = 0; i < n / kQKK; ++i, row += kBlockBytes) {
    const auto& b = *reinterpret_cast<const BlockQ4_K*>(row);
    const uint8_t* qs = kFiveBits ? reinterpret_cast<const BlockQ5_K*>(row)->qs : b.qs;
    __m256i hbits = kFiveBits ? Load256(reinterpret_cast<const BlockQ5_K*>(row)->qh) : __m256i{};
    const float d = Half(b.d), dmin = Half(b.dmin);
    uint8_t sc[8], m[8];
    UnpackScalesMinsK4(b.scales, sc, m);
    for (int c = 0; c < 4; ++c, out += 64) {
      const __m256i q = Load256(qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFiveBits) {
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), bit4));
        hbits = _mm256_srli_epi16(hbits, 2);
      }
      StoreScaledMinus32(lo, _mm256_set1_ps(d * sc[2 * c]), _mm256_set1_ps(dmin * m[2 * c]), out);
      StoreScaledMinus32(hi, _mm256_set1_ps(d * sc[2 * c + 1]), _mm256_set1_ps(dmin * m[2 * c + 1]),
                         out + 32);
    }
  }
}
ARBITER_AVX2 void DequantQ4_K(const uint8_t* row, int64_t n, float* out) { DequantK4<false>(row, n, out); }
ARBITER_AVX2 void DequantQ5_K(const uint8_t* row, int64_t n, float* out) { DequantK4<true>(row, n, out); }

ARBITER_AVX2 void DequantQ6_K(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ6_K*>(row);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i k32 = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = Half(b[i].d);
    for (int h = 0; h < 2; ++h, out += 128) {
      const __m256i qla = Load256(b[i].ql + 64 * h);
      const __m256i qlb = Load256(b[i].ql + 64 * h + 32);
      const __m256i qh = Load256(b[i].qh + 32 * h);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(qla, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
      q[1] = _mm256_or_si256(_mm256_and_si256(qlb, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qla, 4), low4), _mm256_and_si256(qh, bits45));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qlb, 4), low4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
      const int8_t* sc = b[i].scales + 8 * h;
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_sub_epi8(q[k], k32);
        const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
        const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(sc[2 * k]));
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sc[2 * k + 1]));
        float* o = out + 32 * k;
        _mm256_storeu_ps(o, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
      }
    }
  }
}

ARBITER_AVX2 void DequantQ8_K(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ8_K*>(row);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const __m256 d = _mm256_set1_ps(LoadF32(b[i].d));
    for (int c = 0; c < 8; ++c, out += 32) StoreScaled32(Load256(b[i].qs + 32 * c), d, out);
  }
}

}  // namespace

void FillAvx2Kernels(KernelTable* t) {
  t->quantize_q8_0 = ActQ8_0;
  t->quantize_q8_1 = ActQ8_1;
  t->quantize_q8_K = ActQ8_K;
  t->dot_rows[Slot(GgmlType::kF32)] = Rows<DotF32>;
  t->dot_rows[Slot(GgmlType::kF16)] = Rows<DotF16>;
  t->dot_rows[Slot(GgmlType::kBF16)] = Rows<DotBF16>;
  t->dot_rows[Slot(GgmlType::kQ4_0)] = Rows<DotQ4_0>;
  t->dot_rows[Slot(GgmlType::kQ4_1)] = Rows<DotQ4_1>;
  t->dot_rows[Slot(GgmlType::kQ5_0)] = Rows<DotQ5_0>;
  t->dot_rows[Slot(GgmlType::kQ5_1)] = Rows<DotQ5_1>;
  t->dot_rows[Slot(GgmlType::kQ8_0)] = Rows<DotQ8_0>;
  t->dot_rows[Slot(GgmlType::kQ4_K)] = Rows<DotQ4_K>;
  t->dot_rows[Slot(GgmlType::kQ5_K)] = Rows<DotQ5_K>;
  t->dot_rows[Slot(GgmlType::kQ6_K)] = Rows<DotQ6_K>;
  t->dot_rows[Slot(GgmlType::kQ8_K)] = Rows<DotQ8_K>;
  t->dequantize_row[Slot(GgmlType::kF16)] = DequantF16;
  t->dequantize_row[Slot(GgmlType::kBF16)] = DequantBF16;
  t->dequantize_row[Slot(GgmlType::kQ4_0)] = DequantQ4_0;
  t->dequantize_row[Slot(GgmlType::kQ4_1)] = DequantQ4_1;
  t->dequantize_row[Slot(GgmlType::kQ5_0)] = DequantQ5_0;
  t->dequantize_row[Slot(GgmlType::kQ5_1)] = DequantQ5_1;
  t->dequantize_row[Slot(GgmlType::kQ8_0)] = DequantQ8_0;
  t->dequantize_row[Slot(GgmlType::kQ4_K)] = DequantQ4_K;
  t->dequantize_row[Slot(GgmlType::kQ5_K)] = DequantQ5_K;
  t->dequantize_row[Slot(GgmlType::kQ6_K)] = DequantQ6_K;
  t->dequantize_row[Slot(GgmlType::kQ8_K)] = DequantQ8_K;
}

}  // namespace arbiter::engine_internal::quant

#endif  // defined(__x86_64__)
