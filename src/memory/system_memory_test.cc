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

}  // namespace
}  // namespace arbiter
