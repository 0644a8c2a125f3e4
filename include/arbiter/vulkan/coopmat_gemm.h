// arbiter/vulkan/coopmat_gemm.h — which prefill GEMM a Vulkan device runs:
// the fp32 tiled GEMM (gemm.comp; every device, and the reference) or the
// cooperative-matrix GEMM (gemm_coopmat.comp, GL_NV_cooperative_matrix),
// chosen at run time per device, after a self-check against the fp32 one.
//
// Note [Cooperative-matrix GEMM]
// Where: only on a device that reports VK_NV_cooperative_matrix, its
// cooperativeMatrix feature for compute shaders, a multiply shape arbiter
// has a variant of — f16 A and B, f32 C and D, subgroup scope, M × N × K of
// 16×16×16 or else 16×8×16 (both built, shaders/CMakeLists) — and what the
// shader needs besides: shaderFloat16, vulkanMemoryModel (glslc marks the
// shader so for GL_KHR_memory_scope_semantics), subgroup size 32 (the
// workgroup of 128 is four subgroups, each a 32 × 32 quarter of the 64 × 64
// tile) and 27 KiB of shared memory. The extension, the feature and the
// memory model are enabled at vkCreateDevice only on such a device.
// ARBITER_VULKAN_COOPMAT=0 in the environment turns it off (read when a
// device is described: `arbiter devices` and device open).
// Inputs are rounded to f16 in shared memory (activations from f32; weights
// dequantized from their stored blocks by the code gemm.comp uses), products
// are accumulated in f32. Activations beyond f16's range (65504) would
// overflow; the self-check does not cover that, the fp32 GEMM does.
// Self-check: the first time a device's GEMM is chosen in a process
// (SelectGemm: at the engine's compute creation and in `arbiter devices`),
// the pipelines of every weight type's variant are made (a driver refusing
// one fails the check), and the candidate runs on small random problems — m = 61, 96 weight rows,
// 256 columns, with bias and accumulate, for f16, q8_0 and q4_k weights (the three ways a tile is
// filled: 16-byte loads, welem, unit_values) — and its output is compared element by element with
// the fp32 GEMM's on the same inputs. Bound, with S = Σ_c |x_c · w_c| over the element's products
// (the weights as embed_<type> dequantizes them) and K the columns: rounding x and w to f16 (unit
// roundoff 2^-11) moves each product by at most (2^-10 + 2^-22)|x·w|, and fp32 accumulation in any
// order moves each side by at most K·2^-24·S; so |candidate − reference| ≤ 2^-9·S + 2^-22·(|y0| +
// |bias| + |reference|) + K·2^-24 (twice the product term, plus the bias/accumulate roundings and
// f16 subnormals' absolute error on inputs ≤ 1). Any element beyond it, or not finite, fails the
// check: a warning names the device and the worst element, and the device runs the fp32 GEMM for
// the rest of the process. A kernel that passes computes the right products for those shapes; one
// that is wrong (layout, a missed slice, a bad shape) is harmless.
//
// Thread safety: thread-safe. SelectGemm's result per device is computed
// once per process (two threads asking first may both run the check; the
// first result stored wins).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "arbiter/base/status.h"
#include "arbiter/vulkan/vulkan_device.h"

namespace arbiter::vulkan {

// gemm.comp's and gemm_coopmat.comp's push constants (std430-like: 8-byte
// addresses first, then 4-byte fields).
struct GemmPush {
  uint64_t w, x, y, bias;
  uint32_t rows, cols, row_bytes, accumulate, m, ldx, ldy, wvec, xvec;
};

// A GEMM kernel family: the shader of weight type T is prefix + T ("f16",
// "q4_k"); a workgroup covers tile_rows weight rows × tile_m activation rows
// (dispatch ceil(rows / tile_rows) × ceil(m / tile_m)).
struct GemmKernels {
  std::string prefix;
  uint32_t tile_rows = 64;
  uint32_t tile_m = 32;
  bool cooperative = false;
};

// The fp32 tiled GEMM (gemm.comp): every device.
GemmKernels Fp32Gemm();
// The cooperative-matrix GEMM of `info`'s shape; REQUIRES:
// info.cooperative_matrix_gemm_possible.
GemmKernels CoopmatGemm(const VulkanDeviceInfo& info);

// What `arbiter devices` reports: "used" | "failed self-check" | "unavailable".
enum class CoopmatGemmState { kUnavailable, kUsed, kFailedSelfCheck };
std::string_view CoopmatGemmStateName(CoopmatGemmState state);

// The state on `dev`, running the self-check the first time (a failure
// logs a warning naming the device).
CoopmatGemmState CoopmatGemmStateOf(VulkanDevice& dev);
// The GEMM `dev` runs for prefill: the cooperative one when its state is
// kUsed, else Fp32Gemm().
GemmKernels SelectGemm(VulkanDevice& dev);

// The self-check's comparison, for SelectGemm and tests.
struct GemmCheckReport {
  bool passed = false;
  double worst_ratio = 0;  // max over elements of |candidate − reference| / bound
  std::string worst;       // "f16 [i, r]: candidate …, reference …, bound …"
};
// Called with the candidate's output [m, rows] and each element's bound
// before the comparison (tests perturb the candidate through it).
using GemmCheckTamper =
    std::function<void(std::span<float> candidate, std::span<const double> bound)>;
// Makes the pipeline of every weight type of `candidate`, runs `candidate`
// and `reference` on the self-check's problems (Note [Cooperative-matrix
// GEMM]; fixed seed) and compares them. Errors: the device's when a buffer,
// a pipeline or a submission fails (kNotFound for a prefix without shaders).
Result<GemmCheckReport> CompareGemms(VulkanDevice& dev, const GemmKernels& candidate,
                                     const GemmKernels& reference,
                                     const GemmCheckTamper& tamper = nullptr);

}  // namespace arbiter::vulkan
