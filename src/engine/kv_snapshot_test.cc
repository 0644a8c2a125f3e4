// KvBufferAllocator / KvFloats (Note [KV buffers]): small and large
// buffers, 2 MiB alignment of the large ones, vector semantics.
#include "arbiter/engine/kv_snapshot.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace arbiter {
namespace {

TEST(KvBufferTest, LargeBuffersAreHugePageAlignedAndWritable) {
  for (size_t bytes : {kKvBufferHugeBytes, kKvBufferHugeBytes + 4, size_t{33} << 20}) {
    SCOPED_TRACE(bytes);
    void* p = AllocateKvBuffer(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kKvBufferHugeBytes, 0u);
    std::memset(p, 0x5a, bytes);  // every byte is mapped and writable
    EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0x5a);
    FreeKvBuffer(p, bytes);
  }
}

TEST(KvBufferTest, SmallBuffersComeFromTheHeap) {
  for (size_t bytes : {size_t{1}, size_t{4096}, kKvBufferHugeBytes - 1}) {
    void* p = AllocateKvBuffer(bytes);
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, bytes);
    FreeKvBuffer(p, bytes);
  }
  FreeKvBuffer(nullptr, kKvBufferHugeBytes);  // a no-op
}

TEST(KvBufferTest, KvFloatsBehavesAsAVector) {
  KvFloats a;
  a.assign(kKvBufferHugeBytes / sizeof(float) + 3, 0.0f);  // large: its own mapping
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
