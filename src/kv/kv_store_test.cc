// KvStore, the disk tier: real files under a per-test temp dir, ages driven
// by a SimulatedClock on the wall-clock timeline (file mtimes are set
// relative to it).
#include "arbiter/kv/kv_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "arbiter/base/file.h"
#include "arbiter/kv/kv_file.h"
#include "kv/internal/test_fuse.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

constexpr char kHash[] = "0123456789abcdef";
constexpr char kOtherHash[] = "fedcba9876543210";
constexpr int64_t kNowMs = 1'800'000'000'000;  // a fixed wall-clock instant (2027)
constexpr int64_t kMinuteMs = 60'000;

bool Has(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// A consistent f32 snapshot whose every token is `version` and every K/V
// byte (version + its index) mod 256, so a reader can tell a whole
// snapshot from a mix.
KvSnapshot Snap(int n_tokens = 4, int32_t version = 7, const std::string& hash = kHash) {
  KvSnapshot s;
  s.model_hash = hash;
  s.n_layers = 2;
  s.kv_dim = 3;
  s.tokens.assign(static_cast<size_t>(n_tokens), version);
  s.kv.resize(s.ExpectedKvBytes());
  for (size_t i = 0; i < s.kv.size(); ++i) s.kv[i] = static_cast<uint8_t>(version + i);
  return s;
}

bool IsWhole(const KvSnapshot& s) {
  if (s.tokens.empty()) return false;
  const int32_t v = s.tokens[0];
  for (int32_t t : s.tokens) {
    if (t != v) return false;
  }
  if (s.kv.size() != s.ExpectedKvBytes()) return false;
  for (size_t i = 0; i < s.kv.size(); ++i) {
    if (s.kv[i] != static_cast<uint8_t>(v + i)) return false;
  }
  return true;
}

void SetMtime(const std::string& path, int64_t unix_ms) {
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = unix_ms / 1000;
  ts[0].tv_nsec = ts[1].tv_nsec = (unix_ms % 1000) * 1000000;
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), ts, AT_SYMLINK_NOFOLLOW), 0) << path;
}

int64_t MtimeMs(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
}

class KvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/arbiter-kvstore-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/kv";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  std::unique_ptr<KvStore> OpenStore(uint64_t disk_budget = 0) {
    KvStoreOptions o;
    o.dir = dir_;
    o.disk_budget = disk_budget;
    o.clock = &clock_;
    Result<std::unique_ptr<KvStore>> s = KvStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string ModelDir(const std::string& hash = kHash) { return dir_ + "/" + hash; }
  // The *.bin names under the model dir.
  std::set<std::string> Files(const std::string& hash = kHash) {
    std::set<std::string> out;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(ModelDir(hash), ec)) {
      out.insert(e.path().filename().string());
    }
    return out;
  }

  SimulatedClock clock_{kNowMs};
  std::string root_, dir_;
};

TEST_F(KvStoreTest, SaveLoadRoundTripIsExact) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const KvSnapshot s = Snap(5, 42);
  Result<uint64_t> n = store->Save("room-1", TtlClass::kLong, s);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  const std::string path = store->PathFor(kHash, "room-1", TtlClass::kLong);
  EXPECT_EQ(path, ModelDir() + "/room-1.long.bin");
  EXPECT_EQ(*n, KvFileBytes(s));
  EXPECT_EQ(fs::file_size(path), *n);
  EXPECT_EQ(MtimeMs(path), kNowMs);  // stamped from the clock
  EXPECT_TRUE(store->Contains(kHash, "room-1"));
  EXPECT_FALSE(store->Contains(kHash, "room-2"));
  EXPECT_FALSE(store->Contains(kOtherHash, "room-1"));

  Result<KvLoadResult> r = store->Load(kHash, "room-1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->snapshot.model_hash, kHash);
  EXPECT_EQ(r->snapshot.n_layers, s.n_layers);
  EXPECT_EQ(r->snapshot.kv_dim, s.kv_dim);
  EXPECT_EQ(r->snapshot.tokens, s.tokens);
  EXPECT_EQ(r->snapshot.kv, s.kv);
  EXPECT_EQ(r->ttl_class, TtlClass::kLong);
  EXPECT_EQ(r->path, path);
  // Load does not consume the file.
  EXPECT_TRUE(store->Load(kHash, "room-1").ok());
  EXPECT_EQ(store->DiskBytes(), *n);
  EXPECT_EQ(store->Load(kHash, "room-2").status().code(), StatusCode::kNotFound);
}

TEST_F(KvStoreTest, OpenCreatesTheDirectoryPrivateAndNamesItInErrors) {
  dir_ = root_ + "/a/b/kv";
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->dir(), dir_);
  for (const std::string& d : {root_ + "/a", root_ + "/a/b", dir_}) {
    struct stat st {};
    ASSERT_EQ(stat(d.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << d;
  }
  // A trailing slash names the same directory.
  KvStoreOptions o;
  o.dir = dir_ + "/";
  Result<std::unique_ptr<KvStore>> again = KvStore::Open(o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->dir(), dir_);

  std::ofstream(root_ + "/file") << "x";
  o.dir = root_ + "/file";
  Result<std::unique_ptr<KvStore>> bad = KvStore::Open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(bad.status().message(), root_ + "/file")) << bad.status().message();
  o.dir = root_ + "/file/sub";
  bad = KvStore::Open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Has(bad.status().message(), root_ + "/file/sub")) << bad.status().message();
  o.dir = "";
  EXPECT_EQ(KvStore::Open(o).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(KvStoreTest, PathForNeverLeavesTheModelDirectoryAndRoundTrips) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> ids = {"../../x",
                                        "/",
                                        "a/b",
                                        std::string("a\0b", 3),
                                        std::string(10000, 'x'),
                                        ".",
                                        "..",
                                        "",
                                        "h-1234",
                                        "-rf",
                                        "room-1",
                                        "a_b",
                                        "é",
                                        "x.long",
                                        "..\\..\\x"};
  const fs::path model_dir = fs::path(ModelDir()).lexically_normal();
  std::set<std::string> paths;
  int32_t version = 1;
  for (const std::string& id : ids) {
    for (TtlClass t :
         {TtlClass::kShort, TtlClass::kLong, TtlClass::kExtended, TtlClass::kUnclassified}) {
      const fs::path p = fs::path(store->PathFor(kHash, id, t)).lexically_normal();
      EXPECT_EQ(p.parent_path(), model_dir) << "id of " << id.size() << " bytes";
      const std::string name = p.filename().string();
      EXPECT_NE(name, ".");
      EXPECT_NE(name, "..");
      EXPECT_EQ(name.find('/'), std::string::npos);
      EXPECT_EQ(name.find('\0'), std::string::npos);
      EXPECT_LE(name.size(), 64u + std::string_view(".extended.bin").size());
      EXPECT_EQ(ParseSlotCacheTtlClass(name), t);
    }
    // Written where PathFor says, read back by the same id.
    ASSERT_TRUE(store->Save(id, TtlClass::kShort, Snap(3, version)).ok());
    const std::string path = store->PathFor(kHash, id, TtlClass::kShort);
    ASSERT_TRUE(fs::is_regular_file(path));
    EXPECT_EQ(fs::canonical(path).parent_path(), fs::canonical(model_dir));
    paths.insert(path);
    Result<KvLoadResult> r = store->Load(kHash, id);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->snapshot.tokens[0], version);
    EXPECT_EQ(r->path, path);
    version++;
  }
  EXPECT_EQ(paths.size(), ids.size());  // no two ids share a file
  // Nothing was written anywhere but the model directory.
  size_t entries = 0;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root_)) {
    if (e.is_regular_file()) {
      EXPECT_EQ(e.path().parent_path(), model_dir) << e.path();
      entries++;
    }
  }
  EXPECT_EQ(entries, ids.size());
}

TEST_F(KvStoreTest, InvalidModelHashOrClassIsRejected) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  for (std::string bad : {"", "../../../../tmp", "0123456789ABCDEF", "0123456789abcde",
                          "0123456789abcdef0", "..", "0123456789abcde/"}) {
    Result<uint64_t> s = store->Save("room-1", TtlClass::kLong, Snap(2, 1, bad));
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(store->Load(bad, "room-1").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->PathFor(bad, "room-1", TtlClass::kLong), "");
    EXPECT_FALSE(store->Contains(bad, "room-1"));
    EXPECT_EQ(store->Remove(bad, "room-1"), 0);
    store->Touch(bad, "room-1");
  }
  Result<uint64_t> s = store->Save("room-1", TtlClass::kUnclassified, Snap());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  KvSnapshot inconsistent = Snap();
  inconsistent.kv.pop_back();
  EXPECT_EQ(store->Save("room-1", TtlClass::kLong, inconsistent).status().code(),
            StatusCode::kInvalidArgument);
  // Nothing was created.
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(KvStoreTest, SavingAClassRemovesTheConversationsOtherClasses) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("room-1", TtlClass::kShort, Snap(2, 1)).ok());
  ASSERT_TRUE(store->Save("room-2", TtlClass::kShort, Snap(2, 9)).ok());
  // An unclassified file of the same conversation (an older layout).
  ASSERT_TRUE(WriteKvFile(ModelDir() + "/room-1.bin", Snap(2, 3)).ok());
  ASSERT_TRUE(store->Save("room-1", TtlClass::kLong, Snap(2, 2)).ok());
  EXPECT_EQ(Files(), (std::set<std::string>{"room-1.long.bin", "room-2.short.bin"}));
  Result<KvLoadResult> r = store->Load(kHash, "room-1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ttl_class, TtlClass::kLong);
  EXPECT_EQ(r->snapshot.tokens[0], 2);
  ASSERT_TRUE(store->Save("room-1", TtlClass::kExtended, Snap(2, 4)).ok());
  EXPECT_EQ(Files(), (std::set<std::string>{"room-1.extended.bin", "room-2.short.bin"}));
  EXPECT_EQ(store->Remove(kHash, "room-1"), 1);
  EXPECT_EQ(store->Remove(kHash, "room-1"), 0);
  EXPECT_EQ(Files(), (std::set<std::string>{"room-2.short.bin"}));
}

TEST_F(KvStoreTest, LoadPicksTheNewestFileAndReadsUnclassifiedOnes) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("room-1", TtlClass::kLong, Snap(2, 1)).ok());
  // Files of other classes, as a crash between the rename and the cleanup
  // could leave them.
  const std::string shorter = ModelDir() + "/room-1.short.bin";
  const std::string plain = ModelDir() + "/room-1.bin";
  ASSERT_TRUE(WriteKvFile(shorter, Snap(2, 2)).ok());
  ASSERT_TRUE(WriteKvFile(plain, Snap(2, 3)).ok());
  SetMtime(ModelDir() + "/room-1.long.bin", kNowMs - 3000);
  SetMtime(shorter, kNowMs - 1000);
  SetMtime(plain, kNowMs - 2000);
  Result<KvLoadResult> r = store->Load(kHash, "room-1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->snapshot.tokens[0], 2);
  EXPECT_EQ(r->ttl_class, TtlClass::kShort);
  SetMtime(plain, kNowMs);
  r = store->Load(kHash, "room-1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->snapshot.tokens[0], 3);
  EXPECT_EQ(r->ttl_class, TtlClass::kUnclassified);
  EXPECT_EQ(r->path, plain);
  // LoadMapped picks the same file.
  Result<KvMappedLoadResult> m = store->LoadMapped(kHash, "room-1");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->file.view().tokens[0], 3);
  EXPECT_EQ(m->ttl_class, TtlClass::kUnclassified);
  EXPECT_EQ(m->file.path(), plain);
  EXPECT_EQ(store->Remove(kHash, "room-1"), 3);
  EXPECT_EQ(m->file.view().tokens[0], 3) << "a removed file stays mapped";
}

TEST_F(KvStoreTest, LoadMappedViewsWhatLoadCopies) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const KvSnapshot s = Snap(5, 42);
  ASSERT_TRUE(store->Save("room-1", TtlClass::kLong, s).ok());
  Result<KvMappedLoadResult> m = store->LoadMapped(kHash, "room-1");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->file.model_hash(), kHash);
  EXPECT_EQ(m->ttl_class, TtlClass::kLong);
  const KvSnapshotView& v = m->file.view();
  EXPECT_EQ(v.n_layers, s.n_layers);
  EXPECT_EQ(v.kv_dim, s.kv_dim);
  EXPECT_EQ(std::vector<int32_t>(v.tokens, v.tokens + v.n_tokens), s.tokens);
  EXPECT_EQ(KvBytes(v.kv, v.kv + v.kv_bytes), s.kv);
  // A save over it while mapped: the mapping keeps the old data.
  ASSERT_TRUE(store->Save("room-1", TtlClass::kLong, Snap(5, 43)).ok());
  EXPECT_EQ(KvBytes(v.kv, v.kv + v.kv_bytes), s.kv);
  EXPECT_EQ(store->LoadMapped(kHash, "room-2").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->LoadMapped("../etc", "room-1").status().code(), StatusCode::kInvalidArgument);
}

class KvStoreCorruptTest : public KvStoreTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(KvStoreCorruptTest, LoadOfABadFileFailsAndRemovesIt) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("room-1", TtlClass::kLong, Snap(6, 5)).ok());
  const std::string path = store->PathFor(kHash, "room-1", TtlClass::kLong);
  StatusCode want = StatusCode::kDataLoss;
  std::string problem;
  Result<std::string> bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  if (GetParam() == "truncated") {
    ASSERT_TRUE(WriteFileAtomic(path, bytes->substr(0, bytes->size() - 13)).ok());
    problem = "truncated";
  } else if (GetParam() == "flipped") {
    std::string b = *bytes;
    b[kKvFileHeaderBytes + 9] ^= 0x10;
    ASSERT_TRUE(WriteFileAtomic(path, b).ok());
    problem = "checksum";
  } else if (GetParam() == "empty") {
    ASSERT_TRUE(WriteFileAtomic(path, "").ok());
    problem = "too short";
  } else {  // another model's KV under this model's directory
    ASSERT_TRUE(WriteKvFile(path, Snap(6, 5, kOtherHash)).ok());
    want = StatusCode::kFailedPrecondition;
    problem = "foreign";
  }
  SetMtime(path, kNowMs);  // the rewrite stamped the real time
  Result<KvLoadResult> r = store->Load(kHash, "room-1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), want) << r.status().ToString();
  EXPECT_TRUE(Has(r.status().message(), path)) << r.status().message();
  EXPECT_TRUE(Has(r.status().message(), problem)) << r.status().message();
  EXPECT_TRUE(Has(r.status().message(), "removed")) << r.status().message();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(store->Contains(kHash, "room-1"));
  EXPECT_EQ(store->Load(kHash, "room-1").status().code(), StatusCode::kNotFound);
}

TEST_P(KvStoreCorruptTest, LoadMappedOfABadFileFailsAndRemovesIt) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("room-1", TtlClass::kLong, Snap(6, 5)).ok());
  const std::string path = store->PathFor(kHash, "room-1", TtlClass::kLong);
  StatusCode want = StatusCode::kDataLoss;
  Result<std::string> bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  if (GetParam() == "truncated") {
    ASSERT_TRUE(WriteFileAtomic(path, bytes->substr(0, bytes->size() - 13)).ok());
  } else if (GetParam() == "flipped") {
    std::string b = *bytes;
    b[kKvFileHeaderBytes + 9] ^= 0x10;
    ASSERT_TRUE(WriteFileAtomic(path, b).ok());
  } else if (GetParam() == "empty") {
    ASSERT_TRUE(WriteFileAtomic(path, "").ok());
  } else {
    ASSERT_TRUE(WriteKvFile(path, Snap(6, 5, kOtherHash)).ok());
    want = StatusCode::kFailedPrecondition;
  }
  SetMtime(path, kNowMs);
  Result<KvMappedLoadResult> r = store->LoadMapped(kHash, "room-1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), want) << r.status().ToString();
  EXPECT_TRUE(Has(r.status().message(), "removed")) << r.status().message();
  EXPECT_FALSE(fs::exists(path));
}

INSTANTIATE_TEST_SUITE_P(BadFiles, KvStoreCorruptTest,
                         ::testing::Values("truncated", "flipped", "empty", "foreign"));

TEST_F(KvStoreTest, AnExpiredFileIsNotFoundAndRemoved) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("s", TtlClass::kShort, Snap()).ok());
  ASSERT_TRUE(store->Save("l", TtlClass::kLong, Snap()).ok());
  clock_.AdvanceMs(5 * kMinuteMs);  // exactly the window: still valid (age > window expires)
  EXPECT_TRUE(store->Contains(kHash, "s"));
  clock_.AdvanceMs(1);
  EXPECT_FALSE(store->Contains(kHash, "s"));
  EXPECT_TRUE(fs::exists(ModelDir() + "/s.short.bin"));  // Contains does not remove
  Result<KvLoadResult> r = store->Load(kHash, "s");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(ModelDir() + "/s.short.bin"));
  EXPECT_TRUE(store->Load(kHash, "l").ok());
}

TEST_F(KvStoreTest, TouchKeepsAFileAlive) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("s", TtlClass::kShort, Snap()).ok());
  clock_.AdvanceMs(4 * kMinuteMs);
  store->Touch(kHash, "s");
  EXPECT_EQ(MtimeMs(ModelDir() + "/s.short.bin"), clock_.NowUnixMs());
  clock_.AdvanceMs(4 * kMinuteMs);  // 8 min after the save, 4 after the touch
  EXPECT_TRUE(store->Load(kHash, "s").ok());
  store->Touch(kHash, "nobody");  // no file: nothing happens
  EXPECT_EQ(Files(), (std::set<std::string>{"s.short.bin"}));
}

TEST_F(KvStoreTest, SweepExpiresByClassOnTheSimulatedClock) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("s", TtlClass::kShort, Snap()).ok());
  ASSERT_TRUE(store->Save("l", TtlClass::kLong, Snap()).ok());
  ASSERT_TRUE(store->Save("e", TtlClass::kExtended, Snap()).ok());
  ASSERT_TRUE(WriteKvFile(ModelDir() + "/u.bin", Snap()).ok());  // unclassified: the long window
  SetMtime(ModelDir() + "/u.bin", kNowMs);
  ASSERT_TRUE(store->Save("o", TtlClass::kShort, Snap(4, 7, kOtherHash)).ok());
  const uint64_t one = KvFileBytes(Snap());

  clock_.AdvanceMs(4 * kMinuteMs);
  KvSweepResult r = store->Sweep();
  EXPECT_EQ(r.expired, 0);

  clock_.AdvanceMs(2 * kMinuteMs);  // +6 min
  r = store->Sweep();
  EXPECT_EQ(r.expired, 2);  // s in both model directories
  EXPECT_EQ(r.over_budget, 0);
  EXPECT_EQ(r.bytes_freed, 2 * one);
  EXPECT_EQ(Files(), (std::set<std::string>{"l.long.bin", "e.extended.bin", "u.bin"}));
  EXPECT_TRUE(Files(kOtherHash).empty());

  clock_.AdvanceMs(55 * kMinuteMs);  // +61 min
  r = store->Sweep();
  EXPECT_EQ(r.expired, 2);  // l and u
  EXPECT_EQ(Files(), (std::set<std::string>{"e.extended.bin"}));

  clock_.AdvanceMs(23 * 60 * kMinuteMs);  // +24 h 1 min
  r = store->Sweep();
  EXPECT_EQ(r.expired, 1);
  EXPECT_TRUE(Files().empty());
  EXPECT_EQ(store->Sweep().expired, 0);
}

TEST_F(KvStoreTest, SweepUsesTheConfiguredWindows) {
  KvStoreOptions o;
  o.dir = dir_;
  o.clock = &clock_;
  o.ttl.short_ms = 1000;
  o.ttl.extended_ms = 0;  // unset → long
  Result<std::unique_ptr<KvStore>> store = KvStore::Open(o);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Save("s", TtlClass::kShort, Snap()).ok());
  ASSERT_TRUE((*store)->Save("e", TtlClass::kExtended, Snap()).ok());
  clock_.AdvanceMs(1001);
  EXPECT_EQ((*store)->Sweep().expired, 1);
  clock_.AdvanceMs(60 * kMinuteMs);
  EXPECT_EQ((*store)->Sweep().expired, 1);
}

TEST_F(KvStoreTest, SweepRemovesStaleTempFilesOnly) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("a", TtlClass::kLong, Snap()).ok());
  const std::string stale = ModelDir() + "/b.long.bin.tmp.4242.0";
  const std::string fresh = ModelDir() + "/c.long.bin.tmp.4242.1";
  const std::string other = ModelDir() + "/notes.txt";
  const std::string odd = ModelDir() + "/d.long.bin.tmp.x.1";
  for (const std::string& p : {stale, fresh, other, odd}) {
    std::ofstream(p) << "partial";
    SetMtime(p, kNowMs - 2 * kMinuteMs);
  }
  SetMtime(fresh, kNowMs - 30000);
  // Temp files are not the store's *.bin files.
  EXPECT_EQ(store->List().size(), 1u);
  EXPECT_EQ(store->DiskBytes(), KvFileBytes(Snap()));
  KvSweepResult r = store->Sweep();
  EXPECT_EQ(r.stale_temp, 1);
  EXPECT_EQ(r.expired, 0);
  EXPECT_EQ(r.bytes_freed, 0u);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(odd));
  // Files of other kinds are never the store's, however old.
  clock_.AdvanceMs(48 * 60 * kMinuteMs);
  r = store->Sweep();
  EXPECT_EQ(r.expired, 1);
  EXPECT_EQ(r.stale_temp, 1);
  EXPECT_EQ(Files(), (std::set<std::string>{"notes.txt", "d.long.bin.tmp.x.1"}));
}

// A process killed mid-save leaves its temp file; the next Open removes it
// at once (its writer is gone), but never a temp of a live process.
TEST_F(KvStoreTest, OpenRemovesTempFilesOfWritersThatAreGone) {
  ASSERT_NE(OpenStore(), nullptr);  // creates the dir
  fs::create_directories(ModelDir());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: the pid is gone
  const std::string dead = ModelDir() + "/a.short.bin.tmp." + std::to_string(child) + ".0";
  const std::string live = ModelDir() + "/b.short.bin.tmp." + std::to_string(getppid()) + ".0";
  for (const std::string& p : {dead, live}) std::ofstream(p) << "partial";
  ASSERT_NE(OpenStore(), nullptr);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
}

TEST_F(KvStoreTest, DiskBudgetEvictsOldestFirst) {
  const uint64_t one = KvFileBytes(Snap());
  auto store = OpenStore(3 * one + one / 2);  // room for three files
  ASSERT_NE(store, nullptr);
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(store->Save(id, TtlClass::kLong, Snap()).ok());
    clock_.AdvanceMs(1000);
  }
  EXPECT_EQ(store->DiskBytes(), 3 * one);
  ASSERT_TRUE(store->Save("d", TtlClass::kLong, Snap()).ok());
  EXPECT_EQ(Files(), (std::set<std::string>{"b.long.bin", "c.long.bin", "d.long.bin"}));
  clock_.AdvanceMs(1000);
  store->Touch(kHash, "b");  // now newer than c and d
  clock_.AdvanceMs(1000);
  ASSERT_TRUE(store->Save("e", TtlClass::kShort, Snap()).ok());
  EXPECT_EQ(Files(), (std::set<std::string>{"b.long.bin", "d.long.bin", "e.short.bin"}));
  // Budgets are over the whole dir: other models' files count and go too.
  clock_.AdvanceMs(1000);
  ASSERT_TRUE(store->Save("f", TtlClass::kLong, Snap(4, 7, kOtherHash)).ok());
  EXPECT_EQ(Files(), (std::set<std::string>{"b.long.bin", "e.short.bin"}));
  EXPECT_EQ(Files(kOtherHash), (std::set<std::string>{"f.long.bin"}));
  EXPECT_LE(store->DiskBytes(), store->disk_budget());

  // A smaller budget (a restart with a new [kv] disk_budget): Sweep enforces
  // it, oldest first, and counts.
  KvStoreOptions o;
  o.dir = dir_;
  o.clock = &clock_;
  o.disk_budget = one;
  Result<std::unique_ptr<KvStore>> small = KvStore::Open(o);
  ASSERT_TRUE(small.ok());
  KvSweepResult r = (*small)->Sweep();
  EXPECT_EQ(r.expired, 0);
  EXPECT_EQ(r.over_budget, 2);
  EXPECT_EQ(r.bytes_freed, 2 * one);
  EXPECT_TRUE(Files().empty());
  EXPECT_EQ(Files(kOtherHash), (std::set<std::string>{"f.long.bin"}));
}

TEST_F(KvStoreTest, AFileLargerThanTheBudgetIsNotKept) {
  const uint64_t small = KvFileBytes(Snap(2));
  auto store = OpenStore(small);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("room-1", TtlClass::kLong, Snap(2)).ok());
  ASSERT_TRUE(store->Save("room-2", TtlClass::kLong, Snap(1)).ok());  // evicts room-1
  EXPECT_EQ(Files(), (std::set<std::string>{"room-2.long.bin"}));
  Result<uint64_t> r = store->Save("room-2", TtlClass::kShort, Snap(3));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Has(r.status().message(), "disk_budget")) << r.status().message();
  // Nothing of room-2 is left: its older state is gone too.
  EXPECT_TRUE(Files().empty());
  EXPECT_EQ(store->Load(kHash, "room-2").status().code(), StatusCode::kNotFound);
}

TEST_F(KvStoreTest, SymlinksAndOtherEntriesAreNeverFollowedOrDeleted) {
  auto store = OpenStore(1);  // a budget nothing fits: everything the store owns is evictable
  ASSERT_NE(store, nullptr);
  // Outside the store: a valid KV file and a directory of them.
  const std::string outside = root_ + "/outside.long.bin";
  ASSERT_TRUE(WriteKvFile(outside, Snap()).ok());
  fs::create_directories(root_ + "/elsewhere");
  ASSERT_TRUE(WriteKvFile(root_ + "/elsewhere/x.short.bin", Snap()).ok());
  SetMtime(outside, kNowMs - 48 * 60 * kMinuteMs);
  SetMtime(root_ + "/elsewhere/x.short.bin", kNowMs - 48 * 60 * kMinuteMs);

  fs::create_directories(ModelDir());
  fs::create_symlink(outside, ModelDir() + "/victim.long.bin");
  fs::create_directory(ModelDir() + "/dir.short.bin");
  fs::create_directory_symlink(root_ + "/elsewhere", dir_ + "/" + kOtherHash);

  EXPECT_FALSE(store->Contains(kHash, "victim"));
  EXPECT_EQ(store->Load(kHash, "victim").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->Remove(kHash, "victim"), 0);
  store->Touch(kHash, "victim");
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(store->DiskBytes(), 0u);
  clock_.AdvanceMs(48 * 60 * kMinuteMs);
  KvSweepResult r = store->Sweep();
  EXPECT_EQ(r.expired + r.over_budget + r.stale_temp, 0);
  EXPECT_TRUE(fs::is_symlink(ModelDir() + "/victim.long.bin"));
  EXPECT_TRUE(fs::is_directory(ModelDir() + "/dir.short.bin"));
  EXPECT_TRUE(fs::exists(outside));
  EXPECT_EQ(MtimeMs(outside), kNowMs - 48 * 60 * kMinuteMs);  // not touched through the link
  EXPECT_TRUE(fs::exists(root_ + "/elsewhere/x.short.bin"));
  // A save into a model directory that is a symlink is refused.
  Result<uint64_t> s = store->Save("x", TtlClass::kShort, Snap(1, 1, kOtherHash));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s.status().message(), dir_ + "/" + kOtherHash)) << s.status().message();
}

TEST_F(KvStoreTest, ListDescribesEveryFile) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save("b", TtlClass::kShort, Snap(2)).ok());
  clock_.AdvanceMs(1500);
  ASSERT_TRUE(store->Save("a", TtlClass::kExtended, Snap(3)).ok());
  ASSERT_TRUE(store->Save("z", TtlClass::kLong, Snap(1, 7, kOtherHash)).ok());
  ASSERT_TRUE(WriteKvFile(ModelDir() + "/c.bin", Snap(1)).ok());
  SetMtime(ModelDir() + "/c.bin", clock_.NowUnixMs() - 250);
  fs::create_directories(dir_ + "/not-a-model-hash");
  ASSERT_TRUE(WriteKvFile(dir_ + "/not-a-model-hash/q.long.bin", Snap(1)).ok());
  std::ofstream(dir_ + "/top.long.bin") << "x";
  clock_.AdvanceMs(100);

  std::vector<KvFileInfo> list = store->List();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].model_hash, kHash);
  EXPECT_EQ(list[0].file_name, "a.extended.bin");
  EXPECT_EQ(list[0].ttl_class, TtlClass::kExtended);
  EXPECT_EQ(list[0].bytes, KvFileBytes(Snap(3)));
  EXPECT_EQ(list[0].age_ms, 100);
  EXPECT_EQ(list[1].file_name, "b.short.bin");
  EXPECT_EQ(list[1].ttl_class, TtlClass::kShort);
  EXPECT_EQ(list[1].bytes, KvFileBytes(Snap(2)));
  EXPECT_EQ(list[1].age_ms, 1600);
  EXPECT_EQ(list[2].file_name, "c.bin");
  EXPECT_EQ(list[2].ttl_class, TtlClass::kUnclassified);
  EXPECT_EQ(list[2].age_ms, 350);
  EXPECT_EQ(list[3].model_hash, kOtherHash);
  EXPECT_EQ(list[3].file_name, "z.long.bin");
  EXPECT_EQ(list[3].ttl_class, TtlClass::kLong);
  uint64_t total = 0;
  for (const KvFileInfo& f : list) total += f.bytes;
  EXPECT_EQ(store->DiskBytes(), total);
}

// Saves, loads, removes, touches and sweeps from 4 threads over shared and
// private ids, with a budget that keeps evicting. A Load sees a whole
// snapshot or nothing — never a corrupt or mixed file — and nothing is left
// behind (temp files, two classes of one conversation).
TEST_F(KvStoreTest, ConcurrentSaveLoadRemoveSweep) {
  const uint64_t one = KvFileBytes(Snap(8));
  auto store = OpenStore(6 * one);
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 4;
  constexpr int kOps = 120;
  std::atomic<int> loads_ok{0}, bad{0};
  testing_internal::RunWithFuse("concurrent store operations", std::chrono::seconds(120), [&] {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(1234 + t);
        const std::string mine = "own-" + std::to_string(t);
        for (int i = 0; i < kOps; ++i) {
          const std::string id = (rng() % 2 == 0) ? "shared" : (rng() % 2 == 0 ? mine : "h-é/..");
          const TtlClass ttl = static_cast<TtlClass>(rng() % 3);
          switch (rng() % 8) {
            case 0:
            case 1:
            case 2: {
              Result<uint64_t> s = store->Save(id, ttl, Snap(8, t * 1000 + i));
              if (!s.ok()) bad++;
              break;
            }
            case 3:
            case 4: {
              Result<KvLoadResult> r = store->Load(kHash, id);
              if (r.ok()) {
                loads_ok++;
                if (!IsWhole(r->snapshot)) bad++;
              } else if (r.status().code() != StatusCode::kNotFound) {
                ADD_FAILURE() << r.status().ToString();
                bad++;
              }
              break;
            }
            case 5:
              store->Remove(kHash, id);
              break;
            case 6:
              store->Touch(kHash, id);
              break;
            default: {
              if (t == 0) {
                store->Sweep();
              } else {
                (void)store->List();
                (void)store->Contains(kHash, id);
              }
            }
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(loads_ok.load(), 0);
  // One file per conversation at most, none a temp file, within the budget.
  std::set<std::string> ids;
  for (const std::string& name : Files()) {
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
    const std::string id = name.substr(0, name.find('.'));
    EXPECT_TRUE(ids.insert(id).second) << "two files of " << id;
  }
  EXPECT_LE(store->DiskBytes(), 6 * one);
  for (const std::string& id :
       {std::string("shared"), std::string("own-0"), std::string("h-é/..")}) {
    Result<KvLoadResult> r = store->Load(kHash, id);
    if (r.ok()) {
      EXPECT_TRUE(IsWhole(r->snapshot));
    }
  }
}

}  // namespace
}  // namespace arbiter
