#include "arbiter/formats/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

namespace arbiter {
namespace {

namespace fs = std::filesystem;

// Each test gets a fresh temp dir, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "arbiter_st_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Writes raw bytes.
  std::string WriteBytes(const std::string& name, const std::string& bytes) {
    std::string p = Path(name);
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

  // 8-byte LE `length`, then `rest`.
  static std::string WithLength(uint64_t length, const std::string& rest) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    return out + rest;
  }

  // A file whose header is `header` (length set correctly) followed by
  // `data_bytes` zero bytes.
  std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes) {
    return WriteBytes(name, WithLength(header.size(), header) + std::string(data_bytes, '\0'));
  }

  Status OpenRaw(const std::string& header, size_t data_bytes) {
    return SafetensorsFile::Open(WriteRaw("x.safetensors", header, data_bytes)).status();
  }

  std::string dir_;
};

std::string_view Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)};
}
std::string_view Bytes(const std::vector<uint16_t>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(uint16_t)};
}

#define EXPECT_DATA_LOSS(status, substring)                          \
  do {                                                               \
    Status s_ = (status);                                            \
    EXPECT_EQ(s_.code(), StatusCode::kDataLoss) << s_.ToString();    \
    EXPECT_NE(s_.message().find(substring), std::string::npos)       \
        << "message: " << s_.message() << "\nexpected: " << substring; \
  } while (0)

// ---------------------------------------------------------------------------
// DTypes

TEST(DTypeTest, NamesSizesAndParse) {
  const std::pair<const char*, size_t> all[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1},
      {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, size] : all) {
    Result<DType> d = ParseDType(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_EQ(DTypeName(*d), name);
    EXPECT_EQ(DTypeSize(*d), size) << name;
  }
  Result<DType> bad = ParseDType("Q4_K");
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("Q4_K"), std::string::npos);
  EXPECT_FALSE(ParseDType("f32").ok());  // case-sensitive, as in the spec
}

// ---------------------------------------------------------------------------
// Round trips

TEST_F(SafetensorsTest, WriteThenReadRoundTrip) {
  std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 1e-8f, -1e8f};
  std::vector<uint16_t> b = {F32ToBF16(1.0f), F32ToBF16(-0.5f), F32ToBF16(3.0f)};
  std::string c = "\x01\x02\x03\x04\x05";
  float scalar = 42.0f;
  std::vector<TensorToWrite> tensors = {
      {"z.first", DType::kF32, {2, 3}, Bytes(a)},
      {"a.bf16", DType::kBF16, {3}, Bytes(b)},
      {"m.bytes", DType::kU8, {5}, c},
      {"scalar", DType::kF32, {}, std::string_view(reinterpret_cast<const char*>(&scalar), 4)},
      {"empty", DType::kF16, {0, 7}, std::string_view()},
  };
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}, {"note", "héllo"}}).ok());

  // The header length is a multiple of 8 and padded with spaces.
  std::ifstream in(path, std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  EXPECT_EQ(raw.size(), 8 + n + a.size() * 4 + b.size() * 2 + c.size() + 4);

  Result<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->path(), path);
  EXPECT_EQ(file->file_size(), raw.size());
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "héllo");
  ASSERT_EQ(file->tensors().size(), 5u);

  const TensorInfo* t = file->Find("z.first");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->num_elements(), 6);
  EXPECT_EQ(t->size_bytes, 24u);
  EXPECT_EQ(t->data_begin, 0u);  // laid out in the given order
  EXPECT_EQ(t->file, path);
  EXPECT_EQ(std::memcmp(t->data, a.data(), 24), 0);

  const TensorInfo* tb = file->Find("a.bf16");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->data_begin, 24u);
  std::vector<float> out(3);
  ASSERT_TRUE(ConvertToF32(*tb, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -0.5f, 3.0f}));

  const TensorInfo* tc = file->Find("m.bytes");
  ASSERT_NE(tc, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(tc->data), 5), c);

  const TensorInfo* ts = file->Find("scalar");
  ASSERT_NE(ts, nullptr);
  EXPECT_TRUE(ts->shape.empty());
  EXPECT_EQ(ts->num_elements(), 1);
  float sv = 0;
  ASSERT_TRUE(ConvertToF32(*ts, &sv).ok());
  EXPECT_EQ(sv, 42.0f);

  const TensorInfo* te = file->Find("empty");
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->num_elements(), 0);
  EXPECT_EQ(te->size_bytes, 0u);

  EXPECT_EQ(file->Find("nope"), nullptr);
  EXPECT_EQ(file->Find(""), nullptr);

  // Tensors are sorted by name.
  for (size_t i = 1; i < file->tensors().size(); ++i) {
    EXPECT_LT(file->tensors()[i - 1].name, file->tensors()[i].name);
  }
}

TEST_F(SafetensorsTest, EmptyModelRoundTrips) {
  const std::string path = Path("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  Result<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE(file->tensors().empty());
  EXPECT_TRUE(file->metadata().empty());
}

TEST_F(SafetensorsTest, ParseInMemoryImageNamesItInErrors) {
  std::string img = WithLength(2, "{}");
  Result<SafetensorsFile> ok =
      SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "mem");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->path(), "mem");
  std::string bad = WithLength(2, "[]");
  Result<SafetensorsFile> r =
      SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(), "mem");
  EXPECT_DATA_LOSS(r.status(), "mem: header is an array, expected a JSON object");
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  std::vector<float> a(4);
  const std::string path = Path("w.safetensors");
  Status s = WriteSafetensors(path, {{"t", DType::kF32, {2, 3}, Bytes(a)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("data holds 16 bytes but shape [2, 3] of F32 needs 24"),
            std::string::npos)
      << s.message();

  s = WriteSafetensors(path, {{"t", DType::kF32, {4}, Bytes(a)}, {"t", DType::kF32, {4}, Bytes(a)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("appears twice"), std::string::npos) << s.message();

  s = WriteSafetensors(path, {{"t", DType::kF32, {-4}, Bytes(a)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);

  s = WriteSafetensors(path, {{"__metadata__", DType::kF32, {4}, Bytes(a)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);

  s = WriteSafetensors(path, {{"", DType::kF32, {4}, Bytes(a)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);

  s = WriteSafetensors(path, {{"bad\xff", DType::kF32, {4}, Bytes(a)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();

  // Nothing was written, and no temp file left behind.
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(SafetensorsTest, WriteReplacesExistingFileAtomically) {
  const std::string path = Path("m.safetensors");
  std::vector<float> a = {1, 2};
  std::vector<float> b = {3, 4, 5};
  ASSERT_TRUE(WriteSafetensors(path, {{"t", DType::kF32, {2}, Bytes(a)}}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"t", DType::kF32, {3}, Bytes(b)}}).ok());
  Result<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->Find("t")->num_elements(), 3);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
}

// ---------------------------------------------------------------------------
// Hostile files

TEST_F(SafetensorsTest, RejectsFileShorterThanLength) {
  EXPECT_DATA_LOSS(SafetensorsFile::Open(WriteBytes("short.safetensors", "abc")).status(),
                   "short.safetensors: file is 3 bytes, shorter than the 8-byte header length");
  EXPECT_DATA_LOSS(SafetensorsFile::Open(WriteBytes("zero.safetensors", "")).status(),
                   "file is 0 bytes");
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  EXPECT_DATA_LOSS(SafetensorsFile::Open(WriteBytes("t.safetensors", WithLength(100, "{}"))).status(),
                   "header length 100 runs past the end of the 10-byte file; the file is truncated");
}

TEST_F(SafetensorsTest, RejectsHugeHeaderLength) {
  EXPECT_DATA_LOSS(
      SafetensorsFile::Open(WriteBytes("t.safetensors", WithLength(~0ull, "{}"))).status(),
      "exceeds the 100 MiB limit");
  EXPECT_DATA_LOSS(
      SafetensorsFile::Open(WriteBytes("t.safetensors", WithLength((100ull << 20) + 1, "{}")))
          .status(),
      "exceeds the 100 MiB limit");
}

TEST_F(SafetensorsTest, RejectsTinyHeaderLength) {
  EXPECT_DATA_LOSS(SafetensorsFile::Open(WriteBytes("t.safetensors", WithLength(1, "{"))).status(),
                   "header length 1 is too small");
  EXPECT_DATA_LOSS(SafetensorsFile::Open(WriteBytes("t.safetensors", WithLength(0, ""))).status(),
                   "header length 0 is too small");
}

TEST_F(SafetensorsTest, RejectsDataCutShort) {
  std::vector<float> a(16, 1.0f);
  const std::string path = Path("cut.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", DType::kF32, {4, 4}, Bytes(a)}}).ok());
  fs::resize_file(path, fs::file_size(path) - 4);
  EXPECT_DATA_LOSS(SafetensorsFile::Open(path).status(),
                   "cut.safetensors: tensor \"w\": data_offsets [0, 64] ends past the data area "
                   "(60 bytes); the file is truncated or corrupt");
}

TEST_F(SafetensorsTest, RejectsNonJsonHeader) {
  EXPECT_DATA_LOSS(OpenRaw("{not json}", 0), "x.safetensors: header is not valid JSON");
  EXPECT_DATA_LOSS(OpenRaw("\xff\xfe", 0), "header is not valid JSON");
  EXPECT_DATA_LOSS(OpenRaw(std::string("{\"a\"\0:1}", 8), 0), "header is not valid JSON");
  EXPECT_DATA_LOSS(OpenRaw("{\"bad\xff\": {}}", 0), "header is not valid JSON");  // bad UTF-8
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAnObject) {
  EXPECT_DATA_LOSS(OpenRaw("[1, 2]", 0), "header is an array, expected a JSON object");
  EXPECT_DATA_LOSS(OpenRaw("42", 0), "header is an integer, expected a JSON object");
  EXPECT_DATA_LOSS(OpenRaw("\"s\"", 0), "header is a string, expected a JSON object");
}

TEST_F(SafetensorsTest, RejectsDeeplyNestedHeader) {
  std::string deep = "{\"t\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_DATA_LOSS(OpenRaw(deep, 0), "nested deeper than");
}

TEST_F(SafetensorsTest, RejectsDuplicateTensorName) {
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
                              "t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                           2),
                   "key \"t\" appears twice");
}

TEST_F(SafetensorsTest, RejectsMissingFields) {
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"shape":[1],"data_offsets":[0,1]}})", 1),
                   "x.safetensors: tensor \"t\": field \"dtype\" is missing");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","data_offsets":[0,1]}})", 1),
                   "tensor \"t\": field \"shape\" is missing");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[1]}})", 1),
                   "tensor \"t\": field \"data_offsets\" is missing");
}

TEST_F(SafetensorsTest, RejectsIllTypedFields) {
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":[1,2]})", 0), "tensor \"t\": entry is an array, expected an object");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":4,"shape":[1],"data_offsets":[0,1]}})", 1),
                   "tensor \"t\": field \"dtype\" is an integer, expected a string");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":"1","data_offsets":[0,1]}})", 1),
                   "tensor \"t\": field \"shape\" is a string, expected an array of integers");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", 1),
                   "field \"shape\" holds a float, expected non-negative integers");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}})", 1),
                   "field \"shape\" holds a boolean");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 2),
                   "field \"data_offsets\" must be an array of two integers [begin, end], got [0,1,2]");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":{"a":1}}})", 2),
                   "field \"data_offsets\" must be an array of two integers");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,"1"]}})", 2),
                   "field \"data_offsets\" must be an array of two integers");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 2),
                   "data_offsets [-1,0] are negative");
  EXPECT_DATA_LOSS(OpenRaw(R"({"__metadata__":["a"]})", 0),
                   "field \"__metadata__\" is an array, expected an object of strings");
  EXPECT_DATA_LOSS(OpenRaw(R"({"__metadata__":{"k":1}})", 0),
                   "__metadata__ entry \"k\" is an integer, expected a string");
}

TEST_F(SafetensorsTest, RejectsUnknownDType) {
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"Q4_0","shape":[1],"data_offsets":[0,1]}})", 1),
                   "x.safetensors: tensor \"t\": unknown dtype \"Q4_0\"");
}

TEST_F(SafetensorsTest, RejectsOffsetsOutsideData) {
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 6),
                   "tensor \"t\": data_offsets [4, 8] ends past the data area (6 bytes)");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}})", 10),
                   "data_offsets [8, 4] has begin after end");
  EXPECT_DATA_LOSS(
      OpenRaw(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})", 10),
      "has begin after end");
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  EXPECT_DATA_LOSS(OpenRaw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                              "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           12),
                   "tensor \"b\" (data_offsets [4, 12]) overlaps tensor \"a\" (data_offsets [0, 8])");
  // One tensor nested inside a bigger one, with a third sorted between them.
  EXPECT_DATA_LOSS(OpenRaw(R"({"big":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},
                              "x":{"dtype":"U8","shape":[2],"data_offsets":[8,10]},
                              "y":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                           10),
                   "overlaps tensor \"big\"");
  // Same range twice.
  EXPECT_DATA_LOSS(OpenRaw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                              "b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                           4),
                   "overlaps");
}

TEST_F(SafetensorsTest, AllowsZeroSizeTensorsAndHoles) {
  Status s = OpenRaw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                        "z":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},
                        "b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
                     8);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(SafetensorsTest, RejectsShapeSizeMismatch) {
  Status s = SafetensorsFile::Open(WriteRaw("model.safetensors",
                                            R"({"model.layers.0.mlp.up_proj.weight":
                                               {"dtype":"BF16","shape":[16,16],"data_offsets":[0,100]}})",
                                            100))
                 .status();
  EXPECT_DATA_LOSS(s, "model.safetensors: tensor \"model.layers.0.mlp.up_proj.weight\": "
                      "data_offsets [0, 100] hold 100 bytes but shape [16, 16] of BF16 needs 512");
}

TEST_F(SafetensorsTest, RejectsNegativeShape) {
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[2,-2],"data_offsets":[0,4]}})", 4),
                   "tensor \"t\": shape dimension -2 is negative");
}

TEST_F(SafetensorsTest, RejectsOverflowingShape) {
  EXPECT_DATA_LOSS(
      OpenRaw(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
      "tensor \"t\": shape [4294967296, 4294967296] of F32 overflows 64 bits");
  // 2^62 elements × 4 bytes wraps to 0 without the check.
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
                   "overflows 64 bits");
  EXPECT_DATA_LOSS(OpenRaw(R"({"t":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", 0),
                   "shape dimension 18446744073709551615 is too large");
}

TEST_F(SafetensorsTest, OpenMissingFileIsNotFound) {
  EXPECT_EQ(SafetensorsFile::Open(Path("nope.safetensors")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(SafetensorsModel::Open(Path("nope.safetensors")).status().code(), StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// SafetensorsModel: single file, directory, shards

TEST_F(SafetensorsTest, ModelOpensFileAndDirectory) {
  std::vector<float> a = {1, 2, 3, 4};
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), {{"w", DType::kF32, {2, 2}, Bytes(a)}},
                               {{"format", "pt"}})
                  .ok());
  for (const std::string& p : {Path("model.safetensors"), dir_, dir_ + "/"}) {
    Result<SafetensorsModel> m = SafetensorsModel::Open(p);
    ASSERT_TRUE(m.ok()) << p << ": " << m.status().ToString();
    ASSERT_EQ(m->files().size(), 1u);
    EXPECT_EQ(fs::path(m->files()[0]).filename(), "model.safetensors");
    ASSERT_NE(m->Find("w"), nullptr);
    EXPECT_EQ(m->Find("x"), nullptr);
    EXPECT_EQ(m->tensors().size(), 1u);
    EXPECT_EQ(m->total_tensor_bytes(), 16u);
    EXPECT_EQ(m->metadata().at("format"), "pt");
  }
}

TEST_F(SafetensorsTest, ModelInEmptyDirectoryIsNotFound) {
  Status s = SafetensorsModel::Open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos)
      << s.message();
}

class ShardedTest : public SafetensorsTest {
 protected:
  void WriteShards() {
    ASSERT_TRUE(WriteSafetensors(Path("model-00001-of-00002.safetensors"),
                                 {{"a", DType::kF32, {2}, Bytes(a_)}, {"b", DType::kF32, {2}, Bytes(b_)}},
                                 {{"format", "pt"}})
                    .ok());
    ASSERT_TRUE(WriteSafetensors(Path("model-00002-of-00002.safetensors"),
                                 {{"c", DType::kF32, {3}, Bytes(c_)}}, {{"format", "pt"}})
                    .ok());
  }
  void WriteIndex(const std::string& weight_map) {
    WriteBytes("model.safetensors.index.json",
               R"({"metadata": {"total_size": 28}, "weight_map": )" + weight_map + "}");
  }
  std::vector<float> a_ = {1, 2}, b_ = {3, 4}, c_ = {5, 6, 7};
  const std::string good_map_ =
      R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
          "c": "model-00002-of-00002.safetensors"})";
};

TEST_F(ShardedTest, OpensShardedSet) {
  WriteShards();
  WriteIndex(good_map_);
  Result<SafetensorsModel> m = SafetensorsModel::Open(dir_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->files().size(), 2u);
  EXPECT_EQ(m->files()[0], Path("model-00001-of-00002.safetensors"));
  EXPECT_EQ(m->files()[1], Path("model-00002-of-00002.safetensors"));
  std::vector<const TensorInfo*> ts = m->tensors();
  ASSERT_EQ(ts.size(), 3u);
  EXPECT_EQ(ts[0]->name, "a");
  EXPECT_EQ(ts[2]->name, "c");
  EXPECT_EQ(ts[2]->file, Path("model-00002-of-00002.safetensors"));
  EXPECT_EQ(m->total_tensor_bytes(), 28u);
  std::vector<float> out(3);
  ASSERT_TRUE(ConvertToF32(*m->Find("c"), out.data()).ok());
  EXPECT_EQ(out, c_);
  EXPECT_EQ(m->metadata().at("format"), "pt");

  // Copies and moves keep the mapping alive and the pointers valid.
  SafetensorsModel copy = *m;
  Result<SafetensorsModel> moved = std::move(m);
  ASSERT_TRUE(ConvertToF32(*copy.Find("c"), out.data()).ok());
  EXPECT_EQ(out, c_);
}

TEST_F(ShardedTest, MissingShardIsNotFound) {
  WriteShards();
  fs::remove(Path("model-00002-of-00002.safetensors"));
  WriteIndex(good_map_);
  Status s = SafetensorsModel::Open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("model.safetensors.index.json: shard named in weight_map"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("model-00002-of-00002.safetensors"), std::string::npos) << s.message();
}

TEST_F(ShardedTest, IndexClaimsTensorTheShardDoesNotHold) {
  WriteShards();
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"})");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(),
                   "weight_map puts tensor \"d\" in \"model-00002-of-00002.safetensors\" but that "
                   "shard does not hold it");
  // Claimed in the wrong shard.
  WriteIndex(R"({"a": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors",
                 "b": "model-00001-of-00002.safetensors"})");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(), "weight_map puts tensor \"a\"");
}

TEST_F(ShardedTest, TensorInTwoShardsIsAnError) {
  WriteShards();
  ASSERT_TRUE(WriteSafetensors(Path("model-00002-of-00002.safetensors"),
                               {{"a", DType::kF32, {2}, Bytes(a_)}, {"c", DType::kF32, {3}, Bytes(c_)}})
                  .ok());
  WriteIndex(good_map_);
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(),
                   "tensor \"a\" is also in " + Path("model-00001-of-00002.safetensors"));
}

TEST_F(ShardedTest, CorruptShardIsReported) {
  WriteShards();
  WriteBytes("model-00002-of-00002.safetensors", "xyz");
  WriteIndex(good_map_);
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(),
                   "model-00002-of-00002.safetensors: file is 3 bytes");
}

TEST_F(ShardedTest, BadIndexFiles) {
  WriteShards();
  WriteBytes("model.safetensors.index.json", "{oops");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(), "model.safetensors.index.json: not valid JSON");
  WriteBytes("model.safetensors.index.json", "[]");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(), "top level is an array");
  WriteBytes("model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(), "field \"weight_map\" is missing");
  WriteIndex("[]");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(), "field \"weight_map\" is an array");
  WriteIndex("{}");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(), "field \"weight_map\" is empty");
  WriteIndex(R"({"a": 1})");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(),
                   "weight_map entry for tensor \"a\" is an integer, expected a file name");
  WriteIndex(R"({"a": "../model-00001-of-00002.safetensors"})");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(), "not a relative path inside the model directory");
  WriteIndex(R"({"a": "/etc/passwd"})");
  EXPECT_DATA_LOSS(SafetensorsModel::Open(dir_).status(), "not a relative path inside the model directory");
}

// ---------------------------------------------------------------------------
// Conversions

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(ConvertTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToBF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBF16(-0.0f), 0x8000);
  // Exactly halfway: ties go to the even mantissa.
  EXPECT_EQ(F32ToBF16(FromBits(0x3f808000)), 0x3f80);
  EXPECT_EQ(F32ToBF16(FromBits(0x3f818000)), 0x3f82);
  // Just above / below halfway.
  EXPECT_EQ(F32ToBF16(FromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(F32ToBF16(FromBits(0x3f807fff)), 0x3f80);
  // 3.14159274 (0x40490fdb) → 0x4049 (3.140625).
  EXPECT_EQ(F32ToBF16(3.14159274f), 0x4049);
  // Largest finite f32 rounds up to inf; inf stays inf.
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBF16(-std::numeric_limits<float>::infinity()), 0xff80);
  // Subnormal f32 values round like any other.
  EXPECT_EQ(F32ToBF16(FromBits(0x00000001)), 0x0000);
  EXPECT_EQ(F32ToBF16(FromBits(0x00010000)), 0x0001);
}

TEST(ConvertTest, BF16PreservesNaN) {
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u}) {
    uint16_t h = F32ToBF16(FromBits(bits));
    EXPECT_TRUE(std::isnan(BF16ToF32(h))) << std::hex << bits;
    EXPECT_EQ(h >> 15, bits >> 31) << "sign kept";
  }
}

TEST(ConvertTest, BF16AllValuesRoundTrip) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    float f = BF16ToF32(static_cast<uint16_t>(h));
    EXPECT_EQ(Bits(f), h << 16);
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToBF16(f), h) << std::hex << h;
  }
}

TEST(ConvertTest, BF16MatchesDoubleRoundingOnRandomValues) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 200000; ++i) {
    float f = FromBits(rng());
    if (std::isnan(f)) continue;
    uint16_t h = F32ToBF16(f);
    float r = BF16ToF32(h);
    if (std::isinf(r) && !std::isinf(f)) continue;  // overflow case checked above
    // No other bf16 is closer to f.
    float lo = BF16ToF32(static_cast<uint16_t>(h - 1));
    float hi = BF16ToF32(static_cast<uint16_t>(h + 1));
    double err = std::fabs(static_cast<double>(r) - f);
    if (!std::isnan(lo) && !std::isinf(lo) && (h & 0x7fff) != 0) {
      ASSERT_LE(err, std::fabs(static_cast<double>(lo) - f)) << std::hex << Bits(f);
    }
    if (!std::isnan(hi) && !std::isinf(hi)) {
      ASSERT_LE(err, std::fabs(static_cast<double>(hi) - f)) << std::hex << Bits(f);
    }
  }
}

TEST(ConvertTest, F16Subnormals) {
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));   // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), 1023 * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(F16ToF32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));   // smallest normal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(F32ToF16(1023 * std::ldexp(1.0f, -24)), 0x03ff);
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -24)), 0x8001);
  // Half the smallest subnormal is a tie → rounds to even (zero).
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(F32ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  // 1.5 × smallest subnormal is a tie → rounds to 2 (even).
  EXPECT_EQ(F32ToF16(3 * std::ldexp(1.0f, -25)), 0x0002);
  // 2.5 × smallest → 2 (even).
  EXPECT_EQ(F32ToF16(5 * std::ldexp(1.0f, -25)), 0x0002);
  // Largest subnormal + half an ulp rounds up into the smallest normal.
  EXPECT_EQ(F32ToF16(1023.5f * std::ldexp(1.0f, -24)), 0x0400);
  // f32 subnormals are far below f16 range.
  EXPECT_EQ(F32ToF16(FromBits(0x00000001)), 0x0000);
  EXPECT_EQ(F32ToF16(FromBits(0x80000001)), 0x8000);
}

TEST(ConvertTest, F16RangeInfAndNaN) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);   // max finite
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);   // below the halfway point
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);   // tie → even → inf
  EXPECT_EQ(F32ToF16(1e10f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xfc00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(F16ToF32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7c01)));
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xffffffffu}) {
    uint16_t h = F32ToF16(FromBits(bits));
    EXPECT_TRUE(std::isnan(F16ToF32(h))) << std::hex << bits;
  }
  // Ties in the normal range: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(ConvertTest, F16AllValuesRoundTrip) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << std::hex << h;
  }
}

#ifdef __FLT16_MAX__
TEST(ConvertTest, F16MatchesCompilerConversion) {
  std::mt19937 rng(42);
  for (int i = 0; i < 500000; ++i) {
    // Bias toward f16 range: exponents 100..150.
    uint32_t bits = rng();
    if (i % 2 == 0) bits = (bits & 0x807fffffu) | ((100u + bits % 51u) << 23);
    float f = FromBits(bits);
    if (std::isnan(f)) continue;
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(F32ToF16(f), ref_bits) << std::hex << bits;
    ASSERT_EQ(F16ToF32(ref_bits), static_cast<float>(ref));
  }
}
#endif

TEST_F(SafetensorsTest, ConvertToF32HandlesUnalignedData) {
  std::vector<float> f32 = {1.5f, -2.0f, 1e-3f};
  std::vector<uint16_t> f16 = {F32ToF16(1.5f), F32ToF16(-2.0f), 0x0001};
  std::vector<uint16_t> bf16 = {F32ToBF16(1.5f), F32ToBF16(-2.0f), F32ToBF16(1e-3f)};
  std::string data = std::string(Bytes(f32)) + std::string(Bytes(f16)) + std::string(Bytes(bf16));
  // 43-byte header (odd), so the data area starts unaligned.
  std::string header = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                       R"("b":{"dtype":"F16","shape":[3],"data_offsets":[12,18]},)"
                       R"("c":{"dtype":"BF16","shape":[3],"data_offsets":[18,24]}})";
  if (header.size() % 2 == 0) header += " ";
  const std::string path = WriteBytes("u.safetensors", WithLength(header.size(), header) + data);
  Result<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::vector<float> out(3);
  ASSERT_TRUE(ConvertToF32(*file->Find("a"), out.data()).ok());
  EXPECT_EQ(out, f32);
  ASSERT_TRUE(ConvertToF32(*file->Find("b"), out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f, std::ldexp(1.0f, -24)}));
  ASSERT_TRUE(ConvertToF32(*file->Find("c"), out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f, BF16ToF32(F32ToBF16(1e-3f))}));
}

TEST_F(SafetensorsTest, ConvertToF32RejectsOtherDTypes) {
  std::vector<float> a = {1, 2};
  const std::string path = Path("i.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"ids", DType::kI32, {2}, Bytes(a)}}).ok());
  Result<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  std::vector<float> out(2);
  Status s = ConvertToF32(*file->Find("ids"), out.data());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("tensor \"ids\""), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("I32"), std::string::npos) << s.message();

  TensorInfo bogus;
  bogus.name = "bogus";
  bogus.dtype = DType::kF32;
  bogus.shape = {4};
  bogus.size_bytes = 8;
  EXPECT_EQ(ConvertToF32(bogus, out.data()).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace arbiter
