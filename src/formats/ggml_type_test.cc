// The ggml type table against the format: enum values from ggml.h's
// `enum ggml_type`, block sizes recomputed field by field from the block
// structs of ggml-common.h (as its static_asserts state them), so a typo in
// the table's literal byte counts shows up as a mismatch here.
#include "arbiter/formats/ggml_type.h"

#include <gtest/gtest.h>

#include <iterator>
#include <optional>
#include <string>

namespace arbiter {
namespace {

constexpr int64_t kQK = 256;  // QK_K, the K-quant super-block
constexpr size_t kHalf = 2;   // ggml_half

struct Expected {
  GgmlType type;
  uint32_t value;
  const char* name;
  int64_t block_elems;
  size_t block_bytes;
};

// Block bytes written as the sums of the struct fields.
const Expected kExpected[] = {
    {GgmlType::kF32, 0, "F32", 1, 4},
    {GgmlType::kF16, 1, "F16", 1, 2},
    {GgmlType::kQ4_0, 2, "Q4_0", 32, kHalf + 32 / 2},
    {GgmlType::kQ4_1, 3, "Q4_1", 32, 2 * kHalf + 32 / 2},
    {GgmlType::kQ5_0, 6, "Q5_0", 32, kHalf + 4 + 32 / 2},
    {GgmlType::kQ5_1, 7, "Q5_1", 32, 2 * kHalf + 4 + 32 / 2},
    {GgmlType::kQ8_0, 8, "Q8_0", 32, kHalf + 32},
    {GgmlType::kQ8_1, 9, "Q8_1", 32, 2 * kHalf + 32},
    // scales[QK/16], qs[QK/4], d, dmin
    {GgmlType::kQ2_K, 10, "Q2_K", kQK, kQK / 16 + kQK / 4 + 2 * kHalf},
    // hmask[QK/8], qs[QK/4], scales[12], d
    {GgmlType::kQ3_K, 11, "Q3_K", kQK, kQK / 8 + kQK / 4 + 12 + kHalf},
    // d, dmin, scales[12], qs[QK/2]
    {GgmlType::kQ4_K, 12, "Q4_K", kQK, 2 * kHalf + 12 + kQK / 2},
    // d, dmin, scales[12], qh[QK/8], qs[QK/2]
    {GgmlType::kQ5_K, 13, "Q5_K", kQK, 2 * kHalf + 12 + kQK / 8 + kQK / 2},
    // ql[QK/2], qh[QK/4], scales[QK/16], d
    {GgmlType::kQ6_K, 14, "Q6_K", kQK, kQK / 2 + kQK / 4 + kQK / 16 + kHalf},
    // f32 d, qs[QK], i16 bsums[QK/16]
    {GgmlType::kQ8_K, 15, "Q8_K", kQK, 4 + kQK + 2 * (kQK / 16)},
    // d, u16 qs[QK/8]
    {GgmlType::kIQ2_XXS, 16, "IQ2_XXS", kQK, kHalf + 2 * (kQK / 8)},
    // d, u16 qs[QK/8], scales[QK/32]
    {GgmlType::kIQ2_XS, 17, "IQ2_XS", kQK, kHalf + 2 * (kQK / 8) + kQK / 32},
    // d, qs[3*QK/8]
    {GgmlType::kIQ3_XXS, 18, "IQ3_XXS", kQK, kHalf + 3 * kQK / 8},
    // d, qs[QK/8], u16 qh[QK/32]
    {GgmlType::kIQ1_S, 19, "IQ1_S", kQK, kHalf + kQK / 8 + 2 * (kQK / 32)},
    // d, qs[32/2]
    {GgmlType::kIQ4_NL, 20, "IQ4_NL", 32, kHalf + 32 / 2},
    // d, qs[QK/4], qh[QK/32], signs[QK/8], scales[QK/64]
    {GgmlType::kIQ3_S, 21, "IQ3_S", kQK, kHalf + kQK / 4 + kQK / 32 + kQK / 8 + kQK / 64},
    // d, qs[QK/4], qh[QK/32], scales[QK/32]
    {GgmlType::kIQ2_S, 22, "IQ2_S", kQK, kHalf + kQK / 4 + kQK / 32 + kQK / 32},
    // d, u16 scales_h, scales_l[QK/64], qs[QK/2]
    {GgmlType::kIQ4_XS, 23, "IQ4_XS", kQK, kHalf + 2 + kQK / 64 + kQK / 2},
    {GgmlType::kI8, 24, "I8", 1, 1},
    {GgmlType::kI16, 25, "I16", 1, 2},
    {GgmlType::kI32, 26, "I32", 1, 4},
    {GgmlType::kI64, 27, "I64", 1, 8},
    {GgmlType::kF64, 28, "F64", 1, 8},
    // qs[QK/8], qh[QK/16], scales[QK/32] (no d: the scale is packed in scales)
    {GgmlType::kIQ1_M, 29, "IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32},
    {GgmlType::kBF16, 30, "BF16", 1, 2},
    // qs[(QK - 4*QK/64)/5], qh[QK/64], d
    {GgmlType::kTQ1_0, 34, "TQ1_0", kQK, (kQK - 4 * kQK / 64) / 5 + kQK / 64 + kHalf},
    // qs[QK/4], d
    {GgmlType::kTQ2_0, 35, "TQ2_0", kQK, kQK / 4 + kHalf},
    // u8 e (shared exponent), qs[32/2]
    {GgmlType::kMXFP4, 39, "MXFP4", 32, 1 + 32 / 2},
};

TEST(GgmlTypeTest, TableMatchesTheBlockStructs) {
  for (const Expected& e : kExpected) {
    SCOPED_TRACE(e.name);
    EXPECT_EQ(static_cast<uint32_t>(e.type), e.value);
    std::optional<GgmlTypeTraits> t = GgmlTypeTraitsOf(e.value);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->name, e.name);
    EXPECT_EQ(t->block_elems, e.block_elems);
    EXPECT_EQ(t->block_bytes, e.block_bytes);
    EXPECT_EQ(GgmlTypeName(e.type), e.name);
    std::optional<GgmlTypeTraits> by_enum = GgmlTypeTraitsOf(e.type);
    ASSERT_TRUE(by_enum.has_value());
    EXPECT_EQ(by_enum->block_bytes, e.block_bytes);
  }
}

TEST(GgmlTypeTest, EveryDefinedValueIsListed) {
  int defined = 0;
  for (uint32_t v = 0; v < 64; ++v) {
    if (GgmlTypeTraitsOf(v).has_value()) ++defined;
  }
  EXPECT_EQ(defined, static_cast<int>(std::size(kExpected)));
}

TEST(GgmlTypeTest, RemovedAndUnknownValuesAreRefused) {
  for (uint32_t v : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 1000u, 0xffffffffu}) {
    EXPECT_FALSE(GgmlTypeTraitsOf(v).has_value()) << v;
  }
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(4)), "type ?");
}

TEST(GgmlTypeTest, RowBytes) {
  EXPECT_EQ(GgmlRowBytes(GgmlType::kF32, 7), 28u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kBF16, 0), 0u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ8_0, 64), 68u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ4_K, 4096), 16u * 144u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ4_K, 4096 + 32), std::nullopt);  // not whole blocks
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ8_0, -32), std::nullopt);
  EXPECT_EQ(GgmlRowBytes(static_cast<GgmlType>(5), 32), std::nullopt);
}

}  // namespace
}  // namespace arbiter
