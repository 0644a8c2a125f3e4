// vulkan/coopmat_gemm.cc — choosing a device's prefill GEMM and the
// cooperative-matrix GEMM's self-check (Note [Cooperative-matrix GEMM] in
// arbiter/vulkan/coopmat_gemm.h).
#include "arbiter/vulkan/coopmat_gemm.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "arbiter/base/mutex.h"
#include "vulkan/coopmat_gemm_internal.h"

namespace arbiter::vulkan {
namespace {

// Shared memory gemm_coopmat.comp declares: two f16 slices [64][40] and the
// f32 output staging [64][68].
constexpr uint32_t kCoopmatSharedBytes = 2 * 64 * 40 * 2 + 64 * 68 * 4;

// The shapes there are variants of, best first (src/vulkan/CMakeLists.txt).
constexpr std::pair<uint32_t, uint32_t> kShapes[] = {{16, 16}, {16, 8}};  // (M, N); K = 16

Mutex g_state_mu;
// Per device index: the state and what the self-check found.
std::map<int, std::pair<CoopmatGemmState, std::string>>& States() {
  static auto* const kStates = new std::map<int, std::pair<CoopmatGemmState, std::string>>();
  return *kStates;
}

struct Buffers {
  VulkanDevice& dev;
  std::vector<VulkanBuffer> list;
  explicit Buffers(VulkanDevice& d) : dev(d) {}
  ~Buffers() {
    for (VulkanBuffer& b : list) dev.Destroy(b);
  }
  // A device buffer of at least `bytes` (rounded up to 16) holding `data`.
  Result<uint64_t> Make(const void* data, uint64_t bytes) {
    ARBITER_ASSIGN_OR_RETURN(VulkanBuffer b,
                             dev.CreateBuffer((bytes + 15) / 16 * 16, BufferMemory::kDevice));
    list.push_back(b);
    if (data != nullptr) ARBITER_RETURN_IF_ERROR(dev.Upload(b, 0, data, bytes));
    return b.address;
  }
  const VulkanBuffer& last() const { return list.back(); }
};

Status Run(VulkanDevice& dev, const std::string& shader, const void* push, uint32_t push_bytes,
           uint32_t gx, uint32_t gy) {
  ARBITER_ASSIGN_OR_RETURN(VkPipeline p, dev.Pipeline(shader));
  return dev.RunOnce([&](VkCommandBuffer cb) {
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
    vkCmdPushConstants(cb, dev.pipeline_layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
    vkCmdDispatch(cb, gx, gy, 1);
  });
}

// One self-check problem: weights of type `suffix`, [rows, cols], stored.
struct Problem {
  std::string suffix;
  uint32_t row_bytes = 0;
  std::vector<uint8_t> w;
};

// Random weights with finite, small values: f16 with exponents in [2^-7, 1),
// Q8_0 and Q4_K blocks with fixed small scales and random quants.
Problem MakeWeights(std::string_view suffix, uint32_t rows, uint32_t cols, std::mt19937& rng) {
  Problem p;
  p.suffix = std::string(suffix);
  auto put16 = [&](size_t at, uint16_t v) {
    p.w[at] = static_cast<uint8_t>(v & 0xFF);
    p.w[at + 1] = static_cast<uint8_t>(v >> 8);
  };
  std::uniform_int_distribution<int> byte(0, 255);
  if (suffix == "f16") {
    p.row_bytes = cols * 2;
    p.w.resize(size_t{1} * rows * p.row_bytes);
    std::uniform_int_distribution<int> exponent(8, 14), mantissa(0, 1023), sign(0, 1);
    for (size_t e = 0; e < size_t{1} * rows * cols; ++e) {
      put16(2 * e,
            static_cast<uint16_t>((sign(rng) << 15) | (exponent(rng) << 10) | mantissa(rng)));
    }
  } else if (suffix == "q8_0") {
    p.row_bytes = cols / 32 * 34;
    p.w.resize(size_t{1} * rows * p.row_bytes);
    for (size_t b = 0; b < p.w.size(); b += 34) {
      put16(b, 0x2000);  // d = 2^-7
      for (size_t i = 0; i < 32; ++i) p.w[b + 2 + i] = static_cast<uint8_t>(byte(rng));
    }
  } else {  // q4_k: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
    p.row_bytes = cols / 256 * 144;
    p.w.resize(size_t{1} * rows * p.row_bytes);
    for (size_t b = 0; b < p.w.size(); b += 144) {
      put16(b, 0x1400);      // d = 2^-10
      put16(b + 2, 0x1800);  // dmin = 2^-9
      for (size_t i = 4; i < 144; ++i) p.w[b + i] = static_cast<uint8_t>(byte(rng));
    }
  }
  return p;
}

}  // namespace

void DescribeCooperativeMatrix(VkPhysicalDevice pd, VulkanDeviceInfo& info) {
  info.cooperative_matrix_feature = false;
  info.cooperative_matrix_shape.clear();
  info.cooperative_matrix_gemm_possible = false;
  if (!info.cooperative_matrix_nv || vkGetPhysicalDeviceCooperativeMatrixPropertiesNV == nullptr) {
    info.cooperative_matrix_gemm_reason = "no VK_NV_cooperative_matrix";
    return;
  }
  VkPhysicalDeviceCooperativeMatrixFeaturesNV features{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f.pNext = &features;
  vkGetPhysicalDeviceFeatures2(pd, &f);
  VkPhysicalDeviceCooperativeMatrixPropertiesNV props{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_NV};
  VkPhysicalDeviceProperties2 p{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p.pNext = &props;
  vkGetPhysicalDeviceProperties2(pd, &p);
  info.cooperative_matrix_feature =
      features.cooperativeMatrix == VK_TRUE &&
      (props.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;

  uint32_t n = 0;
  vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, nullptr);
  std::vector<VkCooperativeMatrixPropertiesNV> listed(
      n, VkCooperativeMatrixPropertiesNV{VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
  vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, listed.data());
  listed.resize(n);
  for (const auto& [m, nn] : kShapes) {
    for (const VkCooperativeMatrixPropertiesNV& s : listed) {
      if (s.MSize == m && s.NSize == nn && s.KSize == 16 &&
          s.AType == VK_COMPONENT_TYPE_FLOAT16_NV && s.BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
          s.CType == VK_COMPONENT_TYPE_FLOAT32_NV && s.DType == VK_COMPONENT_TYPE_FLOAT32_NV &&
          s.scope == VK_SCOPE_SUBGROUP_NV && info.cooperative_matrix_shape.empty()) {
        info.cooperative_matrix_shape = fmt::format("{}x{}x16", m, nn);
      }
    }
  }
  std::string& why = info.cooperative_matrix_gemm_reason;
  if (!info.cooperative_matrix_feature) {
    why = "the cooperativeMatrix feature is off for compute shaders";
  } else if (info.cooperative_matrix_shape.empty()) {
    why = "no f16 x f16 + f32 subgroup shape 16x16x16 or 16x8x16 listed";
  } else if (!info.fp16) {
    why = "no shaderFloat16";
  } else if (!info.vulkan_memory_model) {
    why = "no vulkanMemoryModel";
  } else if (info.subgroup_size != 32) {
    why = fmt::format("subgroup size {} (the kernel needs 32)", info.subgroup_size);
  } else if (info.max_shared_memory_bytes < kCoopmatSharedBytes) {
    why = fmt::format("{} bytes of shared memory ({} needed)", info.max_shared_memory_bytes,
                      kCoopmatSharedBytes);
  } else if (const char* v = std::getenv("ARBITER_VULKAN_COOPMAT");
             v != nullptr && std::string_view(v) == "0") {
    why = "off (ARBITER_VULKAN_COOPMAT=0)";
  } else {
    why.clear();
    info.cooperative_matrix_gemm_possible = true;
  }
}

GemmKernels Fp32Gemm() { return GemmKernels{"gemm_", 64, 32, false}; }

GemmKernels CoopmatGemm(const VulkanDeviceInfo& info) {
  return GemmKernels{"gemm_cm" + info.cooperative_matrix_shape + "_", 64, 64, true};
}

std::string_view CoopmatGemmStateName(CoopmatGemmState state) {
  switch (state) {
    case CoopmatGemmState::kUsed:
      return "used";
    case CoopmatGemmState::kFailedSelfCheck:
      return "failed self-check";
    case CoopmatGemmState::kUnavailable:
      break;
  }
  return "unavailable";
}

Result<GemmCheckReport> CompareGemms(VulkanDevice& dev, const GemmKernels& candidate,
                                     const GemmKernels& reference, const GemmCheckTamper& tamper) {
  constexpr uint32_t kM = 61, kRows = 96, kCols = 256;
  std::mt19937 rng(20261128);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> x(size_t{1} * kM * kCols), y0(size_t{1} * kM * kRows), bias(kRows);
  for (float& v : x) v = unit(rng);
  for (float& v : y0) v = unit(rng);
  for (float& v : bias) v = unit(rng);
  std::vector<int32_t> tokens(kRows);
  for (uint32_t r = 0; r < kRows; ++r) tokens[r] = static_cast<int32_t>(r);

  // Every type's pipeline is made now, so that a driver refusing one
  // variant fails the check rather than a prefill.
  for (std::string_view t :
       {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"}) {
    ARBITER_RETURN_IF_ERROR(dev.Pipeline(candidate.prefix + std::string(t)).status());
  }
  GemmCheckReport report;
  for (std::string_view suffix : {"f16", "q8_0", "q4_k"}) {
    const Problem prob = MakeWeights(suffix, kRows, kCols, rng);
    Buffers bufs(dev);
    ARBITER_ASSIGN_OR_RETURN(uint64_t w, bufs.Make(prob.w.data(), prob.w.size()));
    ARBITER_ASSIGN_OR_RETURN(uint64_t xa, bufs.Make(x.data(), x.size() * 4));
    ARBITER_ASSIGN_OR_RETURN(uint64_t ba, bufs.Make(bias.data(), bias.size() * 4));
    ARBITER_ASSIGN_OR_RETURN(uint64_t ta, bufs.Make(tokens.data(), tokens.size() * 4));
    ARBITER_ASSIGN_OR_RETURN(uint64_t da, bufs.Make(nullptr, size_t{4} * kRows * kCols));
    const VulkanBuffer deq = bufs.last();
    // The weights as the embedding kernel dequantizes them, for the bound.
    struct {
      uint64_t w, out, tokens;
      uint32_t rows, cols, row_bytes;
    } embed{w, da, ta, kRows, kCols, prob.row_bytes};
    ARBITER_RETURN_IF_ERROR(Run(dev, "embed_" + prob.suffix, &embed, sizeof(embed), 1, kRows));
    std::vector<float> wf(size_t{1} * kRows * kCols);
    ARBITER_RETURN_IF_ERROR(dev.Download(deq, 0, wf.data(), wf.size() * 4));

    std::vector<float> out[2];
    const GemmKernels* kernels[2] = {&candidate, &reference};
    for (int k = 0; k < 2; ++k) {
      ARBITER_ASSIGN_OR_RETURN(uint64_t ya, bufs.Make(y0.data(), y0.size() * 4));
      const VulkanBuffer ybuf = bufs.last();
      const bool plain = prob.suffix == "f16";
      GemmPush push{.w = w,
                    .x = xa,
                    .y = ya,
                    .bias = ba,
                    .rows = kRows,
                    .cols = kCols,
                    .row_bytes = prob.row_bytes,
                    .accumulate = 1,
                    .m = kM,
                    .ldx = kCols,
                    .ldy = kRows,
                    .wvec = plain && w % 16 == 0 && prob.row_bytes % 16 == 0 ? 1u : 0u,
                    .xvec = xa % 16 == 0 ? 1u : 0u};
      const GemmKernels& g = *kernels[k];
      ARBITER_RETURN_IF_ERROR(Run(dev, g.prefix + prob.suffix, &push, sizeof(push),
                                  (kRows + g.tile_rows - 1) / g.tile_rows,
                                  (kM + g.tile_m - 1) / g.tile_m));
      out[k].resize(y0.size());
      ARBITER_RETURN_IF_ERROR(dev.Download(ybuf, 0, out[k].data(), out[k].size() * 4));
    }

    std::vector<double> bound(y0.size());
    for (uint32_t i = 0; i < kM; ++i) {
      for (uint32_t r = 0; r < kRows; ++r) {
        double s = 0;
        for (uint32_t c = 0; c < kCols; ++c) {
          s += std::fabs(double{x[size_t{1} * i * kCols + c]} * wf[size_t{1} * r * kCols + c]);
        }
        const size_t e = size_t{1} * i * kRows + r;
        bound[e] = std::ldexp(s, -9) +
                   std::ldexp(std::fabs(y0[e]) + std::fabs(bias[r]) + std::fabs(out[1][e]), -22) +
                   std::ldexp(double{kCols}, -24);
      }
    }
    if (tamper) tamper(out[0], bound);
    for (size_t e = 0; e < bound.size(); ++e) {
      const double diff = std::fabs(double{out[0][e]} - out[1][e]);
      const double ratio =
          std::isfinite(out[0][e]) && std::isfinite(out[1][e]) ? diff / bound[e] : INFINITY;
      if (ratio > report.worst_ratio) {
        report.worst_ratio = ratio;
        report.worst =
            fmt::format("{} [{}, {}]: candidate {}, reference {}, bound {:.3g}", prob.suffix,
                        e / kRows, e % kRows, out[0][e], out[1][e], bound[e]);
      }
    }
  }
  report.passed = report.worst_ratio <= 1.0;
  return report;
}

CoopmatGemmState CoopmatGemmStateOf(VulkanDevice& dev) {
  const VulkanDeviceInfo& info = dev.info();
  if (!info.cooperative_matrix_gemm_possible) return CoopmatGemmState::kUnavailable;
  {
    MutexLock l(&g_state_mu);
    if (auto it = States().find(info.index); it != States().end()) return it->second.first;
  }
  const GemmKernels cm = CoopmatGemm(info);
  Result<GemmCheckReport> r = CompareGemms(dev, cm, Fp32Gemm());
  CoopmatGemmState state = CoopmatGemmState::kUsed;
  std::string detail;
  if (!r.ok()) {
    state = CoopmatGemmState::kFailedSelfCheck;
    detail = std::string(r.status().message());
  } else if (!r->passed) {
    state = CoopmatGemmState::kFailedSelfCheck;
    detail = fmt::format("worst {} ({:.3g}x the bound)", r->worst, r->worst_ratio);
  } else {
    detail = fmt::format("worst error {:.3g}x the bound", r->worst_ratio);
  }
  if (state == CoopmatGemmState::kUsed) {
    spdlog::info("device {} ({}): prefill GEMM {} (cooperative matrix), self-check passed: {}",
                 info.domain(), info.name, cm.prefix, detail);
  } else {
    spdlog::warn(
        "device {} ({}): the cooperative-matrix GEMM {} failed its self-check: {}; "
        "prefill uses the fp32 GEMM for this process",
        info.domain(), info.name, cm.prefix, detail);
  }
  MutexLock l(&g_state_mu);
  return States().try_emplace(info.index, state, detail).first->second.first;
}

GemmKernels SelectGemm(VulkanDevice& dev) {
  return CoopmatGemmStateOf(dev) == CoopmatGemmState::kUsed ? CoopmatGemm(dev.info()) : Fp32Gemm();
}

}  // namespace arbiter::vulkan
