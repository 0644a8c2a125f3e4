// engine/internal/quant_gemm.cc — see quant_gemm.h: the prepared activation
// layout, the dispatch to the active path's tile kernel, and the portable
// path (DotRows token by token over groups of rows).
#include "engine/internal/quant_gemm.h"

#include <algorithm>

#include "engine/internal/quant.h"
#include "engine/internal/quant_internal.h"

namespace arbiter::engine_internal {
namespace {

// Rows per DotRows call on the portable path: a group's weights stay in L1
// while every token passes over them.
constexpr int64_t kGroupRows = 16;

// Where the per-block f32 scales start: after the quantized rows, aligned.
size_t ScalesOffset(size_t row_bytes, int nt) {
  return (row_bytes * static_cast<size_t>(nt) + 31) / 32 * 32;
}

quant::GemmRowsFn TileKernel(GgmlType type) {
#if defined(__x86_64__)
  if (ActiveKernelPath() == KernelPath::kAvx2) return quant::Avx2GemmKernel(type);
#endif
  (void)type;
  return nullptr;
}

}  // namespace

bool HasGemmTileKernel(GgmlType type) { return TileKernel(type) != nullptr; }

size_t GemmActivationBytes(GgmlType type, int64_t n, int nt) {
  const GgmlType at = ActivationType(type);
  const size_t row_bytes = *GgmlRowBytes(at, n);
  const size_t tokens = static_cast<size_t>(nt);
  if (at == GgmlType::kQ8_K) {
    const size_t nb = static_cast<size_t>(n / quant::kQKK);
    return ScalesOffset(row_bytes, nt) + (sizeof(float) + 8 * sizeof(int16_t)) * nb * tokens;
  }
  const size_t nb = static_cast<size_t>(n / quant::kQK);
  return ScalesOffset(row_bytes, nt) + 2 * sizeof(float) * nb * tokens;
}

void PrepareGemmActivations(GgmlType type, const float* x, int64_t n, int t0, int t1, int nt,
                            void* out) {
  const GgmlType at = ActivationType(type);
  const size_t row_bytes = *GgmlRowBytes(at, n);
  auto* base = static_cast<uint8_t*>(out);
  for (int t = t0; t < t1; ++t) {
    PrepareActivation(type, x + static_cast<size_t>(t) * n, n, base + t * row_bytes);
  }
  auto* dx = reinterpret_cast<float*>(base + ScalesOffset(row_bytes, nt));
  if (at == GgmlType::kQ8_K) {  // d_x [nb, nt], pairs [nt, nb, 8]
    const int64_t nb = n / quant::kQKK;
    auto* pairs = reinterpret_cast<int16_t*>(dx + nb * nt);  // [nt, nb, 8]
    for (int t = t0; t < t1; ++t) {
      const auto* blk =
          reinterpret_cast<const quant::BlockQ8_K*>(base + static_cast<size_t>(t) * row_bytes);
      for (int64_t i = 0; i < nb; ++i) {
        dx[i * nt + t] = quant::LoadF32(blk[i].d);
        for (int j = 0; j < 8; ++j) {
          const int sum = static_cast<int16_t>(quant::LoadU16(blk[i].bsums + 4 * j)) +
                          static_cast<int16_t>(quant::LoadU16(blk[i].bsums + 4 * j + 2));
          pairs[(static_cast<int64_t>(t) * nb + i) * 8 + j] = static_cast<int16_t>(sum);
        }
      }
    }
    return;
  }
  // The 32-element activations: d_x and the block sum as f32, [nt, nb] each.
  const int64_t nb = n / quant::kQK;
  float* sums = dx + nb * nt;
  const size_t block_bytes = at == GgmlType::kQ8_1 ? sizeof(quant::BlockQ8_1)
                                                   : sizeof(quant::BlockQ8_0);
  for (int t = t0; t < t1; ++t) {
    const uint8_t* blk = base + t * row_bytes;
    for (int64_t i = 0; i < nb; ++i, blk += block_bytes) {
      const float d = quant::HalfToFloat(blk);
      dx[t * nb + i] = d;
      if (at == GgmlType::kQ8_1) {
        sums[t * nb + i] = quant::HalfToFloat(blk + 2);
      } else {
        const auto* qs = reinterpret_cast<const int8_t*>(blk + 2);
        int s = 0;
        for (int j = 0; j < quant::kQK; ++j) s += qs[j];
        sums[t * nb + i] = d * static_cast<float>(s);
      }
    }
  }
}

void GemmRows(GgmlType type, const void* w, int64_t n, const void* xa, int nt, int64_t r0,
              int64_t r1, float* y, int64_t ldy, bool accumulate) {
  if (r1 <= r0 || nt <= 0) return;
  const size_t row_bytes = *GgmlRowBytes(type, n);
  const auto* rows = static_cast<const uint8_t*>(w) + static_cast<size_t>(r0) * row_bytes;
  const auto* x = static_cast<const uint8_t*>(xa);
  if (const quant::GemmRowsFn fn = TileKernel(type)) {
    fn(rows, row_bytes, n, x, nt, r1 - r0, y, ldy, accumulate);
    return;
  }
  const size_t x_bytes = *GgmlRowBytes(ActivationType(type), n);
  for (int64_t g = 0; g < r1 - r0; g += kGroupRows) {
    const int64_t g1 = std::min(r1 - r0, g + kGroupRows);
    for (int t = 0; t < nt; ++t) {
      DotRows(type, rows, n, x + t * x_bytes, g, g1, y + t * ldy + g, accumulate);
    }
  }
}

}  // namespace arbiter::engine_internal
