// The v1 KV file: round trip, atomic replacement, and every kind of bad file
// failing with a clear error (never a crash, never a partial snapshot).
#include "arbiter/kv/kv_file.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <xxhash.h>

#include "arbiter/base/file.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

KvSnapshot Sample(uint32_t n_layers = 2, uint32_t kv_dim = 8, int n_tokens = 5,
                  GgmlType kv_type = GgmlType::kF32) {
  KvSnapshot s;
  s.model_hash = "0123456789abcdef";
  s.n_layers = n_layers;
  s.kv_dim = kv_dim;
  s.kv_type = kv_type;
  for (int i = 0; i < n_tokens; ++i) s.tokens.push_back(100 + i);
  s.kv.resize(s.ExpectedKvBytes());
  for (size_t i = 0; i < s.kv.size(); ++i) s.kv[i] = static_cast<uint8_t>(i * 7 + 3);
  return s;
}

class KvFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/arbiter-kvfile-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/room-1.long.bin";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Bytes() {
    Result<std::string> b = ReadFile(path_);
    EXPECT_TRUE(b.ok());
    return b.ok() ? *b : std::string();
  }
  Result<KvSnapshot> Parse(const std::string& bytes, const std::string& model = "") {
    return ParseKvFile(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "f", model);
  }
  // Rewrites the trailing checksum so only the field under test is wrong.
  static void Reseal(std::string* bytes) {
    const uint64_t sum = XXH3_64bits(bytes->data(), bytes->size() - 8);
    std::memcpy(bytes->data() + bytes->size() - 8, &sum, 8);
  }

  std::string dir_, path_;
};

// A file written from per-layer rows anywhere in memory (a slot's cache,
// rows [0, n) of a longer buffer) is byte-identical to the snapshot's.
TEST_F(KvFileTest, WritingFromRowsInPlaceMakesTheSameFile) {
  const KvSnapshot s = Sample();
  ASSERT_TRUE(WriteKvFile(path_, s).ok());
  const std::string want = Bytes();
  // The rows inside a "slot" of 9 positions per layer, K then V.
  constexpr size_t kCtx = 9;
  const size_t n = s.n_tokens(), d = s.row_bytes();
  std::vector<uint8_t> slot(2 * s.n_layers * kCtx * d, 0xee);
  KvRowsView rows{s.n_layers, s.kv_dim, s.kv_type, s.tokens.data(), n, {}, {}};
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    uint8_t* k = slot.data() + 2 * l * kCtx * d;
    uint8_t* v = k + kCtx * d;
    std::copy_n(s.kv.data() + 2 * l * n * d, n * d, k);
    std::copy_n(s.kv.data() + (2 * l + 1) * n * d, n * d, v);
    rows.k.push_back(k);
    rows.v.push_back(v);
  }
  const std::string other = dir_ + "/rows.long.bin";
  ASSERT_TRUE(WriteKvFile(other, s.model_hash, rows).ok());
  EXPECT_EQ(ReadFile(other).value(), want);
  EXPECT_EQ(KvFileBytes(rows), KvFileBytes(s));
  rows.v.pop_back();
  EXPECT_EQ(WriteKvFile(other, s.model_hash, rows).code(), StatusCode::kInvalidArgument);
}

TEST_F(KvFileTest, RoundTrip) {
  const KvSnapshot s = Sample();
  ASSERT_TRUE(WriteKvFile(path_, s).ok());
  EXPECT_EQ(fs::file_size(path_), KvFileBytes(s));
  EXPECT_EQ(KvFileBytes(s), 64u + 4 * 5 + 8u * 2 * 5 * 8 + 8);
  // Owner-only, whatever the umask allows.
  EXPECT_EQ(fs::status(path_).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  Result<KvSnapshot> r = ReadKvFile(path_, "0123456789abcdef");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens, s.tokens);
  EXPECT_EQ(r->kv, s.kv);
  EXPECT_EQ(r->n_layers, 2u);
  EXPECT_EQ(r->kv_dim, 8u);
  EXPECT_EQ(r->n_tokens(), 5u);
  // An empty prefix is a valid file too.
  ASSERT_TRUE(WriteKvFile(path_, Sample(2, 8, 0)).ok());
  EXPECT_EQ(ReadKvFile(path_, "")->n_tokens(), 0u);
}

TEST_F(KvFileTest, AnInvalidSnapshotKeepsTheOldFileAndLeavesNoTemp) {
  ASSERT_TRUE(WriteKvFile(path_, Sample()).ok());
  const std::string before = Bytes();
  KvSnapshot bad = Sample();
  bad.kv.pop_back();
  EXPECT_EQ(WriteKvFile(path_, bad).code(), StatusCode::kInvalidArgument);
  bad = Sample();
  bad.model_hash = "short";
  EXPECT_EQ(WriteKvFile(path_, bad).code(), StatusCode::kInvalidArgument);
  bad = Sample();
  bad.tokens[1] = -1;
  EXPECT_EQ(WriteKvFile(path_, bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Bytes(), before);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    entries++;
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(KvFileTest, EveryTruncationIsDataLoss) {
  ASSERT_TRUE(WriteKvFile(path_, Sample()).ok());
  const std::string good = Bytes();
  for (size_t n = 0; n < good.size(); ++n) {
    Result<KvSnapshot> r = Parse(good.substr(0, n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << n;
  }
  Result<KvSnapshot> r = Parse(good.substr(0, good.size() - 3));
  EXPECT_TRUE(Contains(r.status().message(), "truncated")) << r.status().message();
  r = Parse(good + "x");
  EXPECT_TRUE(Contains(r.status().message(), "trailing bytes")) << r.status().message();
}

TEST_F(KvFileTest, AnyFlippedByteIsCaught) {
  ASSERT_TRUE(WriteKvFile(path_, Sample()).ok());
  const std::string good = Bytes();
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    Result<KvSnapshot> r = Parse(bad);
    EXPECT_FALSE(r.ok()) << "byte " << i;
  }
}

TEST_F(KvFileTest, EachHeaderFieldIsNamed) {
  ASSERT_TRUE(WriteKvFile(path_, Sample()).ok());
  const std::string good = Bytes();
  struct Case {
    size_t at;
    uint32_t value;
    const char* message;
  };
  for (const Case& c : {Case{0, 0x58585858, "bad magic"}, Case{8, 2, "version 2"},
                        Case{12, 2, "dtype 2 is not supported"},
                        Case{12, 8, "kv_dim 8 is not a multiple of q8_0's block"},
                        Case{12, 1, "trailing bytes"},  // f16 rows: half the bytes
                        Case{32, 5000, "over the format's bounds"},
                        Case{40, 6, "truncated"}}) {
    std::string bad = good;
    std::memcpy(bad.data() + c.at, &c.value, 4);
    Reseal(&bad);
    Result<KvSnapshot> r = Parse(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(r.status().message(), c.message)) << r.status().message();
  }
  std::string bad = good;
  const int32_t negative = -7;
  std::memcpy(bad.data() + 64 + 4, &negative, 4);
  Reseal(&bad);
  Result<KvSnapshot> r = Parse(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "negative id -7")) << r.status().message();
  bad = good;
  bad[70] ^= 1;
  r = Parse(bad);
  EXPECT_TRUE(Contains(r.status().message(), "checksum mismatch")) << r.status().message();
}

// MapKvFile reads the same arrays in place, outlives the file's
// replacement and removal, and refuses every bad file ReadKvFile refuses,
// with the same code.
TEST_F(KvFileTest, MapKvFileViewsTheSameArraysAndRefusesTheSameFiles) {
  const KvSnapshot s = Sample(3, 16, 7);
  ASSERT_TRUE(WriteKvFile(path_, s).ok());
  Result<MappedKvFile> m = MapKvFile(path_, "0123456789abcdef");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->model_hash(), "0123456789abcdef");
  EXPECT_EQ(m->path(), path_);
  const KvSnapshotView& v = m->view();
  EXPECT_EQ(v.n_layers, 3u);
  EXPECT_EQ(v.kv_dim, 16u);
  ASSERT_EQ(v.n_tokens, 7u);
  ASSERT_EQ(v.kv_bytes, s.kv.size());
  EXPECT_EQ(v.kv_type, GgmlType::kF32);
  EXPECT_EQ(std::vector<int32_t>(v.tokens, v.tokens + v.n_tokens), s.tokens);
  EXPECT_EQ(std::memcmp(v.kv, s.kv.data(), s.kv.size()), 0);
  // Replaced, then removed: the mapping keeps the data it validated.
  ASSERT_TRUE(WriteKvFile(path_, Sample(3, 16, 2)).ok());
  fs::remove(path_);
  EXPECT_EQ(std::memcmp(m->view().kv, s.kv.data(), s.kv.size()), 0);
  MappedKvFile moved = std::move(*m);
  EXPECT_EQ(moved.view().tokens[6], s.tokens[6]);

  // Every truncation and a flipped byte in each region: same codes as ReadKvFile.
  ASSERT_TRUE(WriteKvFile(path_, s).ok());
  const std::string good = Bytes();
  auto same_code = [&](const std::string& bytes, const std::string& what) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
    const Result<KvSnapshot> r = ReadKvFile(path_, "0123456789abcdef");
    const Result<MappedKvFile> mr = MapKvFile(path_, "0123456789abcdef");
    EXPECT_FALSE(mr.ok()) << what;
    EXPECT_EQ(mr.status().code(), r.status().code()) << what;
  };
  for (size_t n = 0; n < good.size(); n += 97) same_code(good.substr(0, n), "truncated");
  for (size_t at : {size_t{0}, size_t{20}, size_t{66}, size_t{200}, good.size() - 1}) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    same_code(bad, "byte " + std::to_string(at));
  }
  std::ofstream(path_, std::ios::binary | std::ios::trunc) << good;
  EXPECT_EQ(MapKvFile(path_, "fedcba9876543210").status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(MapKvFile(dir_ + "/nope.long.bin", "").status().code(), StatusCode::kNotFound);
}

// Every KV type round-trips through a file (by read and by map), the file
// records the type, and its size is the type's row bytes: f16 and bf16 half
// of f32, q8_0 34 bytes per 32 values.
TEST_F(KvFileTest, EveryKvTypeRoundTripsAndRecordsItsType) {
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
    SCOPED_TRACE(std::string(KvTypeName(t)));
    const KvSnapshot s = Sample(3, 64, 7, t);
    ASSERT_TRUE(WriteKvFile(path_, s).ok());
    const uint64_t per_value_x32 = t == GgmlType::kF32 ? 128 : t == GgmlType::kQ8_0 ? 34 : 64;
    EXPECT_EQ(KvFileBytes(s), 64u + 4 * 7 + 2 * 3 * 7 * 64 * per_value_x32 / 32 + 8);
    EXPECT_EQ(fs::file_size(path_), KvFileBytes(s));
    uint32_t dtype = 0;
    std::memcpy(&dtype, Bytes().data() + 12, 4);
    EXPECT_EQ(dtype, static_cast<uint32_t>(t));
    Result<KvSnapshot> r = ReadKvFile(path_, "0123456789abcdef", t);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->kv_type, t);
    EXPECT_EQ(r->kv, s.kv);
    Result<MappedKvFile> m = MapKvFile(path_, "0123456789abcdef", t);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->view().kv_type, t);
    ASSERT_EQ(m->view().kv_bytes, s.kv.size());
    EXPECT_EQ(std::memcmp(m->view().kv, s.kv.data(), s.kv.size()), 0);
  }
}

// A file of another KV type than the model's is foreign — including every
// f32 file written before KV types existed, read by an f16 model.
TEST_F(KvFileTest, AFileOfAnotherKvTypeIsForeign) {
  ASSERT_TRUE(WriteKvFile(path_, Sample(2, 32, 4, GgmlType::kF32)).ok());
  Result<KvSnapshot> r = ReadKvFile(path_, "0123456789abcdef", GgmlType::kF16);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(r.status().message(), "KV of type f32 is not usable by a model whose "
                                             "kv_type is f16 (foreign file)"))
      << r.status().message();
  EXPECT_EQ(MapKvFile(path_, "", GgmlType::kQ8_0).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ReadKvFile(path_, "", GgmlType::kF32).ok());
  EXPECT_TRUE(ReadKvFile(path_, "").ok());  // no expectation: any type
  // A snapshot whose type cannot hold its rows is refused before writing.
  KvSnapshot bad = Sample(2, 8, 4, GgmlType::kF32);
  bad.kv_type = GgmlType::kQ8_0;
  EXPECT_EQ(WriteKvFile(path_, bad).code(), StatusCode::kInvalidArgument);
  bad.kv_type = GgmlType::kQ4_0;
  EXPECT_EQ(WriteKvFile(path_, bad).code(), StatusCode::kInvalidArgument);
}

TEST_F(KvFileTest, ForeignModelAndMissingFile) {
  ASSERT_TRUE(WriteKvFile(path_, Sample()).ok());
  Result<KvSnapshot> r = ReadKvFile(path_, "fedcba9876543210");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(r.status().message(), "foreign")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), path_)) << r.status().message();
  EXPECT_EQ(ReadKvFile(dir_ + "/nope.long.bin", "").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace arbiter
