// Prefill's integer product (quant_gemm.h) on every supported kernel path,
// against the reference: each output is the f64 dot product of the
// dequantized weight row (DequantizeRowReference) and the dequantized
// activation row (the quantized x, dequantized by the same reference). Random
// blocks, and the edge cases: zero scales, the smallest and largest quants,
// all-zero tokens, token counts and row counts that are not multiples of the
// tiles, rows starting at r0 > 0, an output stride wider than the rows,
// accumulate, and activations prepared in two token ranges.
#include "engine/internal/quant_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "arbiter/formats/safetensors.h"  // F32ToF16
#include "engine/internal/quant.h"
#include "engine/internal/quant_internal.h"
#include "engine/internal/quant_test_util.h"

namespace arbiter::engine_internal {
namespace {

const GgmlType kGemmTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                               GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                               GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K};

// How the quant bytes of a test row are filled.
enum class Fill { kRandom, kAllZero, kAllOnes };

// One row of n elements of `type`: quant bytes per `fill`, scales random f16
// (f32 for Q8_K) in a range typical of the type; `zero_scales` sets every
// block's scale (and min) to 0.
std::vector<uint8_t> MakeRow(GgmlType type, int64_t n, std::mt19937& rng, Fill fill,
                             bool zero_scales) {
  std::vector<uint8_t> row(RowBytes(type, n));
  for (uint8_t& b : row) {
    b = fill == Fill::kRandom ? static_cast<uint8_t>(rng()) : (fill == Fill::kAllOnes ? 0xFF : 0);
  }
  auto half = [&](float lo, float hi) {
    return zero_scales ? uint16_t{0} : F32ToF16(std::uniform_real_distribution<float>(lo, hi)(rng));
  };
  const size_t block_bytes = GgmlTypeTraitsOf(type)->block_bytes;
  for (int64_t i = 0; i < n / BlockElems(type); ++i) {
    uint8_t* p = row.data() + i * block_bytes;
    switch (type) {
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
      case GgmlType::kQ8_0:
        quant::StoreU16(p, half(-0.1f, 0.1f));
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
        quant::StoreU16(p, half(-0.1f, 0.1f));
        quant::StoreU16(p + 2, half(-1.0f, 1.0f));
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        quant::StoreU16(p, half(0.0f, 0.01f));
        quant::StoreU16(p + 2, half(0.0f, 0.01f));
        break;
      case GgmlType::kQ6_K:
        quant::StoreU16(p + 208, half(-0.01f, 0.01f));
        break;
      case GgmlType::kQ8_K: {
        const float d =
            zero_scales ? 0.0f : std::uniform_real_distribution<float>(-0.01f, 0.01f)(rng);
        std::memcpy(p, &d, 4);
        break;
      }
      default:
        ADD_FAILURE() << "no rows of " << GgmlTypeName(type);
    }
  }
  return row;
}

class QuantGemmTest : public ::testing::TestWithParam<TypePath> {
 protected:
  void SetUp() override {
    type_ = std::get<0>(GetParam());
    path_ = std::get<1>(GetParam());
    if (!PathSupported(path_)) {
      GTEST_SKIP() << "kernel path " << KernelPathName(path_)
                   << " is not supported by this CPU; skipped";
    }
    scoped_ = std::make_unique<ScopedPath>(path_);
  }
  void TearDown() override { scoped_.reset(); }

  // Y[nt, r1 − r0] of W (`rows` rows of n) and x [nt, n], checked against
  // the reference with accumulate off and on. The activations are prepared
  // in two token ranges, [0, split) and [split, nt).
  void Check(const std::vector<uint8_t>& w, int64_t n, const std::vector<float>& x, int nt,
             int64_t r0, int64_t r1, const std::string& what) {
    const GgmlType at = ActivationType(type_);
    const size_t x_bytes = RowBytes(at, n);
    std::vector<uint8_t> xa(GemmActivationBytes(type_, n, nt) + 1, 0xAB);
    ASSERT_LE(GemmActivationBytes(type_, n, nt), static_cast<size_t>(nt) * (n * 11 / 8 + 64));
    const int split = nt / 3;
    PrepareGemmActivations(type_, x.data(), n, 0, split, nt, xa.data());
    PrepareGemmActivations(type_, x.data(), n, split, nt, nt, xa.data());
    EXPECT_EQ(xa.back(), 0xAB) << what << ": wrote past GemmActivationBytes";
    // The quantized rows are PrepareActivation's, and their reference values.
    std::vector<std::vector<float>> xv(nt);
    std::vector<uint8_t> one(x_bytes);
    for (int t = 0; t < nt; ++t) {
      PrepareActivation(type_, x.data() + t * n, n, one.data());
      ASSERT_EQ(std::memcmp(one.data(), xa.data() + t * x_bytes, x_bytes), 0)
          << what << ": token " << t << " quantized differently";
      xv[t] = Dequant(at, xa.data() + t * x_bytes, n);
    }
    const size_t row_bytes = RowBytes(type_, n);
    const int64_t cols = r1 - r0, ldy = cols + 3;  // a stride wider than the rows
    std::mt19937 rng(11);
    std::normal_distribution<float> nd;
    for (bool accumulate : {false, true}) {
      std::vector<float> y(static_cast<size_t>(nt * ldy));
      for (float& v : y) v = nd(rng);
      const std::vector<float> y0 = y;
      GemmRows(type_, w.data(), n, xa.data(), nt, r0, r1, y.data(), ldy, accumulate);
      for (int t = 0; t < nt; ++t) {
        for (int64_t c = cols; c < ldy; ++c) {
          ASSERT_EQ(y[t * ldy + c], y0[t * ldy + c]) << what << ": wrote outside the rows";
        }
        for (int64_t r = r0; r < r1; ++r) {
          const uint8_t* row = w.data() + r * row_bytes;
          const std::vector<float> wv = Dequant(type_, row, n);
          double dot = 0, ax = 0, mw = 0;
          for (int64_t j = 0; j < n; ++j) {
            dot += static_cast<double>(wv[j]) * xv[t][j];
            ax += std::fabs(xv[t][j]);
            mw = std::max(mw, static_cast<double>(std::fabs(wv[j])));
          }
          // Q4_1/Q5_1 use x's f16 s = d·Σq where the reference has the
          // exact sum: allow its rounding per block.
          double allowance = 0;
          if (type_ == GgmlType::kQ4_1 || type_ == GgmlType::kQ5_1) {
            const size_t bb = GgmlTypeTraitsOf(type_)->block_bytes;
            for (int64_t i = 0; i < n / 32; ++i) {
              const float m = quant::HalfToFloat(row + i * bb + 2);
              const float s = quant::HalfToFloat(xa.data() + t * x_bytes + i * 36 + 2);
              allowance += std::fabs(m) * std::fabs(s) * 0x1p-10;
            }
          }
          const double want = (accumulate ? y0[t * ldy + (r - r0)] : 0.0) + dot;
          const double tol = 2e-6 * ax * mw + allowance + 1e-6 * std::fabs(want) + 1e-30;
          ASSERT_NEAR(y[t * ldy + (r - r0)], want, tol)
              << what << " token " << t << " row " << r << " accumulate " << accumulate;
        }
      }
    }
  }

  std::vector<int64_t> Lengths() const {
    if (BlockElems(type_) == 32) return {32, 3 * 32, 8 * 32, 11 * 32};  // groups of 8 ± tails
    return {256, 3 * 256};
  }

  GgmlType type_{};
  KernelPath path_{};
  std::unique_ptr<ScopedPath> scoped_;
};

TEST_P(QuantGemmTest, MatchesReferenceOnRandomBlocks) {
  std::mt19937 rng(static_cast<uint32_t>(type_) * 17 + 3);
  for (int64_t n : Lengths()) {
    const int64_t rows = 7;
    std::vector<uint8_t> w;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<uint8_t> row = MakeRow(type_, n, rng, Fill::kRandom, false);
      w.insert(w.end(), row.begin(), row.end());
    }
    for (int nt : {1, 2, 3, 4, 5, 9}) {
      std::normal_distribution<float> nd;
      std::vector<float> x(static_cast<size_t>(nt * n));
      for (float& v : x) v = nd(rng);
      const std::string what = "n " + std::to_string(n) + " nt " + std::to_string(nt);
      Check(w, n, x, nt, 0, rows, what);
      Check(w, n, x, nt, 1, 6, what + " rows [1, 6)");
      Check(w, n, x, nt, 3, 4, what + " row 3");
    }
  }
}

TEST_P(QuantGemmTest, EdgeCases) {
  std::mt19937 rng(static_cast<uint32_t>(type_) * 29 + 5);
  const int64_t n = Lengths().back();
  // Rows: zero scales, all quant bytes 0 (smallest codes), all 0xFF (largest
  // codes; −1 for the signed types), random.
  std::vector<uint8_t> w;
  for (auto [fill, zero] : {std::pair{Fill::kRandom, true}, std::pair{Fill::kAllZero, false},
                            std::pair{Fill::kAllOnes, false}, std::pair{Fill::kRandom, false},
                            std::pair{Fill::kAllOnes, true}}) {
    const std::vector<uint8_t> row = MakeRow(type_, n, rng, fill, zero);
    w.insert(w.end(), row.begin(), row.end());
  }
  // Q8 weights with −128 and 127: the sign trick's extremes.
  if (type_ == GgmlType::kQ8_0) {
    for (int64_t i = 0; i < n / 32; ++i) {
      auto* qs = reinterpret_cast<int8_t*>(w.data() + 3 * RowBytes(type_, n) + i * 34 + 2);
      for (int j = 0; j < 32; ++j) qs[j] = j % 2 ? -128 : 127;
    }
  }
  const int nt = 7;
  std::vector<float> x(static_cast<size_t>(nt * n));
  std::normal_distribution<float> nd;
  for (int t = 0; t < nt; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      float v = nd(rng);
      if (t == 1) v = 0;                       // an all-zero token: zero activation scales
      if (t == 2) v = (j % 3 == 0) ? 50.0f : -50.0f;  // ±127 activation codes
      if (t == 3 && j % 64 < 32) v = 0;        // some zero blocks
      x[t * n + j] = v;
    }
  }
  Check(w, n, x, nt, 0, 5, "edge rows");
  Check(w, n, x, 1, 2, 5, "edge rows, one token");
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndPaths, QuantGemmTest,
                         ::testing::Combine(::testing::ValuesIn(kGemmTypes),
                                            ::testing::Values(KernelPath::kScalar,
                                                              KernelPath::kAvx2)),
                         TypePathName);

}  // namespace
}  // namespace arbiter::engine_internal
