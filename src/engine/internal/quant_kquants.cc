// engine/internal/quant_kquants.cc — the reference quantizers of the
// K-quants (QuantizeRow for Q4_K, Q5_K, Q6_K; block layouts in
// quant_internal.h):
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
// They are not bit-identical to ggml's (which weight the error by the
// values' magnitude); their blocks are valid and any file they write
// computes the same everywhere.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "arbiter/formats/safetensors.h"  // F32ToF16
#include "engine/internal/quant_internal.h"

namespace arbiter::engine_internal::quant {
namespace {

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

}  // namespace

void QuantizeRowQ4_K(const float* x, int64_t n, uint8_t* out) {
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

void QuantizeRowQ5_K(const float* x, int64_t n, uint8_t* out) {
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

void QuantizeRowQ6_K(const float* x, int64_t n, uint8_t* out) {
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

}  // namespace arbiter::engine_internal::quant
