// AllocateBuffer / FreeBuffer / ZeroAndPrefault (Note [Where freed memory
// goes], Note [Charged memory is resident]): alignment, own mappings that
// go back to the OS, pre-faulted zeroes.
#include "arbiter/base/buffer_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace arbiter {
namespace {

// Pages of [p, p + bytes) resident now, by mincore.
size_t ResidentPages(void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  EXPECT_EQ(::mincore(p, bytes, vec.data()), 0);
  size_t n = 0;
  for (unsigned char c : vec) n += c & 1;
  return n;
}

bool IsMapped(void* p) {
  unsigned char c = 0;
  return ::mincore(p, 1, &c) == 0;  // ENOMEM once unmapped
}

TEST(BufferMemoryTest, LargeBuffersAreHugePageAlignedAndWritable) {
  for (size_t bytes : {kBufferHugeBytes, kBufferHugeBytes + 4, size_t{33} << 20}) {
    SCOPED_TRACE(bytes);
    void* p = AllocateBuffer(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kBufferHugeBytes, 0u);
    std::memset(p, 0x5a, bytes);  // every byte is mapped and writable
    EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0x5a);
    FreeBuffer(p, bytes);
    EXPECT_FALSE(IsMapped(p));  // back to the OS
  }
}

TEST(BufferMemoryTest, MidSizedBuffersAreOwnMappingsReturnedOnFree) {
  const size_t bytes = kOwnMappingMinBytes + 100;
  void* p = AllocateBuffer(bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kBufferAlignmentBytes, 0u);
  std::memset(p, 1, bytes);
  FreeBuffer(p, bytes);
  EXPECT_FALSE(IsMapped(p));
}

TEST(BufferMemoryTest, SmallBuffersAreAlignedHeapMemory) {
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, kOwnMappingMinBytes - 1}) {
    void* p = AllocateBuffer(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kBufferAlignmentBytes, 0u);
    std::memset(p, 1, bytes);
    FreeBuffer(p, bytes);
  }
  FreeBuffer(nullptr, kBufferHugeBytes);  // a no-op
}

TEST(BufferMemoryTest, ZeroAndPrefaultMakesEveryPageResidentAndZero) {
  for (size_t bytes : {size_t{1000}, kOwnMappingMinBytes * 3, kBufferHugeBytes * 2 + 12345}) {
    SCOPED_TRACE(bytes);
    auto* p = static_cast<unsigned char*>(AllocateBuffer(bytes));
    if (bytes >= kOwnMappingMinBytes) EXPECT_EQ(ResidentPages(p, bytes), 0u);  // untouched
    ZeroAndPrefault(p, bytes);
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    if (bytes >= kOwnMappingMinBytes) EXPECT_EQ(ResidentPages(p, bytes), (bytes + page - 1) / page);
    for (size_t i = 0; i < bytes; i += 997) ASSERT_EQ(p[i], 0) << i;
    EXPECT_EQ(p[bytes - 1], 0);
    FreeBuffer(p, bytes);
  }
}

TEST(BufferMemoryTest, HeapSettingsAndTrimAreSafeToCall) {
  ConfigureProcessHeap();
  std::vector<char*> blocks;
  for (int i = 0; i < 100; ++i) blocks.push_back(new char[200 << 10]);
  for (char* b : blocks) delete[] b;
  TrimProcessHeap();
}

}  // namespace
}  // namespace arbiter
