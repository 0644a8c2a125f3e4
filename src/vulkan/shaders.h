// vulkan/shaders.h — the compute shaders compiled into the binary: GLSL in
// src/vulkan/shaders/, compiled by glslc at build time (one SPIR-V module per
// shader and variant, src/vulkan/CMakeLists.txt) and embedded by
// cmake/embed_spirv.cmake.
//
// Thread safety: immutable data; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace arbiter::vulkan {

struct ShaderBlob {
  std::string_view name;             // e.g. "matvec_f16"
  std::span<const uint32_t> spirv;   // SPIR-V words
};

// Every embedded shader, in CMakeLists order.
const std::vector<ShaderBlob>& Shaders();

}  // namespace arbiter::vulkan
