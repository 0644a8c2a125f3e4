#include "engine/internal/text_stream.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace arbiter::engine_internal {
namespace {

// Feeds `pieces`, returns the deltas (plus the Finish() delta as the last).
std::vector<std::string> Feed(TextStream& ts, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const std::string& p : pieces) {
    out.push_back(ts.Append(p));
    if (ts.stopped()) return out;
  }
  out.push_back(ts.Finish());
  return out;
}

TEST(TextStreamTest, PassesPlainTextThrough) {
  TextStream ts;
  auto d = Feed(ts, {"Hello", ", ", "world"});
  EXPECT_EQ(d, (std::vector<std::string>{"Hello", ", ", "world", ""}));
  EXPECT_EQ(ts.text(), "Hello, world");
}

TEST(TextStreamTest, HoldsBackPartialUtf8) {
  // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80 split across tokens.
  TextStream ts;
  auto d = Feed(ts, {"caf\xC3", "\xA9 ", "\xE2", "\x82", "\xAC!", "\xF0\x9F", "\x98\x80"});
  EXPECT_EQ(d[0], "caf");
  EXPECT_EQ(d[1], "\xC3\xA9 ");
  EXPECT_EQ(d[2], "");
  EXPECT_EQ(d[3], "");
  EXPECT_EQ(d[4], "\xE2\x82\xAC!");
  EXPECT_EQ(d[5], "");
  EXPECT_EQ(d[6], "\xF0\x9F\x98\x80");
  EXPECT_EQ(ts.text(), "caf\xC3\xA9 \xE2\x82\xAC!\xF0\x9F\x98\x80");
}

TEST(TextStreamTest, InvalidBytesBecomeReplacementChar) {
  const std::string fffd = "\xEF\xBF\xBD";
  TextStream ts;
  // Stray continuation, lead followed by ASCII, overlong lead C0, surrogate ED A0.
  auto d = Feed(ts, {"a\x80", "\xC3(", "\xC0", "\xED\xA0\x80", "z"});
  EXPECT_EQ(ts.text(), "a" + fffd + fffd + "(" + fffd + fffd + fffd + fffd + "z");
  // Truncated tail at the end becomes one U+FFFD.
  TextStream t2;
  Feed(t2, {"ok\xE2\x82"});
  EXPECT_EQ(t2.text(), "ok" + fffd);
}

TEST(TextStreamTest, StopStringAcrossTokenBoundaries) {
  TextStream ts({"</end>"});
  auto d = Feed(ts, {"foo <", "/e", "nd", "> ignored", "more"});
  // "<" could start the stop string: held; "foo " released.
  EXPECT_EQ(d[0], "foo ");
  EXPECT_EQ(d[1], "");
  EXPECT_EQ(d[2], "");
  EXPECT_EQ(d[3], "");
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(d.size(), 4u);
  EXPECT_EQ(ts.text(), "foo ");
  EXPECT_EQ(ts.Append("x"), "");
  EXPECT_EQ(ts.Finish(), "");
}

TEST(TextStreamTest, FalseStartIsReleasedOnceResolved) {
  TextStream ts({"STOP"});
  auto d = Feed(ts, {"a ST", "OX b", "S"});
  EXPECT_EQ(d[0], "a ");
  EXPECT_EQ(d[1], "STOX b");
  EXPECT_EQ(d[2], "");     // "S" held
  EXPECT_EQ(d[3], "S");    // released by Finish
  EXPECT_FALSE(ts.stopped());
  EXPECT_EQ(ts.text(), "a STOX bS");
}

TEST(TextStreamTest, EarliestOfSeveralStopsWins) {
  TextStream ts({"world", "lo, w", "\n\n"});
  Feed(ts, {"Hel", "lo, world"});
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(ts.text(), "Hel");
}

TEST(TextStreamTest, StopStringInsideOneToken) {
  TextStream ts({"\n\n"});
  auto d = Feed(ts, {"line one\n\nline two"});
  EXPECT_EQ(d[0], "line one");
  EXPECT_TRUE(ts.stopped());
}

TEST(TextStreamTest, MultiByteStopStringSplitMidCharacter) {
  TextStream ts({"\xE2\x82\xAC"});  // "€"
  auto d = Feed(ts, {"5 \xE2", "\x82", "\xAC more"});
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(ts.text(), "5 ");
}

TEST(TextStreamTest, EmptyStopStringsIgnored) {
  TextStream ts({""});
  Feed(ts, {"abc"});
  EXPECT_EQ(ts.text(), "abc");
}

}  // namespace
}  // namespace arbiter::engine_internal
