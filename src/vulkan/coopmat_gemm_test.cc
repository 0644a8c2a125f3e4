// The prefill GEMM's choice and the cooperative-matrix self-check (Note
// [Cooperative-matrix GEMM]). The device here (lavapipe) has no cooperative
// matrices, so the self-check's comparison is exercised with the fp32 GEMM
// as the candidate: unchanged it must pass; perturbed beyond the bound, or
// dispatched wrongly, it must fail.
#include "arbiter/vulkan/coopmat_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "vulkan/shaders.h"
#include "vulkan/vulkan_test_util.h"

namespace arbiter::vulkan {
namespace {

using CoopmatGemmTest = VulkanTest;

TEST(CoopmatGemmShadersTest, EveryWeightTypeHasBothShapeVariantsEmbedded) {
  for (const char* t :
       {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"}) {
    for (const char* shape : {"16x16x16", "16x8x16"}) {
      const std::string name = std::string("gemm_cm") + shape + "_" + t;
      bool found = false;
      for (const ShaderBlob& s : Shaders()) found |= s.name == name && !s.spirv.empty();
      EXPECT_TRUE(found) << name;
    }
  }
}

TEST(CoopmatGemmShadersTest, StateNames) {
  EXPECT_EQ(CoopmatGemmStateName(CoopmatGemmState::kUsed), "used");
  EXPECT_EQ(CoopmatGemmStateName(CoopmatGemmState::kFailedSelfCheck), "failed self-check");
  EXPECT_EQ(CoopmatGemmStateName(CoopmatGemmState::kUnavailable), "unavailable");
}

TEST_F(CoopmatGemmTest, ADeviceWithoutCooperativeMatricesRunsTheFp32Gemm) {
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  if (dev->info().cooperative_matrix_gemm_possible) GTEST_SKIP() << "this device has them";
  EXPECT_FALSE(dev->info().cooperative_matrix_gemm_reason.empty());
  EXPECT_EQ(CoopmatGemmStateOf(*dev), CoopmatGemmState::kUnavailable);
  const GemmKernels g = SelectGemm(*dev);
  EXPECT_EQ(g.prefix, "gemm_");
  EXPECT_FALSE(g.cooperative);
}

// Runs only on a device with cooperative matrices (a lent GPU): the real
// kernel against the fp32 GEMM.
TEST_F(CoopmatGemmTest, OnADeviceWithCooperativeMatricesTheKernelPassesItsSelfCheck) {
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  if (!dev->info().cooperative_matrix_gemm_possible) {
    GTEST_SKIP() << "no cooperative-matrix GEMM here: "
                 << dev->info().cooperative_matrix_gemm_reason;
  }
  Result<GemmCheckReport> r = CompareGemms(*dev, CoopmatGemm(dev->info()), Fp32Gemm());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->passed) << r->worst << " (" << r->worst_ratio << "x the bound)";
  EXPECT_EQ(CoopmatGemmStateOf(*dev), CoopmatGemmState::kUsed);
  EXPECT_TRUE(SelectGemm(*dev).cooperative);
}

TEST_F(CoopmatGemmTest, TheFp32GemmAgainstItselfPasses) {
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  Result<GemmCheckReport> r = CompareGemms(*dev, Fp32Gemm(), Fp32Gemm());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->passed) << r->worst;
  EXPECT_EQ(r->worst_ratio, 0.0) << r->worst;
}

TEST_F(CoopmatGemmTest, AnErrorWithinTheBoundPassesAndBeyondItFails) {
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  for (const double scale : {0.5, 2.0}) {
    Result<GemmCheckReport> r = CompareGemms(
        *dev, Fp32Gemm(), Fp32Gemm(), [scale](std::span<float> out, std::span<const double> bound) {
          ASSERT_EQ(out.size(), bound.size());
          // Element [7, 90]: a row in the second token tile and
          // the weight rows' tail tile (96 rows).
          const size_t e = size_t{7} * 96 + 90;
          for (size_t i = 0; i < bound.size(); ++i) ASSERT_GT(bound[i], 0.0);
          out[e] = static_cast<float>(out[e] + scale * bound[e]);
        });
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->passed, scale < 1.0) << scale << ": " << r->worst;
    EXPECT_NEAR(r->worst_ratio, scale, 1e-3);
    EXPECT_NE(r->worst.find("[7, 90]"), std::string::npos) << r->worst;
  }
}

TEST_F(CoopmatGemmTest, ANonFiniteCandidateFails) {
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  Result<GemmCheckReport> r =
      CompareGemms(*dev, Fp32Gemm(), Fp32Gemm(), [](std::span<float> out, std::span<const double>) {
        out[3] = std::numeric_limits<float>::quiet_NaN();
      });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->passed);
  EXPECT_TRUE(std::isinf(r->worst_ratio));
}

TEST_F(CoopmatGemmTest, AWronglyDispatchedVariantFails) {
  // Claims 64 token rows per workgroup where gemm.comp computes 32: the
  // tokens of the second half of each tile are never computed.
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  GemmKernels wrong = Fp32Gemm();
  wrong.tile_m = 64;
  Result<GemmCheckReport> r = CompareGemms(*dev, wrong, Fp32Gemm());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->passed) << r->worst;
  EXPECT_GT(r->worst_ratio, 10.0);
}

TEST_F(CoopmatGemmTest, AMissingVariantIsAnError) {
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  GemmKernels none = Fp32Gemm();
  none.prefix = "gemm_nonexistent_";
  EXPECT_EQ(CompareGemms(*dev, none, Fp32Gemm()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace arbiter::vulkan
