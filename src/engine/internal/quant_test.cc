// The quantized kernels (quant.h) on every supported path: DotRows against
// the reference dequantizers, DequantizeRows bit-identical to the reference,
// QuantizeRow round trips, hand-built blocks checked against the ggml
// layouts, and the edge cases (zero scales, extreme quants, equal inputs,
// one and many blocks, accumulate, r0 > 0). A path this CPU cannot run is
// skipped with a message naming it.
#include "engine/internal/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "arbiter/formats/safetensors.h"  // F32ToF16, F16ToF32
#include "engine/internal/quant_internal.h"
#include "engine/internal/quant_test_util.h"

namespace arbiter::engine_internal {
namespace {

const GgmlType kComputeTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,
                                  GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                  GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                  GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K};

uint16_t RandomHalf(std::mt19937& rng, float lo, float hi) {
  return F32ToF16(std::uniform_real_distribution<float>(lo, hi)(rng));
}

// A row of n elements of `type`: random quant bytes (every value of every
// field occurs), scales random finite f16/f32 in [lo, hi) (mins ≥ 0 for the
// K-quants, any sign elsewhere).
std::vector<uint8_t> RandomRow(GgmlType type, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> row(RowBytes(type, n));
  for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
  std::normal_distribution<float> nd;
  using namespace quant;  // NOLINT: the block structs
  const int64_t nb = n / BlockElems(type);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* p = row.data() + i * GgmlTypeTraitsOf(type)->block_bytes;
    switch (type) {
      case GgmlType::kF32: {
        const float v = nd(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case GgmlType::kF16:
        StoreU16(p, F32ToF16(nd(rng)));
        break;
      case GgmlType::kBF16:
        StoreU16(p, F32ToBF16(nd(rng)));
        break;
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
      case GgmlType::kQ8_0:
        StoreU16(p, RandomHalf(rng, -0.1f, 0.1f));
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
        StoreU16(p, RandomHalf(rng, -0.1f, 0.1f));
        StoreU16(p + 2, RandomHalf(rng, -1.0f, 1.0f));
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        StoreU16(p, RandomHalf(rng, 0.0f, 0.01f));
        StoreU16(p + 2, RandomHalf(rng, 0.0f, 0.01f));
        break;
      case GgmlType::kQ6_K:
        StoreU16(p + 208, RandomHalf(rng, -0.01f, 0.01f));
        break;
      case GgmlType::kQ8_K: {
        const float d = std::uniform_real_distribution<float>(-0.01f, 0.01f)(rng);
        std::memcpy(p, &d, 4);
        break;
      }
      default:
        ADD_FAILURE() << "no random rows of " << GgmlTypeName(type);
    }
  }
  return row;
}

std::vector<float> RandomFloats(int64_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = nd(rng);
  return x;
}

// x as the kernels see it: the activation row, and its reference values.
struct Activation {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
Activation Prepare(GgmlType weight_type, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  const GgmlType at = ActivationType(weight_type);
  Activation a;
  a.bytes.resize(RowBytes(at, n));
  PrepareActivation(weight_type, x.data(), n, a.bytes.data());
  a.values = Dequant(at, a.bytes.data(), n);
  return a;
}

// Σ w·x in double, and the scale of its tolerance: Σ|x| · max|w|.
void ReferenceDot(const std::vector<float>& w, const std::vector<float>& x, double* dot,
                  double* scale) {
  double s = 0, ax = 0, mw = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    s += static_cast<double>(w[i]) * x[i];
    ax += std::fabs(x[i]);
    mw = std::max(mw, static_cast<double>(std::fabs(w[i])));
  }
  *dot = s;
  *scale = ax * mw;
}

// Q4_1/Q5_1 use x's stored s = d·Σq (f16) where the reference has the exact
// sum: allow its rounding, |m_w|·|s|·2⁻¹¹ per block.
double MinRoundingAllowance(GgmlType type, const uint8_t* w_row, const Activation& a, int64_t n) {
  if (type != GgmlType::kQ4_1 && type != GgmlType::kQ5_1) return 0;
  const size_t block_bytes = GgmlTypeTraitsOf(type)->block_bytes;
  double allowance = 0;
  for (int64_t i = 0; i < n / 32; ++i) {
    const float m = quant::HalfToFloat(w_row + i * block_bytes + 2);
    const float s = quant::HalfToFloat(a.bytes.data() + i * 36 + 2);
    allowance += std::fabs(m) * std::fabs(s) * 0x1p-10;
  }
  return allowance;
}

class QuantKernelTest : public ::testing::TestWithParam<TypePath> {
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

  // DotRows over `rows` rows of `w` (n elements each), rows [r0, r1),
  // checked against the reference, with accumulate off and on.
  void CheckDotRows(const std::vector<uint8_t>& w, int64_t n, const std::vector<float>& x,
                    int64_t r0, int64_t r1, const std::string& what) {
    const Activation a = Prepare(type_, x);
    const size_t row_bytes = RowBytes(type_, n);
    std::mt19937 rng(7);
    for (bool accumulate : {false, true}) {
      std::vector<float> y = RandomFloats(r1 - r0 + 2, rng);  // one guard element each side
      const std::vector<float> y0 = y;
      DotRows(type_, w.data(), n, a.bytes.data(), r0, r1, y.data() + 1, accumulate);
      EXPECT_EQ(y.front(), y0.front()) << what << ": wrote before y";
      EXPECT_EQ(y.back(), y0.back()) << what << ": wrote past y";
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = w.data() + r * row_bytes;
        double dot, scale;
        ReferenceDot(Dequant(type_, row, n), a.values, &dot, &scale);
        const double want = (accumulate ? y0[r - r0 + 1] : 0.0) + dot;
        const double tol =
            2e-6 * scale + MinRoundingAllowance(type_, row, a, n) + 1e-6 * std::fabs(want) + 1e-30;
        EXPECT_NEAR(y[r - r0 + 1], want, tol)
            << what << " row " << r << " accumulate " << accumulate << " (scale " << scale << ")";
      }
    }
  }

  GgmlType type_{};
  KernelPath path_{};
  std::unique_ptr<ScopedPath> scoped_;
};

TEST_P(QuantKernelTest, DotRowsMatchesReferenceOnRandomBlocks) {
  std::mt19937 rng(static_cast<uint32_t>(type_) * 31 + 1);
  const int64_t be = BlockElems(type_);
  // One block, many blocks, and (block size 1) lengths that leave tails.
  std::vector<int64_t> lengths = {be == 1 ? 32 : be,
                                  be == 1 ? 512 : 16 * std::max<int64_t>(be, 32)};
  if (be == 1) lengths.insert(lengths.end(), {1, 7, 37, 515});
  if (be == 32) {  // AVX2 works in groups of 8 blocks: none, and one plus a tail
    lengths.push_back(3 * 32);
    lengths.push_back(11 * 32);
  }
  if (be == 256) lengths.push_back(3 * 256);
  for (int64_t n : lengths) {
    const int64_t rows = 5;
    std::vector<uint8_t> w;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<uint8_t> row = RandomRow(type_, n, rng);
      w.insert(w.end(), row.begin(), row.end());
    }
    const std::vector<float> x = RandomFloats(n, rng);
    CheckDotRows(w, n, x, 0, rows, "n " + std::to_string(n));
    CheckDotRows(w, n, x, 2, 4, "n " + std::to_string(n) + " r0 2");
  }
}

TEST_P(QuantKernelTest, DotRowsEdgeCases) {
  std::mt19937 rng(99);
  const int64_t be = BlockElems(type_);
  const int64_t n = be == 1 ? 64 : 2 * std::max<int64_t>(be, 32);
  const size_t bb = GgmlTypeTraitsOf(type_)->block_bytes;
  std::vector<uint8_t> w = RandomRow(type_, n, rng);
  // Row 1: first block with its scale(s) zeroed (d = 0; K-quants also dmin).
  std::vector<uint8_t> zero_scale = w;
  if (be > 1) {
    const size_t d_at = type_ == GgmlType::kQ6_K ? 208 : 0;
    std::memset(zero_scale.data() + d_at, 0, type_ == GgmlType::kQ8_K ? 4 : 2);
    if (type_ == GgmlType::kQ4_K || type_ == GgmlType::kQ5_K)
      std::memset(zero_scale.data() + 2, 0, 2);
  }
  // Rows 2 and 3: every quant field at its minimum (all bits 0) and maximum
  // (all bits 1), scales kept.
  std::vector<uint8_t> lo = w, hi = w;
  if (be > 1) {
    for (int64_t i = 0; i < n / be; ++i) {
      uint8_t* l = lo.data() + i * bb;
      uint8_t* h = hi.data() + i * bb;
      auto fill = [&](size_t from, size_t to) {
        std::memset(l + from, 0x00, to - from);
        std::memset(h + from, 0xFF, to - from);
      };
      switch (type_) {
        case GgmlType::kQ4_0:
        case GgmlType::kQ5_0:
        case GgmlType::kQ8_0:
          fill(2, bb);
          break;
        case GgmlType::kQ4_1:
        case GgmlType::kQ5_1:
          fill(4, bb);
          break;
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K:
          fill(16, bb);
          break;  // scales too: 0 and 63
        case GgmlType::kQ6_K:
          fill(0, 192);
          break;
        case GgmlType::kQ8_K: {  // −128 and 127 (0xFF would be −1)
          std::memset(l + 4, 0x80, 256);
          std::memset(h + 4, 0x7F, 256);
          break;
        }
        default:
          break;
      }
      if (type_ == GgmlType::kQ8_0) {
        std::memset(l + 2, 0x80, 32);
        std::memset(h + 2, 0x7F, 32);
      }
    }
  }
  std::vector<uint8_t> rows;
  for (const auto* r : {&w, &zero_scale, &lo, &hi}) rows.insert(rows.end(), r->begin(), r->end());
  // x: random; all equal (every activation quant at 127); zero in its first
  // block (activation d = 0); alternating ±amax.
  std::vector<float> x_random = RandomFloats(n, rng);
  std::vector<float> x_equal(static_cast<size_t>(n), 0.75f);
  std::vector<float> x_zero_block = x_random;
  std::fill(x_zero_block.begin(), x_zero_block.begin() + std::max<int64_t>(be, 32), 0.0f);
  std::vector<float> x_alt(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x_alt[i] = (i % 2 ? -3.0f : 3.0f);
  CheckDotRows(rows, n, x_random, 0, 4, "random x");
  CheckDotRows(rows, n, x_equal, 0, 4, "all-equal x");
  CheckDotRows(rows, n, x_zero_block, 0, 4, "x zero in block 0");
  CheckDotRows(rows, n, x_alt, 1, 4, "alternating x, r0 1");
  // All-zero x gives exactly 0.
  const std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
  const Activation a = Prepare(type_, zeros);
  float y[4] = {1, 1, 1, 1};
  DotRows(type_, rows.data(), n, a.bytes.data(), 0, 4, y, false);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  // An empty range writes nothing.
  DotRows(type_, rows.data(), n, a.bytes.data(), 2, 2, nullptr, false);
}

TEST_P(QuantKernelTest, DequantizeRowsEqualsReferenceBitForBit) {
  std::mt19937 rng(static_cast<uint32_t>(type_) + 5);
  const int64_t be = BlockElems(type_);
  for (int64_t n :
       {be == 1 ? int64_t{37} : be, be == 1 ? int64_t{512} : 8 * std::max<int64_t>(be, 32)}) {
    const int64_t rows = 4;
    std::vector<uint8_t> w;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<uint8_t> row = RandomRow(type_, n, rng);
      if (r == 1 && be > 1) std::memset(row.data() + (type_ == GgmlType::kQ6_K ? 208 : 0), 0, 2);
      w.insert(w.end(), row.begin(), row.end());
    }
    std::vector<float> got(static_cast<size_t>((rows - 1) * n));
    DequantizeRows(type_, w.data(), n, 1, rows, got.data());
    for (int64_t r = 1; r < rows; ++r) {
      const std::vector<float> want = Dequant(type_, w.data() + r * RowBytes(type_, n), n);
      EXPECT_EQ(std::memcmp(got.data() + (r - 1) * n, want.data(), n * sizeof(float)), 0)
          << "n " << n << " row " << r;
    }
  }
}

// A slice of every row (a KV cache's head columns): the middle n of 3n
// elements of each row, read at the full row's stride.
TEST_P(QuantKernelTest, DequantizeStridedRowsReadsSlicesOfRows) {
  std::mt19937 rng(static_cast<uint32_t>(type_) + 9);
  const int64_t n = std::max<int64_t>(BlockElems(type_), 32);
  const size_t slice = RowBytes(type_, n), stride = 3 * slice;
  const int64_t rows = 5;
  std::vector<uint8_t> w;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint8_t> row = RandomRow(type_, 3 * n, rng);
    w.insert(w.end(), row.begin(), row.end());
  }
  std::vector<float> got(static_cast<size_t>(rows * n));
  DequantizeStridedRows(type_, w.data() + slice, stride, n, rows, got.data());
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> want = Dequant(type_, w.data() + r * stride + slice, n);
    EXPECT_EQ(std::memcmp(got.data() + r * n, want.data(), n * sizeof(float)), 0) << "row " << r;
  }
}

TEST_P(QuantKernelTest, ActivationsAreIdenticalOnEveryPath) {
  if (ActivationType(type_) == GgmlType::kF32) GTEST_SKIP() << "f32 activations: a copy";
  std::mt19937 rng(3);
  const int64_t n = 1024;
  std::vector<float> x = RandomFloats(n, rng, 0.01f);
  for (int64_t i = 0; i < 32; ++i) x[i] = 0;                             // an all-zero block
  for (int64_t i = 256; i < 288; ++i) x[i] = static_cast<float>(i % 5);  // ties at .5 steps
  const Activation here = Prepare(type_, x);
  Activation scalar;
  {
    ScopedPath s(KernelPath::kScalar);
    scalar = Prepare(type_, x);
  }
  EXPECT_EQ(here.bytes, scalar.bytes);
  if (ActivationType(type_) == GgmlType::kQ8_K) {  // bsums are the sums of the quants
    for (int64_t blk = 0; blk < n / 256; ++blk) {
      const auto* b = reinterpret_cast<const quant::BlockQ8_K*>(here.bytes.data()) + blk;
      for (int s = 0; s < 16; ++s) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += b->qs[16 * s + j];
        int16_t stored;
        std::memcpy(&stored, b->bsums + 2 * s, 2);
        EXPECT_EQ(stored, sum) << "block " << blk << " sum " << s;
      }
    }
  }
  // Every element within half a step of x (plus the f16 rounding of d:
  // 127·d·2⁻¹¹ ≈ 0.062·d).
  for (int64_t i = 0; i < n; ++i) {
    const int64_t blk = ActivationType(type_) == GgmlType::kQ8_K ? 256 : 32;
    float amax = 0;
    for (int64_t j = i / blk * blk; j < (i / blk + 1) * blk; ++j)
      amax = std::max(amax, std::fabs(x[j]));
    EXPECT_NEAR(here.values[i], x[i], amax / 127 * 0.57 + 1e-7 * amax) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantKernelTest,
                         ::testing::Combine(::testing::ValuesIn(kComputeTypes),
                                            ::testing::Values(KernelPath::kScalar,
                                                              KernelPath::kAvx2)),
                         TypePathName);

// --- QuantizeRow ----------------------------------------------------------------

// Relative RMS error bounds of QuantizeRow → DequantizeRowReference on
// N(0, 1) data (the measured errors are 80-85 % of these).
struct RoundTripBound {
  GgmlType type;
  double max_rel_rms;
};
const RoundTripBound kRoundTrip[] = {
    {GgmlType::kF32, 0.0},     {GgmlType::kF16, 2.5e-4},  {GgmlType::kBF16, 2e-3},
    {GgmlType::kQ8_0, 0.0065}, {GgmlType::kQ8_1, 0.0065}, {GgmlType::kQ8_K, 0.0085},
    {GgmlType::kQ4_0, 0.10},   {GgmlType::kQ4_1, 0.095},  {GgmlType::kQ5_0, 0.05},
    {GgmlType::kQ5_1, 0.045},  {GgmlType::kQ4_K, 0.085},  {GgmlType::kQ5_K, 0.043},
    {GgmlType::kQ6_K, 0.02},
};

class QuantizeRowTest : public ::testing::TestWithParam<RoundTripBound> {};

TEST_P(QuantizeRowTest, RoundTripErrorIsBounded) {
  const GgmlType type = GetParam().type;
  std::mt19937 rng(11);
  const int64_t n = 8192;
  const std::vector<float> x = RandomFloats(n, rng);
  std::vector<uint8_t> q(RowBytes(type, n));
  ASSERT_TRUE(QuantizeRow(type, x.data(), n, q.data()).ok());
  const std::vector<float> back = Dequant(type, q.data(), n);
  double se = 0, sx = 0;
  for (int64_t i = 0; i < n; ++i) {
    se += (back[i] - x[i]) * static_cast<double>(back[i] - x[i]);
    sx += x[i] * static_cast<double>(x[i]);
  }
  const double rel = std::sqrt(se / sx);
  EXPECT_LE(rel, GetParam().max_rel_rms) << GgmlTypeName(type);
  RecordProperty("rel_rms_error", std::to_string(rel));
  std::printf("[ round trip ] %-5s relative RMS error %.5f\n",
              std::string(GgmlTypeName(type)).c_str(), rel);
}

TEST_P(QuantizeRowTest, ZerosAndEqualInputs) {
  const GgmlType type = GetParam().type;
  const int64_t n = std::max<int64_t>(256, BlockElems(type));
  std::vector<uint8_t> q(RowBytes(type, n));
  const std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
  ASSERT_TRUE(QuantizeRow(type, zeros.data(), n, q.data()).ok());
  for (float v : Dequant(type, q.data(), n)) EXPECT_EQ(v, 0.0f) << GgmlTypeName(type);
  // Constants whose super-block scales stay f16 normals or nearly so: the
  // f16 d of Q6_K is max|x| / 4096, a subnormal below 0.25 (as in ggml).
  for (float c : {1.0f, -2.5f, 0.05f}) {
    const std::vector<float> same(static_cast<size_t>(n), c);
    ASSERT_TRUE(QuantizeRow(type, same.data(), n, q.data()).ok());
    for (float v : Dequant(type, q.data(), n)) {
      EXPECT_NEAR(v, c, std::fabs(c) * 0.02) << GgmlTypeName(type) << " constant " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantizeRowTest, ::testing::ValuesIn(kRoundTrip),
                         [](const ::testing::TestParamInfo<RoundTripBound>& info) {
                           return std::string(GgmlTypeName(info.param.type));
                         });

TEST(QuantizeRowErrors, RejectsBadLengthsAndTypes) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> out(4096);
  EXPECT_EQ(QuantizeRow(GgmlType::kQ4_0, x.data(), 33, out.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeRow(GgmlType::kQ4_K, x.data(), 32, out.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeRow(GgmlType::kQ2_K, x.data(), 256, out.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(QuantizeRow(GgmlType::kF16, x.data(), 3, out.data()).ok());
}

// --- The layouts, from the ggml block definitions, on hand-built blocks -----------

TEST(QuantLayout, BlockSizesMatchGgml) {
  EXPECT_EQ(RowBytes(GgmlType::kQ4_0, 32), sizeof(quant::BlockQ4_0));
  EXPECT_EQ(RowBytes(GgmlType::kQ4_1, 32), sizeof(quant::BlockQ4_1));
  EXPECT_EQ(RowBytes(GgmlType::kQ5_0, 32), sizeof(quant::BlockQ5_0));
  EXPECT_EQ(RowBytes(GgmlType::kQ5_1, 32), sizeof(quant::BlockQ5_1));
  EXPECT_EQ(RowBytes(GgmlType::kQ8_0, 32), sizeof(quant::BlockQ8_0));
  EXPECT_EQ(RowBytes(GgmlType::kQ8_1, 32), sizeof(quant::BlockQ8_1));
  EXPECT_EQ(RowBytes(GgmlType::kQ4_K, 256), sizeof(quant::BlockQ4_K));
  EXPECT_EQ(RowBytes(GgmlType::kQ5_K, 256), sizeof(quant::BlockQ5_K));
  EXPECT_EQ(RowBytes(GgmlType::kQ6_K, 256), sizeof(quant::BlockQ6_K));
  EXPECT_EQ(RowBytes(GgmlType::kQ8_K, 256), sizeof(quant::BlockQ8_K));
}

TEST(QuantLayout, HalfToFloatIsExact) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = quant::HalfToFloat(static_cast<uint16_t>(h));
    const float b = F16ToF32(static_cast<uint16_t>(h));
    const float c = quant::HalfToFloatBranchless(static_cast<uint16_t>(h));
    EXPECT_EQ(std::memcmp(&a, &c, 4), 0) << h;  // NaN payloads too
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << h;
    } else {
      EXPECT_EQ(std::memcmp(&a, &b, 4), 0) << h;
    }
  }
}

TEST(QuantLayout, Q4_0AndQ5_0Nibbles) {
  uint8_t b4[18] = {};
  quant::StoreU16(b4, 0x3C00);  // d = 1
  b4[2] = 0x1F;                 // element 0: 0xF − 8 = 7; element 16: 1 − 8 = −7
  b4[17] = 0x80;                // element 15: 0 − 8; element 31: 8 − 8
  const std::vector<float> v4 = Dequant(GgmlType::kQ4_0, b4, 32);
  EXPECT_EQ(v4[0], 7);
  EXPECT_EQ(v4[16], -7);
  EXPECT_EQ(v4[15], -8);
  EXPECT_EQ(v4[31], 0);
  uint8_t b5[22] = {};
  quant::StoreU16(b5, 0x4000);                 // d = 2
  const uint32_t qh = (1u << 3) | (1u << 20);  // 5th bit of elements 3 and 20
  std::memcpy(b5 + 2, &qh, 4);
  b5[6 + 3] = 0x02;  // element 3: (2 | 16) − 16 = 2; element 19: 0 − 16
  b5[6 + 4] = 0x50;  // element 4: 0 − 16; element 20: (5 | 16) − 16 = 5
  const std::vector<float> v5 = Dequant(GgmlType::kQ5_0, b5, 32);
  EXPECT_EQ(v5[3], 4);
  EXPECT_EQ(v5[19], -32);
  EXPECT_EQ(v5[4], -32);
  EXPECT_EQ(v5[20], 10);
}

// ggml's get_scale_min_k4, spelled as the spec writes it.
void ScaleMinK4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

TEST(QuantLayout, Q4_KScalesMinsAndNibbles) {
  std::mt19937 rng(5);
  uint8_t b[144];
  for (uint8_t& v : b) v = static_cast<uint8_t>(rng());
  quant::StoreU16(b, 0x3C00);      // d = 1
  quant::StoreU16(b + 2, 0x3800);  // dmin = 0.5
  const std::vector<float> v = Dequant(GgmlType::kQ4_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 32, chunk = e / 64, l = e % 32;
    const uint8_t byte = b[16 + 32 * chunk + l];
    const int q = (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
    int d, m;
    ScaleMinK4(sub, b + 4, &d, &m);
    EXPECT_EQ(v[e], static_cast<float>(d * q) - 0.5f * static_cast<float>(m)) << e;
  }
  uint8_t sc[8], mins[8], repacked[12];
  quant::UnpackScalesMinsK4(b + 4, sc, mins);
  quant::PackScalesMinsK4(sc, mins, repacked);
  EXPECT_EQ(std::memcmp(repacked, b + 4, 12), 0);
}

TEST(QuantLayout, Q6_KElements) {
  std::mt19937 rng(6);
  uint8_t b[210];
  for (uint8_t& v : b) v = static_cast<uint8_t>(rng());
  quant::StoreU16(b + 208, 0x3C00);  // d = 1
  const std::vector<float> v = Dequant(GgmlType::kQ6_K, b, 256);
  // ggml's dequantize_row_q6_K loop, element by element.
  for (int n = 0; n < 2; ++n) {
    const uint8_t* ql = b + 64 * n;
    const uint8_t* qh = b + 128 + 32 * n;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      EXPECT_EQ(v[128 * n + l], static_cast<float>(sc[is] * q1));
      EXPECT_EQ(v[128 * n + l + 32], static_cast<float>(sc[is + 2] * q2));
      EXPECT_EQ(v[128 * n + l + 64], static_cast<float>(sc[is + 4] * q3));
      EXPECT_EQ(v[128 * n + l + 96], static_cast<float>(sc[is + 6] * q4));
    }
  }
}

TEST(QuantLayout, Q5_KHighBits) {
  uint8_t b[176] = {};
  quant::StoreU16(b, 0x3C00);  // d = 1, dmin = 0
  b[4] = 1;                    // sub-block 0 scale 1
  b[5] = 1;                    // sub-block 1 scale 1
  b[16 + 0] = 0x01 | 0x02;     // qh[0]: 5th bit of element 0 (bit 0) and element 32 (bit 1)
  b[16 + 5] = 0x04;            // qh[5] bit 2: element 64 + 5 (sub-block 2, scale 0)
  b[48 + 1] = 0x30;            // qs[1]: element 1 low nibble 0, element 33 high nibble 3
  const std::vector<float> v = Dequant(GgmlType::kQ5_K, b, 256);
  EXPECT_EQ(v[0], 16);
  EXPECT_EQ(v[32], 16);
  EXPECT_EQ(v[1], 0);
  EXPECT_EQ(v[33], 3);
  EXPECT_EQ(v[69], 0);  // scale 0
}

TEST(QuantPaths, ScalarIsAlwaysSupported) {
  const std::vector<KernelPath> paths = SupportedKernelPaths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths[0], KernelPath::kScalar);
  std::printf("[ paths ] supported:");
  for (KernelPath p : paths) std::printf(" %s", std::string(KernelPathName(p)).c_str());
  std::printf("; active: %s\n", std::string(KernelPathName(ActiveKernelPath())).c_str());
}

}  // namespace
}  // namespace arbiter::engine_internal
