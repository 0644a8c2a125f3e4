// engine/internal/quant_reference.cc — the scalar reference of every block
// type: dequantizers written straight from the block layouts
// (quant_internal.h) and the quantizers behind QuantizeRow.
//
// Quantizers:
//   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 Q8_K  ggml's reference formulas (the
//       block's scale from its absolute maximum, or min and max; round by
//       truncating x·id + 0.5 (+ offset), Q8 types with roundf), so a row
//       quantized here has the same bytes as ggml's quantize_row_*_ref.
//   Q4_K Q5_K  per 32-element sub-block, a search for the scale s ≥ 0 and
//       offset b ≤ 0 minimizing Σ (s·q + b − x)² over q ∈ [0, nmax]: 21
//       candidate inverse scales (nmax + δ) / (max − min), δ ∈ [−1, 1] in
//       steps of 0.1, each q rounded and then (s, b) refit by least squares;
//       the sub-block scales and mins are then quantized to 6 bits against
//       the super-block's d = max s / 63 and dmin = max (−b) / 63 (both f16)
//       and q re-rounded with the quantized values. Same idea as ggml's
//       make_qkx2_quants with unit weights (plain squared error).
//   Q6_K  per 16-element sub-block, a search for the signed scale s
//       minimizing Σ (s·q − x)², q ∈ [−32, 31]: candidates mapping the
//       largest |x| to −32 − δ or to 31 + δ (δ ∈ [−0.9, 0.9]), each refit by
//       least squares; the 16 scales then quantized to int8 against d =
//       −(signed largest scale) / 128, q re-rounded. (ggml's make_qx_quants,
//       unit weights.)
// The K-quant quantizers are not bit-identical to ggml's (which weight the
// error by the values' magnitude); their blocks are valid and any file
// they write computes the same everywhere.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "arbiter/formats/safetensors.h"  // F32ToF16, F32ToBF16
#include "engine/internal/quant.h"
#include "engine/internal/quant_internal.h"

namespace arbiter::engine_internal {
namespace quant {
namespace {

// --- Dequantizers ----------------------------------------------------------

void DequantF32(const uint8_t* row, int64_t n, float* out) {
  std::memcpy(out, row, static_cast<size_t>(n) * 4);
}
void DequantF16(const uint8_t* row, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(row + 2 * i);
}
void DequantBF16(const uint8_t* row, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(LoadU16(row + 2 * i));
}

void DequantQ4_0(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    const float d = HalfToFloat(b[i].d);
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      out[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantQ4_1(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    const float d = HalfToFloat(b[i].d), m = HalfToFloat(b[i].m);
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      out[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void DequantQ5_0(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ5_0*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    const float d = HalfToFloat(b[i].d);
    const uint32_t qh = LoadU32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      out[j] = static_cast<float>(lo - 16) * d;
      out[j + 16] = static_cast<float>(hi - 16) * d;
    }
  }
}

void DequantQ5_1(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ5_1*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    const float d = HalfToFloat(b[i].d), m = HalfToFloat(b[i].m);
    const uint32_t qh = LoadU32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      out[j] = static_cast<float>(lo) * d + m;
      out[j + 16] = static_cast<float>(hi) * d + m;
    }
  }
}

void DequantQ8_0(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    const float d = HalfToFloat(b[i].d);
    for (int j = 0; j < kQK; ++j) out[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void DequantQ8_1(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ8_1*>(row);
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    const float d = HalfToFloat(b[i].d);
    for (int j = 0; j < kQK; ++j) out[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void DequantQ4_K(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ4_K*>(row);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = HalfToFloat(b[i].d), dmin = HalfToFloat(b[i].dmin);
    uint8_t sc[8], m[8];
    UnpackScalesMinsK4(b[i].scales, sc, m);
    for (int c = 0; c < 4; ++c, out += 64) {
      const uint8_t* q = b[i].qs + 32 * c;
      const float d0 = d * sc[2 * c], m0 = dmin * m[2 * c];
      const float d1 = d * sc[2 * c + 1], m1 = dmin * m[2 * c + 1];
      for (int l = 0; l < 32; ++l) out[l] = d0 * static_cast<float>(q[l] & 0xF) - m0;
      for (int l = 0; l < 32; ++l) out[l + 32] = d1 * static_cast<float>(q[l] >> 4) - m1;
    }
  }
}

void DequantQ5_K(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ5_K*>(row);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = HalfToFloat(b[i].d), dmin = HalfToFloat(b[i].dmin);
    uint8_t sc[8], m[8];
    UnpackScalesMinsK4(b[i].scales, sc, m);
    for (int c = 0; c < 4; ++c, out += 64) {
      const uint8_t* q = b[i].qs + 32 * c;
      const float d0 = d * sc[2 * c], m0 = dmin * m[2 * c];
      const float d1 = d * sc[2 * c + 1], m1 = dmin * m[2 * c + 1];
      for (int l = 0; l < 32; ++l) {
        const int h = (b[i].qh[l] >> (2 * c)) & 1;
        out[l] = d0 * static_cast<float>((q[l] & 0xF) | (h << 4)) - m0;
      }
      for (int l = 0; l < 32; ++l) {
        const int h = (b[i].qh[l] >> (2 * c + 1)) & 1;
        out[l + 32] = d1 * static_cast<float>((q[l] >> 4) | (h << 4)) - m1;
      }
    }
  }
}

void DequantQ6_K(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ6_K*>(row);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = HalfToFloat(b[i].d);
    for (int h = 0; h < 2; ++h, out += 128) {
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      const int8_t* sc = b[i].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        const int s = l / 16;
        out[l] = d * static_cast<float>(sc[s + 0]) * static_cast<float>(q0);
        out[l + 32] = d * static_cast<float>(sc[s + 2]) * static_cast<float>(q1);
        out[l + 64] = d * static_cast<float>(sc[s + 4]) * static_cast<float>(q2);
        out[l + 96] = d * static_cast<float>(sc[s + 6]) * static_cast<float>(q3);
      }
    }
  }
}

void DequantQ8_K(const uint8_t* row, int64_t n, float* out) {
  const auto* b = reinterpret_cast<const BlockQ8_K*>(row);
  for (int64_t i = 0; i < n / kQKK; ++i, out += kQKK) {
    const float d = LoadF32(b[i].d);
    for (int j = 0; j < kQKK; ++j) out[j] = d * static_cast<float>(b[i].qs[j]);
  }
}

// --- Quantizers ------------------------------------------------------------

// v rounded half to even and clamped to [lo, hi] — clamped as a float
// first, so a huge quotient (a tiny scale) never overflows the int.
int RoundClamp(double v, int lo, int hi) {
  if (!(v > lo)) return lo;  // also NaN
  if (v >= hi) return hi;
  return static_cast<int>(std::nearbyint(v));
}

// The value of largest magnitude (the first, on ties) and its magnitude.
void SignedAbsMax(const float* x, int n, float* max, float* amax) {
  *max = 0;
  *amax = 0;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > *amax) {
      *amax = std::fabs(x[j]);
      *max = x[j];
    }
  }
}

void QuantQ4_0(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ4_0*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float max, amax;
    SignedAbsMax(x, kQK, &max, &amax);
    const float d = max / -8;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    StoreU16(b[i].d, F32ToF16(d));
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void MinMax(const float* x, int n, float* min, float* max) {
  *min = x[0];
  *max = x[0];
  for (int j = 1; j < n; ++j) {
    *min = std::min(*min, x[j]);
    *max = std::max(*max, x[j]);
  }
}

void QuantQ4_1(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ4_1*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float min, max;
    MinMax(x, kQK, &min, &max);
    const float d = (max - min) / 15;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    StoreU16(b[i].d, F32ToF16(d));
    StoreU16(b[i].m, F32ToF16(min));
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const int q1 =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f)));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Packs 32 five-bit values into nibbles and the 32 fifth bits.
void PackQ5(const int q[32], uint8_t qs[16], uint8_t qh_bytes[4]) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, 4);
}

void QuantQ5_0(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ5_0*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float max, amax;
    SignedAbsMax(x, kQK, &max, &amax);
    const float d = max / -16;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    StoreU16(b[i].d, F32ToF16(d));
    int q[32];
    for (int j = 0; j < kQK; ++j) {
      q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    }
    PackQ5(q, b[i].qs, b[i].qh);
  }
}

void QuantQ5_1(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ5_1*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float min, max;
    MinMax(x, kQK, &min, &max);
    const float d = (max - min) / 31;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    StoreU16(b[i].d, F32ToF16(d));
    StoreU16(b[i].m, F32ToF16(min));
    int q[32];
    for (int j = 0; j < kQK; ++j) {
      q[j] = std::min(31, static_cast<int>(static_cast<uint8_t>((x[j] - min) * id + 0.5f)));
    }
    PackQ5(q, b[i].qs, b[i].qh);
  }
}

void QuantQ8_0(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float max, amax;
    SignedAbsMax(x, kQK, &max, &amax);
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    StoreU16(b[i].d, F32ToF16(d));
    for (int j = 0; j < kQK; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void QuantQ8_1(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ8_1*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float max, amax;
    SignedAbsMax(x, kQK, &max, &amax);
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    StoreU16(b[i].d, F32ToF16(d));
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      b[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
      sum += b[i].qs[j];
    }
    StoreU16(b[i].s, F32ToF16(static_cast<float>(sum) * d));
  }
}

void QuantQ8_K(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ8_K*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float max, amax;
    SignedAbsMax(x, kQKK, &max, &amax);
    std::memset(&b[i], 0, sizeof(BlockQ8_K));
    if (amax == 0) continue;  // d = 0, all quants 0
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQKK; ++j) {
      b[i].qs[j] = static_cast<int8_t>(RoundClamp(iscale * x[j], -127, 127));
    }
    for (int s = 0; s < 16; ++s) {
      int16_t sum = 0;
      for (int j = 0; j < 16; ++j) sum = static_cast<int16_t>(sum + b[i].qs[16 * s + j]);
      std::memcpy(b[i].bsums + 2 * s, &sum, 2);
    }
    const float d = 1 / iscale;
    std::memcpy(b[i].d, &d, 4);
  }
}

// Best (s, b) with x ≈ s·q + b, q ∈ [0, nmax], b ≤ 0, for one sub-block
// (the file comment's search). Returns s ≥ 0 and m = −b ≥ 0.
void FitScaleMin(const float* x, int n, int nmax, float* s_out, float* m_out) {
  float min, max;
  MinMax(x, n, &min, &max);
  min = std::min(min, 0.0f);
  if (max <= min) {  // all equal and ≤ 0: the offset alone
    *s_out = 0;
    *m_out = -min;
    return;
  }
  float best_s = (max - min) / static_cast<float>(nmax), best_b = min;
  auto error = [&](float s, float b) {
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const float inv = s > 0 ? 1 / s : 0;
      const int q = RoundClamp((x[i] - b) * inv, 0, nmax);
      const double r = static_cast<double>(s) * q + b - x[i];
      e += r * r;
    }
    return e;
  };
  double best_e = error(best_s, best_b);
  for (int k = -10; k <= 10; ++k) {
    const float iscale = (static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / (max - min);
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int i = 0; i < n; ++i) {
      const int q = RoundClamp((x[i] - min) * iscale, 0, nmax);
      sq += q;
      sqq += static_cast<double>(q) * q;
      sx += x[i];
      sqx += static_cast<double>(q) * x[i];
    }
    const double det = n * sqq - sq * sq;
    if (det <= 0) continue;
    double s = (n * sqx - sq * sx) / det;
    double b = (sqq * sx - sq * sqx) / det;
    if (b > 0) {  // the offset must be ≤ 0 (a non-negative stored min)
      b = 0;
      s = sqx / sqq;
    }
    if (s <= 0) continue;
    const double e = error(static_cast<float>(s), static_cast<float>(b));
    if (e < best_e) {
      best_e = e;
      best_s = static_cast<float>(s);
      best_b = static_cast<float>(b);
    }
  }
  *s_out = best_s;
  *m_out = -best_b;
}

// Q4_K (nmax 15) or Q5_K (nmax 31): one super-block → sc, m, d, dmin and
// the 256 quants q[i] ∈ [0, nmax].
void QuantizeKSuperBlock(const float* x, int nmax, uint8_t sc[8], uint8_t m[8], uint16_t* d_half,
                         uint16_t* dmin_half, uint8_t q[256]) {
  float s[8], mins[8];
  float max_s = 0, max_m = 0;
  for (int j = 0; j < 8; ++j) {
    FitScaleMin(x + 32 * j, 32, nmax, &s[j], &mins[j]);
    max_s = std::max(max_s, s[j]);
    max_m = std::max(max_m, mins[j]);
  }
  const float inv_s = max_s > 0 ? 63 / max_s : 0;
  const float inv_m = max_m > 0 ? 63 / max_m : 0;
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(RoundClamp(s[j] * inv_s, 0, 63));
    m[j] = static_cast<uint8_t>(RoundClamp(mins[j] * inv_m, 0, 63));
  }
  *d_half = F32ToF16(max_s / 63);
  *dmin_half = F32ToF16(max_m / 63);
  const float d = HalfToFloat(*d_half), dmin = HalfToFloat(*dmin_half);
  for (int j = 0; j < 8; ++j) {
    const float ds = d * sc[j], dm = dmin * m[j];
    for (int l = 0; l < 32; ++l) {
      q[32 * j + l] =
          static_cast<uint8_t>(ds > 0 ? RoundClamp((x[32 * j + l] + dm) / ds, 0, nmax) : 0);
    }
  }
}

void QuantQ4_K(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ4_K*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    uint8_t sc[8], m[8], q[256];
    uint16_t d, dmin;
    QuantizeKSuperBlock(x, 15, sc, m, &d, &dmin, q);
    StoreU16(b[i].d, d);
    StoreU16(b[i].dmin, dmin);
    PackScalesMinsK4(sc, m, b[i].scales);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        b[i].qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
      }
    }
  }
}

void QuantQ5_K(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ5_K*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    uint8_t sc[8], m[8], q[256];
    uint16_t d, dmin;
    QuantizeKSuperBlock(x, 31, sc, m, &d, &dmin, q);
    StoreU16(b[i].d, d);
    StoreU16(b[i].dmin, dmin);
    PackScalesMinsK4(sc, m, b[i].scales);
    std::memset(b[i].qh, 0, 32);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
        b[i].qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        b[i].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

// Best signed s with x ≈ s·q, q ∈ [−32, 31], for one 16-element sub-block.
float FitScaleQ6(const float* x) {
  float max, amax;
  SignedAbsMax(x, 16, &max, &amax);
  if (amax == 0) return 0;
  auto error = [&](float s) {
    double e = 0;
    for (int i = 0; i < 16; ++i) {
      const int q = RoundClamp(x[i] / s, -32, 31);
      const double r = static_cast<double>(s) * q - x[i];
      e += r * r;
    }
    return e;
  };
  float best_s = max / -32;
  double best_e = error(best_s);
  for (int k = -9; k <= 9; ++k) {
    for (float target :
         {-32.0f - 0.1f * static_cast<float>(k), 31.0f + 0.1f * static_cast<float>(k)}) {
      const float iscale = target / max;
      double sqq = 0, sqx = 0;
      for (int i = 0; i < 16; ++i) {
        const int q = RoundClamp(x[i] * iscale, -32, 31);
        sqq += static_cast<double>(q) * q;
        sqx += static_cast<double>(q) * x[i];
      }
      if (sqq == 0) continue;
      const float s = static_cast<float>(sqx / sqq);
      if (s == 0) continue;
      const double e = error(s);
      if (e < best_e) {
        best_e = e;
        best_s = s;
      }
    }
  }
  return best_s;
}

void QuantQ6_K(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ6_K*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float s[16];
    float max_s = 0, amax_s = 0;
    for (int j = 0; j < 16; ++j) {
      s[j] = FitScaleQ6(x + 16 * j);
      if (std::fabs(s[j]) > amax_s) {
        amax_s = std::fabs(s[j]);
        max_s = s[j];
      }
    }
    std::memset(&b[i], 0, sizeof(BlockQ6_K));
    if (amax_s == 0) {  // all zero: d = 0, q = 32 (the value 0)
      std::memset(b[i].ql, 0, 128);
      for (int j = 0; j < 64; ++j) b[i].qh[j] = 0xAA;  // each 2-bit field = 2 → q = 32
      continue;
    }
    const float iscale = -128 / max_s;
    for (int j = 0; j < 16; ++j) {
      b[i].scales[j] = static_cast<int8_t>(RoundClamp(iscale * s[j], -128, 127));
    }
    const uint16_t d_half = F32ToF16(1 / iscale);
    StoreU16(b[i].d, d_half);
    const float d = HalfToFloat(d_half);
    uint8_t q[256];
    for (int j = 0; j < 16; ++j) {
      const float ds = d * b[i].scales[j];
      for (int l = 0; l < 16; ++l) {
        q[16 * j + l] =
            static_cast<uint8_t>((ds != 0 ? RoundClamp(x[16 * j + l] / ds, -32, 31) : 0) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = b[i].ql + 64 * h;
      uint8_t* qh = b[i].qh + 32 * h;
      const uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                     ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
      }
    }
  }
}

void QuantF32(const float* x, int64_t n, uint8_t* out) {
  std::memcpy(out, x, static_cast<size_t>(n) * 4);
}
void QuantF16(const float* x, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) StoreU16(out + 2 * i, F32ToF16(x[i]));
}
void QuantBF16(const float* x, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) StoreU16(out + 2 * i, F32ToBF16(x[i]));
}

using QuantizeFn = void (*)(const float* x, int64_t n, uint8_t* out);

QuantizeFn ReferenceQuantizer(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return QuantF32;
    case GgmlType::kF16:
      return QuantF16;
    case GgmlType::kBF16:
      return QuantBF16;
    case GgmlType::kQ4_0:
      return QuantQ4_0;
    case GgmlType::kQ4_1:
      return QuantQ4_1;
    case GgmlType::kQ5_0:
      return QuantQ5_0;
    case GgmlType::kQ5_1:
      return QuantQ5_1;
    case GgmlType::kQ8_0:
      return QuantQ8_0;
    case GgmlType::kQ8_1:
      return QuantQ8_1;
    case GgmlType::kQ4_K:
      return QuantQ4_K;
    case GgmlType::kQ5_K:
      return QuantQ5_K;
    case GgmlType::kQ6_K:
      return QuantQ6_K;
    case GgmlType::kQ8_K:
      return QuantQ8_K;
    default:
      return nullptr;
  }
}

}  // namespace

DequantizeRowFn ReferenceDequantizer(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return DequantF32;
    case GgmlType::kF16:
      return DequantF16;
    case GgmlType::kBF16:
      return DequantBF16;
    case GgmlType::kQ4_0:
      return DequantQ4_0;
    case GgmlType::kQ4_1:
      return DequantQ4_1;
    case GgmlType::kQ5_0:
      return DequantQ5_0;
    case GgmlType::kQ5_1:
      return DequantQ5_1;
    case GgmlType::kQ8_0:
      return DequantQ8_0;
    case GgmlType::kQ8_1:
      return DequantQ8_1;
    case GgmlType::kQ4_K:
      return DequantQ4_K;
    case GgmlType::kQ5_K:
      return DequantQ5_K;
    case GgmlType::kQ6_K:
      return DequantQ6_K;
    case GgmlType::kQ8_K:
      return DequantQ8_K;
    default:
      return nullptr;
  }
}

}  // namespace quant

void DequantizeRowReference(GgmlType type, const void* row, int64_t n, float* out) {
  quant::ReferenceDequantizer(type)(static_cast<const uint8_t*>(row), n, out);
}

Status QuantizeRow(GgmlType type, const float* x, int64_t n, void* out) {
  const quant::QuantizeFn fn = quant::ReferenceQuantizer(type);
  if (fn == nullptr) {
    return InvalidArgumentError("QuantizeRow: type " + std::string(GgmlTypeName(type)) +
                                " is not a compute type (supported: F32, F16, BF16, Q4_0, Q4_1, "
                                "Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K)");
  }
  if (!GgmlRowBytes(type, n).has_value()) {
    return InvalidArgumentError("QuantizeRow: " + std::to_string(n) +
                                " elements is not a whole "
                                "number of " +
                                std::string(GgmlTypeName(type)) + " blocks");
  }
  fn(x, n, static_cast<uint8_t*>(out));
  return OkStatus();
}

}  // namespace arbiter::engine_internal
