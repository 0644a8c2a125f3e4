#include "arbiter/base/clip.h"

#include <string>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

TEST(ClipInputTest, ShortTextIsUnchanged) {
  EXPECT_EQ(ClipInput("demo-chat"), "demo-chat");
  EXPECT_EQ(ClipInput(std::string(kMaxQuotedInputBytes, 'a')), std::string(256, 'a'));
  EXPECT_EQ(ClipInput(""), "");
}

TEST(ClipInputTest, LongTextKeepsTheLimitAndMarksTheCut) {
  const std::string huge(8 << 20, 'x');
  EXPECT_EQ(ClipInput(huge), std::string(256, 'x') + "\u2026");
  EXPECT_EQ(ClipInput("abcdef", 3), "abc\u2026");
}

TEST(ClipInputTest, CutsAtACharacterBoundary) {
  // "é" is 2 bytes (C3 A9), "€" 3 (E2 82 AC), "😀" 4 (F0 9F 98 80).
  EXPECT_EQ(ClipInput("aé", 2), "a\u2026");    // would split é
  EXPECT_EQ(ClipInput("aéb", 3), "aé\u2026");  // é fits whole
  EXPECT_EQ(ClipInput("€€", 4), "€\u2026");
  EXPECT_EQ(ClipInput("😀😀", 7), "😀\u2026");
  EXPECT_EQ(ClipInput("😀😀", 3), "\u2026");
  std::string s(255, 'a');
  s += "€€";  // the first € straddles byte 256
  EXPECT_EQ(ClipInput(s), std::string(255, 'a') + "\u2026");
}

TEST(ClipInputTest, InvalidUtf8StillEndsWithinTheLimit) {
  const std::string cont(300, '\x80');  // continuation bytes only
  const std::string clipped = ClipInput(cont);
  EXPECT_LE(clipped.size(), kMaxQuotedInputBytes + 3);
}

}  // namespace
}  // namespace arbiter
