// arbiter/formats/ggml_type.h — the tensor types of GGUF files (ggml's
// `enum ggml_type`) and their block layouts.
//
// A ggml tensor row of n elements is stored as n / block_elems blocks of
// block_bytes each (for F32/F16/BF16 a "block" is one element). The numeric
// values are the ones GGUF files store in their tensor infos (ggml.h,
// `GGML_TYPE_*`); they never change. Block layouts (ggml-common.h):
//   Q4_0  32 elems, 18 B: f16 d; 16 B nibbles (elements j and j+16 share byte j)
//   Q4_1  32 elems, 20 B: f16 d, f16 m; 16 B nibbles
//   Q5_0  32 elems, 22 B: f16 d; u32 high bits; 16 B nibbles
//   Q5_1  32 elems, 24 B: f16 d, f16 m; u32 high bits; 16 B nibbles
//   Q8_0  32 elems, 34 B: f16 d; 32 × i8
//   Q8_1  32 elems, 36 B: f16 d, f16 s (= d × Σq); 32 × i8
//   Q2_K 256 elems, 84 B; Q3_K 256, 110 B
//   Q4_K 256 elems, 144 B: f16 d, f16 dmin; 12 B packed 6-bit scales/mins; 128 B nibbles
//   Q5_K 256 elems, 176 B: f16 d, f16 dmin; 12 B scales; 32 B high bits; 128 B nibbles
//   Q6_K 256 elems, 210 B: 128 B low nibbles; 64 B high 2 bits; 16 × i8 scales; f16 d
//   Q8_K 256 elems, 292 B: f32 d; 256 × i8; 16 × i16 block sums
// The IQ* and other types are listed so that a file holding them is measured
// and refused by name, not misread.
//
// Thread safety: pure functions over constants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace arbiter {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  // 4 and 5 (Q4_2, Q4_3) were removed from ggml; files never hold them.
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  // 31-33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) were removed from ggml.
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  // 36-38 (IQ4_NL_4_4, …) were removed from ggml.
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  std::string_view name;  // "Q4_K", "BF16", … as llama.cpp prints them
  int64_t block_elems = 0;
  size_t block_bytes = 0;
};

// The traits of the ggml type with numeric value `value`, or nullopt for a
// value ggml does not define (or has removed).
std::optional<GgmlTypeTraits> GgmlTypeTraitsOf(uint32_t value);
inline std::optional<GgmlTypeTraits> GgmlTypeTraitsOf(GgmlType type) {
  return GgmlTypeTraitsOf(static_cast<uint32_t>(type));
}

// The name of `type` ("Q8_0"), or "type ?" for an undefined value.
std::string_view GgmlTypeName(GgmlType type);

// Bytes of a row of `n` elements of `type`, or nullopt when `type` is
// undefined or `n` is not a multiple of its block size.
std::optional<size_t> GgmlRowBytes(GgmlType type, int64_t n);

}  // namespace arbiter
