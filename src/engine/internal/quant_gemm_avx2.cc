// engine/internal/quant_gemm_avx2.cc — the AVX2 tile kernels of prefill's
// integer product (quant_gemm.h), for the 32-element types (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0) and the K-quants Q4_K, Q5_K and Q6_K.
//
// A tile is R rows × T tokens: each weight block is unpacked to bytes once
// and multiplied (maddubs + madd, as quant_avx2.cc's decode dot products)
// with the T tokens' activation blocks, so the unpacking — shifts, masks,
// high bits, K-quant scale shuffles — is paid once per T products instead of
// once per product.
//   - The K-quants: 1 row × up to 8 tokens. Per 32-element sub-block and
//     token: maddubs, madd by the sub-block's integer scale, add. Per
//     256-element super-block the T integer sums (and Q4_K/Q5_K's mins
//     terms, from the prepared pair sums) are reduced to one lane per token
//     (hadd), so the float work — d·d_x, dmin·d_x — is one 4-lane vector op
//     per 4 tokens. Q6_K's −32 offset is taken out of the integer sums with
//     the activation's 16-element sums (as DotQ6_K).
//   - The 32-element types: 2 rows × up to 4 tokens. Per 8 blocks, the 8 f16
//     weight scales of each row are converted once and multiplied with the 8
//     prepared d_x of each token; each block and token then needs
//     int→float and an FMA (and Q8_0 the sign trick), and the offsets
//     (Q4_0: −8·d_w·d_x·Σq_x, Q5_0: −16·…) and mins (Q4_1/Q5_1: + m_w·s_x)
//     go into the same accumulators with one FMA per 8 blocks. forward.cc
//     Note [Prefill on typed weights] says why prefill uses these only for
//     the K-quants.
//
// A call loops over groups of tokens outside and tiles of rows inside, so
// the call's rows (a few dozen, from MatVecPool::ParallelFor) stay in L1/L2
// while every group of tokens passes over them.
//
// Every function carries ARBITER_AVX2; quant_gemm.cc calls here only when
// the active path is AVX2.
#if defined(__x86_64__)

#include <algorithm>
#include <cstddef>

#include "engine/internal/quant_avx2.h"

namespace arbiter::engine_internal::quant {
namespace {

using namespace avx2;  // NOLINT: this path's helpers

constexpr int kTileTokens = 4;  // tokens per tile of the 32-element types

// The 32-element types' view of PrepareGemmActivations' layout.
struct Acts {
  const uint8_t* rows = nullptr;  // [nt] activation rows
  size_t row_bytes = 0;
  const float* dx = nullptr;    // [nt, nb]
  const float* sums = nullptr;  // [nt, nb]
  int64_t nb = 0;
};

Acts ActsOf(const uint8_t* xa, size_t row_bytes, int64_t nb, int nt) {
  Acts a;
  a.rows = xa;
  a.row_bytes = row_bytes;
  a.nb = nb;
  const size_t off = (row_bytes * static_cast<size_t>(nt) + 31) / 32 * 32;
  a.dx = reinterpret_cast<const float*>(xa + off);
  a.sums = a.dx + nb * nt;
  return a;
}

// An empty asm on an accumulator: GCC reassociates chains of integer adds
// into trees whose pending products (one vector per token and sub-block)
// spill; this keeps each token's sum a running register.
ARBITER_AVX2 inline void KeepInRegister(__m256i& v) { __asm__("" : "+x"(v)); }

ARBITER_AVX2 inline void Store(float* y, float v, bool accumulate) {
  *y = accumulate ? *y + v : v;
}

// --- The 32-element types ------------------------------------------------------

enum class Kind { kQ4_0, kQ5_0, kQ8_0, kQ4_1, kQ5_1 };

template <Kind kKind>
struct Traits {
  static constexpr bool kMins = kKind == Kind::kQ4_1 || kKind == Kind::kQ5_1;
  static constexpr int kOffset = kKind == Kind::kQ4_0 ? 8 : (kKind == Kind::kQ5_0 ? 16 : 0);
  static constexpr size_t kB = kKind == Kind::kQ4_0   ? sizeof(BlockQ4_0)
                               : kKind == Kind::kQ5_0 ? sizeof(BlockQ5_0)
                               : kKind == Kind::kQ8_0 ? sizeof(BlockQ8_0)
                               : kKind == Kind::kQ4_1 ? sizeof(BlockQ4_1)
                                                      : sizeof(BlockQ5_1);
  static constexpr size_t kX = kMins ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
  static constexpr size_t kXq = kMins ? 4 : 2;  // offset of the activation's qs
};

// One weight block as maddubs operands: `u` the unsigned operand (codes, or
// |w| for Q8_0), `s` Q8_0's signed bytes (the sign trick, quant_avx2.cc).
struct WBlock {
  __m256i u, s;
};

template <Kind kKind>
ARBITER_AVX2 inline WBlock Unpack(const uint8_t* blk) {
  WBlock b;
  if constexpr (kKind == Kind::kQ8_0) {
    b.s = Load256(blk + 2);
    b.u = _mm256_sign_epi8(b.s, b.s);
  } else if constexpr (kKind == Kind::kQ4_0) {
    b.u = Nibbles32(blk + 2);
  } else if constexpr (kKind == Kind::kQ5_0) {
    const __m256i high = _mm256_and_si256(BitsToBytes(LoadU32(blk + 2)), _mm256_set1_epi8(0x10));
    b.u = _mm256_or_si256(Nibbles32(blk + 6), high);
  } else if constexpr (kKind == Kind::kQ4_1) {
    b.u = Nibbles32(blk + 4);
  } else {  // Q5_1
    const __m256i high = _mm256_and_si256(BitsToBytes(LoadU32(blk + 4)), _mm256_set1_epi8(0x10));
    b.u = _mm256_or_si256(Nibbles32(blk + 8), high);
  }
  return b;
}

// Σ over groups of 4 of q_w·q_x, as 8 f32 (exact: |Σ| < 2^24).
template <Kind kKind>
ARBITER_AVX2 inline __m256 BlockDot(const WBlock& b, __m256i x) {
  __m256i p;
  if constexpr (kKind == Kind::kQ8_0) {
    p = _mm256_maddubs_epi16(b.u, _mm256_sign_epi8(x, b.s));
  } else {
    p = _mm256_maddubs_epi16(b.u, x);
  }
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

// Rows [0, R) × tokens [t0, t0 + T) of the product; w the tile's first row,
// y the output of (row 0, token t0).
template <Kind kKind, int R, int T>
ARBITER_AVX2 void Tile32(const uint8_t* w, size_t row_bytes, const Acts& a, int t0, float* y,
                         int64_t ldy, bool accumulate) {
  using Tr = Traits<kKind>;
  const int64_t nb = a.nb;
  const uint8_t* xr[T];
  const float* dx[T];
  const float* sx[T];
  for (int t = 0; t < T; ++t) {
    xr[t] = a.rows + static_cast<size_t>(t0 + t) * a.row_bytes + Tr::kXq;
    dx[t] = a.dx + (t0 + t) * nb;
    sx[t] = a.sums + (t0 + t) * nb;
  }
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  alignas(32) float scale[R][T][8];
  int64_t i = 0;
  for (; i + 8 <= nb; i += 8) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = w + r * row_bytes + i * Tr::kB;
      const __m256 dw = Gather8Halves(b, Tr::kB);
      for (int t = 0; t < T; ++t) {
        _mm256_store_ps(scale[r][t], _mm256_mul_ps(dw, _mm256_loadu_ps(dx[t] + i)));
      }
      if constexpr (Tr::kOffset != 0) {
        const __m256 dwo = _mm256_mul_ps(dw, _mm256_set1_ps(static_cast<float>(Tr::kOffset)));
        for (int t = 0; t < T; ++t) {
          acc[r][t] = _mm256_fnmadd_ps(dwo, _mm256_loadu_ps(sx[t] + i), acc[r][t]);
        }
      }
      if constexpr (Tr::kMins) {
        const __m256 mw = Gather8Halves(b + 2, Tr::kB);
        for (int t = 0; t < T; ++t) {
          acc[r][t] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(sx[t] + i), acc[r][t]);
        }
      }
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      WBlock wb[R];
      for (int r = 0; r < R; ++r) wb[r] = Unpack<kKind>(w + r * row_bytes + (i + k) * Tr::kB);
      for (int t = 0; t < T; ++t) {
        const __m256i x = Load256(xr[t] + (i + k) * Tr::kX);
        for (int r = 0; r < R; ++r) {
          acc[r][t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scale[r][t][k]),
                                      BlockDot<kKind>(wb[r], x), acc[r][t]);
        }
      }
    }
  }
  float tail[R][T] = {};
  for (; i < nb; ++i) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = w + r * row_bytes + i * Tr::kB;
      const WBlock wb = Unpack<kKind>(b);
      const float dw = Half(b);
      for (int t = 0; t < T; ++t) {
        const __m256i x = Load256(xr[t] + i * Tr::kX);
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx[t][i]), BlockDot<kKind>(wb, x),
                                    acc[r][t]);
        if constexpr (Tr::kOffset != 0) tail[r][t] -= dw * Tr::kOffset * sx[t][i];
        if constexpr (Tr::kMins) tail[r][t] += Half(b + 2) * sx[t][i];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) Store(y + t * ldy + r, Hsum(acc[r][t]) + tail[r][t], accumulate);
  }
}

template <Kind kKind, int R>
ARBITER_AVX2 void Tile32Tokens(int tn, const uint8_t* w, size_t row_bytes, const Acts& a, int t0,
                               float* y, int64_t ldy, bool accumulate) {
  switch (tn) {
    case 4:
      return Tile32<kKind, R, 4>(w, row_bytes, a, t0, y, ldy, accumulate);
    case 3:
      return Tile32<kKind, R, 3>(w, row_bytes, a, t0, y, ldy, accumulate);
    case 2:
      return Tile32<kKind, R, 2>(w, row_bytes, a, t0, y, ldy, accumulate);
    default:
      return Tile32<kKind, R, 1>(w, row_bytes, a, t0, y, ldy, accumulate);
  }
}

template <Kind kKind>
ARBITER_AVX2 void Gemm32(const uint8_t* w, size_t row_bytes, int64_t n, const uint8_t* xa, int nt,
                         int64_t rows, float* y, int64_t ldy, bool accumulate) {
  const Acts a = ActsOf(xa, static_cast<size_t>(n / kQK) * Traits<kKind>::kX, n / kQK, nt);
  for (int t0 = 0; t0 < nt; t0 += kTileTokens) {
    const int tn = std::min(kTileTokens, nt - t0);
    float* yt = y + t0 * ldy;
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
      Tile32Tokens<kKind, 2>(tn, w + r * row_bytes, row_bytes, a, t0, yt + r, ldy, accumulate);
    }
    if (r < rows) {
      Tile32Tokens<kKind, 1>(tn, w + r * row_bytes, row_bytes, a, t0, yt + r, ldy, accumulate);
    }
  }
}

// --- The K-quants -----------------------------------------------------------------

// [Σ lanes of s[0], …, Σ lanes of s[3]] (s[t] zero for t ≥ T).
template <int T>
ARBITER_AVX2 inline __m128i Reduce4(const __m256i* s) {
  const __m256i z = _mm256_setzero_si256();
  const __m256i h01 = _mm256_hadd_epi32(s[0], T > 1 ? s[1] : z);
  const __m256i h23 = _mm256_hadd_epi32(T > 2 ? s[2] : z, T > 3 ? s[3] : z);
  const __m256i h = _mm256_hadd_epi32(h01, h23);  // per half: [s0, s1, s2, s3] partial sums
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
// The same for 4 × i32 vectors.
template <int T>
ARBITER_AVX2 inline __m128i Reduce4(const __m128i* s) {
  const __m128i z = _mm_setzero_si128();
  return _mm_hadd_epi32(_mm_hadd_epi32(s[0], T > 1 ? s[1] : z),
                        _mm_hadd_epi32(T > 2 ? s[2] : z, T > 3 ? s[3] : z));
}

// f32 p[0, T) in lanes [0, T), zeros above (reads nothing past p[T − 1]).
template <int T>
ARBITER_AVX2 inline __m128 LoadTokens(const float* p) {
  if constexpr (T == 4) {
    return _mm_loadu_ps(p);
  } else if constexpr (T == 3) {
    return _mm_setr_ps(p[0], p[1], p[2], 0.0f);
  } else if constexpr (T == 2) {
    return _mm_setr_ps(p[0], p[1], 0.0f, 0.0f);
  } else {
    return _mm_setr_ps(p[0], 0.0f, 0.0f, 0.0f);
  }
}

// Stores lanes [0, T) of v to y[t·ldy] (or adds them).
template <int T>
ARBITER_AVX2 inline void StoreTokens(__m128 v, float* y, int64_t ldy, bool accumulate) {
  alignas(16) float out[4];
  _mm_store_ps(out, v);
  for (int t = 0; t < T; ++t) Store(y + t * ldy, out[t], accumulate);
}

// Up to 8 tokens: the per-token sums reduced to lanes, 4 tokens per __m128.
template <int T>
ARBITER_AVX2 inline void ReduceTokens(const __m256i* s, __m128* out) {
  out[0] = _mm_cvtepi32_ps(Reduce4<(T < 4 ? T : 4)>(s));
  if constexpr (T > 4) out[1] = _mm_cvtepi32_ps(Reduce4<T - 4>(s + 4));
}
template <int T>
ARBITER_AVX2 inline void ReduceTokens(const __m128i* s, __m128* out) {
  out[0] = _mm_cvtepi32_ps(Reduce4<(T < 4 ? T : 4)>(s));
  if constexpr (T > 4) out[1] = _mm_cvtepi32_ps(Reduce4<T - 4>(s + 4));
}
template <int T>
ARBITER_AVX2 inline void LoadTokensUpTo8(const float* p, __m128* out) {
  out[0] = LoadTokens<(T < 4 ? T : 4)>(p);
  if constexpr (T > 4) out[1] = LoadTokens<T - 4>(p + 4);
}
template <int T>
ARBITER_AVX2 inline void StoreTokensUpTo8(const __m128* v, float* y, int64_t ldy, bool accumulate) {
  StoreTokens<(T < 4 ? T : 4)>(v[0], y, ldy, accumulate);
  if constexpr (T > 4) StoreTokens<T - 4>(v[1], y + 4 * ldy, ldy, accumulate);
}

// The K-quant activations: PrepareGemmActivations' d_x [nb, nt] and pair
// sums [nt, nb, 8] after the rows.
struct ActsK {
  const uint8_t* rows = nullptr;
  size_t row_bytes = 0;
  const float* dx = nullptr;
  const int16_t* pairs = nullptr;
  int64_t nb = 0;
  int nt = 0;
};

// The 6-bit scales and mins as i16 (lanes 0-7 scales, 8-15 mins); reads 16
// bytes (the 12 scale bytes and 4 quant bytes). As quant_avx2.cc's.
ARBITER_AVX2 inline __m256i ScalesMinsK4(const uint8_t* packed) {
  const __m128i v = Load128(packed);
  const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x3f));
  const __m128i u2 = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
  const __m128i nib =
      _mm_and_si128(_mm_srlv_epi32(u2, _mm_setr_epi32(0, 4, 0, 0)), _mm_set1_epi8(0x0f));
  const __m128i top = _mm_and_si128(_mm_srli_epi32(v, 2), _mm_set1_epi8(0x30));
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi32(lo, _mm_or_si128(nib, top)));
}

// One row × tokens [t0, t0 + T) of a Q4_K/Q5_K product. Per super-block the
// T integer sums Σ sc_j·Σ q·q_x are reduced to one lane per token, so the
// float work (d·d_x, the mins' dmin·d_x·Σ m_j·pair_j) is one vector for all
// T tokens.
template <bool kFiveBits, int T>
ARBITER_AVX2 void TileK4(const uint8_t* w, const ActsK& a, int t0, float* y, int64_t ldy,
                         bool accumulate) {
  constexpr size_t kBlockBytes = kFiveBits ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  constexpr size_t kQsAt = kFiveBits ? offsetof(BlockQ5_K, qs) : offsetof(BlockQ4_K, qs);
  const BlockQ8_K* xb[T];
  const int16_t* pairs[T];
  for (int t = 0; t < T; ++t) {
    xb[t] = reinterpret_cast<const BlockQ8_K*>(a.rows + static_cast<size_t>(t0 + t) * a.row_bytes);
    pairs[t] = a.pairs + static_cast<int64_t>(t0 + t) * a.nb * 8;
  }
  constexpr int kG = (T + 3) / 4;  // groups of 4 tokens
  __m128 acc[kG];
  for (int g = 0; g < kG; ++g) acc[g] = _mm_setzero_ps();
  for (int64_t i = 0; i < a.nb; ++i, w += kBlockBytes) {
    const __m256i sm = ScalesMinsK4(w + 4);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
    const __m128i mins = _mm256_extracti128_si256(sm, 1);
    const uint8_t* qs = w + kQsAt;
    __m256i hbits = kFiveBits ? Load256(w + offsetof(BlockQ5_K, qh)) : __m256i{};
    __m256i sum[T];
    for (int t = 0; t < T; ++t) sum[t] = _mm256_setzero_si256();
    // Not unrolled: with 8 tokens' sums live, an unrolled body spills.
#pragma GCC unroll 1
    for (int c = 0; c < 4; ++c) {
      const __m256i q = Load256(qs + 32 * c);
      __m256i lo, hi;
      UnpackK4Chunk<kFiveBits>(q, &hbits, &lo, &hi);
      const __m256i s0 = _mm256_shuffle_epi8(sc, Shuffle(kBroadcast16, 2 * c));
      const __m256i s1 = _mm256_shuffle_epi8(sc, Shuffle(kBroadcast16, 2 * c + 1));
      for (int t = 0; t < T; ++t) {
        const int8_t* yq = xb[t][i].qs + 64 * c;
        sum[t] = _mm256_add_epi32(sum[t],
                                  _mm256_madd_epi16(_mm256_maddubs_epi16(lo, Load256(yq)), s0));
        sum[t] = _mm256_add_epi32(
            sum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, Load256(yq + 32)), s1));
        KeepInRegister(sum[t]);
      }
    }
    __m128i m[T];
    for (int t = 0; t < T; ++t) m[t] = _mm_madd_epi16(mins, Load128(pairs[t] + i * 8));
    // d·S − dmin·M per token, then × d_x.
    __m128 dx[kG], fs[kG], fm[kG];
    LoadTokensUpTo8<T>(a.dx + i * a.nt + t0, dx);
    ReduceTokens<T>(sum, fs);
    ReduceTokens<T>(m, fm);
    const __m128 d = _mm_set1_ps(Half(w)), dmin = _mm_set1_ps(Half(w + 2));
    for (int g = 0; g < kG; ++g) {
      acc[g] = _mm_fmadd_ps(dx[g], _mm_fmsub_ps(d, fs[g], _mm_mul_ps(dmin, fm[g])), acc[g]);
    }
  }
  StoreTokensUpTo8<T>(acc, y, ldy, accumulate);
}

// --- Q6_K -----------------------------------------------------------------------

// One row × tokens [t0, t0 + T) of a Q6_K product: q ∈ [0, 63] through
// maddubs, the −32 offset as 32·Σ_j sc_j·bsum_j per token (as DotQ6_K), the
// sums reduced to one lane per token as TileK4.
template <int T>
ARBITER_AVX2 void TileQ6_K(const uint8_t* w, const ActsK& a, int t0, float* y, int64_t ldy,
                           bool accumulate) {
  const auto* b = reinterpret_cast<const BlockQ6_K*>(w);
  const BlockQ8_K* xb[T];
  for (int t = 0; t < T; ++t) {
    xb[t] = reinterpret_cast<const BlockQ8_K*>(a.rows + static_cast<size_t>(t0 + t) * a.row_bytes);
  }
  constexpr int kG = (T + 3) / 4;  // groups of 4 tokens
  __m128 acc[kG];
  for (int g = 0; g < kG; ++g) acc[g] = _mm_setzero_ps();
  for (int64_t i = 0; i < a.nb; ++i) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(Load128(b[i].scales));
    __m256i sum[T];
    for (int t = 0; t < T; ++t) {
      sum[t] = _mm256_slli_epi32(_mm256_madd_epi16(sc16, Load256(xb[t][i].bsums)), 5);
      sum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), sum[t]);
    }
#pragma GCC unroll 1
    for (int h = 0; h < 2; ++h) {
      const __m256i sc = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                                : _mm256_permute2x128_si256(sc16, sc16, 0x11);
      const __m256i qla = Load256(b[i].ql + 64 * h);
      const __m256i qlb = Load256(b[i].ql + 64 * h + 32);
      const __m256i qh = Load256(b[i].qh + 32 * h);
      // Two passes of two 32-element groups each: 8 tokens' sums, two codes
      // and two scale vectors stay in registers.
      {
        const __m256i q0 = Q6Code<0>(qla, qlb, qh);
        const __m256i q1 = Q6Code<1>(qla, qlb, qh);
        const __m256i s0 = _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 0));
        const __m256i s1 = _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 1));
        for (int t = 0; t < T; ++t) {
          const int8_t* yq = xb[t][i].qs + 128 * h;
          sum[t] = _mm256_add_epi32(sum[t],
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(q0, Load256(yq)), s0));
          sum[t] = _mm256_add_epi32(
              sum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q1, Load256(yq + 32)), s1));
          KeepInRegister(sum[t]);
        }
      }
      {
        const __m256i q2 = Q6Code<2>(qla, qlb, qh);
        const __m256i q3 = Q6Code<3>(qla, qlb, qh);
        const __m256i s2 = _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 2));
        const __m256i s3 = _mm256_shuffle_epi8(sc, Shuffle(kPairQ6, 3));
        for (int t = 0; t < T; ++t) {
          const int8_t* yq = xb[t][i].qs + 128 * h + 64;
          sum[t] = _mm256_add_epi32(sum[t],
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(q2, Load256(yq)), s2));
          sum[t] = _mm256_add_epi32(
              sum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q3, Load256(yq + 32)), s3));
          KeepInRegister(sum[t]);
        }
      }
    }
    __m128 dx[kG], fs[kG];
    LoadTokensUpTo8<T>(a.dx + i * a.nt + t0, dx);
    ReduceTokens<T>(sum, fs);
    const __m128 d = _mm_set1_ps(Half(b[i].d));
    for (int g = 0; g < kG; ++g) acc[g] = _mm_fmadd_ps(_mm_mul_ps(d, dx[g]), fs[g], acc[g]);
  }
  StoreTokensUpTo8<T>(acc, y, ldy, accumulate);
}

// The K-quant driver: groups of kTileTokensK tokens outside, one row at a
// time inside; Tile(T) handles T tokens.
constexpr int kTileTokensK = 8;
using TileKFn = void (*)(const uint8_t*, const ActsK&, int, float*, int64_t, bool);
template <template <int> class Tile>
ARBITER_AVX2 void GemmK(const uint8_t* w, size_t row_bytes, int64_t n, const uint8_t* xa, int nt,
                        int64_t rows, float* y, int64_t ldy, bool accumulate) {
  static constexpr TileKFn kTiles[kTileTokensK + 1] = {
      nullptr,    Tile<1>::Run, Tile<2>::Run, Tile<3>::Run, Tile<4>::Run,
      Tile<5>::Run, Tile<6>::Run, Tile<7>::Run, Tile<8>::Run};
  ActsK a;
  a.rows = xa;
  a.nb = n / kQKK;
  a.nt = nt;
  a.row_bytes = static_cast<size_t>(a.nb) * sizeof(BlockQ8_K);
  a.dx = reinterpret_cast<const float*>(xa + (a.row_bytes * nt + 31) / 32 * 32);
  a.pairs = reinterpret_cast<const int16_t*>(a.dx + a.nb * nt);
  for (int t0 = 0; t0 < nt; t0 += kTileTokensK) {
    const TileKFn tile = kTiles[std::min(kTileTokensK, nt - t0)];
    float* yt = y + t0 * ldy;
    for (int64_t r = 0; r < rows; ++r) tile(w + r * row_bytes, a, t0, yt + r, ldy, accumulate);
  }
}

template <int T>
struct TileQ4_KOf {
  static constexpr TileKFn Run = TileK4<false, T>;
};
template <int T>
struct TileQ5_KOf {
  static constexpr TileKFn Run = TileK4<true, T>;
};
template <int T>
struct TileQ6_KOf {
  static constexpr TileKFn Run = TileQ6_K<T>;
};

}  // namespace

GemmRowsFn Avx2GemmKernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return Gemm32<Kind::kQ4_0>;
    case GgmlType::kQ4_1:
      return Gemm32<Kind::kQ4_1>;
    case GgmlType::kQ5_0:
      return Gemm32<Kind::kQ5_0>;
    case GgmlType::kQ5_1:
      return Gemm32<Kind::kQ5_1>;
    case GgmlType::kQ8_0:
      return Gemm32<Kind::kQ8_0>;
    case GgmlType::kQ4_K:
      return GemmK<TileQ4_KOf>;
    case GgmlType::kQ5_K:
      return GemmK<TileQ5_KOf>;
    case GgmlType::kQ6_K:
      return GemmK<TileQ6_KOf>;
    default:
      return nullptr;
  }
}

}  // namespace arbiter::engine_internal::quant

#endif  // defined(__x86_64__)
