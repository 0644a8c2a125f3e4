// engine/internal/quant_test_util.h — helpers shared by the kernel tests
// (quant_test.cc, quant_gemm_test.cc): type sizes, which kernel paths this
// CPU runs, a scoped path switch, the reference dequantizer, and the
// type × path parameter with its test name.
//
// Thread safety: ScopedPath changes the process-wide kernel path (tests
// only, no concurrent kernel calls); the rest are pure.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "arbiter/formats/ggml_type.h"
#include "engine/internal/quant.h"

namespace arbiter::engine_internal {

inline int64_t BlockElems(GgmlType t) { return GgmlTypeTraitsOf(t)->block_elems; }
inline size_t RowBytes(GgmlType t, int64_t n) { return *GgmlRowBytes(t, n); }

// Whether this CPU can run `path` (SupportedKernelPaths).
inline bool PathSupported(KernelPath path) {
  for (KernelPath p : SupportedKernelPaths()) {
    if (p == path) return true;
  }
  return false;
}

// Runs the kernels on one path for the scope, then restores the previous one.
// REQUIRES: PathSupported(path).
class ScopedPath {
 public:
  explicit ScopedPath(KernelPath path) : saved_(ActiveKernelPath()) { SetKernelPathForTest(path); }
  ~ScopedPath() { SetKernelPathForTest(saved_); }
  ScopedPath(const ScopedPath&) = delete;
  ScopedPath& operator=(const ScopedPath&) = delete;

 private:
  KernelPath saved_;
};

// One row of n elements of `type` as f32, by the scalar reference.
inline std::vector<float> Dequant(GgmlType type, const void* row, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  DequantizeRowReference(type, row, n, out.data());
  return out;
}

// A parameterized kernel test's weight type and kernel path, and its name
// ("Q4_K_avx2").
using TypePath = std::tuple<GgmlType, KernelPath>;
inline std::string TypePathName(const ::testing::TestParamInfo<TypePath>& info) {
  return std::string(GgmlTypeName(std::get<0>(info.param))) + "_" +
         std::string(KernelPathName(std::get<1>(info.param)));
}

}  // namespace arbiter::engine_internal
