// ReadJson: the DOM nlohmann's own parser builds, keys in the order
// written, repeated keys named by their path, the depth bound given. The
// request-body rules built on it (Note [One JSON reader]) are tested in
// server/request_rules_test.cc.
#include "arbiter/base/json_reader.h"

#include <string>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

using json = nlohmann::ordered_json;

std::string ErrorOf(const Result<json>& r) { return r.ok() ? "(ok)" : r.status().message(); }

TEST(ReadJson, BuildsWhatNlohmannBuildsWithKeysInTheOrderWritten) {
  const std::string text =
      R"({"zeta":[1,-2,3.5,"s",null,true],"alpha":{"y":{},"x":[]},"mid":18446744073709551615})";
  Result<json> r = ReadJson(text, "x", 8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, json::parse(text));  // ordered_json compares objects in order
  EXPECT_EQ(r->dump(), text);
  EXPECT_EQ(*ReadJson(" 7 ", "x", 1), json(7));
}

TEST(ReadJson, ARepeatedKeyIsAnErrorNamingItsPath) {
  EXPECT_EQ(ErrorOf(ReadJson(R"({"a":1,"b":2,"a":3})", "body", 8)),
            "body has the key \"a\" twice; a key may appear once per object");
  EXPECT_EQ(ErrorOf(ReadJson(R"({"l":[0,{"k":{"b":1,"b":2}}]})", "body", 8)),
            "body has the key \"l[1].k.b\" twice; a key may appear once per object");
  const Result<json> r = ReadJson(R"({"a":1,"a":2})", "body", 8);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ReadJson(R"({"k":{"k":1},"j":[{"k":1},{"k":1}]})", "body", 8).ok());
}

TEST(ReadJson, NestingIsBoundedByMaxDepth) {
  EXPECT_TRUE(ReadJson("[[[1]]]", "x", 3).ok());
  EXPECT_EQ(ErrorOf(ReadJson("[[[[1]]]]", "x", 3)),
            "x is not valid JSON: arrays and objects nest deeper than 3 levels");
  EXPECT_EQ(ErrorOf(ReadJson(R"({"a":{"b":{"c":{}}}})", "x", 3)),
            "x is not valid JSON: arrays and objects nest deeper than 3 levels");
}

TEST(ReadJson, InvalidTextIsAnErrorQuotingLittleOfIt) {
  EXPECT_NE(ErrorOf(ReadJson("{\"a\":", "x", 8)).find("x is not valid JSON: "), std::string::npos);
  EXPECT_NE(ErrorOf(ReadJson("[1e400]", "x", 8)).find("not valid JSON"), std::string::npos);
  EXPECT_LE(ErrorOf(ReadJson("[" + std::string(1 << 20, 't') + "]", "x", 8)).size(), 400u);
}

}  // namespace
}  // namespace arbiter
