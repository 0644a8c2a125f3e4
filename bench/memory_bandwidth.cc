// bench/memory_bandwidth.cc — see memory_bandwidth.h.
#include "bench/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "bench/bench_stats.h"
#include "engine/internal/aligned_buffer.h"
#include "engine/internal/vec_ops.h"

namespace arbiter {
namespace {

constexpr int kPasses = 5;  // timed passes; the best is kept

// Runs fn(begin, end) over [0, n) split into `n_threads` contiguous parts,
// one thread each (the caller runs part 0); returns the wall seconds.
double TimeSplit(size_t n, int n_threads, const std::function<void(size_t, size_t)>& fn) {
  const size_t per = (n / n_threads + 1023) / 1024 * 1024;
  const double t0 = NowSeconds();
  std::vector<std::thread> threads;
  for (int t = 1; t < n_threads; ++t) {
    const size_t b = std::min(n, per * t), e = std::min(n, per * (t + 1));
    threads.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(0, std::min(n, per));
  for (std::thread& t : threads) t.join();
  return NowSeconds() - t0;
}

}  // namespace

double MeasureMemcpyBandwidth(size_t bytes, int n_threads) {
  n_threads = std::max(1, n_threads);
  const size_t n = (bytes + 4095) / 4096 * 4096 / sizeof(float);
  engine_internal::AlignedFloats src(n), dst(n);
  for (size_t i = 0; i < n; i += 1024) src[i] = static_cast<float>(i);  // touch every page
  std::memcpy(dst.data(), src.data(), n * sizeof(float));               // fault dst in
  std::vector<double> seconds;
  for (int pass = 0; pass < kPasses; ++pass) {
    seconds.push_back(TimeSplit(n, n_threads, [&](size_t b, size_t e) {
      std::memcpy(dst.data() + b, src.data() + b, (e - b) * sizeof(float));
    }));
  }
  volatile float sink = dst[n / 2];  // keep the copy observable
  (void)sink;
  return static_cast<double>(n * sizeof(float)) / Summarize(seconds).min;
}

double MeasureReadBandwidth(size_t bytes, int n_threads) {
  n_threads = std::max(1, n_threads);
  const size_t n = (bytes + 4095) / 4096 * 4096 / sizeof(float);
  engine_internal::AlignedFloats buf(n);
  for (size_t i = 0; i < n; i += 1024) buf[i] = 1.0f;
  std::atomic<double> total{0};
  auto sum = [&](size_t b, size_t e) {
    double part = 0;
    for (size_t i = b; i < e; i += size_t{1} << 24) {
      const size_t len = std::min(e - i, size_t{1} << 24);
      part += engine_internal::Sum(buf.data() + i, static_cast<int>(len));
    }
    total.fetch_add(part);
  };
  TimeSplit(n, n_threads, sum);  // warm the TLB
  std::vector<double> seconds;
  for (int pass = 0; pass < kPasses; ++pass) seconds.push_back(TimeSplit(n, n_threads, sum));
  volatile double sink = total.load();
  (void)sink;
  return static_cast<double>(n * sizeof(float)) / Summarize(seconds).min;
}

}  // namespace arbiter
