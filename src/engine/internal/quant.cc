// engine/internal/quant.cc — see quant.h: the dispatch of the quantized
// kernels to the active path, and why the activations are quantized.
//
// Files: quant_reference.cc (reference dequantizers, QuantizeRow and the
// ggml-formula quantizers), quant_kquants.cc (the K-quants' search-based
// quantizers), quant_scalar.cc (the portable path), quant_avx2.cc and
// quant_avx2_dequant.cc (the AVX2+FMA+F16C path; helpers in quant_avx2.h),
// quant_internal.h (block layouts and the per-path kernel tables). A path's
// table is built once; the active table is an atomic pointer chosen at
// first use from CPUID, replaced only by SetKernelPathForTest.
//
// Note [Activation quantization]
// For the integer block types (Q4_0 … Q8_0, the K-quants) decode does not
// dequantize weights to f32: it quantizes x once per product to 8 bits per
// element in blocks that line up with the weight blocks (Q8_0 for the
// symmetric 32-element types, Q8_1 — with s = d·Σq — for Q4_1/Q5_1, whose
// mins multiply Σx, and Q8_K — with 16-element sums — for the K-quants,
// whose mins and Q6_K's −32 offset multiply partial sums of x), and computes
// each block's Σ q_w·q_x in integers: AVX2's maddubs multiplies 32 u8×i8
// pairs per instruction and adds adjacent pairs, madd folds to 8 × i32, so
// one 256-bit multiply covers 32 elements where an f32 FMA covers 8, and the
// activation operand is 1 byte per element instead of 4. The block scales
// are applied once per block (K-quants: the 6-/8-bit sub-block scales as
// integer multipliers, the f32 scales once per 256 elements). The
// dequantize-to-f32 alternative must expand every weight to a float and FMA
// it with a 4-byte x: 4–8× the vector work per weight byte, and at 4–6 bits
// per weight one core cannot do it as fast as memory delivers the weights.
// Measured with `arbiter bench kernels` (1 thread, AVX2, rows of 768, a
// 134 MB matrix streamed from memory): the integer kernels stream 2.4×
// (8-bit) to 4.5× (4-bit) more weight bytes per second than dequantizing
// each row (DequantizeRows, into L1) and dotting it in f32 — Q4_0 12.3 vs
// 3.2 GB/s, Q4_K 12.6 vs 2.8, Q6_K 14.6 vs 4.2, Q8_0 14.7 vs 6.1 on a busy
// 2-vCPU Zen 3 (docs/BENCHMARKS.md "Quantized kernels" has the table and
// the caveats; a fused dequantizing kernel would save the trip through L1,
// not the 4–8× in vector work). The price is x's rounding: 8 bits per
// element with a scale per 32 (or 256) elements, an error of at most 0.4 %
// of the block's largest |x|, well under the weights' own 4–6-bit error;
// ggml computes the same way, so results stay comparable with llama.cpp on
// the same file.
// F16/BF16 weights keep x in f32: their weights are already 16 bits, the
// widening to f32 is one instruction (vcvtph2ps; a 16-bit shift for bf16),
// and quantizing x would add an error the weights do not have.
#include "engine/internal/quant.h"

#include <algorithm>
#include <atomic>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "engine/internal/quant_internal.h"

namespace arbiter::engine_internal {
namespace {

using quant::KernelTable;
using quant::Slot;

bool CpuHasAvx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
  // does not know "f16c" (the clang-built TSA and fuzz targets must compile).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

const KernelTable& ScalarTable() {
  static const KernelTable table = [] {
    KernelTable t;
    quant::FillScalarKernels(&t);
    return t;
  }();
  return table;
}

const KernelTable& Avx2Table() {
  static const KernelTable table = [] {
    KernelTable t = ScalarTable();
#if defined(__x86_64__)
    quant::FillAvx2Kernels(&t);
#endif
    return t;
  }();
  return table;
}

const KernelTable* TableOf(KernelPath path) {
  return path == KernelPath::kAvx2 ? &Avx2Table() : &ScalarTable();
}

std::atomic<const KernelTable*>& ActiveTableSlot() {
  static std::atomic<const KernelTable*> active{
      TableOf(CpuHasAvx2() ? KernelPath::kAvx2 : KernelPath::kScalar)};
  return active;
}

const KernelTable& Active() { return *ActiveTableSlot().load(std::memory_order_acquire); }

}  // namespace

std::string_view KernelPathName(KernelPath path) {
  return path == KernelPath::kAvx2 ? "avx2" : "scalar";
}

std::vector<KernelPath> SupportedKernelPaths() {
  std::vector<KernelPath> paths = {KernelPath::kScalar};
  if (CpuHasAvx2()) paths.push_back(KernelPath::kAvx2);
  return paths;
}

KernelPath ActiveKernelPath() {
  return &Active() == &Avx2Table() ? KernelPath::kAvx2 : KernelPath::kScalar;
}

void SetKernelPathForTest(KernelPath path) {
  ActiveTableSlot().store(TableOf(path), std::memory_order_release);
}

bool IsComputeType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kQ8_K:
      return true;
    default:
      return false;
  }
}

GgmlType ActivationType(GgmlType weight_type) {
  switch (weight_type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      return GgmlType::kQ8_0;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      return GgmlType::kQ8_1;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kQ8_K:
      return GgmlType::kQ8_K;
    default:
      return GgmlType::kF32;
  }
}

void PrepareActivation(GgmlType weight_type, const float* x, int64_t n, void* out) {
  const KernelTable& t = Active();
  auto* o = static_cast<uint8_t*>(out);
  switch (ActivationType(weight_type)) {
    case GgmlType::kQ8_0:
      t.quantize_q8_0(x, n, o);
      return;
    case GgmlType::kQ8_1:
      t.quantize_q8_1(x, n, o);
      return;
    case GgmlType::kQ8_K:
      t.quantize_q8_K(x, n, o);
      return;
    default:
      std::copy(x, x + n, reinterpret_cast<float*>(o));
      return;
  }
}

void DotRows(GgmlType type, const void* w, int64_t n, const void* xa, int64_t r0, int64_t r1,
             float* y, bool accumulate) {
  if (r1 <= r0) return;
  const size_t row_bytes = *GgmlRowBytes(type, n);
  const auto* rows = static_cast<const uint8_t*>(w) + static_cast<size_t>(r0) * row_bytes;
  Active().dot_rows[Slot(type)](rows, row_bytes, n, xa, r1 - r0, y, accumulate);
}

void DequantizeRows(GgmlType type, const void* w, int64_t n, int64_t r0, int64_t r1, float* out) {
  const size_t row_bytes = *GgmlRowBytes(type, n);
  const auto* row = static_cast<const uint8_t*>(w) + static_cast<size_t>(r0) * row_bytes;
  DequantizeStridedRows(type, row, row_bytes, n, r1 - r0, out);
}

void DequantizeStridedRows(GgmlType type, const void* w, size_t stride, int64_t n, int64_t rows,
                           float* out) {
  const quant::DequantizeRowFn fn = Active().dequantize_row[Slot(type)];
  const auto* row = static_cast<const uint8_t*>(w);
  for (int64_t r = 0; r < rows; ++r, row += stride, out += n) fn(row, n, out);
}

}  // namespace arbiter::engine_internal
