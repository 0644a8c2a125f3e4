#include "arbiter/base/size.h"

#include <gtest/gtest.h>

namespace arbiter {
namespace {

TEST(SizeTest, ParsesUnits) {
  EXPECT_EQ(*ParseSize("1048576"), 1048576u);
  EXPECT_EQ(*ParseSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseSize("512 mib"), 512ull << 20);
  EXPECT_EQ(*ParseSize("2GB"), 2000000000ull);
  EXPECT_EQ(*ParseSize("2G"), 2ull << 30);
  EXPECT_EQ(*ParseSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseSize("10KB"), 10000u);
  EXPECT_EQ(*ParseSize("4k"), 4096u);
  EXPECT_EQ(*ParseSize(" 7 B "), 7u);
}

TEST(SizeTest, Percent) {
  EXPECT_EQ(*ParseSize("75%", 1000), 750u);
  EXPECT_EQ(*ParseSize("100%", 1 << 20), 1u << 20);
  Result<uint64_t> r = ParseSize("75%");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("percentage is not allowed"), std::string::npos);
  EXPECT_FALSE(ParseSize("150%", 100).ok());
}

TEST(SizeTest, RejectsGarbageWithClearMessages) {
  for (const char* bad : {"", "MiB", "12XB", "1.2.3G", "-5", "1.5", "abc", "99999999999999999999TiB"}) {
    Result<uint64_t> r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("size \""), std::string::npos) << r.status().message();
  }
}

TEST(SizeTest, Format) {
  EXPECT_EQ(FormatSize(12), "12 B");
  EXPECT_EQ(FormatSize(1536), "1.50 KiB");
  EXPECT_EQ(FormatSize(512ull << 20), "512.00 MiB");
}

}  // namespace
}  // namespace arbiter
