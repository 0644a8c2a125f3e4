// engine/internal/quant_scalar.cc — the portable path: activation
// quantizers and dot products in plain C++ (quant_internal.h's KernelTable).
//
// The dot products compute what the AVX2 path computes, in the same integer
// form (Note [Activation quantization] in quant.cc): per block an exact
// integer Σ q_w·q_x, scaled once by the product of the block scales; the
// K-quants' mins and Q6_K's −32 offset come from the activation's block sums
// (Q8_K bsums), the Q4_1/Q5_1 mins from Q8_1's s = d·Σq. Only the order of
// the float additions differs between the paths.
//
// Dequantization uses the reference dequantizers (quant_reference.cc).
#include <cmath>
#include <cstring>

#include "arbiter/formats/safetensors.h"  // F32ToF16
#include "engine/internal/quant_internal.h"
#include "engine/internal/vec_ops.h"

namespace arbiter::engine_internal::quant {
namespace {

// --- Activation quantizers (one formula on every path) ----------------------

// d and 1/d of a block of `n` floats: d = amax / 127, id = 127 / amax.
void BlockScale(const float* x, int n, float* d, float* id) {
  float amax = 0;
  for (int j = 0; j < n; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  *d = amax / 127.0f;
  *id = amax != 0 ? 127.0f / amax : 0.0f;
}

int8_t RoundToQ8(float v) { return static_cast<int8_t>(std::nearbyint(v)); }

void ActQ8_0(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float d, id;
    BlockScale(x, kQK, &d, &id);
    StoreU16(b[i].d, F32ToF16(d));
    for (int j = 0; j < kQK; ++j) b[i].qs[j] = RoundToQ8(x[j] * id);
  }
}

void ActQ8_1(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ8_1*>(out);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float d, id;
    BlockScale(x, kQK, &d, &id);
    const uint16_t d_half = F32ToF16(d);
    StoreU16(b[i].d, d_half);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      b[i].qs[j] = RoundToQ8(x[j] * id);
      sum += b[i].qs[j];
    }
    StoreU16(b[i].s, F32ToF16(HalfToFloat(d_half) * static_cast<float>(sum)));
  }
}

void ActQ8_K(const float* x, int64_t n, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ8_K*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float d, id;
    BlockScale(x, kQKK, &d, &id);
    std::memcpy(b[i].d, &d, 4);
    for (int s = 0; s < 16; ++s) {
      int16_t sum = 0;
      for (int j = 0; j < 16; ++j) {
        const int8_t q = RoundToQ8(x[16 * s + j] * id);
        b[i].qs[16 * s + j] = q;
        sum = static_cast<int16_t>(sum + q);
      }
      std::memcpy(b[i].bsums + 2 * s, &sum, 2);
    }
  }
}

int16_t BlockSum16(const BlockQ8_K& y, int s) {
  int16_t v;
  std::memcpy(&v, y.bsums + 2 * s, 2);
  return v;
}

// --- Dot products of one row: n / block elements blocks ---------------------

float DotF32(const uint8_t* w, const uint8_t* xa, int64_t n) {
  return Dot(reinterpret_cast<const float*>(w), reinterpret_cast<const float*>(xa),
             static_cast<int>(n));
}

float DotF16(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* x = reinterpret_cast<const float*>(xa);
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l)
      acc[l] += HalfToFloatBranchless(LoadU16(w + 2 * (i + l))) * x[i + l];
  }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += HalfToFloat(w + 2 * i) * x[i];
  return s;
}

float DotBF16(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* x = reinterpret_cast<const float*>(xa);
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += Bf16ToFloat(LoadU16(w + 2 * (i + l))) * x[i + l];
  }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += Bf16ToFloat(LoadU16(w + 2 * i)) * x[i];
  return s;
}

float DotQ4_0(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_0*>(xa);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += ((b[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((b[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
    }
    sum += HalfToFloat(b[i].d) * HalfToFloat(y[i].d) * static_cast<float>(sumi);
  }
  return sum;
}

float DotQ4_1(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_1*>(xa);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += (b[i].qs[j] & 0xF) * y[i].qs[j] + (b[i].qs[j] >> 4) * y[i].qs[j + 16];
    }
    sum += HalfToFloat(b[i].d) * HalfToFloat(y[i].d) * static_cast<float>(sumi) +
           HalfToFloat(b[i].m) * HalfToFloat(y[i].s);
  }
  return sum;
}

float DotQ5_0(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ5_0*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_0*>(xa);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint32_t qh = LoadU32(b[i].qh);
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = ((b[i].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4)) - 16;
      const int hi = ((b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4)) - 16;
      sumi += lo * y[i].qs[j] + hi * y[i].qs[j + 16];
    }
    sum += HalfToFloat(b[i].d) * HalfToFloat(y[i].d) * static_cast<float>(sumi);
  }
  return sum;
}

float DotQ5_1(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ5_1*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_1*>(xa);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint32_t qh = LoadU32(b[i].qh);
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      sumi += lo * y[i].qs[j] + hi * y[i].qs[j + 16];
    }
    sum += HalfToFloat(b[i].d) * HalfToFloat(y[i].d) * static_cast<float>(sumi) +
           HalfToFloat(b[i].m) * HalfToFloat(y[i].s);
  }
  return sum;
}

float DotQ8_0(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_0*>(xa);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK; ++j) sumi += b[i].qs[j] * y[i].qs[j];
    sum += HalfToFloat(b[i].d) * HalfToFloat(y[i].d) * static_cast<float>(sumi);
  }
  return sum;
}

// Q4_K/Q5_K: d·dy·Σ_j sc_j·Σ q·qy − dmin·dy·Σ_j m_j·(bsum_2j + bsum_2j+1).
float DotK4Like(const uint8_t* scales, float d, float dmin, const uint8_t q[256],
                const BlockQ8_K& y) {
  uint8_t sc[8], m[8];
  UnpackScalesMinsK4(scales, sc, m);
  int sumi = 0, summ = 0;
  for (int j = 0; j < 8; ++j) {
    int s = 0;
    for (int l = 0; l < 32; ++l) s += q[32 * j + l] * y.qs[32 * j + l];
    sumi += sc[j] * s;
    summ += m[j] * (BlockSum16(y, 2 * j) + BlockSum16(y, 2 * j + 1));
  }
  const float dy = LoadF32(y.d);
  return d * dy * static_cast<float>(sumi) - dmin * dy * static_cast<float>(summ);
}

float DotQ4_K(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ4_K*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_K*>(xa);
  float sum = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    uint8_t q[256];
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        q[64 * c + l] = b[i].qs[32 * c + l] & 0xF;
        q[64 * c + 32 + l] = b[i].qs[32 * c + l] >> 4;
      }
    }
    sum += DotK4Like(b[i].scales, HalfToFloat(b[i].d), HalfToFloat(b[i].dmin), q, y[i]);
  }
  return sum;
}

float DotQ5_K(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ5_K*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_K*>(xa);
  float sum = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    uint8_t q[256];
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int h = b[i].qh[l] >> (2 * c);
        q[64 * c + l] = static_cast<uint8_t>((b[i].qs[32 * c + l] & 0xF) | ((h & 1) << 4));
        q[64 * c + 32 + l] = static_cast<uint8_t>((b[i].qs[32 * c + l] >> 4) | ((h & 2) << 3));
      }
    }
    sum += DotK4Like(b[i].scales, HalfToFloat(b[i].d), HalfToFloat(b[i].dmin), q, y[i]);
  }
  return sum;
}

// d·dy·(Σ_j sc_j·Σ q·qy − 32·Σ_j sc_j·bsum_j), q ∈ [0, 63] unsigned.
float DotQ6_K(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ6_K*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_K*>(xa);
  float sum = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    uint8_t q[256];
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        qq[l] = static_cast<uint8_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4));
        qq[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
        qq[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        qq[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
    int sumi = 0, offset = 0;
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += q[16 * j + l] * y[i].qs[16 * j + l];
      sumi += b[i].scales[j] * s;
      offset += b[i].scales[j] * BlockSum16(y[i], j);
    }
    sum += HalfToFloat(b[i].d) * LoadF32(y[i].d) * static_cast<float>(sumi - 32 * offset);
  }
  return sum;
}

float DotQ8_K(const uint8_t* w, const uint8_t* xa, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ8_K*>(w);
  const auto* y = reinterpret_cast<const BlockQ8_K*>(xa);
  float sum = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQKK; ++j) sumi += b[i].qs[j] * y[i].qs[j];
    sum += LoadF32(b[i].d) * LoadF32(y[i].d) * static_cast<float>(sumi);
  }
  return sum;
}

template <float (*RowDot)(const uint8_t*, const uint8_t*, int64_t)>
void RowsLoop(const uint8_t* w, size_t row_bytes, int64_t n, const void* xa, int64_t rows, float* y,
              bool accumulate) {
  const auto* x = static_cast<const uint8_t*>(xa);
  for (int64_t r = 0; r < rows; ++r, w += row_bytes) {
    const float dot = RowDot(w, x, n);
    y[r] = accumulate ? y[r] + dot : dot;
  }
}

}  // namespace

void FillScalarKernels(KernelTable* t) {
  t->quantize_q8_0 = ActQ8_0;
  t->quantize_q8_1 = ActQ8_1;
  t->quantize_q8_K = ActQ8_K;
  t->dot_rows[Slot(GgmlType::kF32)] = RowsLoop<DotF32>;
  t->dot_rows[Slot(GgmlType::kF16)] = RowsLoop<DotF16>;
  t->dot_rows[Slot(GgmlType::kBF16)] = RowsLoop<DotBF16>;
  t->dot_rows[Slot(GgmlType::kQ4_0)] = RowsLoop<DotQ4_0>;
  t->dot_rows[Slot(GgmlType::kQ4_1)] = RowsLoop<DotQ4_1>;
  t->dot_rows[Slot(GgmlType::kQ5_0)] = RowsLoop<DotQ5_0>;
  t->dot_rows[Slot(GgmlType::kQ5_1)] = RowsLoop<DotQ5_1>;
  t->dot_rows[Slot(GgmlType::kQ8_0)] = RowsLoop<DotQ8_0>;
  t->dot_rows[Slot(GgmlType::kQ4_K)] = RowsLoop<DotQ4_K>;
  t->dot_rows[Slot(GgmlType::kQ5_K)] = RowsLoop<DotQ5_K>;
  t->dot_rows[Slot(GgmlType::kQ6_K)] = RowsLoop<DotQ6_K>;
  t->dot_rows[Slot(GgmlType::kQ8_K)] = RowsLoop<DotQ8_K>;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0,
                        GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K}) {
    t->dequantize_row[Slot(type)] = ReferenceDequantizer(type);
  }
}

}  // namespace arbiter::engine_internal::quant
