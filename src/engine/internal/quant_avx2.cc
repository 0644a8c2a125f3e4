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
// activations by maddubs (u8 × i8 → i16 pairs) and madd (→ i32). The
// signed 8-bit weights (Q8_0, Q8_K) go through the sign trick: |w| as the
// unsigned operand and x·sign(w) as the signed one; |w| ≤ 128 and |x| ≤ 127
// (activations never hold −128) keep every i16 pair sum below
// 2·128·127 = 32512, so maddubs never saturates. The offset types (Q4_0,
// Q5_0, Q6_K) multiply their unsigned codes and take the offset out with
// x's block sums (see the 32-element types and DotQ6_K). K-quant sub-block scales
// are applied in the integer domain (madd by the scale), so a 256-element
// super-block needs one int→float conversion and one FMA.
//
// The dequantizers are in quant_avx2_dequant.cc, the shared helpers in
// quant_avx2.h.
#if defined(__x86_64__)

#include "engine/internal/quant_avx2.h"

#include <cstring>
#include <vector>

namespace arbiter::engine_internal::quant {
namespace {

using namespace avx2;  // NOLINT: this path's helpers

// --- Activation quantizers (quant_internal.h: identical to the scalar ones) ---

// max |x| over n floats (n a multiple of 32).
ARBITER_AVX2 inline float AbsMax(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8)
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
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
  const __m256i s =
      _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
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
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs),
                        QuantizeBlock32(x, _mm256_set1_ps(id)));
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
  for (; i + 8 <= n; i += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
  float s = Hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}

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
  for (; i + 8 <= n; i += 8)
    a0 = _mm256_fmadd_ps(LoadBf16x8(w + 2 * i), _mm256_loadu_ps(x + i), a0);
  float s = Hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += Bf16ToFloat(LoadU16(w + 2 * i)) * x[i];
  return s;
}

// The 32-element types. Once per DotRows call, x's blocks are prepared
// (Prepared32): their f32 scales d_x, Q8_1's s_x, and for the offset types
// (Q4_0: w = d·(q − 8), Q5_0: d·(q − 16)) offset·d_x·Σx per block, so the
// weights go through maddubs as unsigned values (no sign trick) and
// d_w·d_x·Σ (q − o)·x = d_w·d_x·Σ q·x − d_w·(o·d_x·Σx) takes the offset
// out with one FMA per 8 blocks. Per 8 blocks of a row, the 8 f16 scales
// d_w are gathered in general-purpose registers and converted and multiplied
// by d_x with one instruction each; each block then only broadcasts its
// scale from memory. Q4_1/Q5_1's mins add m_w·s_x for 8 blocks in one FMA.
enum class Kind32 { kQ4_0, kQ5_0, kQ8_0, kQ4_1, kQ5_1 };

struct Prepared32 {
  const float* dx = nullptr;  // [nb]
  const float* sx = nullptr;  // [nb]: s_x (Q8_1), or o·d_x·Σ q_x (Q4_0, Q5_0)
};

// Per-thread scratch for Prepared32, grown as needed (DotRows is called per
// chunk of rows, from any thread).
struct Scratch32 {
  std::vector<float> dx, sx;
};
thread_local Scratch32 t_scratch32;

template <Kind32 kKind>
ARBITER_AVX2 Prepared32 Prepare32(const uint8_t* xa, int64_t nb) {
  constexpr bool kQ81 = kKind == Kind32::kQ4_1 || kKind == Kind32::kQ5_1;
  constexpr size_t kXBytes = kQ81 ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
  constexpr int kOffset = kKind == Kind32::kQ4_0 ? 8 : (kKind == Kind32::kQ5_0 ? 16 : 0);
  Scratch32& s = t_scratch32;
  const size_t need = static_cast<size_t>(nb);
  if (s.dx.size() < need) s.dx.resize(need);
  Prepared32 p;
  p.dx = s.dx.data();
  for (int64_t i = 0; i < nb; ++i) s.dx[i] = Half(xa + i * kXBytes);
  if (s.sx.size() < need) s.sx.resize(need);
  p.sx = s.sx.data();
  if constexpr (kQ81) {
    for (int64_t i = 0; i < nb; ++i) s.sx[i] = Half(xa + i * kXBytes + 2);
  } else if constexpr (kOffset != 0) {
    for (int64_t i = 0; i < nb; ++i) {
      const int sum = SumBytes(Load256(xa + i * kXBytes + 2));
      s.sx[i] = static_cast<float>(kOffset) * s.dx[i] * static_cast<float>(sum);
    }
  }
  return p;
}

// Σ over groups of 4 of q_w·q_x for one block, as 8 × i32; Q4_0/Q5_0 with
// their unsigned codes (DotRow32 takes the offsets out).
template <Kind32 kKind>
ARBITER_AVX2 inline __m256i BlockSum32(const uint8_t* blk, const uint8_t* xblk) {
  if constexpr (kKind == Kind32::kQ8_0) {
    return MulSumI8(Load256(blk + 2), Load256(xblk + 2));
  } else if constexpr (kKind == Kind32::kQ4_0) {
    return MulSumU8I8(Nibbles32(blk + 2), Load256(xblk + 2));
  } else if constexpr (kKind == Kind32::kQ5_0) {
    const __m256i high = _mm256_and_si256(BitsToBytes(LoadU32(blk + 2)), _mm256_set1_epi8(0x10));
    const __m256i q = _mm256_or_si256(Nibbles32(blk + 6), high);
    return MulSumU8I8(q, Load256(xblk + 2));
  } else if constexpr (kKind == Kind32::kQ4_1) {
    return MulSumU8I8(Nibbles32(blk + 4), Load256(xblk + 4));
  } else {  // Q5_1
    const __m256i high = _mm256_and_si256(BitsToBytes(LoadU32(blk + 4)), _mm256_set1_epi8(0x10));
    return MulSumU8I8(_mm256_or_si256(Nibbles32(blk + 8), high), Load256(xblk + 4));
  }
}

// acc + (*scale) · float(sum).
ARBITER_AVX2 inline __m256 ScaledAdd(const float* scale, __m256i sum, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_broadcast_ss(scale), _mm256_cvtepi32_ps(sum), acc);
}

template <Kind32 kKind>
ARBITER_AVX2 inline float DotRow32(const uint8_t* w, const uint8_t* xa, int64_t nb,
                                   const Prepared32& p) {
  // Q4_1/Q5_1: + m_w·s_x; Q4_0/Q5_0: − d_w·(o·d_x·Σx). Both per block
  // from Prepared32::sx, with the f16 at offset kAux of the block.
  constexpr bool kMins = kKind == Kind32::kQ4_1 || kKind == Kind32::kQ5_1;
  constexpr bool kAux = kMins || kKind == Kind32::kQ4_0 || kKind == Kind32::kQ5_0;
  constexpr size_t kAuxAt = kMins ? 2 : 0;
  constexpr size_t kB = kKind == Kind32::kQ4_0   ? sizeof(BlockQ4_0)
                        : kKind == Kind32::kQ5_0 ? sizeof(BlockQ5_0)
                        : kKind == Kind32::kQ8_0 ? sizeof(BlockQ8_0)
                        : kKind == Kind32::kQ4_1 ? sizeof(BlockQ4_1)
                                                 : sizeof(BlockQ5_1);
  constexpr size_t kX = kMins ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
  // Four accumulators (an FMA's latency is ~4 cycles, a block's work ~2),
  // as named variables: an array indexed by k & 3 ends up on the stack.
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc_m = acc0;
  alignas(32) float scale[8];
  int64_t i = 0;
  for (; i + 8 <= nb; i += 8) {
    const uint8_t* b = w + i * kB;
    const uint8_t* xb = xa + i * kX;
    const __m256 dw = Gather8Halves(b, kB);
    _mm256_store_ps(scale, _mm256_mul_ps(dw, _mm256_loadu_ps(p.dx + i)));
    if constexpr (kMins)
      acc_m = _mm256_fmadd_ps(Gather8Halves(b + kAuxAt, kB), _mm256_loadu_ps(p.sx + i), acc_m);
    if constexpr (!kMins && kAux) acc_m = _mm256_fmadd_ps(dw, _mm256_loadu_ps(p.sx + i), acc_m);
    acc0 = ScaledAdd(scale + 0, BlockSum32<kKind>(b + 0 * kB, xb + 0 * kX), acc0);
    acc1 = ScaledAdd(scale + 1, BlockSum32<kKind>(b + 1 * kB, xb + 1 * kX), acc1);
    acc2 = ScaledAdd(scale + 2, BlockSum32<kKind>(b + 2 * kB, xb + 2 * kX), acc2);
    acc3 = ScaledAdd(scale + 3, BlockSum32<kKind>(b + 3 * kB, xb + 3 * kX), acc3);
    acc0 = ScaledAdd(scale + 4, BlockSum32<kKind>(b + 4 * kB, xb + 4 * kX), acc0);
    acc1 = ScaledAdd(scale + 5, BlockSum32<kKind>(b + 5 * kB, xb + 5 * kX), acc1);
    acc2 = ScaledAdd(scale + 6, BlockSum32<kKind>(b + 6 * kB, xb + 6 * kX), acc2);
    acc3 = ScaledAdd(scale + 7, BlockSum32<kKind>(b + 7 * kB, xb + 7 * kX), acc3);
  }
  float mins = 0;
  for (; i < nb; ++i) {
    const uint8_t* b = w + i * kB;
    const __m256i s = BlockSum32<kKind>(b, xa + i * kX);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b) * p.dx[i]), _mm256_cvtepi32_ps(s), acc0);
    if constexpr (kAux) mins += Half(b + kAuxAt) * p.sx[i];
  }
  if constexpr (kAux) mins += Hsum(acc_m);
  if constexpr (!kMins && kAux) mins = -mins;
  return Hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))) + mins;
}

template <Kind32 kKind>
ARBITER_AVX2 void Rows32(const uint8_t* w, size_t row_bytes, int64_t n, const void* xa,
                         int64_t rows, float* y, bool accumulate) {
  const auto* x = static_cast<const uint8_t*>(xa);
  const int64_t nb = n / kQK;
  const Prepared32 p = Prepare32<kKind>(x, nb);
  for (int64_t r = 0; r < rows; ++r, w += row_bytes) {
    const float dot = DotRow32<kKind>(w, x, nb, p);
    y[r] = accumulate ? y[r] + dot : dot;
  }
}

// Q4_K/Q5_K: the 6-bit scales and mins (UnpackScalesMinsK4 on 32-bit
// words, in vector registers) as i16: lanes 0-7 the scales, 8-15 the mins.
// Reads 16 bytes from `packed` (the 12 scale bytes and 4 quant bytes).
ARBITER_AVX2 inline __m256i ScalesMinsK4(const uint8_t* packed) {
  const __m128i v = Load128(packed);                         // dwords u0, u1, u2, (quants)
  const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x3f));  // sc0-3, m0-3
  const __m128i u2 = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
  const __m128i nib =
      _mm_and_si128(_mm_srlv_epi32(u2, _mm_setr_epi32(0, 4, 0, 0)), _mm_set1_epi8(0x0f));
  const __m128i top = _mm_and_si128(_mm_srli_epi32(v, 2), _mm_set1_epi8(0x30));
  const __m128i hi = _mm_or_si128(nib, top);  // sc4-7, m4-7
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi32(lo, hi));
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
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i, w += kBlockBytes) {
    // Q4_K and Q5_K share d, dmin and scales at the same offsets.
    const auto& b = *reinterpret_cast<const BlockQ4_K*>(w);
    const uint8_t* qs = kFiveBits ? reinterpret_cast<const BlockQ5_K*>(w)->qs : b.qs;
    // [d·d_x, dmin·d_x] from the two adjacent f16s.
    const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(b.d)))),
                                 _mm_set1_ps(LoadF32(y[i].d)));
    const __m256i sm = ScalesMinsK4(b.scales);
    acc_m = _mm_fmadd_ps(_mm_shuffle_ps(dd, dd, 0x55), _mm_cvtepi32_ps(MinsTerm(sm, y[i])), acc_m);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
    __m256i hbits = kFiveBits ? Load256(reinterpret_cast<const BlockQ5_K*>(w)->qh) : __m256i{};
    __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i q = Load256(qs + 32 * c);
      __m256i lo, hi;
      UnpackK4Chunk<kFiveBits>(q, &hbits, &lo, &hi);
      const __m256i p0 = _mm256_maddubs_epi16(lo, Load256(y[i].qs + 64 * c));
      const __m256i p1 = _mm256_maddubs_epi16(hi, Load256(y[i].qs + 64 * c + 32));
      sum0 = _mm256_add_epi32(
          sum0, _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, Shuffle(kBroadcast16, 2 * c))));
      sum1 = _mm256_add_epi32(
          sum1, _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc, Shuffle(kBroadcast16, 2 * c + 1))));
    }
    acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd),
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
      const __m256i q0 = Q6Code<0>(qla, qlb, qh);
      const __m256i q1 = Q6Code<1>(qla, qlb, qh);
      const __m256i q2 = Q6Code<2>(qla, qlb, qh);
      const __m256i q3 = Q6Code<3>(qla, qlb, qh);
      const __m256i p0 = _mm256_maddubs_epi16(q0, Load256(yq));
      const __m256i p1 = _mm256_maddubs_epi16(q1, Load256(yq + 32));
      const __m256i p2 = _mm256_maddubs_epi16(q2, Load256(yq + 64));
      const __m256i p3 = _mm256_maddubs_epi16(q3, Load256(yq + 96));
      sum0 = _mm256_add_epi32(sum0,
                              _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 0))));
      sum1 = _mm256_add_epi32(sum1,
                              _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 1))));
      sum0 = _mm256_add_epi32(sum0,
                              _mm256_madd_epi16(p2, _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 2))));
      sum1 = _mm256_add_epi32(sum1,
                              _mm256_madd_epi16(p3, _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 3))));
    }
    const __m256i total =
        _mm256_sub_epi32(_mm256_add_epi32(sum0, sum1), _mm256_slli_epi32(offset, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(Half(b[i].d) * LoadF32(y[i].d)), _mm256_cvtepi32_ps(total),
                          acc);
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
      sum1 = _mm256_add_epi32(
          sum1, MulSumI8(Load256(b[i].qs + 32 * c + 32), Load256(y[i].qs + 32 * c + 32)));
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

}  // namespace

void FillAvx2Kernels(KernelTable* t) {
  t->quantize_q8_0 = ActQ8_0;
  t->quantize_q8_1 = ActQ8_1;
  t->quantize_q8_K = ActQ8_K;
  t->dot_rows[Slot(GgmlType::kF32)] = Rows<DotF32>;
  t->dot_rows[Slot(GgmlType::kF16)] = Rows<DotF16>;
  t->dot_rows[Slot(GgmlType::kBF16)] = Rows<DotBF16>;
  t->dot_rows[Slot(GgmlType::kQ4_0)] = Rows32<Kind32::kQ4_0>;
  t->dot_rows[Slot(GgmlType::kQ4_1)] = Rows32<Kind32::kQ4_1>;
  t->dot_rows[Slot(GgmlType::kQ5_0)] = Rows32<Kind32::kQ5_0>;
  t->dot_rows[Slot(GgmlType::kQ5_1)] = Rows32<Kind32::kQ5_1>;
  t->dot_rows[Slot(GgmlType::kQ8_0)] = Rows32<Kind32::kQ8_0>;
  t->dot_rows[Slot(GgmlType::kQ4_K)] = Rows<DotQ4_K>;
  t->dot_rows[Slot(GgmlType::kQ5_K)] = Rows<DotQ5_K>;
  t->dot_rows[Slot(GgmlType::kQ6_K)] = Rows<DotQ6_K>;
  t->dot_rows[Slot(GgmlType::kQ8_K)] = Rows<DotQ8_K>;
  avx2::FillAvx2Dequantizers(t);
}

}  // namespace arbiter::engine_internal::quant

#endif  // defined(__x86_64__)
