// engine/internal/quant.h — the engine's kernels on weights in the type
// they are stored in (issue 13 point 2): dequantize, quantize, and the
// decode dot products, for the ggml block types of arbiter/formats/ggml_type.h.
//
// A weight matrix W [rows, n] of type T is rows × GgmlRowBytes(T, n) bytes,
// row after row, each row n / block_elems(T) blocks (row-major, the layout
// GGUF files store; F32/F16/BF16 rows are plain element arrays).
//
// Decode computes y = W·x one row at a time. x (f32) is first converted by
// PrepareActivation into the activation type the weight type pairs with
// (ActivationType: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the
// K-quants, F32 for F32/F16/BF16, whose activations stay f32); DotRows then
// computes the rows' dot products on the stored blocks
// (Note [Activation quantization] in quant.cc says why).
// Prefill computes in integers on the stored blocks for the K-quants
// (quant_gemm.h) and dequantizes row panels (DequantizeRows) for sgemm
// otherwise (forward.cc Note [Prefill on typed weights]).
//
// Paths: each kernel has a portable scalar path and an AVX2+FMA(+F16C)
// path; the active path is the best the CPU supports (CPUID, at first use),
// and tests run every supported path (SetKernelPathForTest).
//
// Thread safety: all functions are pure over their arguments and
// thread-safe, except SetKernelPathForTest (tests only, no concurrent
// kernel calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/ggml_type.h"

namespace arbiter::engine_internal {

enum class KernelPath { kScalar, kAvx2 };
std::string_view KernelPathName(KernelPath path);  // "scalar", "avx2"
// The paths this CPU can run, scalar first.
std::vector<KernelPath> SupportedKernelPaths();
// The path the kernels use now.
KernelPath ActiveKernelPath();
// Tests: run the kernels on `path`. REQUIRES: `path` is supported.
void SetKernelPathForTest(KernelPath path);

// The weight types the engine computes with: F32, F16, BF16, Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q8_K.
bool IsComputeType(GgmlType type);

// The type x is converted into for dot products with rows of `weight_type`.
// REQUIRES: IsComputeType(weight_type).
GgmlType ActivationType(GgmlType weight_type);

// Converts x[n] into ActivationType(weight_type): writes
// GgmlRowBytes(ActivationType(weight_type), n) bytes to `out` (a plain copy
// of the floats for F32/F16/BF16 weights). Each 8-bit block has
// d = max|x| / 127 and q = x·127 / max|x| rounded half to even (all zero for
// an all-zero block); the bytes are the same on every kernel path.
// REQUIRES: n is a multiple of the weight type's block size.
void PrepareActivation(GgmlType weight_type, const float* x, int64_t n, void* out);

// y[r - r0] = dot(row r of W, x) (or += when `accumulate`) for r in [r0, r1).
// W: rows of n elements of `type`, row stride GgmlRowBytes(type, n);
// xa: x as PrepareActivation(type, x, n, xa) wrote it. The paths differ only
// in the order of float additions. The AVX2 path prepares x's block scales
// once per call in a per-thread scratch (grown on first use: 8 bytes per
// 32 elements), so a call should cover many rows (a chunk, not one row).
// REQUIRES: IsComputeType(type); y does not overlap W or xa.
void DotRows(GgmlType type, const void* w, int64_t n, const void* xa, int64_t r0, int64_t r1,
             float* y, bool accumulate);

// Rows [r0, r1) of W (as DotRows) as f32: out[(r - r0) × n + j] [r1 − r0, n],
// bit-identical to DequantizeRowReference on every path.
void DequantizeRows(GgmlType type, const void* w, int64_t n, int64_t r0, int64_t r1, float* out);

// `rows` rows of n elements of `type`, row r at byte w + r·stride (e.g. one
// head's slice of each KV cache row), as f32: out[r × n + j]. One dispatch
// for all rows; bit-identical to DequantizeRows.
void DequantizeStridedRows(GgmlType type, const void* w, size_t stride, int64_t n, int64_t rows,
                           float* out);

// The scalar reference: one row of n elements of `type` → n floats.
// REQUIRES: IsComputeType(type) or type == Q8_1; n a multiple of the block size.
void DequantizeRowReference(GgmlType type, const void* row, int64_t n, float* out);

// Quantizes n floats into one row of `type` (the reference quantizers, as
// the ggml specification defines each block; used by `make-model --format
// gguf` and tests; quant_reference.cc says which formulas). kInvalidArgument
// when n is not a multiple of the block size or the type is not a compute
// type (or Q8_1). REQUIRES: x is finite.
Status QuantizeRow(GgmlType type, const float* x, int64_t n, void* out);

}  // namespace arbiter::engine_internal
