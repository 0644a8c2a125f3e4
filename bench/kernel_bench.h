// bench/kernel_bench.h — the quantized decode kernels (engine/internal/
// quant.h) against the memory bandwidth measured in the same run
// (`arbiter bench kernels`, docs/BENCHMARKS.md "Quantized kernels").
//
// Method, per weight type and per kernel path the CPU supports, 1 thread:
//   stream  a [rows, n] matrix of `stream_bytes` weight bytes (far larger
//           than the caches): PrepareActivation + DotRows over all rows,
//           i.e. one decode matvec; GB/s = weight bytes / seconds. Best and
//           median of 3 × `repetitions` passes after one untimed pass (on a
//           shared machine the best pass is the undisturbed one).
//   cached  the same on a matrix of `cached_bytes` (fits in L2): the
//           kernel's compute ceiling, weight bytes / seconds, best of
//           max(20, 5 × repetitions) passes of ≥ 2 ms each.
//   dequant the dequantize-to-f32 alternative on the stream matrix, for the
//           integer types: each row DequantizeRows'd into an L1 buffer and
//           dotted with x in f32 (DotRows F32 on the same path); GB/s of
//           the same weight bytes, best of `repetitions` passes (Note
//           [Activation quantization]).
//   prefill a chunk's projection, for the integer types: Y [prefill_tokens,
//           prefill_rows] = X · Wᵀ on a cache-sized [prefill_rows, n] matrix,
//           (a) "gemm": PrepareGemmActivations + GemmRows (quant_gemm.h), and
//           (b) "sgemm": DequantizeRows + one 1-thread cblas_sgemm; GMAC/s
//           (10⁹ multiply-adds per second), best of `repetitions` passes.
//           forward.cc Note [Prefill on typed weights] chooses between them
//           per type from these figures.
// Limits (same run, 1 thread, `limit_bytes` = 256 MiB): sequential read (a sum of floats)
// and memcpy bandwidth (bench/memory_bandwidth.h). ratio = stream GB/s /
// read GB/s. Matrices are made from QuantizeRow'd random rows (a 64-row
// band repeated); the figures do not depend on the values.
//
// Errors: kInvalidArgument for n not a multiple of 256 or non-positive
// sizes / repetitions / prefill tokens or rows.
// Thread safety: not thread-safe (switches the kernel path with
// SetKernelPathForTest and restores it); run one bench at a time with
// nothing else computing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

struct KernelBenchOptions {
  int64_t n = 768;                          // row length (demo-chat's hidden size)
  size_t stream_bytes = size_t{128} << 20;  // weight bytes of the streamed matrix
  size_t cached_bytes = size_t{256} << 10;  // weight bytes of the cache-resident one
  int repetitions = 7;
  size_t limit_bytes = size_t{256} << 20;  // buffer of the read / memcpy limits
  int prefill_tokens = 512;                // tokens of the prefill product
  int64_t prefill_rows = 1024;             // rows of the prefill product's matrix
};

struct KernelBenchRow {
  std::string type;  // "Q4_K"
  std::string path;  // "scalar" | "avx2"
  double bits_per_weight = 0;
  double stream_gb_s = 0;  // best pass
  double stream_p50_gb_s = 0;
  double cached_gb_s = 0;
  double dequant_gb_s = 0;   // 0 = not measured (f32/f16/bf16)
  double gemm_gmac_s = 0;    // prefill, integer: 0 = not measured (f32/f16/bf16)
  double sgemm_gmac_s = 0;   // prefill, dequantize + sgemm: 0 = not measured
  double ratio_to_read = 0;  // stream_gb_s / read_gb_s
};

struct KernelBenchResult {
  int64_t n = 0;
  size_t stream_bytes = 0;
  size_t cached_bytes = 0;
  int repetitions = 0;
  size_t limit_bytes = 0;
  int prefill_tokens = 0;
  int64_t prefill_rows = 0;
  double read_gb_s = 0;    // 1 thread, best of 5
  double memcpy_gb_s = 0;  // 1 thread, best of 5
  double loadavg_start = 0;
  double loadavg_end = 0;
  std::vector<KernelBenchRow> rows;
};

Result<KernelBenchResult> RunKernelBench(const KernelBenchOptions& options);

// A table: type, path, bits/weight, stream GB/s (best, p50), ratio to read,
// cached GB/s, dequant+f32 GB/s, prefill gemm and sgemm GMAC/s.
std::string FormatKernelBench(const KernelBenchResult& result);

// The result as one JSON object (`arbiter bench kernels --json`), with a
// trailing newline.
std::string FormatKernelBenchJson(const KernelBenchResult& result);

}  // namespace arbiter
