// KvBufferAllocator (Note [KV buffers]): vector semantics over small and
// large buffers; the KV types' names and row sizes.
#include "arbiter/engine/kv_snapshot.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace arbiter {
namespace {

using KvFloats = std::vector<float, KvBufferAllocator<float>>;

TEST(KvBufferTest, KvFloatsBehavesAsAVector) {
  KvFloats a;
  a.assign(kBufferHugeBytes / sizeof(float) + 3, 0.0f);  // large: its own mapping
  for (float v : a) ASSERT_EQ(v, 0.0f);
  a[7] = 1.5f;
  KvFloats b = a;  // copy
  EXPECT_EQ(a, b);
  b.resize(b.size() + 10);  // grows (reallocates); old values kept
  EXPECT_EQ(b[7], 1.5f);
  for (size_t i = a.size(); i < b.size(); ++i) b[i] = 2.0f;  // new values: written before use
  b.resize(4);                                               // shrinks
  KvFloats c = std::move(b);
  EXPECT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0], 0.0f);
  c.pop_back();
  EXPECT_EQ(c.size(), 3u);
  KvFloats d{1.0f, 2.0f};  // small: the heap
  EXPECT_EQ(d.size(), 2u);
  EXPECT_EQ(d[1], 2.0f);
}

TEST(KvTypeTest, NamesAndRowBytes) {
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
    EXPECT_TRUE(IsKvType(t));
    EXPECT_EQ(ParseKvType(KvTypeName(t)), t);
  }
  EXPECT_FALSE(IsKvType(GgmlType::kQ4_0));
  EXPECT_EQ(ParseKvType("F16"), std::nullopt);  // the config's spelling only
  EXPECT_EQ(ParseKvType("q4_0"), std::nullopt);
  EXPECT_EQ(kDefaultKvType, GgmlType::kF16);
  EXPECT_EQ(KvRowBytes(GgmlType::kF32, 256), 1024u);
  EXPECT_EQ(KvRowBytes(GgmlType::kF16, 256), 512u);
  EXPECT_EQ(KvRowBytes(GgmlType::kBF16, 256), 512u);
  EXPECT_EQ(KvRowBytes(GgmlType::kQ8_0, 256), 8u * 34);
  EXPECT_EQ(KvRowBytes(GgmlType::kQ8_0, 48), 0u);  // not whole blocks
  EXPECT_EQ(KvRowBytes(GgmlType::kQ4_0, 256), 0u);  // not a KV type
  KvSnapshot s;
  s.n_layers = 3;
  s.kv_dim = 64;
  s.kv_type = GgmlType::kF16;
  s.tokens = {1, 2, 3, 4, 5};
  EXPECT_EQ(s.ExpectedKvBytes(), 2u * 3 * 5 * 128);
  s.kv.resize(s.ExpectedKvBytes());
  EXPECT_EQ(s.MemoryBytes(), 5u * 4 + 2 * 3 * 5 * 128);
  const KvRowsView rows = s.Rows();
  ASSERT_EQ(rows.k.size(), 3u);
  EXPECT_EQ(rows.v[2] - s.kv.data(), 5 * 5 * 128);
}

}  // namespace
}  // namespace arbiter
