// bench/kernel_bench.cc — `arbiter bench kernels`: see kernel_bench.h.
#include "bench/kernel_bench.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "bench/bench_stats.h"
#include "bench/memory_bandwidth.h"
#include "engine/internal/aligned_buffer.h"
#include "engine/internal/quant.h"
#include "engine/internal/quant_gemm.h"

namespace arbiter {
namespace {

using engine_internal::ActivationType;
using engine_internal::AlignedFloats;
using engine_internal::KernelPath;

const GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                           GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                           GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K};

// A 64-byte-aligned byte buffer, pages resident.
struct Bytes {
  explicit Bytes(size_t n) : floats((n + 3) / 4) {}
  uint8_t* data() { return reinterpret_cast<uint8_t*>(floats.data()); }
  AlignedFloats floats;
};

// A [rows, n] matrix of `type`: a band of QuantizeRow'd random rows repeated.
Status FillMatrix(GgmlType type, int64_t n, int64_t rows, uint8_t* out) {
  const size_t row_bytes = *GgmlRowBytes(type, n);
  const int64_t band = std::min<int64_t>(rows, 64);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t r = 0; r < band; ++r) {
    for (float& v : x) v = nd(rng);
    ARBITER_RETURN_IF_ERROR(engine_internal::QuantizeRow(type, x.data(), n, out + r * row_bytes));
  }
  for (int64_t r = band; r < rows; r += band) {
    std::memcpy(out + r * row_bytes, out,
                static_cast<size_t>(std::min(band, rows - r)) * row_bytes);
  }
  return OkStatus();
}

struct Timing {
  double best_s = 0;
  double p50_s = 0;
};

// One decode matvec: PrepareActivation + DotRows over all rows.
void MatVec(GgmlType type, const uint8_t* w, int64_t n, int64_t rows, const float* x, uint8_t* xa,
            float* y) {
  engine_internal::PrepareActivation(type, x, n, xa);
  engine_internal::DotRows(type, w, n, xa, 0, rows, y, false);
}

// The dequantize-to-f32 alternative: each row into `row_f32` (L1), then an
// f32 dot with x on the same path.
void DequantMatVec(GgmlType type, const uint8_t* w, int64_t n, int64_t rows, const float* x,
                   float* row_f32, float* y) {
  const size_t row_bytes = *GgmlRowBytes(type, n);
  for (int64_t r = 0; r < rows; ++r) {
    engine_internal::DequantizeRows(type, w + r * row_bytes, n, 0, 1, row_f32);
    engine_internal::DotRows(GgmlType::kF32, row_f32, n, x, 0, 1, y + r, false);
  }
}

// Prefill's two ways to Y [nt, rows] = X [nt, n] · Wᵀ (quant_gemm.h, and
// forward.cc's panels; one thread).
void PrefillGemm(GgmlType type, const uint8_t* w, int64_t n, int64_t rows, const float* x, int nt,
                 uint8_t* xa, float* y) {
  engine_internal::PrepareGemmActivations(type, x, n, 0, nt, nt, xa);
  engine_internal::GemmRows(type, w, n, xa, nt, 0, rows, y, rows, false);
}
void PrefillSgemm(GgmlType type, const uint8_t* w, int64_t n, int64_t rows, const float* x, int nt,
                  float* panel, float* y) {
  engine_internal::DequantizeRows(type, w, n, 0, rows, panel);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nt, static_cast<int>(rows),
              static_cast<int>(n), 1.0f, x, static_cast<int>(n), panel, static_cast<int>(n), 0.0f,
              y, static_cast<int>(rows));
}

template <typename Fn>
Timing TimePasses(int passes, double min_pass_s, Fn&& fn) {
  fn();  // untimed: faults, warms caches and branch predictors
  std::vector<double> s;
  for (int p = 0; p < passes; ++p) {
    int reps = 0;
    const double t0 = NowSeconds();
    double t = 0;
    do {
      fn();
      ++reps;
      t = NowSeconds() - t0;
    } while (t < min_pass_s);
    s.push_back(t / reps);
  }
  const SampleSummary sum = Summarize(s);
  return {sum.min, sum.p50};
}

}  // namespace

Result<KernelBenchResult> RunKernelBench(const KernelBenchOptions& o) {
  if (o.n <= 0 || o.n % 256 != 0) {
    return InvalidArgumentError("bench kernels: n must be a positive multiple of 256, got " +
                                std::to_string(o.n));
  }
  if (o.repetitions < 1 || o.stream_bytes == 0 || o.cached_bytes == 0 || o.limit_bytes == 0 ||
      o.prefill_tokens < 1 || o.prefill_rows < 1) {
    return InvalidArgumentError("bench kernels: repetitions and sizes must be positive");
  }
  KernelBenchResult r;
  r.n = o.n;
  r.stream_bytes = o.stream_bytes;
  r.cached_bytes = o.cached_bytes;
  r.repetitions = o.repetitions;
  r.limit_bytes = o.limit_bytes;
  r.prefill_tokens = o.prefill_tokens;
  r.prefill_rows = o.prefill_rows;
  r.loadavg_start = LoadAverage1();
  r.read_gb_s = MeasureReadBandwidth(o.limit_bytes, 1) / 1e9;
  r.memcpy_gb_s = MeasureMemcpyBandwidth(o.limit_bytes, 1) / 1e9;

  const KernelPath saved = engine_internal::ActiveKernelPath();
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(o.n));
  for (float& v : x) v = nd(rng);
  std::vector<uint8_t> xa(*GgmlRowBytes(GgmlType::kF32, o.n));
  AlignedFloats row_f32(static_cast<size_t>(o.n));
  // Prefill: X [nt, n], Y [nt, rows], the dequantized panel [rows, n].
  const int nt = o.prefill_tokens;
  std::vector<float> px(static_cast<size_t>(nt) * o.n);
  for (float& v : px) v = nd(rng);
  std::vector<float> py(static_cast<size_t>(nt) * o.prefill_rows);
  AlignedFloats panel(static_cast<size_t>(o.prefill_rows) * o.n);
  const double prefill_macs = static_cast<double>(nt) * static_cast<double>(o.prefill_rows) *
                              static_cast<double>(o.n);
  const int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);

  for (GgmlType type : kTypes) {
    const size_t row_bytes = *GgmlRowBytes(type, o.n);
    const int64_t stream_rows =
        std::max<int64_t>(1, static_cast<int64_t>(o.stream_bytes / row_bytes));
    const int64_t cached_rows =
        std::max<int64_t>(1, static_cast<int64_t>(o.cached_bytes / row_bytes));
    Bytes stream(static_cast<size_t>(stream_rows) * row_bytes);
    Bytes cached(static_cast<size_t>(cached_rows) * row_bytes);
    ARBITER_RETURN_IF_ERROR(FillMatrix(type, o.n, stream_rows, stream.data()));
    ARBITER_RETURN_IF_ERROR(FillMatrix(type, o.n, cached_rows, cached.data()));
    std::vector<float> y(static_cast<size_t>(stream_rows));
    const double stream_b = static_cast<double>(stream_rows) * static_cast<double>(row_bytes);
    const double cached_b = static_cast<double>(cached_rows) * static_cast<double>(row_bytes);
    const bool integer = ActivationType(type) != GgmlType::kF32;
    Bytes prefill_w(static_cast<size_t>(o.prefill_rows) * row_bytes);
    std::vector<uint8_t> prefill_xa;
    if (integer) {
      ARBITER_RETURN_IF_ERROR(FillMatrix(type, o.n, o.prefill_rows, prefill_w.data()));
      prefill_xa.resize(engine_internal::GemmActivationBytes(type, o.n, nt));
    }

    for (KernelPath path : engine_internal::SupportedKernelPaths()) {
      engine_internal::SetKernelPathForTest(path);
      KernelBenchRow row;
      row.type = std::string(GgmlTypeName(type));
      row.path = std::string(engine_internal::KernelPathName(path));
      row.bits_per_weight = 8.0 * static_cast<double>(row_bytes) / static_cast<double>(o.n);
      // 3 × repetitions passes (~10 ms each): on a shared machine the best
      // pass is the one no other process disturbed.
      const Timing st = TimePasses(3 * o.repetitions, 0, [&] {
        MatVec(type, stream.data(), o.n, stream_rows, x.data(), xa.data(), y.data());
      });
      row.stream_gb_s = GbPerSecond(stream_b, st.best_s);
      row.stream_p50_gb_s = GbPerSecond(stream_b, st.p50_s);
      row.ratio_to_read = row.stream_gb_s / r.read_gb_s;
      // Short passes, many of them: on a shared machine the best one is the
      // one no other process interrupted.
      const Timing ct = TimePasses(std::max(20, 5 * o.repetitions), 0.002, [&] {
        MatVec(type, cached.data(), o.n, cached_rows, x.data(), xa.data(), y.data());
      });
      row.cached_gb_s = GbPerSecond(cached_b, ct.best_s);
      if (integer) {
        const Timing dt = TimePasses(o.repetitions, 0, [&] {
          DequantMatVec(type, stream.data(), o.n, stream_rows, x.data(), row_f32.data(), y.data());
        });
        row.dequant_gb_s = GbPerSecond(stream_b, dt.best_s);
        const Timing gt = TimePasses(o.repetitions, 0, [&] {
          PrefillGemm(type, prefill_w.data(), o.n, o.prefill_rows, px.data(), nt,
                      prefill_xa.data(), py.data());
        });
        row.gemm_gmac_s = prefill_macs / gt.best_s / 1e9;
        const Timing sg = TimePasses(o.repetitions, 0, [&] {
          PrefillSgemm(type, prefill_w.data(), o.n, o.prefill_rows, px.data(), nt, panel.data(),
                       py.data());
        });
        row.sgemm_gmac_s = prefill_macs / sg.best_s / 1e9;
      }
      r.rows.push_back(row);
    }
  }
  engine_internal::SetKernelPathForTest(saved);
  openblas_set_num_threads(blas_threads);
  r.loadavg_end = LoadAverage1();
  return r;
}

std::string FormatKernelBench(const KernelBenchResult& r) {
  std::string s = fmt::format(
      "row length {} elements; streamed matrix {:.0f} MB, cached matrix {:.0f} KB; 1 thread\n"
      "limits: read {:.2f} GB/s, memcpy {:.2f} GB/s (1 thread, {:.0f} MiB, best of 5)\n"
      "load average {:.2f} → {:.2f}\n\n"
      "{:<6} {:<7} {:>5} {:>11} {:>9} {:>8} {:>10} {:>13} {:>10} {:>11}\n",
      r.n, r.stream_bytes / 1e6, r.cached_bytes / 1e3, r.read_gb_s, r.memcpy_gb_s,
      r.limit_bytes / 1048576.0, r.loadavg_start, r.loadavg_end, "type", "path", "bits",
      "stream GB/s", "p50 GB/s", "vs read", "cached", "dequant+f32", "gemm GMAC", "sgemm GMAC");
  for (const KernelBenchRow& row : r.rows) {
    auto opt = [](double v) { return v > 0 ? fmt::format("{:.2f}", v) : std::string("-"); };
    s += fmt::format(
        "{:<6} {:<7} {:>5.2f} {:>11.2f} {:>9.2f} {:>8.2f} {:>10.2f} {:>13} {:>10} {:>11}\n",
        row.type, row.path, row.bits_per_weight, row.stream_gb_s, row.stream_p50_gb_s,
        row.ratio_to_read, row.cached_gb_s, opt(row.dequant_gb_s), opt(row.gemm_gmac_s),
        opt(row.sgemm_gmac_s));
  }
  s += "\nGB/s = weight bytes streamed per second (PrepareActivation + DotRows over every row);\n"
       "cached = the same on an L2-resident matrix; dequant+f32 = DequantizeRows into L1 + f32 "
       "dot;\ngemm / sgemm GMAC = prefill's product of " +
       fmt::format("{} tokens × [{}, {}]", r.prefill_tokens, r.prefill_rows, r.n) +
       ": PrepareGemmActivations + GemmRows / DequantizeRows + 1-thread sgemm.\n";
  return s;
}

std::string FormatKernelBenchJson(const KernelBenchResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const KernelBenchRow& row : r.rows) {
    rows.push_back({{"type", row.type},
                    {"path", row.path},
                    {"bits_per_weight", row.bits_per_weight},
                    {"stream_gb_s", row.stream_gb_s},
                    {"stream_p50_gb_s", row.stream_p50_gb_s},
                    {"ratio_to_read", row.ratio_to_read},
                    {"cached_gb_s", row.cached_gb_s},
                    {"dequant_gb_s", row.dequant_gb_s},
                    {"gemm_gmac_s", row.gemm_gmac_s},
                    {"sgemm_gmac_s", row.sgemm_gmac_s}});
  }
  const nlohmann::json j = {{"n", r.n},
                            {"stream_bytes", r.stream_bytes},
                            {"cached_bytes", r.cached_bytes},
                            {"repetitions", r.repetitions},
                            {"limit_bytes", r.limit_bytes},
                            {"prefill_tokens", r.prefill_tokens},
                            {"prefill_rows", r.prefill_rows},
                            {"read_gb_s", r.read_gb_s},
                            {"memcpy_gb_s", r.memcpy_gb_s},
                            {"loadavg_start", r.loadavg_start},
                            {"loadavg_end", r.loadavg_end},
                            {"rows", rows}};
  return j.dump(2) + "\n";
}

}  // namespace arbiter
