// engine/internal/quant_avx2_dequant.cc — the AVX2 dequantizers behind
// DequantizeRows (prefill's row panels). Each value is computed with the
// reference's float operations in the reference's order (quant_reference.cc;
// no FMA contraction: the quant files build with -ffp-contract=off), so the
// output is bit-identical to DequantizeRowReference.
#if defined(__x86_64__)

#include "engine/internal/quant_avx2.h"

namespace arbiter::engine_internal::quant::avx2 {
namespace {

// out[0..32) = float(q_j) · d for 32 signed bytes q.
ARBITER_AVX2 inline void StoreScaled32(__m256i q, __m256 d, float* out) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
  _mm256_storeu_ps(
      out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
  _mm256_storeu_ps(out + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
  _mm256_storeu_ps(
      out + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
}
// out[0..32) = float(q_j) · d + m.
ARBITER_AVX2 inline void StoreScaledPlus32(__m256i q, __m256 d, __m256 m, float* out) {
  StoreScaled32(q, d, out);
  for (int k = 0; k < 32; k += 8)
    _mm256_storeu_ps(out + k, _mm256_add_ps(_mm256_loadu_ps(out + k), m));
}
// out[0..32) = float(q_j) · d − m (the K-quants' order: d·q first).
ARBITER_AVX2 inline void StoreScaledMinus32(__m256i q, __m256 d, __m256 m, float* out) {
  StoreScaled32(q, d, out);
  for (int k = 0; k < 32; k += 8)
    _mm256_storeu_ps(out + k, _mm256_sub_ps(_mm256_loadu_ps(out + k), m));
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
    StoreScaled32(_mm256_sub_epi8(Nibbles32(b[i].qs), _mm256_set1_epi8(8)),
                  _mm256_set1_ps(Half(b[i].d)), out);
  }
}
ARBITER_AVX2 void DequantQ4_1(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    StoreScaledPlus32(Nibbles32(b[i].qs), _mm256_set1_ps(Half(b[i].d)),
                      _mm256_set1_ps(Half(b[i].m)), out);
  }
}
ARBITER_AVX2 void DequantQ5_0(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ5_0*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    const __m256i high = _mm256_andnot_si256(BitsToBytes(LoadU32(b[i].qh)),
                                             _mm256_set1_epi8(static_cast<char>(0xF0)));
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
  for (int64_t i = 0; i < n / kQKK; ++i, row += kBlockBytes) {
    const auto& b = *reinterpret_cast<const BlockQ4_K*>(row);
    const uint8_t* qs = kFiveBits ? reinterpret_cast<const BlockQ5_K*>(row)->qs : b.qs;
    __m256i hbits = kFiveBits ? Load256(reinterpret_cast<const BlockQ5_K*>(row)->qh) : __m256i{};
    const float d = Half(b.d), dmin = Half(b.dmin);
    uint8_t sc[8], m[8];
    UnpackScalesMinsK4(b.scales, sc, m);
    for (int c = 0; c < 4; ++c, out += 64) {
      const __m256i q = Load256(qs + 32 * c);
      __m256i lo, hi;
      UnpackK4Chunk<kFiveBits>(q, &hbits, &lo, &hi);
      StoreScaledMinus32(lo, _mm256_set1_ps(d * sc[2 * c]), _mm256_set1_ps(dmin * m[2 * c]), out);
      StoreScaledMinus32(hi, _mm256_set1_ps(d * sc[2 * c + 1]), _mm256_set1_ps(dmin * m[2 * c + 1]),
                         out + 32);
    }
  }
}
ARBITER_AVX2 void DequantQ4_K(const uint8_t* row, int64_t n, float* out) {
  DequantK4<false>(row, n, out);
}
ARBITER_AVX2 void DequantQ5_K(const uint8_t* row, int64_t n, float* out) {
  DequantK4<true>(row, n, out);
}

ARBITER_AVX2 void DequantQ6_K(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ6_K*>(row);
  const __m256i k32 = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = Half(b[i].d);
    for (int h = 0; h < 2; ++h, out += 128) {
      const __m256i qla = Load256(b[i].ql + 64 * h);
      const __m256i qlb = Load256(b[i].ql + 64 * h + 32);
      const __m256i qh = Load256(b[i].qh + 32 * h);
      const __m256i q[4] = {Q6Code<0>(qla, qlb, qh), Q6Code<1>(qla, qlb, qh),
                            Q6Code<2>(qla, qlb, qh), Q6Code<3>(qla, qlb, qh)};
      const int8_t* sc = b[i].scales + 8 * h;
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_sub_epi8(q[k], k32);
        const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
        const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(sc[2 * k]));
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sc[2 * k + 1]));
        float* o = out + 32 * k;
        _mm256_storeu_ps(o, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
        _mm256_storeu_ps(
            o + 8,
            _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
        _mm256_storeu_ps(
            o + 24,
            _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
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

void FillAvx2Dequantizers(KernelTable* t) {
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

}  // namespace arbiter::engine_internal::quant::avx2

#endif  // defined(__x86_64__)
