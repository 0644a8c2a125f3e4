// engine/internal/quant_avx2.h — the helpers the AVX2 kernel files share
// (quant_avx2.cc: activations and dot products; quant_avx2_dequant.cc:
// dequantizers). Included only by them: every function carries ARBITER_AVX2,
// a function-level target attribute, so callers must carry it too.
//
// Thread safety: pure functions and constants.
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "engine/internal/quant_internal.h"

#define ARBITER_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace arbiter::engine_internal::quant::avx2 {

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

// Code group k ∈ [0, 4) (32 weights) of one 128-weight half of a Q6_K
// super-block as unsigned 6-bit quants: the low 4 bits from ql (qla =
// ql[0, 32), qlb = ql[32, 64) of the half; groups 2 and 3 take the high
// nibbles), bits 4–5 from qh's 2-bit field k.
template <int k>
ARBITER_AVX2 inline __m256i Q6Code(__m256i qla, __m256i qlb, __m256i qh) {
  static_assert(k >= 0 && k < 4);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i ql = k % 2 == 0 ? qla : qlb;
  const __m256i nibble = k < 2 ? _mm256_and_si256(ql, low4)
                               : _mm256_and_si256(_mm256_srli_epi16(ql, 4), low4);
  __m256i high = qh;  // field k of qh moved to bits 4–5
  if constexpr (k == 0) high = _mm256_slli_epi16(qh, 4);
  if constexpr (k == 1) high = _mm256_slli_epi16(qh, 2);
  if constexpr (k == 3) high = _mm256_srli_epi16(qh, 2);
  return _mm256_or_si256(nibble, _mm256_and_si256(high, bits45));
}

// Chunk c (32 bytes of qs, 64 weights) of a Q4_K / Q5_K super-block as
// unsigned 8-bit quants: *lo the first 32 weights (low nibbles), *hi the
// next 32 (high nibbles); for Q5_K (kFiveBits) bit 4 comes from *hbits
// (the block's qh, loaded whole), which is shifted on for the next chunk.
template <bool kFiveBits>
ARBITER_AVX2 inline void UnpackK4Chunk(__m256i q, __m256i* hbits, __m256i* lo, __m256i* hi) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  *lo = _mm256_and_si256(q, low4);
  *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
  if constexpr (kFiveBits) {
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi16(*hbits, 4), bit4));
    *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_slli_epi16(*hbits, 3), bit4));
    *hbits = _mm256_srli_epi16(*hbits, 2);
  }
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
inline constexpr ShuffleTable kBroadcast16 = MakeBroadcast16();
inline constexpr ShuffleTable kPairQ6 = MakePairQ6();

ARBITER_AVX2 inline __m256i Shuffle(const ShuffleTable& t, int k) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(t.b[k]));
}

// The 8 f16 values at w + k·stride (k < 8) as f32. The 16-bit loads are
// combined in general-purpose registers (the empty asm keeps GCC from
// "vectorizing" the combination into a dozen vector shuffles, which would
// compete with the dot product for the vector pipes).
ARBITER_AVX2 inline __m256 Gather8Halves(const uint8_t* w, size_t stride) {
  uint64_t lo = 0, hi = 0;
  for (int k = 0; k < 4; ++k) {
    lo |= static_cast<uint64_t>(LoadU16(w + k * stride)) << (16 * k);
    hi |= static_cast<uint64_t>(LoadU16(w + (k + 4) * stride)) << (16 * k);
    __asm__("" : "+r"(lo), "+r"(hi));
  }
  return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<int64_t>(hi), static_cast<int64_t>(lo)));
}

ARBITER_AVX2 inline __m256 LoadF16x8(const uint8_t* p) { return _mm256_cvtph_ps(Load128(p)); }

// 8 bf16 → 8 f32: widen to 32 bits, shift into the high half.
ARBITER_AVX2 inline __m256 LoadBf16x8(const uint8_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(Load128(p)), 16));
}

// Fills the dequantizer entries (quant_avx2_dequant.cc).
void FillAvx2Dequantizers(KernelTable* table);

}  // namespace arbiter::engine_internal::quant::avx2

#endif  // defined(__x86_64__)
