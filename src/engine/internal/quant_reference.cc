// engine/internal/quant_reference.cc — the scalar reference of every block
// type: dequantizers written straight from the block layouts
// (quant_internal.h) and the quantizers behind QuantizeRow.
//
// Quantizers:
//   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 Q8_K  ggml's reference formulas (the
//       block's scale from its absolute maximum, or min and max; round by
//       truncating x·id + 0.5 (+ offset), Q8_0/Q8_1 with roundf, Q8_K to
//       nearest even as ggml's nearest_int), so a row quantized here has the
//       same bytes as ggml's quantize_row_*_ref.
//   Q4_K Q5_K Q6_K  search-based (quant_kquants.cc).
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
      return QuantizeRowQ4_K;
    case GgmlType::kQ5_K:
      return QuantizeRowQ5_K;
    case GgmlType::kQ6_K:
      return QuantizeRowQ6_K;
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
