// The weight-reading kernels (matvec_<t>, embed_<t>: shaders/weights.glsl,
// quant.glsl) for every type they read, against the CPU engine's reference
// dequantizer (engine/internal/quant.h DequantizeRowReference): rows
// quantized by QuantizeRow, products computed in double on the host.
// The Khronos validation layer is on; any message fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "arbiter/formats/ggml_type.h"
#include "arbiter/vulkan/vulkan_device.h"
#include "engine/internal/quant.h"
#include "vulkan/vulkan_test_util.h"

namespace arbiter::vulkan {
namespace {

using engine_internal::DequantizeRowReference;
using engine_internal::QuantizeRow;

// Push-constant blocks as matvec.comp and embed.comp declare them.
struct MatvecPush {
  uint64_t w, x, y, bias, norm;
  uint32_t rows, cols, row_bytes, accumulate, vec4, mode;
  float eps;
};
struct EmbedPush {
  uint64_t w, out, step;
  uint32_t rows, cols, row_bytes;
};

constexpr uint32_t kRowsPerY = 32768;  // matvec.comp: group = y · 32768 + x
constexpr uint32_t kMatvecRows = 4;     // matvec.comp's NR: rows per group

// A weight matrix [rows, cols] of `type`: its bytes (rows × row_bytes,
// padded to whole words) and each row's reference values. Only `distinct`
// rows are drawn; row r holds the bytes of row r % distinct (a big matrix
// costs no quantization time, and a wrong row index still reads other
// values).
struct Matrix {
  uint32_t rows = 0, cols = 0, row_bytes = 0, distinct = 0;
  std::vector<uint8_t> bytes;
  std::vector<std::vector<float>> values;  // [distinct][cols]
  const std::vector<float>& row(uint32_t r) const { return values[r % distinct]; }
};

Matrix MakeMatrix(GgmlType type, uint32_t rows, uint32_t cols, std::mt19937& rng) {
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = static_cast<uint32_t>(*GgmlRowBytes(type, cols));
  m.distinct = std::min<uint32_t>(rows, 61);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<uint8_t>> encoded(m.distinct, std::vector<uint8_t>(m.row_bytes));
  for (uint32_t r = 0; r < m.distinct; ++r) {
    // Rows of different scales, some offset from zero (the mins of the
    // affine types).
    const float scale = std::pow(10.0f, 2.0f * u(rng) - 0.5f);
    const float offset = r % 3 == 0 ? scale * u(rng) : 0.0f;
    std::vector<float> x(cols);
    for (float& v : x) v = offset + scale * u(rng);
    Status s = QuantizeRow(type, x.data(), cols, encoded[r].data());
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::vector<float> back(cols);
    DequantizeRowReference(type, encoded[r].data(), cols, back.data());
    m.values.push_back(std::move(back));
  }
  m.bytes.resize((uint64_t{rows} * m.row_bytes + 3) / 4 * 4);
  for (uint32_t r = 0; r < rows; ++r) {
    std::memcpy(m.bytes.data() + uint64_t{r} * m.row_bytes, encoded[r % m.distinct].data(),
                m.row_bytes);
  }
  return m;
}

std::string KernelSuffix(GgmlType type) {
  std::string s(GgmlTypeName(type));
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Shape {
  uint32_t rows, cols;
};

// Shapes for a type with blocks of `block` elements: odd row counts and
// more units per row than a workgroup has threads. Plain types get columns
// that are not a multiple of their unit (4 or 8). F32 and Q6_K (blocks at
// odd word offsets) also get rows past one dispatch dimension (matvec's y
// dimension; the row arithmetic is the same for every type, and a tall
// matrix costs lavapipe seconds).
std::vector<Shape> ShapesFor(GgmlType type) {
  const auto block = static_cast<uint32_t>(GgmlTypeTraitsOf(type)->block_elems);
  std::vector<Shape> shapes;
  if (block == 1) {
    shapes = {{1, 1}, {7, 7}, {33, 13}, {5, 100}, {3, 1029}};
  } else {
    // 130 or 136 units of 32 per row: more than matvec's 128 threads.
    const uint32_t wide = block == 32 ? 130 * 32 : 17 * 256;
    shapes = {{1, block}, {7, 3 * block}, {33, 2 * block}, {3, wide}};
  }
  if (type == GgmlType::kF32 || type == GgmlType::kQ6_K) {
    shapes.push_back({kRowsPerY + 1, block == 1 ? 3 : block});
  }
  return shapes;
}

class VulkanKernelsTest : public VulkanTest, public ::testing::WithParamInterface<GgmlType> {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (IsSkipped()) return;
    Result<std::shared_ptr<VulkanDevice>> dev = VulkanDevice::Open("vulkan");
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    dev_ = *dev;
  }
  void TearDown() override {
    for (VulkanBuffer& b : buffers_) dev_->Destroy(b);
    VulkanTest::TearDown();
  }

  // A device buffer holding `bytes` bytes of `data` (padded to ≥ 4 bytes).
  VulkanBuffer Buffer(const void* data, size_t bytes) {
    const size_t size = std::max<size_t>(4, (bytes + 3) / 4 * 4);
    Result<VulkanBuffer> b = dev_->CreateBuffer(size, BufferMemory::kDevice);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return {};
    buffers_.push_back(*b);
    std::vector<uint8_t> padded(size, 0);
    std::memcpy(padded.data(), data, bytes);
    EXPECT_TRUE(dev_->Upload(*b, 0, padded.data(), size).ok());
    return *b;
  }
  template <typename T>
  VulkanBuffer Buffer(const std::vector<T>& v) {
    return Buffer(v.data(), v.size() * sizeof(T));
  }

  template <typename Push>
  void Run(const std::string& kernel, const Push& push, uint32_t gx, uint32_t gy) {
    Result<VkPipeline> p = dev_->Pipeline(kernel);
    ASSERT_TRUE(p.ok()) << kernel << ": " << p.status().ToString();
    Status s = dev_->RunOnce([&](VkCommandBuffer cb) {
      vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, *p);
      vkCmdPushConstants(cb, dev_->pipeline_layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(push),
                         &push);
      vkCmdDispatch(cb, gx, gy, 1);
    });
    ASSERT_TRUE(s.ok()) << kernel << ": " << s.ToString();
  }

  std::vector<float> Read(const VulkanBuffer& b, size_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(dev_->Download(b, 0, out.data(), n * 4).ok());
    return out;
  }

  std::shared_ptr<VulkanDevice> dev_;
  std::vector<VulkanBuffer> buffers_;
};

TEST_P(VulkanKernelsTest, MatvecMatchesTheReferenceDequantizer) {
  const GgmlType type = GetParam();
  const std::string kernel = "matvec_" + KernelSuffix(type);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Shape& shape : ShapesFor(type)) {
    SCOPED_TRACE(kernel + " rows " + std::to_string(shape.rows) + " cols " +
                 std::to_string(shape.cols));
    const Matrix m = MakeMatrix(type, shape.rows, shape.cols, rng);
    std::vector<float> x(shape.cols), y0(shape.rows), bias(shape.rows);
    for (float& v : x) v = u(rng);
    for (float& v : y0) v = u(rng);
    for (float& v : bias) v = u(rng);
    const VulkanBuffer wb = Buffer(m.bytes), xb = Buffer(x), biasb = Buffer(bias);
    // The 16-byte path where the rows allow it (plain types), else scalar.
    const bool plain = type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE(accumulate ? "accumulate, bias" : "overwrite");
      const VulkanBuffer yb = Buffer(y0);
      const MatvecPush push{.w = wb.address,
                            .x = xb.address,
                            .y = yb.address,
                            .bias = accumulate ? biasb.address : 0,
                            .rows = shape.rows,
                            .cols = shape.cols,
                            .row_bytes = m.row_bytes,
                            .accumulate = accumulate ? 1u : 0u,
                            .vec4 = plain && m.row_bytes % 16 == 0 ? 1u : 0u};
      const uint32_t groups = (shape.rows + kMatvecRows - 1) / kMatvecRows;
      Run(kernel, push, std::min(groups, kRowsPerY), (groups + kRowsPerY - 1) / kRowsPerY);
      if (HasFatalFailure()) return;
      const std::vector<float> y = Read(yb, shape.rows);
      int failures = 0;
      for (uint32_t r = 0; r < shape.rows && failures < 5; ++r) {
        const std::vector<float>& w = m.row(r);
        double want = 0, scale = 0;
        for (uint32_t c = 0; c < shape.cols; ++c) {
          const double p = static_cast<double>(w[c]) * x[c];
          want += p;
          scale += std::fabs(p);
        }
        if (accumulate) {
          want += static_cast<double>(y0[r]) + bias[r];
          scale += std::fabs(y0[r]) + std::fabs(bias[r]);
        }
        if (!(std::fabs(y[r] - want) <= 1e-5 * scale)) {
          ADD_FAILURE() << "row " << r << ": got " << y[r] << ", want " << want << " (Σ|w·x| "
                        << scale << ")";
          ++failures;
        }
      }
    }
  }
}

TEST_P(VulkanKernelsTest, EmbedWritesTheReferenceValuesOfTheTokensRow) {
  const GgmlType type = GetParam();
  const std::string kernel = "embed_" + KernelSuffix(type);
  std::mt19937 rng(99);
  for (const Shape& shape : ShapesFor(type)) {
    SCOPED_TRACE(kernel + " rows " + std::to_string(shape.rows) + " cols " +
                 std::to_string(shape.cols));
    const Matrix m = MakeMatrix(type, shape.rows, shape.cols, rng);
    const VulkanBuffer wb = Buffer(m.bytes);
    // One token in range per run, and one past the table (writes nothing).
    for (const uint32_t token : {0u, shape.rows / 2, shape.rows - 1, shape.rows}) {
      SCOPED_TRACE("token " + std::to_string(token));
      constexpr float kUntouched = -12345.0f;
      const std::vector<float> init(shape.cols + 8, kUntouched);
      const VulkanBuffer out = Buffer(init);
      const int32_t step[2] = {static_cast<int32_t>(token), 0};
      const VulkanBuffer sb = Buffer(step, sizeof(step));
      const EmbedPush push{.w = wb.address,
                           .out = out.address,
                           .step = sb.address,
                           .rows = shape.rows,
                           .cols = shape.cols,
                           .row_bytes = m.row_bytes};
      Run(kernel, push, 1, 1);
      if (HasFatalFailure()) return;
      const std::vector<float> got = Read(out, init.size());
      for (uint32_t c = shape.cols; c < got.size(); ++c) ASSERT_EQ(got[c], kUntouched) << c;
      if (token == shape.rows) {
        for (uint32_t c = 0; c < shape.cols; ++c) ASSERT_EQ(got[c], kUntouched) << c;
        continue;
      }
      const std::vector<float>& want = m.row(token);
      float amax = 0;
      for (const float v : want) amax = std::max(amax, std::fabs(v));
      for (uint32_t c = 0; c < shape.cols; ++c) {
        ASSERT_NEAR(got[c], want[c], 1e-6 * amax) << "column " << c;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, VulkanKernelsTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                           GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                           GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const auto& info) { return KernelSuffix(info.param); });

}  // namespace
}  // namespace arbiter::vulkan
