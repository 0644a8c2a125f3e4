#include "engine/internal/matvec_pool.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace arbiter::engine_internal
