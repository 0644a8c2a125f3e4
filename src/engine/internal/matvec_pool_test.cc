#include "engine/internal/matvec_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

namespace arbiter::engine_internal {
namespace {

std::vector<float> Reference(const std::vector<float>& w, int rows, int cols,
                             const std::vector<float>& x, const std::vector<float>& y0,
                             bool accumulate) {
  std::vector<float> y(rows);
  for (int r = 0; r < rows; ++r) {
    double s = 0;
    for (int c = 0; c < cols; ++c) s += double{w[size_t{1} * r * cols + c]} * x[c];
    y[r] = static_cast<float>(accumulate ? y0[r] + s : s);
  }
  return y;
}

TEST(MatVecPoolTest, MatchesReferenceForEveryThreadCount) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int threads : {1, 2, 3, 4}) {
    MatVecPool pool(threads);
    EXPECT_EQ(pool.n_threads(), threads);
    for (int rows : {1, 31, 32, 33, 100, 1000}) {
      for (bool acc : {false, true}) {
        const int cols = 70;
        std::vector<float> w(size_t{1} * rows * cols), x(cols), y(rows);
        for (float& v : w) v = nd(rng);
        for (float& v : x) v = nd(rng);
        for (float& v : y) v = nd(rng);
        const std::vector<float> want = Reference(w, rows, cols, x, y, acc);
        pool.Run(w.data(), rows, cols, x.data(), acc, y.data());
        for (int r = 0; r < rows; ++r) ASSERT_NEAR(y[r], want[r], 1e-4) << rows << " " << r;
      }
    }
  }
}

TEST(MatVecPoolTest, ConcurrentCallersAllGetTheirOwnResult) {
  MatVecPool pool(2);
  const int rows = 500, cols = 64;
  std::vector<float> w(size_t{1} * rows * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 17) - 8;
  std::vector<std::thread> threads;
  std::vector<int> failures(6, 0);
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> x(cols, static_cast<float>(t + 1)), y(rows);
      const std::vector<float> want = Reference(w, rows, cols, x, y, false);
      for (int rep = 0; rep < 300; ++rep) {
        pool.Run(w.data(), rows, cols, x.data(), false, y.data());
        for (int r = 0; r < rows; ++r) failures[t] += y[r] != want[r];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 6; ++t) EXPECT_EQ(failures[t], 0) << "caller " << t;
}

TEST(MatVecPoolTest, ParallelForVisitsEveryItemOnce) {
  for (int threads : {1, 2, 3}) {
    MatVecPool pool(threads);
    for (int n : {0, 1, 7, 64, 65, 1000, 200000}) {
      for (int chunk : {1, 3, 64}) {
        std::vector<std::atomic<int>> seen(n);
        std::atomic<int> bad_chunks{0};
        pool.ParallelFor(n, chunk, [&](int begin, int end) {
          // Chunks are aligned to the chunk size the pool chose (≥ chunk).
          if (begin >= end || end > n) bad_chunks.fetch_add(1);
          for (int i = begin; i < end; ++i) seen[i].fetch_add(1);
        });
        EXPECT_EQ(bad_chunks.load(), 0);
        for (int i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << n << " " << chunk << " " << i;
      }
    }
  }
}

TEST(MatVecPoolTest, ParallelForAndProductsInterleave) {
  MatVecPool pool(2);
  const int rows = 300, cols = 40;
  std::vector<float> w(size_t{1} * rows * cols, 1.0f), x(cols, 2.0f), y(rows);
  for (int rep = 0; rep < 200; ++rep) {
    std::vector<int> out(100, 0);
    pool.ParallelFor(100, 7, [&](int b, int e) {
      for (int i = b; i < e; ++i) out[i] = i + rep;
    });
    for (int i = 0; i < 100; ++i) ASSERT_EQ(out[i], i + rep);
    pool.Run(w.data(), rows, cols, x.data(), false, y.data());
    for (int r = 0; r < rows; ++r) ASSERT_EQ(y[r], 80.0f);
  }
}

}  // namespace
}  // namespace arbiter::engine_internal
