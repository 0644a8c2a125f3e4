#include "arbiter/base/log_safe.h"

#include <random>
#include <string>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

using namespace std::string_literals;

TEST(LogSafeTest, KeepsPrintableText) {
  EXPECT_EQ(LogSafe(""), "");
  EXPECT_EQ(LogSafe("/v1/models/demo-chat"), "/v1/models/demo-chat");
  EXPECT_EQ(LogSafe("modèle «ü» 模型 🙂"), "modèle «ü» 模型 🙂");
}

TEST(LogSafeTest, EscapesC0ControlsAndDel) {
  EXPECT_EQ(LogSafe("/v1/x\n2031-01-01 info POST\r\n"), "/v1/x\\x0a2031-01-01 info POST\\x0d\\x0a");
  EXPECT_EQ(LogSafe("a\tb\x1b[31mc\x7f"), "a\\x09b\\x1b[31mc\\x7f");
  EXPECT_EQ(LogSafe("nul\0!"s), "nul\\x00!");
}

TEST(LogSafeTest, BackslashIsEscapedSoEscapesReadBack) {
  EXPECT_EQ(LogSafe("a\\x0ab"), "a\\\\x0ab");
  EXPECT_NE(LogSafe("a\\x0ab"), LogSafe("a\nb"));
}

TEST(LogSafeTest, EscapesInvalidUtf8AndC1AndLineSeparators) {
  EXPECT_EQ(LogSafe("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(LogSafe("a\x80z"), "a\\x80z");                         // stray continuation
  EXPECT_EQ(LogSafe("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(LogSafe("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(LogSafe("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
  EXPECT_EQ(LogSafe("\xe6\xa8"), "\\xe6\\xa8");                    // cut short
  EXPECT_EQ(LogSafe("\xc2\x85"), "\\xc2\\x85");                    // U+0085 NEL (C1)
  EXPECT_EQ(LogSafe("\xc2\x9b"), "\\xc2\\x9b");                    // U+009B CSI (C1)
  EXPECT_EQ(LogSafe("\xe2\x80\xa8"), "\\xe2\\x80\\xa8");           // U+2028
  EXPECT_EQ(LogSafe("\xe2\x80\xae"), "\\xe2\\x80\\xae");           // U+202E RLO
  EXPECT_EQ(LogSafe("\xc2\xa0"), "\xc2\xa0");                      // U+00A0 is kept
}

TEST(LogSafeTest, BoundsTheLengthAtACharacterBoundary) {
  const std::string long_name(10000, 'm');
  const std::string cut = LogSafe(long_name);
  EXPECT_EQ(cut, std::string(256, 'm') + "…");
  EXPECT_EQ(LogSafe("abcdef", 3), "abc…");
  EXPECT_EQ(LogSafe("abc", 3), "abc");
  // "é" is 2 bytes: the cut never splits it.
  EXPECT_EQ(LogSafe("aé", 2), "a…");
  EXPECT_EQ(LogSafe("aé", 3), "aé");
}

// Whatever the bytes, the result is one line of printable ASCII or valid
// UTF-8, no longer than the documented bound.
TEST(LogSafeTest, AnyBytesGiveOneBoundedLine) {
  std::mt19937 rng(25);
  for (int round = 0; round < 2000; ++round) {
    std::string in(rng() % 600, '\0');
    for (char& c : in) c = static_cast<char>(rng() & 0xFF);
    const size_t max_bytes = 1 + rng() % 300;
    const std::string out = LogSafe(in, max_bytes);
    ASSERT_LE(out.size(), 4 * max_bytes + 3);
    for (char c : out) {
      const auto u = static_cast<unsigned char>(c);
      ASSERT_TRUE(u >= 0x20 && u != 0x7F) << "byte " << int{u} << " in " << out;
    }
    // Nothing in it is left to escape: read again, only its backslashes change.
    std::string doubled;
    for (char c : out) doubled += c == '\\' ? std::string("\\\\") : std::string(1, c);
    ASSERT_EQ(LogSafe(out, out.size()), doubled);
  }
}

}  // namespace
}  // namespace arbiter
