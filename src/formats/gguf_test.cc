#include "arbiter/formats/gguf.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "arbiter/base/file.h"
#include "arbiter/formats/model_config.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using VT = GgufValueType;

// Hand-assembled GGUF bytes, for files the writer refuses to produce.
struct Raw {
  std::string b;
  Raw& U8(uint8_t v) {
    b.push_back(static_cast<char>(v));
    return *this;
  }
  Raw& U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Raw& U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Raw& Str(std::string_view s) {
    U64(s.size());
    b.append(s);
    return *this;
  }
  Raw& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.append("GGUF");
    U32(version);
    U64(n_tensors);
    return U64(n_kv);
  }
  Raw& KvU32(std::string_view key, uint32_t v) {
    Str(key);
    U32(static_cast<uint32_t>(VT::kUint32));
    return U32(v);
  }
  Raw& Tensor(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type,
              uint64_t offset) {
    Str(name);
    U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    U32(type);
    return U64(offset);
  }
  Raw& PadTo(size_t alignment) {
    while (b.size() % alignment != 0) b.push_back('\0');
    return *this;
  }
  Raw& Zeros(size_t n) {
    b.append(n, '\0');
    return *this;
  }
};

Status ParseStatus(const std::string& bytes) { return ParseGguf(bytes, "model.gguf").status(); }

void ExpectDataLoss(const std::string& bytes, const std::string& fragment) {
  Status s = ParseStatus(bytes);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
  EXPECT_EQ(s.message().rfind("model.gguf: ", 0), 0u) << s.message();
}

std::string F32Bytes(const std::vector<float>& v) {
  std::string out(v.size() * 4, '\0');
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

GgufValue Must(Result<GgufValue> r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : GgufValue();
}

// Every scalar type at its extremes, strings, and arrays of every element
// type, nested three deep.
GgufWriter EveryValueType() {
  GgufWriter w;
  auto add = [&w](std::string key, GgufValue v) { EXPECT_TRUE(w.Add(std::move(key), std::move(v)).ok()); };
  add("u8", GgufValue::Uint8(255));
  add("i8", GgufValue::Int8(-128));
  add("u16", GgufValue::Uint16(65535));
  add("i16", GgufValue::Int16(-32768));
  add("u32", GgufValue::Uint32(4294967295u));
  add("i32", GgufValue::Int32(std::numeric_limits<int32_t>::min()));
  add("f32", GgufValue::Float32(-1.5f));
  add("bool.t", GgufValue::Bool(true));
  add("bool.f", GgufValue::Bool(false));
  add("string", GgufValue::String("héllo"));
  add("string.empty", GgufValue::String(""));
  add("string.nul", GgufValue::String(std::string_view("a\0b", 3)));
  add("u64", GgufValue::Uint64(std::numeric_limits<uint64_t>::max()));
  add("i64", GgufValue::Int64(std::numeric_limits<int64_t>::min()));
  add("f64", GgufValue::Float64(1e300));
  add("arr.string", GgufValue::StringArray({"<unk>", "", "▁the"}));
  add("arr.u8", Must(GgufValue::IntArray(VT::kUint8, {0, 255})));
  add("arr.i8", Must(GgufValue::IntArray(VT::kInt8, {-128, 127})));
  add("arr.u16", Must(GgufValue::IntArray(VT::kUint16, {65535})));
  add("arr.i16", Must(GgufValue::IntArray(VT::kInt16, {-32768, 32767})));
  add("arr.u32", Must(GgufValue::IntArray(VT::kUint32, {4294967295ll, 7})));
  add("arr.i32", Must(GgufValue::IntArray(VT::kInt32, {-1, 2, -3})));
  add("arr.u64", Must(GgufValue::IntArray(VT::kUint64, {std::numeric_limits<int64_t>::max()})));
  add("arr.i64", Must(GgufValue::IntArray(VT::kInt64, {std::numeric_limits<int64_t>::min(), 0})));
  add("arr.f32", Must(GgufValue::FloatArray(VT::kFloat32, {0.5, -2.0, 3.25})));
  add("arr.f64", Must(GgufValue::FloatArray(VT::kFloat64, {1e-300, 2.5})));
  add("arr.bool", GgufValue::BoolArray({true, false, true}));
  add("arr.empty", Must(GgufValue::IntArray(VT::kInt32, {})));
  GgufValue inner = Must(GgufValue::ArrayOfArrays(
      {GgufValue::StringArray({"x"}), Must(GgufValue::IntArray(VT::kUint16, {1, 2}))}));
  add("arr.nested", Must(GgufValue::ArrayOfArrays(
                        {inner, Must(GgufValue::ArrayOfArrays({})), GgufValue::BoolArray({})})));
  return w;
}

TEST(GgufTest, EveryValueTypeRoundTrips) {
  GgufWriter w = EveryValueType();
  const std::string bytes = w.Serialize();
  Result<GgufFile> r = ParseGguf(bytes, "all.gguf");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const GgufFile& f = *r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.file_size(), bytes.size());
  EXPECT_TRUE(f.tensors().empty());

  // Same entries, same order, same values as written.
  GgufWriter again = EveryValueType();
  Result<GgufFile> r2 = ParseGguf(again.Serialize(), "again.gguf");
  ASSERT_TRUE(r2.ok());
  ASSERT_EQ(f.metadata().size(), 29u);
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    EXPECT_EQ(f.metadata()[i].key, r2->metadata()[i].key);
    EXPECT_TRUE(f.metadata()[i].value == r2->metadata()[i].value) << f.metadata()[i].key;
  }
  EXPECT_EQ(f.metadata()[0].key, "u8");
  EXPECT_EQ(f.metadata()[28].key, "arr.nested");

  EXPECT_EQ(*f.GetUint("u8"), 255u);
  EXPECT_EQ(*f.GetInt("i8"), -128);
  EXPECT_EQ(*f.GetUint("u16"), 65535u);
  EXPECT_EQ(*f.GetInt("i16"), -32768);
  EXPECT_EQ(*f.GetUint("u32"), 4294967295u);
  EXPECT_EQ(*f.GetInt("i32"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(*f.GetFloat("f32"), -1.5);
  EXPECT_EQ(*f.GetBool("bool.t"), true);
  EXPECT_EQ(*f.GetBool("bool.f"), false);
  EXPECT_EQ(*f.GetString("string"), "héllo");
  EXPECT_EQ(*f.GetString("string.empty"), "");
  EXPECT_EQ(*f.GetString("string.nul"), std::string("a\0b", 3));
  EXPECT_EQ(*f.GetUint("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f.GetInt("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f.GetFloat("f64"), 1e300);
  EXPECT_EQ(*f.GetStringArray("arr.string"), (std::vector<std::string>{"<unk>", "", "▁the"}));
  EXPECT_EQ(*f.GetIntArray("arr.u8"), (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(*f.GetIntArray("arr.i8"), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(*f.GetIntArray("arr.u16"), (std::vector<int64_t>{65535}));
  EXPECT_EQ(*f.GetIntArray("arr.i16"), (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(*f.GetIntArray("arr.u32"), (std::vector<int64_t>{4294967295ll, 7}));
  EXPECT_EQ(*f.GetIntArray("arr.i32"), (std::vector<int64_t>{-1, 2, -3}));
  EXPECT_EQ(*f.GetIntArray("arr.u64"),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::max()}));
  EXPECT_EQ(*f.GetIntArray("arr.i64"),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 0}));
  EXPECT_EQ(*f.GetFloatArray("arr.f32"), (std::vector<double>{0.5, -2.0, 3.25}));
  EXPECT_EQ(*f.GetFloatArray("arr.f64"), (std::vector<double>{1e-300, 2.5}));
  EXPECT_TRUE(f.GetIntArray("arr.empty")->empty());

  const GgufValue* b = f.FindValue("arr.bool");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->element_type(), VT::kBool);
  ASSERT_EQ(b->size(), 3u);
  EXPECT_EQ(b->At(0).AsBool(), true);
  EXPECT_EQ(b->At(1).AsBool(), false);

  const GgufValue* nested = f.FindValue("arr.nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->element_type(), VT::kArray);
  ASSERT_EQ(nested->size(), 3u);
  const GgufValue& in = nested->ArrayAt(0);
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in.ArrayAt(0).StringAt(0), "x");
  EXPECT_EQ(in.ArrayAt(1).element_type(), VT::kUint16);
  EXPECT_EQ(in.ArrayAt(1).At(1).AsUint(), 2u);
  EXPECT_EQ(nested->ArrayAt(1).size(), 0u);
  EXPECT_EQ(nested->ArrayAt(1).element_type(), VT::kArray);
  EXPECT_EQ(nested->ArrayAt(2).element_type(), VT::kBool);
  EXPECT_TRUE(nested->At(0) == in);  // At copies a nested array
}

TEST(GgufTest, ValueAccessorsConvertOnlyWhatFits) {
  EXPECT_EQ(GgufValue::Int32(-1).AsUint(), std::nullopt);
  EXPECT_EQ(GgufValue::Int32(-1).AsInt(), -1);
  EXPECT_EQ(GgufValue::Int8(5).AsUint(), 5u);
  EXPECT_EQ(GgufValue::Uint64(std::numeric_limits<uint64_t>::max()).AsInt(), std::nullopt);
  EXPECT_EQ(GgufValue::Uint16(7).AsFloat(), std::nullopt);  // floats are floats only
  EXPECT_EQ(GgufValue::Float32(2.0f).AsUint(), std::nullopt);
  EXPECT_EQ(GgufValue::Bool(true).AsUint(), std::nullopt);
  EXPECT_EQ(GgufValue::String("x").AsBool(), std::nullopt);
  EXPECT_EQ(GgufValue::String("x").AsString(), "x");
  EXPECT_EQ(GgufValue::Uint8(1).size(), 0u);
  EXPECT_EQ(GgufValue::Uint8(1).StringAt(0), "");
  EXPECT_EQ(GgufValue::StringArray({"a"}).StringAt(1), "");  // out of range
  EXPECT_EQ(GgufValue::StringArray({"a"}).ArrayAt(0).size(), 0u);
  EXPECT_EQ(GgufValue::StringArray({"a"}).At(5).type(), VT::kUint8);
  const double nan = std::nan("");
  EXPECT_TRUE(std::isnan(*GgufValue::Float64(nan).AsFloat()));
  EXPECT_TRUE(GgufValue::Float64(nan) == GgufValue::Float64(nan));  // bitwise
  EXPECT_FALSE(GgufValue::Int32(1) == GgufValue::Uint32(1));

  EXPECT_EQ(GgufValue::IntArray(VT::kUint8, {256}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GgufValue::IntArray(VT::kInt8, {-129}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GgufValue::IntArray(VT::kUint64, {-1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GgufValue::IntArray(VT::kFloat32, {1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GgufValue::FloatArray(VT::kInt32, {1}).status().code(), StatusCode::kInvalidArgument);
  Status s = GgufValue::ArrayOfArrays({GgufValue::StringArray({}), GgufValue::Uint8(1)}).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("element 1"), std::string::npos) << s.message();
}

TEST(GgufTest, TypedGettersNameTheKeyAndTheTypes) {
  GgufWriter w;
  ASSERT_TRUE(w.AddFloat32("f", 1.0f).ok());
  ASSERT_TRUE(w.Add("neg", GgufValue::Int32(-3)).ok());
  ASSERT_TRUE(w.Add("big", GgufValue::Uint64(std::numeric_limits<uint64_t>::max())).ok());
  ASSERT_TRUE(w.Add("bigs", Must(GgufValue::IntArray(VT::kUint64, {1}))).ok());
  ASSERT_TRUE(w.AddStringArray("toks", {"a", "b"}).ok());
  ASSERT_TRUE(w.AddUint32("n", 7).ok());
  Result<GgufFile> r = ParseGguf(w.Serialize(), "m.gguf");
  ASSERT_TRUE(r.ok()) << r.status().ToString();

  Status s = r->GetString("absent").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "m.gguf: key \"absent\": is missing");
  s = r->GetString("f").status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "m.gguf: key \"f\": is f32, expected a string");
  s = r->GetUint("neg").status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "m.gguf: key \"neg\": is i32 -3, expected a non-negative integer");
  EXPECT_EQ(*r->GetInt("neg"), -3);
  s = r->GetInt("big").status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("does not fit int64"), std::string::npos) << s.message();
  EXPECT_EQ(r->GetUint("f").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r->GetFloat("n").status().message(), "m.gguf: key \"n\": is u32, expected f32 or f64");
  EXPECT_EQ(r->GetBool("n").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r->GetIntArray("toks").status().message(),
            "m.gguf: key \"toks\": is array of string, expected an array of integers");
  EXPECT_EQ(r->GetFloatArray("toks").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r->GetStringArray("n").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(*r->GetIntArray("bigs"), (std::vector<int64_t>{1}));
  EXPECT_EQ(r->GetStringArray("nope").status().code(), StatusCode::kNotFound);
}

TEST(GgufTest, TensorsRoundTripAligned) {
  const std::string a = F32Bytes({1, 2, 3, 4, 5, 6});   // [3, 2] f32
  const std::string q8(2 * 34 * 2, '\x11');             // [64, 2] Q8_0
  const std::string h(5 * 2, '\x22');                   // [5] f16
  const std::string k(144, '\x33');                     // [256] Q4_K
  GgufWriter w;
  ASSERT_TRUE(w.AddString("general.architecture", "llama").ok());
  ASSERT_TRUE(w.AddTensor("a", {3, 2}, GgmlType::kF32, a).ok());
  ASSERT_TRUE(w.AddTensor("q8", {64, 2}, GgmlType::kQ8_0, q8).ok());
  ASSERT_TRUE(w.AddTensor("h", {5}, GgmlType::kF16, h).ok());
  ASSERT_TRUE(w.AddTensor("empty", {0, 4}, GgmlType::kF32, "").ok());
  ASSERT_TRUE(w.AddTensor("k", {256, 1, 1, 1}, GgmlType::kQ4_K, k).ok());
  const std::string bytes = w.Serialize();
  Result<GgufFile> r = ParseGguf(bytes, "t.gguf");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->data_offset() % 32, 0u);
  ASSERT_EQ(r->tensors().size(), 5u);
  const std::vector<std::string> datas = {a, q8, h, "", k};
  for (size_t i = 0; i < r->tensors().size(); ++i) {
    const GgufTensorInfo& t = r->tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ(t.size_bytes, datas[i].size());
    EXPECT_EQ(bytes.substr(r->data_offset() + t.offset, t.size_bytes), datas[i]);
    EXPECT_EQ(r->FindTensor(t.name), &t);
  }
  const GgufTensorInfo& t0 = r->tensors()[0];
  EXPECT_EQ(t0.name, "a");
  EXPECT_EQ(t0.dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(t0.RowMajorShape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t0.type, GgmlType::kF32);
  EXPECT_EQ(t0.n_elements, 6);
  EXPECT_EQ(r->tensors()[1].type, GgmlType::kQ8_0);
  EXPECT_EQ(r->tensors()[1].n_elements, 128);
  EXPECT_EQ(r->tensors()[3].n_elements, 0);
  EXPECT_EQ(r->tensors()[4].dims.size(), 4u);
  EXPECT_EQ(r->FindTensor("absent"), nullptr);
  // The file ends with the last tensor's bytes.
  EXPECT_EQ(bytes.size(), r->data_offset() + r->tensors()[4].offset + k.size());
}

TEST(GgufTest, CustomAlignment) {
  const std::string a = F32Bytes({1, 2, 3});
  GgufWriter w;
  ASSERT_TRUE(w.AddTensor("a", {3}, GgmlType::kF32, a).ok());
  ASSERT_TRUE(w.AddUint32("general.alignment", 64).ok());  // after a tensor: still applies
  ASSERT_TRUE(w.AddTensor("b", {3}, GgmlType::kF32, a).ok());
  EXPECT_EQ(w.alignment(), 64u);
  Result<GgufFile> r = ParseGguf(w.Serialize(), "t.gguf");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->alignment(), 64u);
  EXPECT_EQ(r->data_offset() % 64, 0u);
  EXPECT_EQ(r->tensors()[1].offset, 64u);
}

TEST(GgufTest, Version2And3ReadAlike) {
  GgufWriter w = EveryValueType();
  const std::string a = F32Bytes({1, 2});
  ASSERT_TRUE(w.AddTensor("a", {2}, GgmlType::kF32, a).ok());
  std::string bytes = w.Serialize();
  for (uint8_t v : {2, 3}) {
    bytes[4] = static_cast<char>(v);
    Result<GgufFile> r = ParseGguf(bytes, "v.gguf");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->version(), v);
    EXPECT_EQ(r->metadata().size(), 29u);
    EXPECT_EQ(r->tensors().size(), 1u);
  }
}

TEST(GgufTest, OtherVersionsAreRefusedByName) {
  std::string bytes = GgufWriter().Serialize();
  bytes[4] = 1;
  Status s = ParseStatus(bytes);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("version 1"), std::string::npos) << s.message();
  bytes[4] = 0;
  bytes[7] = 3;  // 3, big-endian
  s = ParseStatus(bytes);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("big-endian"), std::string::npos) << s.message();
  bytes[7] = 0;
  bytes[4] = 4;
  s = ParseStatus(bytes);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("version 4"), std::string::npos) << s.message();
}

TEST(GgufTest, NotGguf) {
  ExpectDataLoss("", "too short");
  ExpectDataLoss("GGU", "too short");
  ExpectDataLoss(std::string("GGML\x03\0\0\0", 8), "not a GGUF file");
  const std::string st("\x10\0\0\0\0\0\0\0{}", 10);  // a safetensors header
  ExpectDataLoss(st, "not a GGUF file");
}

// A small file with metadata of several types and three tensors: cutting it
// anywhere must be kDataLoss, never a crash or an accepted file.
TEST(GgufTest, TruncationAtEveryByteIsDataLoss) {
  GgufWriter w;
  ASSERT_TRUE(w.AddString("general.architecture", "llama").ok());
  ASSERT_TRUE(w.AddUint32("llama.block_count", 1).ok());
  ASSERT_TRUE(w.AddStringArray("tokenizer.ggml.tokens", {"a", "bc", ""}).ok());
  ASSERT_TRUE(w.Add("nested", Must(GgufValue::ArrayOfArrays({GgufValue::BoolArray({true})}))).ok());
  ASSERT_TRUE(w.Add("f64", GgufValue::Float64(0.25)).ok());
  const std::string a = F32Bytes({1, 2, 3});
  const std::string q8(34, '\x01');
  ASSERT_TRUE(w.AddTensor("a", {3}, GgmlType::kF32, a).ok());
  ASSERT_TRUE(w.AddTensor("q", {32}, GgmlType::kQ8_0, q8).ok());
  ASSERT_TRUE(w.AddTensor("z", {0}, GgmlType::kF32, "").ok());
  const std::string bytes = w.Serialize();
  ASSERT_TRUE(ParseGguf(bytes, "model.gguf").ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    Status s = ParseStatus(bytes.substr(0, n));
    ASSERT_EQ(s.code(), StatusCode::kDataLoss) << "cut at " << n << ": " << s.ToString();
  }
}

TEST(GgufTest, HugeCountsAreRefusedWithoutAllocating) {
  ExpectDataLoss(Raw().Header(0, ~uint64_t{0}).b, "metadata entries");
  ExpectDataLoss(Raw().Header(~uint64_t{0}, 0).b, "tensors");
  ExpectDataLoss(Raw().Header(uint64_t{1} << 60, uint64_t{1} << 60).Zeros(64).b, "more than");
  // Array counts, for every element kind.
  for (uint32_t et : {0u, 6u, 8u, 9u, 12u}) {
    Raw r;
    r.Header(0, 1).Str("k").U32(9).U32(et).U64(~uint64_t{0} / 2).Zeros(16);
    ExpectDataLoss(r.b, "key \"k\": array at byte");
  }
  // A string longer than the file.
  ExpectDataLoss(Raw().Header(0, 1).Str("k").U32(8).U64(~uint64_t{0}).b, "key \"k\": string truncated");
  // A key longer than the limit, and an empty one.
  ExpectDataLoss(Raw().Header(0, 1).U64(70000).Zeros(70000 + 5).b, "key length 70000");
  ExpectDataLoss(Raw().Header(0, 1).Str("").U32(0).U8(0).Zeros(8).b, "key length 0");
  // A string array whose lengths run past the end.
  Raw r;
  r.Header(0, 1).Str("k").U32(9).U32(8).U64(2).Str("ab").U64(1000).Zeros(8);
  ExpectDataLoss(r.b, "string 1 of the array truncated");
}

TEST(GgufTest, BadValuesAreDataLossNamingTheKey) {
  ExpectDataLoss(Raw().Header(0, 1).Str("k").U32(13).U64(0).b, "key \"k\": unknown value type 13");
  ExpectDataLoss(Raw().Header(0, 1).Str("k").U32(7).U8(2).b, "key \"k\": bool at byte");
  ExpectDataLoss(Raw().Header(0, 1).Str("k").U32(9).U32(7).U64(2).U8(1).U8(5).b,
                 "element 1 of the array) is 5");
  ExpectDataLoss(Raw().Header(0, 1).Str("k").U32(9).U32(99).U64(0).b, "unknown element type 99");
  // Duplicate keys.
  ExpectDataLoss(Raw().Header(0, 2).KvU32("a.b", 1).KvU32("a.b", 2).b,
                 "key \"a.b\": appears twice (metadata entries 0 and 1)");
  // Names from the file are escaped in messages.
  Status s = ParseStatus(Raw().Header(0, 1).Str("k\n\"").U32(13).b);
  EXPECT_NE(s.message().find("key \"k\\x0a\\\"\""), std::string::npos) << s.message();
}

TEST(GgufTest, ArrayNestingIsBounded) {
  auto nested = [](int depth) {
    Raw r;
    r.Header(0, 1).Str("deep").U32(9);
    for (int i = 1; i < depth; ++i) r.U32(9).U64(1);  // an array holding one array
    r.U32(0).U64(0);                                  // the innermost: an empty u8 array
    return r.b;
  };
  EXPECT_TRUE(ParseGguf(nested(GgufFile::kMaxArrayDepth), "model.gguf").ok());
  ExpectDataLoss(nested(GgufFile::kMaxArrayDepth + 1), "nested deeper than 8 levels");

  // The writer refuses what the reader would refuse.
  GgufValue v = GgufValue::BoolArray({});
  for (int i = 1; i <= GgufFile::kMaxArrayDepth; ++i) v = Must(GgufValue::ArrayOfArrays({v}));
  GgufWriter w;
  EXPECT_EQ(w.Add("deep", v).code(), StatusCode::kInvalidArgument);
}

TEST(GgufTest, AlignmentMustBeAU32PowerOfTwo) {
  ExpectDataLoss(Raw().Header(0, 1).KvU32("general.alignment", 0).b,
                 "key \"general.alignment\": 0 is not a power of two");
  ExpectDataLoss(Raw().Header(0, 1).KvU32("general.alignment", 48).b,
                 "key \"general.alignment\": 48 is not a power of two");
  ExpectDataLoss(Raw().Header(0, 1).Str("general.alignment").U32(10).U64(32).b,
                 "key \"general.alignment\": is u64, expected u32");
  GgufWriter w;
  EXPECT_EQ(w.AddUint32("general.alignment", 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("general.alignment", GgufValue::Uint64(32)).code(), StatusCode::kInvalidArgument);
}

// One tensor "t" of `dims`/`type`/`offset` with `data_bytes` of data.
std::string OneTensor(const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset,
                      size_t data_bytes, std::string_view name = "blk.0.attn_q.weight") {
  Raw r;
  r.Header(1, 0).Tensor(name, dims, type, offset).PadTo(32).Zeros(data_bytes);
  return r.b;
}

TEST(GgufTest, BadTensorInfosNameTheTensor) {
  EXPECT_TRUE(ParseGguf(OneTensor({4, 2}, 0, 0, 32), "model.gguf").ok());
  const std::string t = "tensor \"blk.0.attn_q.weight\": ";
  ExpectDataLoss(OneTensor({}, 0, 0, 32), t + "n_dims 0");
  ExpectDataLoss(OneTensor({1, 1, 1, 1, 1}, 0, 0, 32), t + "n_dims 5");
  ExpectDataLoss(OneTensor({uint64_t{1} << 63}, 0, 0, 32), t + "dims[0] = 9223372036854775808");
  ExpectDataLoss(OneTensor({uint64_t{1} << 62, 4}, 0, 0, 32), t + "the element count of dims [4611686018427387904, 4] overflows");
  ExpectDataLoss(OneTensor({uint64_t{1} << 62, 1}, 0, 0, 32), t + "the byte size");
  ExpectDataLoss(OneTensor({1, uint64_t{1} << 62}, 28, 0, 32), t + "the byte size");  // f64
  ExpectDataLoss(OneTensor({33}, 8, 0, 64), t + "row length dims[0] = 33 is not a multiple of Q8_0");
  ExpectDataLoss(OneTensor({4, 3}, 0, 0, 32), t + "bytes [0, +48) of the data section end past the 32 bytes");
  ExpectDataLoss(OneTensor({4}, 0, 64, 32), t + "bytes [64, +16)");  // offset past EOF
  ExpectDataLoss(OneTensor({4}, 0, ~uint64_t{0} - 31, 32), t + "bytes [18446744073709551584, +16)");
  ExpectDataLoss(OneTensor({4}, 0, 16, 64), t + "offset 16 is not a multiple of the alignment 32");
  ExpectDataLoss(OneTensor({4}, 0, 0, 0, std::string(65, 'n')), "name length 65");
  ExpectDataLoss(OneTensor({4}, 0, 0, 0, ""), "name length 0");

  for (uint32_t type : {4u, 1000u}) {
    Status s = ParseStatus(OneTensor({4}, type, 0, 32));
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
    EXPECT_NE(s.message().find(t + "ggml type " + std::to_string(type)), std::string::npos)
        << s.message();
  }
}

TEST(GgufTest, OverlapsAndDuplicatesAreRefused) {
  Raw r;
  r.Header(2, 0).Tensor("a", {16}, 0, 0).Tensor("b", {8}, 0, 32).PadTo(32).Zeros(128);
  ExpectDataLoss(r.b, "tensor \"b\" (data bytes [32, 64)) overlaps tensor \"a\" (data bytes [0, 64))");
  Raw same;
  same.Header(2, 0).Tensor("a", {8}, 0, 0).Tensor("b", {8}, 0, 0).PadTo(32).Zeros(64);
  ExpectDataLoss(same.b, "overlaps");
  Raw dup;
  dup.Header(2, 0).Tensor("a", {8}, 0, 0).Tensor("a", {8}, 0, 32).PadTo(32).Zeros(64);
  ExpectDataLoss(dup.b, "tensor \"a\": appears twice (tensor infos 0 and 1)");
  // Zero-byte tensors overlap nothing; holes are fine.
  Raw ok;
  ok.Header(3, 0).Tensor("a", {8}, 0, 0).Tensor("z", {0}, 0, 0).Tensor("b", {8}, 0, 64)
      .PadTo(32).Zeros(96);
  EXPECT_TRUE(ParseGguf(ok.b, "model.gguf").ok());
}

TEST(GgufTest, DataSectionMustStartInsideTheFile) {
  Raw r;
  r.Header(1, 0).Tensor("z", {0}, 0, 0);  // infos end unaligned, no padding
  ExpectDataLoss(r.b, "the data section would start at byte");
  // Without tensors the padding may be missing.
  Result<GgufFile> f = ParseGguf(Raw().Header(0, 1).KvU32("a", 1).b, "model.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->data_offset() % 32, 0u);
}

TEST(GgufTest, WriterRefusesBadInput) {
  GgufWriter w;
  const std::string four = F32Bytes({1, 2, 3, 4});
  EXPECT_EQ(w.AddUint32("", 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(w.AddUint32("k", 1).ok());
  EXPECT_EQ(w.AddUint32("k", 2).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(w.AddTensor("t", {4}, GgmlType::kF32, four).ok());
  Status s = w.AddTensor("t", {4}, GgmlType::kF32, four);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"t\""), std::string::npos) << s.message();
  EXPECT_EQ(w.AddTensor("", {4}, GgmlType::kF32, four).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor(std::string(65, 'x'), {4}, GgmlType::kF32, four).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("u", {2, 2}, GgmlType::kF32, four.substr(1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("u", {}, GgmlType::kF32, "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("u", {1, 1, 1, 1, 4}, GgmlType::kF32, four).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("u", {-4}, GgmlType::kF32, "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("u", {16}, GgmlType::kQ8_0, std::string(34, '\0')).code(),
            StatusCode::kInvalidArgument);  // half a block
  EXPECT_EQ(w.AddTensor("u", {4}, static_cast<GgmlType>(4), four).code(),
            StatusCode::kInvalidArgument);
  // What was accepted still makes a valid file.
  Result<GgufFile> r = ParseGguf(w.Serialize(), "w.gguf");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors().size(), 1u);
  EXPECT_EQ(r->metadata().size(), 1u);
}

class GgufFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "arbiter_gguf_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(GgufFileTest, WriteThenOpen) {
  GgufWriter w = EveryValueType();
  const std::string a = F32Bytes({1, 2, 3, 4, 5});
  ASSERT_TRUE(w.AddTensor("a", {5}, GgmlType::kF32, a).ok());
  const std::string path = dir_ + "/m.gguf";
  ASSERT_TRUE(w.Write(path).ok());
  Result<GgufFile> f = OpenGguf(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->name(), path);
  EXPECT_EQ(f->file_size(), fs::file_size(path));
  EXPECT_EQ(f->metadata().size(), 29u);
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->file_size(), f->data_offset() + f->tensors()[0].offset + a.size());
  // Only the file is left in the directory (no temp files).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);

  EXPECT_EQ(OpenGguf(dir_ + "/absent.gguf").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(w.Write(dir_ + "/no/such/dir/m.gguf").ok());

  fs::resize_file(path, f->file_size() - 1);
  Status s = OpenGguf(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(path + ": tensor \"a\""), std::string::npos) << s.message();
}

// A vocabulary the size of Qwen's: one buffer, parsed in one pass.
TEST(GgufTest, LargeTokenArray) {
  std::vector<std::string> tokens;
  tokens.reserve(151936);
  for (int i = 0; i < 151936; ++i) tokens.push_back("tok" + std::to_string(i));
  std::vector<double> scores(tokens.size(), -1.0);
  GgufWriter w;
  ASSERT_TRUE(w.AddStringArray("tokenizer.ggml.tokens", tokens).ok());
  ASSERT_TRUE(w.Add("tokenizer.ggml.scores", Must(GgufValue::FloatArray(VT::kFloat32, scores))).ok());
  Result<GgufFile> r = ParseGguf(w.Serialize(), "big.gguf");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const GgufValue* v = r->FindValue("tokenizer.ggml.tokens");
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(v->size(), tokens.size());
  EXPECT_EQ(v->StringAt(0), "tok0");
  EXPECT_EQ(v->StringAt(151935), "tok151935");
  EXPECT_EQ(r->GetStringArray("tokenizer.ggml.tokens")->size(), tokens.size());
  EXPECT_EQ(r->GetFloatArray("tokenizer.ggml.scores")->back(), -1.0);
}

// The fuzz seeds (fuzz/corpus/make_seeds.py) are valid files, so the fuzzer
// starts from the accepting paths.
TEST(GgufTest, FuzzSeedsAreValid) {
  const fs::path dir = fs::path(ARBITER_SOURCE_DIR) / "fuzz" / "corpus" / "gguf";
  int n = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    SCOPED_TRACE(e.path().string());
    Result<GgufFile> f = OpenGguf(e.path().string());
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    if (f->FindValue("general.architecture") != nullptr) {
      Result<ModelConfig> c = ModelConfigFromGguf(*f);
      EXPECT_TRUE(c.ok()) << c.status().ToString();
    }
    ++n;
  }
  EXPECT_GE(n, 3);
}

}  // namespace
}  // namespace arbiter
