// Cache keys, slot ids, model hash, TTL classes, file names and the sweep:
// the reference's list (docs/kv-precache.md "Keys and names") and two of its
// fixed defects (docs/kv-precache.md "Defects of the reference, fixed": no
// slot count in the model hash; safe file names). Expected hashes were
// computed independently with Python's hashlib.
#include "arbiter/kv/cache_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

namespace fs = std::filesystem;

TEST(CacheKeyTest, PrecedenceConvThenSegThenPfxThenRawThenNone) {
  CacheKeyInputs in;
  in.conversation_id = "room-1";
  in.segments = {{"sys", true}, {"tools", true}, {"user", false}};
  in.prefix_hash = "abc";
  in.prompt_cache_key = "v5:xyz";
  EXPECT_EQ(ResolveCacheKey(in), "conv:room-1");
  in.conversation_id.clear();
  EXPECT_EQ(ResolveCacheKey(in), "seg:8e2d5596bb4d05ea");
  in.segments = {{"user", false}, {"sys", true}};  // first segment unstable: no hash
  EXPECT_EQ(ResolveCacheKey(in), "pfx:abc");
  in.prefix_hash.clear();
  EXPECT_EQ(ResolveCacheKey(in), "v5:xyz");
  in.prompt_cache_key.clear();
  EXPECT_EQ(ResolveCacheKey(in), std::nullopt);
}

TEST(CacheKeyTest, StablePrefixHashUsesTheSeparatorAndStopsAtTheFirstUnstable) {
  EXPECT_EQ(StablePrefixHash({{"sys", true}, {"tools", true}}), "8e2d5596bb4d05ea");
  // The same bytes split differently hash differently (the old copy's bug).
  EXPECT_NE(StablePrefixHash({{"abc", true}, {"def", true}}),
            StablePrefixHash({{"abcdef", true}}));
  EXPECT_EQ(StablePrefixHash({{"sys", true}, {"tools", true}, {"u", false}, {"late", true}}),
            StablePrefixHash({{"sys", true}, {"tools", true}}));
  EXPECT_EQ(StablePrefixHash({}), std::nullopt);
  EXPECT_EQ(StablePrefixHash({{"u", false}}), std::nullopt);
}

TEST(CacheKeyTest, DeriveSlotIdFollowsTheReferenceFormula) {
  EXPECT_EQ(DeriveSlotId("conv:room-1", 0), -1);
  EXPECT_EQ(DeriveSlotId("conv:room-1", -3), -1);
  EXPECT_EQ(DeriveSlotId("", 4), -1);
  EXPECT_EQ(DeriveSlotId("conv:room-1", 1), 0);
  // sha256("conv:room-1")[0..4] big-endian = 856252634.
  EXPECT_EQ(DeriveSlotId("conv:room-1", 4), 856252634 % 4);
  EXPECT_EQ(DeriveSlotId("conv:room-1", 7), 856252634 % 7);
  std::set<int> seen;
  for (int i = 0; i < 200; ++i) {
    const int s = DeriveSlotId("conv:" + std::to_string(i), 8);
    ASSERT_GE(s, 0);
    ASSERT_LT(s, 8);
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 8u);
}

TEST(CacheKeyTest, ModelHashIsTheReferenceHashWithoutTheSlotCount) {
  ModelHashInputs in{"qwen", "", "f32", "f32", ""};
  EXPECT_EQ(ModelHash(in), "5a6e6d09b0e5da63");
  // No slot count in the model hash (docs/kv-precache.md "Defects of the
  // reference, fixed"): nothing about parallel or ctx goes in, so resizing
  // keeps the directory; anything that changes the K/V bytes changes it.
  ModelHashInputs other = in;
  other.cache_type_k = "f16";
  EXPECT_NE(ModelHash(other), ModelHash(in));
  other = in;
  other.drafter = "tiny";
  EXPECT_NE(ModelHash(other), ModelHash(in));
  // Fields do not run into each other.
  EXPECT_NE(ModelHash({"ab", "c", "", "", ""}), ModelHash({"a", "bc", "", "", ""}));
}

TEST(CacheKeyTest, IsModelHashAcceptsOnlyTheHashShape) {
  EXPECT_TRUE(IsModelHash(ModelHash({"qwen", "", "f32", "f32", ""})));
  EXPECT_TRUE(IsModelHash("0123456789abcdef"));
  EXPECT_FALSE(IsModelHash(""));
  EXPECT_FALSE(IsModelHash("0123456789abcde"));     // 15
  EXPECT_FALSE(IsModelHash("0123456789abcdef0"));   // 17
  EXPECT_FALSE(IsModelHash("0123456789ABCDEF"));    // upper case
  EXPECT_FALSE(IsModelHash("0123456789abcdeg"));
  EXPECT_FALSE(IsModelHash("../../../../etc/x"));
  EXPECT_FALSE(IsModelHash(std::string_view("0123456789abcd\0f", 16)));
  EXPECT_FALSE(IsModelHash(std::string("0123456789abcde\0", 16)));
}

TEST(CacheKeyTest, TtlClassesAndWindows) {
  EXPECT_EQ(TtlMs(TtlClass::kShort), 300000);
  EXPECT_EQ(TtlMs(TtlClass::kLong), 3600000);
  EXPECT_EQ(TtlMs(TtlClass::kExtended), 86400000);
  EXPECT_EQ(TtlMs(TtlClass::kUnclassified), 3600000);
  TtlWindows w;
  w.extended_ms = 0;  // unset → long
  EXPECT_EQ(TtlMs(TtlClass::kExtended, w), 3600000);
  EXPECT_EQ(*ParseTtlClass("extended"), TtlClass::kExtended);
  Result<TtlClass> bad = ParseTtlClass("forever");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("short, long or extended"), std::string::npos);
}

TEST(CacheKeyTest, FileNamesCarryTheirTtlClass) {
  EXPECT_EQ(SlotCacheFileName("room-1", TtlClass::kShort), "room-1.short.bin");
  EXPECT_EQ(ParseSlotCacheTtlClass("room-1.short.bin"), TtlClass::kShort);
  EXPECT_EQ(ParseSlotCacheTtlClass("room-1.long.bin"), TtlClass::kLong);
  EXPECT_EQ(ParseSlotCacheTtlClass("a.b.extended.bin"), TtlClass::kExtended);
  EXPECT_EQ(ParseSlotCacheTtlClass("room-1.bin"), TtlClass::kUnclassified);
  EXPECT_EQ(ParseSlotCacheTtlClass("room-1"), TtlClass::kUnclassified);
  EXPECT_EQ(ParseSlotCacheTtlClass("room.with.dots.bin"), TtlClass::kUnclassified);
  EXPECT_EQ(ParseSlotCacheTtlClass(".bin"), TtlClass::kUnclassified);
}

// Safe file names (docs/kv-precache.md "Defects of the reference, fixed").
TEST(CacheKeyTest, SafeFileIdNeverLeavesTheDirectory) {
  EXPECT_EQ(SafeFileId("room-42"), "room-42");
  EXPECT_EQ(SafeFileId("Room_1"), "Room_1");
  EXPECT_EQ(SafeFileId("../../x"), "h-9cdf6a50100a862e14286c7a334296da");
  const std::string hostile[] = {"../../x", "/",          std::string("a\0b", 3),
                                 "..",      ".",          "",
                                 "a/b",     "-rf",        std::string(10000, 'a'),
                                 "h-abc",   "room 1",     "caf\xc3\xa9",
                                 "x.short", "\n",         "h-9cdf6a50100a862e14286c7a334296da"};
  std::set<std::string> outs;
  for (const std::string& id : hostile) {
    const std::string safe = SafeFileId(id);
    EXPECT_EQ(safe.find('/'), std::string::npos) << id;
    EXPECT_EQ(safe.find('.'), std::string::npos) << id;
    EXPECT_EQ(safe.find('\0'), std::string::npos) << id;
    EXPECT_LE(safe.size(), 64u) << id;
    EXPECT_FALSE(safe.empty());
    EXPECT_EQ(fs::path(SlotCacheFileName(safe, TtlClass::kLong)).parent_path(), "") << id;
    outs.insert(safe);
  }
  EXPECT_EQ(outs.size(), std::size(hostile));  // distinct ids, distinct names
}

class SweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/arbiter-kv-sweep-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // A file whose mtime is `age_ms` before `now_ms`.
  void File(const std::string& name, int64_t age_ms) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << "kv";
    const int64_t t = now_ms_ - age_ms;
    struct timespec ts[2];
    ts[0].tv_sec = ts[1].tv_sec = t / 1000;
    ts[0].tv_nsec = ts[1].tv_nsec = (t % 1000) * 1000000;
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), ts, 0), 0);
  }
  bool Exists(const std::string& name) { return fs::exists(dir_ + "/" + name); }

  std::string dir_;
  const int64_t now_ms_ = 1800000000000;  // a fixed wall-clock instant
};

TEST_F(SweepTest, DeletesFilesPastTheirClassWindowOnly) {
  File("a.short.bin", 301000);    // past 5 min
  File("b.short.bin", 100000);    // within
  File("c.long.bin", 3700000);    // past 60 min
  File("d.long.bin", 3500000);    // within
  File("e.extended.bin", 3700000);  // within 24 h
  File("f.bin", 3700000);         // unclassified: long window, past
  File("g.bin", 301000);          // unclassified, within long
  fs::create_directory(dir_ + "/sub.short.bin");
  fs::create_symlink(dir_ + "/b.short.bin", dir_ + "/link.short.bin");
  Result<int> n = SweepExpiredKvFiles(dir_, now_ms_);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 3);
  EXPECT_FALSE(Exists("a.short.bin"));
  EXPECT_TRUE(Exists("b.short.bin"));
  EXPECT_FALSE(Exists("c.long.bin"));
  EXPECT_TRUE(Exists("d.long.bin"));
  EXPECT_TRUE(Exists("e.extended.bin"));
  EXPECT_FALSE(Exists("f.bin"));
  EXPECT_TRUE(Exists("g.bin"));
  EXPECT_TRUE(fs::is_directory(dir_ + "/sub.short.bin"));
  EXPECT_TRUE(fs::is_symlink(dir_ + "/link.short.bin"));
  // Configurable windows.
  TtlWindows w;
  w.long_ms = 1000;
  n = SweepExpiredKvFiles(dir_, now_ms_, w);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2);  // d.long.bin and g.bin
}

TEST_F(SweepTest, MissingDirectoryIsZero) {
  Result<int> n = SweepExpiredKvFiles(dir_ + "/nope", now_ms_);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
}

}  // namespace
}  // namespace arbiter
