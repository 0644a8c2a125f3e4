// KvBufferAllocator / KvFloats (Note [KV buffers]): vector semantics over
// small and large buffers.
#include "arbiter/engine/kv_snapshot.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace arbiter {
namespace {

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

}  // namespace
}  // namespace arbiter
