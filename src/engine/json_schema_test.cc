// JSON Schema → GBNF: each keyword through the grammar it produces
// (sentences that must and must not match), $ref recursion, the error texts,
// and the pattern subset.
#include "arbiter/engine/json_schema.h"

#include <gtest/gtest.h>

#include <string>

#include "arbiter/engine/grammar.h"

namespace arbiter {
namespace {

std::shared_ptr<const Grammar> Compile(const std::string& schema) {
  Result<std::string> gbnf = JsonSchemaToGbnf(schema);
  EXPECT_TRUE(gbnf.ok()) << gbnf.status().ToString();
  if (!gbnf.ok()) return nullptr;
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(*gbnf);
  EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << *gbnf;
  return g.ok() ? *g : nullptr;
}

std::string Error(const std::string& schema) {
  Result<std::string> gbnf = JsonSchemaToGbnf(schema);
  EXPECT_FALSE(gbnf.ok()) << schema << "\n" << (gbnf.ok() ? *gbnf : "");
  if (gbnf.ok()) return "";
  EXPECT_EQ(gbnf.status().code(), StatusCode::kInvalidArgument);
  return gbnf.status().message();
}

#define EXPECT_MATCH(g, text) EXPECT_TRUE((g)->Matches(text)) << (text)
#define EXPECT_NO_MATCH(g, text) EXPECT_FALSE((g)->Matches(text)) << (text)

TEST(JsonSchema, PrimitivesAndWhitespace) {
  auto s = Compile(R"({"type":"string"})");
  EXPECT_MATCH(s, R"("")");
  EXPECT_MATCH(s, R"("a\"b\\c\n\u00e9 é")");
  EXPECT_NO_MATCH(s, "\"a\nb\"");  // raw control character
  EXPECT_NO_MATCH(s, R"("\q")");
  EXPECT_NO_MATCH(s, R"("abc)");
  auto n = Compile(R"({"type":"number"})");
  EXPECT_MATCH(n, "-0.5e+10");
  EXPECT_MATCH(n, "12");
  auto i = Compile(R"({"type":"integer"})");
  EXPECT_MATCH(i, "-42");
  EXPECT_NO_MATCH(i, "4.2");
  auto b = Compile(R"({"type":"boolean"})");
  EXPECT_MATCH(b, "true");
  EXPECT_NO_MATCH(b, "True");
  auto z = Compile(R"({"type":"null"})");
  EXPECT_MATCH(z, "null");
  auto multi = Compile(R"({"type":["string","null"]})");
  EXPECT_MATCH(multi, "null");
  EXPECT_MATCH(multi, R"("x")");
  EXPECT_NO_MATCH(multi, "1");
  auto any = Compile("{}");
  EXPECT_MATCH(any, R"({"a": [1, {"b": null}], "c": "d"})");
  EXPECT_MATCH(any, "[\n  true,\n\tfalse]");
  // Whitespace is bounded: one space, or a newline and ≤ 20 blanks.
  EXPECT_NO_MATCH(any, "[  1]");
  EXPECT_NO_MATCH(any, "[\n" + std::string(21, ' ') + "1]");
  EXPECT_MATCH(any, "[\n" + std::string(20, ' ') + "1]");
  EXPECT_TRUE(Compile("true")->Matches("1"));
}

TEST(JsonSchema, ObjectsKeepDeclaredOrderWithOptionalMembers) {
  auto g = Compile(R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"},
      "c":{"type":"boolean"}},"required":["a"]})");
  EXPECT_MATCH(g, R"({"a":"x"})");
  EXPECT_MATCH(g, R"({"b":1,"a":"x"})");
  EXPECT_MATCH(g, R"({ "b": 1, "a": "x", "c": true })");
  EXPECT_MATCH(g, R"({"a":"x","c":false})");
  EXPECT_NO_MATCH(g, R"({"a":"x","b":1})");    // declared order
  EXPECT_NO_MATCH(g, R"({"b":1})");            // a is required
  EXPECT_NO_MATCH(g, R"({"a":"x","d":1})");    // absent additionalProperties: only declared
  EXPECT_NO_MATCH(g, R"({,"a":"x"})");
  EXPECT_NO_MATCH(g, R"({"a":"x",})");
  auto none_required = Compile(R"({"properties":{"x":{"type":"null"},"y":{"type":"null"}}})");
  EXPECT_MATCH(none_required, "{}");
  EXPECT_MATCH(none_required, R"({"y":null})");
  EXPECT_MATCH(none_required, R"({"x":null,"y":null})");
  EXPECT_NO_MATCH(none_required, R"({"y":null,"x":null})");
  auto extra = Compile(R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],
      "additionalProperties":{"type":"string"}})");
  EXPECT_MATCH(extra, R"({"id":1})");
  EXPECT_MATCH(extra, R"({"id":1,"k":"v","k2":"w"})");
  EXPECT_NO_MATCH(extra, R"({"id":1,"k":2})");
  auto open = Compile(R"({"type":"object","additionalProperties":true})");
  EXPECT_MATCH(open, R"({"k":[1,2],"z":{}})");
  EXPECT_MATCH(open, "{}");
  auto closed = Compile(R"({"type":"object","additionalProperties":false})");
  EXPECT_MATCH(closed, "{}");
  EXPECT_NO_MATCH(closed, R"({"a":1})");
  EXPECT_NE(Error(R"({"type":"object","properties":{"a":{}},"required":["b"]})").find("\"b\""), std::string::npos);
  // Property names that are also primitive rule names do not clash with them.
  auto names = Compile(R"({"properties":{"string":{"type":"string","maxLength":2},"value":{"enum":[1,2]},
      "date-time":{"type":"integer","minimum":3},"b":{"type":"string"},"c":{},"d":{"type":"string","format":"date-time"}}})");
  ASSERT_NE(names, nullptr);
  EXPECT_MATCH(names, R"({"string":"ab","value":2,"date-time":4,"b":"x","c":[1],"d":"2026-01-02T03:04:05Z"})");
}

// Note [Keys beside declared properties] in json_schema.cc.
TEST(JsonSchema, ExtraKeysAreNotDeclaredNames) {
  auto g = Compile(R"({"type":"object","properties":{"b":{"type":"boolean"},"é😀":{"type":"null"},"bc":{"type":"string"}},)"
                   R"("additionalProperties":{"type":"integer"}})");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {R"({"k":1})", R"({"bb":1})", R"({"":1})", R"({"bcd":1})", R"({"\u0042":1})",
                         R"({"é":1})", R"({"\u00e9":1})", R"({"é😀x":1})", R"({"é😁":1})", R"({"\ud83d\ude00":1})",
                         R"({"b":true,"k":1,"k2":2})", R"({"b\/":1})", R"({"\n":1})"}) {
    EXPECT_MATCH(g, ok);
  }
  for (const char* bad : {R"({"b":1})", R"({"\u0062":1})", R"({"bc":1})", R"({"b\u0063":1})", R"({"é😀":1})",
                          R"({"\u00E9\uD83D\uDE00":1})", R"({"\u00e9\ud83d\ude00":1})", R"({"b":true,"b":1})",
                          R"({"k":1,"b":true})"}) {
    EXPECT_NO_MATCH(g, bad);
  }
  // Without declared properties any key is an extra one.
  EXPECT_MATCH(Compile(R"({"type":"object","additionalProperties":true})"), R"({"b":1,"b":2})");
}

TEST(JsonSchema, UnicodeEscapesPairSurrogates) {
  auto s = Compile(R"({"type":"string"})");
  EXPECT_MATCH(s, R"("\ud83d\ude00")");
  EXPECT_MATCH(s, R"("\uD7FF\uE000\uFFFF")");
  EXPECT_NO_MATCH(s, R"("\ud83d")");  // a lone surrogate: not JSON to nlohmann or serde_json
  EXPECT_NO_MATCH(s, R"("\ude00")");
  EXPECT_NO_MATCH(s, R"("\ud83dx")");
  EXPECT_NO_MATCH(s, R"("\ud83d\ud83d")");
  auto len = Compile(R"({"type":"string","maxLength":1})");
  EXPECT_MATCH(len, R"("\ud83d\ude00")");  // one code point
}

TEST(JsonSchema, Arrays) {
  auto g = Compile(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})");
  EXPECT_MATCH(g, "[1]");
  EXPECT_MATCH(g, "[1, 2, 3]");
  EXPECT_NO_MATCH(g, "[]");
  EXPECT_NO_MATCH(g, "[1,2,3,4]");
  EXPECT_NO_MATCH(g, "[1,\"a\"]");
  auto open = Compile(R"({"type":"array"})");
  EXPECT_MATCH(open, "[]");
  EXPECT_MATCH(open, R"([1,"a",null])");
  auto tuple = Compile(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],
      "items":{"type":"boolean"},"minItems":1})");
  EXPECT_MATCH(tuple, R"(["a"])");
  EXPECT_MATCH(tuple, R"(["a",1])");
  EXPECT_MATCH(tuple, R"(["a",1,true,false])");
  EXPECT_NO_MATCH(tuple, "[]");
  EXPECT_NO_MATCH(tuple, R"([1])");
  EXPECT_NO_MATCH(tuple, R"(["a",true])");
  auto exact = Compile(R"({"type":"array","prefixItems":[{"const":1},{"const":2}]})");
  EXPECT_MATCH(exact, "[]");  // prefix items are optional without minItems
  EXPECT_MATCH(exact, "[1,2]");
  EXPECT_NO_MATCH(exact, "[1,2,3]");  // absent items after prefixItems: none
  EXPECT_NO_MATCH(exact, "[2]");
  auto empty = Compile(R"({"type":"array","maxItems":0})");
  EXPECT_MATCH(empty, "[]");
  EXPECT_NO_MATCH(empty, "[1]");
  EXPECT_NE(Error(R"({"type":"array","maxItems":20000})").find("\"maxItems\" above 10000"), std::string::npos);
  EXPECT_NE(Error(R"({"type":"array","minItems":3,"maxItems":2})").find("maxItems"), std::string::npos);
}

TEST(JsonSchema, EnumConstAndCombinators) {
  auto e = Compile(R"({"enum":["red",2,null,{"a":[true]}]})");
  EXPECT_MATCH(e, R"("red")");
  EXPECT_MATCH(e, "2");
  EXPECT_MATCH(e, "null");
  EXPECT_MATCH(e, R"({"a":[true]})");
  EXPECT_NO_MATCH(e, R"("blue")");
  auto typed = Compile(R"({"type":"string","enum":["a","b",3]})");  // 3 is not a string: dropped
  EXPECT_MATCH(typed, R"("b")");
  EXPECT_NO_MATCH(typed, "3");
  EXPECT_NE(Error(R"({"type":"integer","enum":["a"]})").find("no value of \"enum\""), std::string::npos);
  EXPECT_NE(Error(R"({"enum":["a"],"minLength":3})").find("\"minLength\" beside \"enum\""), std::string::npos);
  auto c = Compile(R"({"const":"a\"b"})");
  EXPECT_MATCH(c, R"("a\"b")");
  auto any_of = Compile(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})");
  EXPECT_MATCH(any_of, "5");
  EXPECT_MATCH(any_of, R"("ab")");
  EXPECT_NO_MATCH(any_of, R"("abc")");
  auto one_of = Compile(R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})");
  EXPECT_MATCH(one_of, "null");
  auto all_of = Compile(R"({"allOf":[{"type":"boolean"}]})");
  EXPECT_MATCH(all_of, "true");
  EXPECT_NE(Error(R"({"allOf":[{"type":"boolean"},{"type":"null"}]})").find("\"allOf\""), std::string::npos);
}

TEST(JsonSchema, StringsLengthsFormatsAndPatterns) {
  auto len = Compile(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_MATCH(len, R"("ab")");
  EXPECT_MATCH(len, R"("é\n")");  // code points; an escape counts once
  EXPECT_NO_MATCH(len, R"("a")");
  EXPECT_NO_MATCH(len, R"("abcd")");
  auto date = Compile(R"({"type":"string","format":"date"})");
  EXPECT_MATCH(date, R"("2026-11-24")");
  EXPECT_NO_MATCH(date, R"("2026-13-01")");
  auto time = Compile(R"({"type":"string","format":"time"})");
  EXPECT_MATCH(time, R"("23:59:59.5+01:00")");
  EXPECT_NO_MATCH(time, R"("24:00:00Z")");
  auto dt = Compile(R"({"type":"string","format":"date-time"})");
  EXPECT_MATCH(dt, R"("2026-11-24T13:00:00Z")");
  EXPECT_NO_MATCH(dt, R"("2026-11-24 13:00:00Z")");
  auto uuid = Compile(R"({"type":"string","format":"uuid"})");
  EXPECT_MATCH(uuid, R"("123e4567-e89b-12d3-a456-426614174000")");
  EXPECT_NO_MATCH(uuid, R"("123e4567e89b12d3a456426614174000")");
  auto email = Compile(R"({"type":"string","format":"email"})");  // an annotation
  EXPECT_MATCH(email, R"("not an email")");

  auto p = Compile(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3,4}(x|yz)?$"})");
  EXPECT_MATCH(p, R"("AB-123")");
  EXPECT_MATCH(p, R"("AB-1234yz")");
  EXPECT_NO_MATCH(p, R"("AB-12")");
  EXPECT_NO_MATCH(p, R"("ab-123")");
  EXPECT_NO_MATCH(p, R"("AB-123y")");
  auto q = Compile(R"({"type":"string","pattern":"a\"b\\\\c[^a-z]\\.\\w+\\s?.(?:d)*"})");
  EXPECT_MATCH(q, R"("a\"b\\cQ.w_9 éddd")");
  EXPECT_MATCH(q, R"("a\"b\\c\".x\n!")");  // [^a-z] includes '"' (escaped); \s a newline
  EXPECT_NO_MATCH(q, R"("a"b\\cQ.w")");
  EXPECT_NE(Error(R"({"type":"string","pattern":"(?=a)b"})").find("\"pattern\""), std::string::npos);
  EXPECT_NE(Error(R"({"type":"string","pattern":"(a)\\1"})").find("backreferences"), std::string::npos);
  EXPECT_NE(Error(R"({"type":"string","pattern":"\\bword"})").find("\"pattern\""), std::string::npos);
  EXPECT_NE(Error(R"({"type":"string","pattern":"a{3,1}"})").find("n < m"), std::string::npos);
  EXPECT_NE(Error(R"({"type":"string","pattern":"[a-"})").find("unterminated"), std::string::npos);
}

TEST(JsonSchema, IntegerBounds) {
  auto g = Compile(R"({"type":"integer","minimum":-12,"maximum":305})");
  for (int v = -20; v <= 400; ++v) {
    EXPECT_EQ(g->Matches(std::to_string(v)), v >= -12 && v <= 305) << v;
  }
  EXPECT_NO_MATCH(g, "-0");
  EXPECT_NO_MATCH(g, "007");
  auto ex = Compile(R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":1000})");
  EXPECT_NO_MATCH(ex, "0");
  EXPECT_MATCH(ex, "1");
  EXPECT_MATCH(ex, "999");
  EXPECT_NO_MATCH(ex, "1000");
  auto lo = Compile(R"({"type":"integer","minimum":95})");
  EXPECT_NO_MATCH(lo, "94");
  EXPECT_MATCH(lo, "95");
  EXPECT_MATCH(lo, "100000");
  EXPECT_NO_MATCH(lo, "-100");
  auto hi = Compile(R"({"type":"integer","maximum":-5})");
  EXPECT_MATCH(hi, "-5");
  EXPECT_MATCH(hi, "-123456");
  EXPECT_NO_MATCH(hi, "-4");
  EXPECT_NO_MATCH(hi, "3");
  auto open_lo = Compile(R"({"type":"integer","maximum":7})");
  EXPECT_MATCH(open_lo, "-99999");
  EXPECT_MATCH(open_lo, "7");
  EXPECT_NO_MATCH(open_lo, "8");
  EXPECT_NE(Error(R"({"type":"integer","minimum":5,"maximum":4})").find("minimum"), std::string::npos);
  EXPECT_NE(Error(R"({"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":5})").find("no integer"),
            std::string::npos);
  EXPECT_NE(Error(R"({"minimum":1})").find("\"type\": \"integer\" or \"number\""), std::string::npos);
}

// Note [Numbers every client can read] in json_schema.cc.
TEST(JsonSchema, IntegersAreSafeIntegers) {
  // zod 4 writes these bounds for z.number().int() and z.int().
  auto zod = Compile(R"({"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991})");
  auto bare = Compile(R"({"type":"integer"})");
  for (const auto& g : {zod, bare}) {
    ASSERT_NE(g, nullptr);
    EXPECT_MATCH(g, "0");
    EXPECT_MATCH(g, "42");
    EXPECT_MATCH(g, "9007199254740991");
    EXPECT_MATCH(g, "-9007199254740991");
    EXPECT_MATCH(g, "8999999999999999");
    EXPECT_MATCH(g, "1000000000000000");
    EXPECT_NO_MATCH(g, "9007199254740992");
    EXPECT_NO_MATCH(g, "-9007199254740992");
    EXPECT_NO_MATCH(g, "9100000000000000");
    EXPECT_NO_MATCH(g, "10000000000000000");
    EXPECT_NO_MATCH(g, "-0");
    EXPECT_NO_MATCH(g, "01");
    EXPECT_NO_MATCH(g, "1e3");
    EXPECT_NO_MATCH(g, "1.0");
  }
  auto ex = Compile(R"({"type":"integer","exclusiveMinimum":-9007199254740991,"exclusiveMaximum":9007199254740991})");
  EXPECT_MATCH(ex, "9007199254740990");
  EXPECT_NO_MATCH(ex, "9007199254740991");
  EXPECT_NO_MATCH(ex, "-9007199254740991");
  auto big = Compile(R"({"type":"integer","minimum":1234567890123456})");
  EXPECT_NO_MATCH(big, "1234567890123455");
  EXPECT_MATCH(big, "1234567890123456");
  EXPECT_MATCH(big, "9007199254740991");
  EXPECT_NO_MATCH(big, "9007199254740992");
  auto frac_bounds = Compile(R"({"type":"integer","minimum":-2.5,"maximum":2.5})");
  EXPECT_MATCH(frac_bounds, "-2");
  EXPECT_MATCH(frac_bounds, "2");
  EXPECT_NO_MATCH(frac_bounds, "3");
  EXPECT_NO_MATCH(frac_bounds, "-3");
  for (const char* kw : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    for (const char* v : {"9007199254740992", "-9007199254740992", "1e20"}) {
      const std::string schema = std::string(R"({"type":"integer",")") + kw + "\":" + v + "}";
      EXPECT_EQ(Error(schema), std::string("schema: \"/\": \"") + kw +
                                   "\" beyond ±(2^53 − 1) (±9007199254740991) is not supported");
    }
  }
}

TEST(JsonSchema, NumbersParseToFiniteNormalDoubles) {
  auto n = Compile(R"({"type":"number"})");
  ASSERT_NE(n, nullptr);
  EXPECT_MATCH(n, "-0.5e+10");
  EXPECT_MATCH(n, "6E68");
  EXPECT_MATCH(n, "886.6E-99");
  EXPECT_MATCH(n, "-0");
  EXPECT_MATCH(n, "0e-99");
  EXPECT_MATCH(n, "1E05");
  EXPECT_MATCH(n, "9999999999999999.9999999999999999e99");  // the largest: < 1e115
  EXPECT_MATCH(n, "0.0000000000000001e-99");               // the smallest nonzero: 1e-115
  EXPECT_NO_MATCH(n, "6E688");                              // infinity
  EXPECT_NO_MATCH(n, "886.6E-999");                         // underflows to 0
  EXPECT_NO_MATCH(n, "1e100");
  EXPECT_NO_MATCH(n, "1e-100");
  EXPECT_NO_MATCH(n, "1e308");
  EXPECT_NO_MATCH(n, "12345678901234567");    // 17 integer digits
  EXPECT_NO_MATCH(n, "0.12345678901234567");  // 17 fraction digits
  EXPECT_NO_MATCH(n, "1e");
  EXPECT_NO_MATCH(n, "01");
  EXPECT_NO_MATCH(n, "1.");
  EXPECT_NO_MATCH(n, ".5");
  // json_object and `{}` use the same number rule.
  Result<std::shared_ptr<const Grammar>> obj = Grammar::Parse(JsonObjectGbnf());
  ASSERT_TRUE(obj.ok()) << obj.status().ToString();
  EXPECT_TRUE((*obj)->Matches(R"({"a": 6E68})"));
  EXPECT_FALSE((*obj)->Matches(R"({"a": 6E688})"));
  EXPECT_FALSE((*obj)->Matches(R"({"a": [886.6E-999]})"));
  EXPECT_NO_MATCH(Compile("{}"), "1e999");
  // Values in enum and const are written as given, so ones a double cannot
  // hold are refused.
  EXPECT_NE(Error(R"({"enum":[1, 5e-324]})").find("\"enum\" holds a number"), std::string::npos);
  EXPECT_NE(Error(R"({"const":{"a":[2.2e-310]}})").find("\"const\" holds a number"), std::string::npos);
  EXPECT_MATCH(Compile(R"({"const":1e300})"), "1e+300");
}

TEST(JsonSchema, NumberBounds) {
  auto unit = Compile(R"({"type":"number","minimum":0,"maximum":1})");
  ASSERT_NE(unit, nullptr);
  for (const char* ok : {"0", "0.0", "0.5", "0.9999999999999999", "1", "1.0", "1.0000000000000000"}) {
    EXPECT_MATCH(unit, ok);
  }
  for (const char* bad : {"-0", "-0.1", "1.0000000000000001", "1.5", "2", "1e0", "0.5e-1", "01"}) {
    EXPECT_NO_MATCH(unit, bad);
  }
  // zod's .positive(): exclusiveMinimum 0 allows any nonzero positive value
  // that 16 fraction digits can write.
  auto positive = Compile(R"({"type":"number","exclusiveMinimum":0})");
  EXPECT_NO_MATCH(positive, "0");
  EXPECT_NO_MATCH(positive, "0.0000000000000000");
  EXPECT_MATCH(positive, "0.0000000000000001");
  EXPECT_MATCH(positive, "9999999999999999.5");
  EXPECT_NO_MATCH(positive, "-1");
  auto negative = Compile(R"({"type":"number","exclusiveMaximum":0})");
  EXPECT_MATCH(negative, "-0.0000000000000001");
  EXPECT_MATCH(negative, "-12.5");
  EXPECT_NO_MATCH(negative, "-0");
  EXPECT_NO_MATCH(negative, "-0.0");
  EXPECT_NO_MATCH(negative, "0");
  auto range = Compile(R"({"type":"number","minimum":-2.25,"exclusiveMaximum":10.5})");
  EXPECT_MATCH(range, "-2.25");
  EXPECT_MATCH(range, "-2.2499");
  EXPECT_NO_MATCH(range, "-2.2500001");
  EXPECT_NO_MATCH(range, "-3");
  EXPECT_MATCH(range, "0");
  EXPECT_MATCH(range, "10.4999");
  EXPECT_NO_MATCH(range, "10.5");
  EXPECT_NO_MATCH(range, "10.50");
  // An exclusive bound is the next double: 999.99999999999999 would parse
  // to 1000.0, which a client's own check refuses.
  auto below = Compile(R"({"type":"number","exclusiveMaximum":1000})");
  EXPECT_MATCH(below, "999.9999999999999");
  EXPECT_NO_MATCH(below, "999.99999999999999");
  EXPECT_NO_MATCH(below, "1000");
  auto small = Compile(R"({"type":"number","minimum":0.1,"maximum":0.125})");
  EXPECT_MATCH(small, "0.1");
  EXPECT_MATCH(small, "0.12");
  EXPECT_MATCH(small, "0.125");
  EXPECT_NO_MATCH(small, "0.0999");
  EXPECT_NO_MATCH(small, "0.1251");
  // zod's z.float64() (±Number.MAX_VALUE): the unbounded rule; z.float32():
  // no exponent, |x| < 10^16.
  auto f64 = Compile(R"({"type":"number","minimum":-1.7976931348623157e+308,"maximum":1.7976931348623157e+308})");
  EXPECT_MATCH(f64, "-1.5e99");
  EXPECT_NO_MATCH(f64, "1e100");
  auto f32 = Compile(R"({"type":"number","minimum":-3.4028234663852886e+38,"maximum":3.4028234663852886e+38})");
  EXPECT_MATCH(f32, "-9999999999999999.5");
  EXPECT_NO_MATCH(f32, "1e3");
  auto safe = Compile(R"({"type":"number","minimum":-9007199254740991,"maximum":9007199254740991})");
  EXPECT_MATCH(safe, "9007199254740990.75");
  EXPECT_MATCH(safe, "9007199254740991");
  EXPECT_NO_MATCH(safe, "9007199254740991.5");
  EXPECT_NO_MATCH(safe, "-9007199254740992");
  auto or_null = Compile(R"({"type":["number","null"],"maximum":5})");
  EXPECT_MATCH(or_null, "null");
  EXPECT_MATCH(or_null, "-5.5");
  EXPECT_NO_MATCH(or_null, "5.5");
  EXPECT_NE(Error(R"({"type":"number","minimum":2,"maximum":1})").find("no number"), std::string::npos);
  EXPECT_NE(Error(R"({"type":"number","minimum":1e20})").find("no number"), std::string::npos);
  EXPECT_NE(Error(R"({"type":"number","exclusiveMinimum":0,"maximum":1e-17})").find("no number"), std::string::npos);
  EXPECT_NE(Error(R"({"type":"number","maximum":"1"})").find("\"maximum\" must be a number"), std::string::npos);
}

TEST(JsonSchema, RefsAndRecursion) {
  auto tree = Compile(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})");
  EXPECT_MATCH(tree, R"({"v":1})");
  EXPECT_MATCH(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})");
  EXPECT_NO_MATCH(tree, R"({"v":1,"kids":[{"kids":[]}]})");
  auto old = Compile(R"({"definitions":{"s":{"type":"string"}},"type":"array","items":{"$ref":"#/definitions/s"}})");
  EXPECT_MATCH(old, R"(["a","b"])");
  auto self = Compile(R"({"type":"array","items":{"$ref":"#"},"maxItems":2})");
  EXPECT_MATCH(self, "[[],[[]]]");
  EXPECT_NE(Error(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(Error(R"({"$ref":"http://x/y"})").find("\"$ref\""), std::string::npos);
  // A cycle that writes nothing, and a required recursion that never ends.
  EXPECT_NE(Error(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})").find("cannot build a grammar"),
            std::string::npos);
  EXPECT_NE(Error(R"({"type":"object","properties":{"x":{"$ref":"#"}},"required":["x"]})").find("never end"),
            std::string::npos);
}

TEST(JsonSchema, ErrorsNamePointerAndKeyword) {
  EXPECT_EQ(Error(R"({"type":"object","properties":{"x":{"not":{"type":"string"}}}})"),
            R"(schema: "/properties/x": unsupported keyword "not")");
  EXPECT_EQ(Error(R"({"type":"string","multipleOf":2})"), R"(schema: "/": unsupported keyword "multipleOf")");
  EXPECT_EQ(Error(R"({"items":{"type":"array","items":{"if":{}}}})"), R"(schema: "/items/items": unsupported keyword "if")");
  EXPECT_NE(Error("{\"type\":").find("schema is not valid JSON"), std::string::npos);
  EXPECT_NE(Error(R"({"type":"date"})").find("unknown \"type\""), std::string::npos);
  EXPECT_NE(Error("false").find("allows no value"), std::string::npos);
  // Annotations are accepted and ignored.
  EXPECT_NE(Compile(R"({"title":"t","description":"d","default":1,"examples":[1],"$schema":"x","$id":"y",
      "$comment":"c","deprecated":false,"readOnly":true,"writeOnly":false,"type":"integer"})"),
            nullptr);
}

TEST(JsonSchema, RootNamesPrefixEveryRule) {
  Result<std::string> a = JsonSchemaToGbnf(R"({"type":"object","properties":{"q":{"type":"string"}}})", "args0");
  Result<std::string> b = JsonSchemaToGbnf(R"({"type":"array","items":{"type":"integer"}})", "args1");
  ASSERT_TRUE(a.ok() && b.ok());
  for (const std::string* text : {&*a, &*b}) {
    size_t at = 0;
    while (at < text->size()) {
      const std::string line = text->substr(at, text->find('\n', at) - at);
      EXPECT_EQ(line.rfind(text == &*a ? "args0" : "args1", 0), 0u) << line;
      at += line.size() + 1;
    }
  }
  const std::string tool = "root ::= \"<tool_call>\\n{\\\"name\\\": \\\"f\\\", \\\"arguments\\\": \" args0 \"}\" | args1\n";
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(tool + *a + *b);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE((*g)->Matches("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\":\"x\"}}"));
  EXPECT_TRUE((*g)->Matches("[1,2]"));
  EXPECT_FALSE(JsonSchemaToGbnf("{}", "bad name").ok());

  Result<std::shared_ptr<const Grammar>> obj = Grammar::Parse(JsonObjectGbnf());
  ASSERT_TRUE(obj.ok()) << obj.status().ToString();
  EXPECT_TRUE((*obj)->Matches(R"({"a": [1, {"b": "c"}]})"));
  EXPECT_FALSE((*obj)->Matches("[1]"));
  EXPECT_FALSE((*obj)->Matches("\"s\""));
  Result<std::shared_ptr<const Grammar>> two = Grammar::Parse("root ::= x \" \" y\n" + JsonObjectGbnf("x") + JsonObjectGbnf("y"));
  ASSERT_TRUE(two.ok()) << two.status().ToString();
}

}  // namespace
}  // namespace arbiter
