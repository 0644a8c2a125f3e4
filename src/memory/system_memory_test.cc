#include "arbiter/memory/system_memory.h"

#include <gtest/gtest.h>

namespace arbiter {
namespace {

TEST(SystemMemoryTest, ParsesMeminfo) {
  auto r = ParseMemInfo("MemTotal:       16384 kB\nMemFree:  10 kB\nMemAvailable:    8192 kB\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->total_bytes, 16384ull * 1024);
  EXPECT_EQ(r->available_bytes, 8192ull * 1024);
}

TEST(SystemMemoryTest, MissingOrBadFieldsAreDataLoss) {
  EXPECT_EQ(ParseMemInfo("MemTotal: 5 kB\n").status().code(), StatusCode::kDataLoss);
  auto r = ParseMemInfo("MemTotal: x kB\nMemAvailable: 1 kB\n");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("MemTotal"), std::string::npos);
}

TEST(SystemMemoryTest, ReadsThisMachine) {
  auto r = ReadSystemMemory();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->total_bytes, 0u);
  EXPECT_LE(r->available_bytes, r->total_bytes);
  EXPECT_EQ(ReadSystemMemory("/nonexistent/meminfo").status().code(), StatusCode::kUnavailable);
}

TEST(SystemMemoryTest, ParsesProcessStatus) {
  auto r = ParseProcessStatus(
      "Name:\tarbiter\nVmRSS:\t  300 kB\nRssAnon:\t  200 kB\nRssFile:\t   64 kB\n"
      "RssShmem:\t   36 kB\nThreads:\t4\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->anon_bytes, 200u * 1024);
  EXPECT_EQ(r->file_bytes, 64u * 1024);
  EXPECT_EQ(r->shmem_bytes, 36u * 1024);
  EXPECT_EQ(r->resident_bytes(), 236u * 1024);
  auto bad = ParseProcessStatus("RssAnon: 1 kB\nRssFile: 1 kB\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("RssShmem"), std::string::npos);
}

TEST(SystemMemoryTest, ProcessMemoryFollowsTouchedPages) {
  auto before = ReadProcessMemory();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  const size_t bytes = size_t{64} << 20;
  auto* p = static_cast<volatile char*>(new char[bytes]);
  for (size_t i = 0; i < bytes; i += 4096) p[i] = 1;
  auto during = ReadProcessMemory();
  ASSERT_TRUE(during.ok());
  delete[] p;
  EXPECT_GE(during->anon_bytes, before->anon_bytes + bytes * 9 / 10);
}

}  // namespace
}  // namespace arbiter
