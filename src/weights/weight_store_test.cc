// Weight stores: private and shared host floors, the shared region protocol
// across real processes (fork), remnant recovery, sweeps, hostile keys and
// ValidateSharedRegion (docs/weights.md acceptance 11 and the store defects
// it lists as fixed).
//
// Every shared test uses its own prefix "arbtest-<pid>-<test>" and removes
// whatever it left under /dev/shm. Children report through pipes; every wait
// on a child has a fuse (kFuseMs) so a bug fails the test instead of hanging
// it. Nothing asserts on elapsed time.
#include "arbiter/weights/region_format.h"
#include "arbiter/weights/weight_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

const std::string kShmDir = "/dev/shm";
// How long a test waits on a child before it fails. Never reached when the
// code works; it turns a hang into a failure.
constexpr int kFuseMs = 30000;

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<WeightSpec> TestSpecs() {
  return {{"tok_embd", DType::kF32, {3, 5}},
          {"norm", DType::kU8, {7}},
          {"empty", DType::kF16, {0, 4}},
          {"scalar", DType::kBF16, {}},
          {"w", DType::kBF16, {2, 2, 3}}};
}

uint8_t PatternByte(size_t tensor, uint64_t i) {
  return static_cast<uint8_t>(tensor * 37 + i * 11 + 5);
}

// Writes the pattern; fails if the arrays are not zeroed, misaligned or
// miscounted. Counts its calls in `calls` (may be null).
WeightFill PatternFill(const std::vector<WeightSpec>& specs, std::atomic<int>* calls) {
  return [specs, calls](const std::vector<void*>& arrays) -> Status {
    if (calls != nullptr) ++*calls;
    if (arrays.size() != specs.size()) return InternalError("wrong array count");
    for (size_t t = 0; t < arrays.size(); ++t) {
      if (arrays[t] == nullptr) return InternalError("null array");
      if (reinterpret_cast<uintptr_t>(arrays[t]) % kHostFloorAlignment != 0) {
        return InternalError("misaligned array");
      }
      uint8_t* p = static_cast<uint8_t*>(arrays[t]);
      const uint64_t n = WeightSpecBytes(specs[t]);
      for (uint64_t i = 0; i < n; ++i) {
        if (p[i] != 0) return InternalError("array not zeroed");
        p[i] = PatternByte(t, i);
      }
    }
    return OkStatus();
  };
}

// "" when `floor` is a correct floor of `specs` holding the pattern.
std::string CheckFloor(const HostFloor& floor, const std::vector<WeightSpec>& specs) {
  if (floor.arrays().size() != specs.size()) return "array count";
  if (floor.tensor_bytes().size() != specs.size()) return "tensor_bytes count";
  uint64_t payload = 0;
  for (size_t t = 0; t < specs.size(); ++t) {
    const uint64_t n = WeightSpecBytes(specs[t]);
    if (floor.tensor_bytes()[t] != n) return "tensor_bytes[" + std::to_string(t) + "]";
    if (floor.arrays()[t] == nullptr) return "null array " + std::to_string(t);
    if (reinterpret_cast<uintptr_t>(floor.arrays()[t]) % kHostFloorAlignment != 0) {
      return "misaligned array " + std::to_string(t);
    }
    const uint8_t* p = static_cast<const uint8_t*>(floor.arrays()[t]);
    for (uint64_t i = 0; i < n; ++i) {
      if (p[i] != PatternByte(t, i)) return "data of tensor " + std::to_string(t);
    }
    payload += n;
  }
  if (floor.payload_bytes() != payload) return "payload_bytes";
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (floor.mapped_bytes() < payload || floor.mapped_bytes() % page != 0) return "mapped_bytes";
  return "";
}

// ---- a test-side encoder of the region format (independent of the code) ------

void Put(std::vector<uint8_t>* bytes, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) (*bytes)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t Align64(uint64_t v) { return (v + 63) / 64 * 64; }

struct EncodedRegion {
  std::vector<uint8_t> bytes;
  std::vector<uint64_t> offsets;
  uint64_t data_offset = 0;
};

EncodedRegion EncodeRegion(uint64_t digest, const std::vector<WeightSpec>& specs) {
  EncodedRegion r;
  r.data_offset = Align64(64 + 16 * specs.size());
  uint64_t cursor = r.data_offset;
  for (const WeightSpec& s : specs) {
    r.offsets.push_back(Align64(cursor));
    cursor = r.offsets.back() + WeightSpecBytes(s);
  }
  r.bytes.assign(cursor, 0);
  std::memcpy(r.bytes.data(), "ARBWFLR1", 8);
  Put(&r.bytes, 8, 1, 4);   // version
  Put(&r.bytes, 12, 1, 4);  // ready
  Put(&r.bytes, 16, digest, 8);
  Put(&r.bytes, 24, cursor, 8);
  Put(&r.bytes, 32, specs.size(), 8);
  Put(&r.bytes, 40, 64, 8);
  Put(&r.bytes, 48, r.data_offset, 8);
  for (size_t t = 0; t < specs.size(); ++t) {
    Put(&r.bytes, 64 + 16 * t, r.offsets[t], 8);
    Put(&r.bytes, 64 + 16 * t + 8, WeightSpecBytes(specs[t]), 8);
    for (uint64_t i = 0; i < WeightSpecBytes(specs[t]); ++i) {
      r.bytes[r.offsets[t] + i] = PatternByte(t, i);
    }
  }
  return r;
}

// ---- shm and process helpers --------------------------------------------------

// Replaces the shm object `region` with one holding `bytes` (mode 0600).
void WriteShm(const std::string& region, const std::vector<uint8_t>& bytes) {
  ::shm_unlink(region.c_str());
  const int fd = ::shm_open(region.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << region << ": " << std::strerror(errno);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes.size())), 0);
  if (!bytes.empty()) {
    void* p = ::mmap(nullptr, bytes.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(p, MAP_FAILED);
    std::memcpy(p, bytes.data(), bytes.size());
    ::munmap(p, bytes.size());
  }
  ::close(fd);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

uint32_t PathMode(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 07777;
  return st.st_mode & 07777;
}

// One byte from `fd`, or -1 on EOF, error or when the fuse blows.
int ReadByte(int fd, int timeout_ms = kFuseMs) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return -1;
  char c;
  return ::read(fd, &c, 1) == 1 ? static_cast<unsigned char>(c) : -1;
}

void WriteByte(int fd, char c) {
  if (::write(fd, &c, 1) != 1) std::abort();
}

// A forked child running `body(in_fd, out_fd)`; it exits with the returned
// code (never running the parent's destructors or gtest). The destructor
// kills and reaps a child still running (a failed test).
class Child {
 public:
  explicit Child(const std::function<int(int in, int out)>& body) {
    int down[2], up[2];
    if (::pipe2(down, O_CLOEXEC) != 0 || ::pipe2(up, O_CLOEXEC) != 0) std::abort();
    std::fflush(nullptr);  // the child must not flush a copy of our stdio buffers
    pid_ = ::fork();
    if (pid_ < 0) std::abort();
    if (pid_ == 0) {
      ::close(down[1]);
      ::close(up[0]);
      ::_exit(body(down[0], up[1]));
    }
    ::close(down[0]);
    ::close(up[1]);
    to_child_ = down[1];
    from_child_ = up[0];
  }
  ~Child() {
    if (to_child_ >= 0) ::close(to_child_);
    if (from_child_ >= 0) ::close(from_child_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int to_child() const { return to_child_; }
  int from_child() const { return from_child_; }
  pid_t pid() const { return pid_; }
  // The exit code, or -signal; -1000 when the fuse blows (child killed).
  int Wait() {
    int status = 0;
    for (int waited_ms = 0; waited_ms < kFuseMs; waited_ms += 5) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
      ::usleep(5000);
    }
    return -1000;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
};

// ---- WeightSpecBytes -----------------------------------------------------------

TEST(WeightSpecBytesTest, ProductTimesElementSize) {
  EXPECT_EQ(WeightSpecBytes({"a", DType::kF32, {3, 5}}), 60u);
  EXPECT_EQ(WeightSpecBytes({"a", DType::kBF16, {}}), 2u);
  EXPECT_EQ(WeightSpecBytes({"a", DType::kF16, {0, 4}}), 0u);
  // A 0 dim wins over a product that would overflow.
  EXPECT_EQ(WeightSpecBytes({"a", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40, 0}}), 0u);
  EXPECT_EQ(WeightSpecBytes({"a", DType::kF32, {2, -1}}), UINT64_MAX);
  EXPECT_EQ(WeightSpecBytes({"a", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}}),
            UINT64_MAX);
}

// ---- PrivateWeightStore --------------------------------------------------------

TEST(PrivateWeightStoreTest, FillsAlignedArraysOfTheRightSizes) {
  PrivateWeightStore store;
  EXPECT_EQ(store.kind(), "private");
  const std::vector<WeightSpec> specs = TestSpecs();
  std::atomic<int> calls{0};
  Result<std::unique_ptr<HostFloor>> floor =
      store.Materialize("demo-chat", 42, specs, PatternFill(specs, &calls));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(CheckFloor(**floor, specs), "");
  EXPECT_TRUE((*floor)->filled_here());
  EXPECT_EQ((*floor)->region_name(), "");
  EXPECT_EQ((*floor)->payload_bytes(), 60u + 7u + 0u + 2u + 24u);
  // Packed: every tensor at the next 64-byte boundary, so ≤ one page here.
  EXPECT_EQ((*floor)->mapped_bytes(), static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  // Distinct, ordered arrays.
  for (size_t t = 1; t < specs.size(); ++t) {
    if (WeightSpecBytes(specs[t - 1]) == 0) continue;
    EXPECT_GE(static_cast<const uint8_t*>((*floor)->arrays()[t]),
              static_cast<const uint8_t*>((*floor)->arrays()[t - 1]) +
                  WeightSpecBytes(specs[t - 1]));
  }
}

TEST(PrivateWeightStoreTest, EmptyFloorAndZeroByteTensorsHaveNonNullPointers) {
  PrivateWeightStore store;
  std::atomic<int> calls{0};
  Result<std::unique_ptr<HostFloor>> none = store.Materialize("m", 1, {}, PatternFill({}, &calls));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE((*none)->arrays().empty());
  EXPECT_EQ((*none)->payload_bytes(), 0u);
  const std::vector<WeightSpec> zeros = {{"a", DType::kF32, {0}}, {"b", DType::kU8, {4, 0}}};
  Result<std::unique_ptr<HostFloor>> floor =
      store.Materialize("m", 1, zeros, PatternFill(zeros, &calls));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_EQ(calls, 2);
  EXPECT_NE((*floor)->arrays()[0], nullptr);
  EXPECT_NE((*floor)->arrays()[1], nullptr);
  EXPECT_EQ((*floor)->payload_bytes(), 0u);
}

TEST(PrivateWeightStoreTest, FillErrorIsPrefixedWithKeyAndNothingIsKept) {
  PrivateWeightStore store;
  const std::vector<WeightSpec> specs = {{"big", DType::kF32, {1 << 20}}};  // 4 MiB
  void* seen = nullptr;
  Result<std::unique_ptr<HostFloor>> floor =
      store.Materialize("demo-chat", 1, specs, [&](const std::vector<void*>& arrays) {
        seen = arrays[0];
        std::memset(arrays[0], 1, 4096);
        return DataLossError("model.safetensors: short read");
      });
  ASSERT_FALSE(floor.ok());
  EXPECT_EQ(floor.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(floor.status().message(), "demo-chat: model.safetensors: short read");
  // The mapping is gone: msync on an unmapped page fails with ENOMEM.
  ASSERT_NE(seen, nullptr);
  EXPECT_EQ(::msync(seen, 4096, MS_ASYNC), -1);
  EXPECT_EQ(errno, ENOMEM);
}

TEST(PrivateWeightStoreTest, RejectsBadSpecsAndKeys) {
  PrivateWeightStore store;
  auto fill = [](const std::vector<void*>&) { return OkStatus(); };
  Result<std::unique_ptr<HostFloor>> neg =
      store.Materialize("m", 1, {{"ok", DType::kF32, {2}}, {"bad.w", DType::kF32, {4, -3}}}, fill);
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(neg.status().message(), "m: ")) << neg.status().message();
  EXPECT_TRUE(Contains(neg.status().message(), "'bad.w'")) << neg.status().message();
  EXPECT_TRUE(Contains(neg.status().message(), "-3")) << neg.status().message();

  Result<std::unique_ptr<HostFloor>> huge = store.Materialize(
      "m", 1, {{"huge", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}}}, fill);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(huge.status().message(), "'huge'")) << huge.status().message();

  Result<std::unique_ptr<HostFloor>> empty_key = store.Materialize("", 1, TestSpecs(), fill);
  EXPECT_EQ(empty_key.status().code(), StatusCode::kInvalidArgument);
  Result<std::unique_ptr<HostFloor>> no_fill = store.Materialize("m", 1, TestSpecs(), nullptr);
  EXPECT_EQ(no_fill.status().code(), StatusCode::kInvalidArgument);
}

// ---- SharedWeightStore ---------------------------------------------------------

class SharedWeightStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    prefix_ = "arbtest-" + std::to_string(::getpid()) + "-" + test.substr(0, 40);
    Cleanup();
    store_ = MakeStore();
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override { Cleanup(); }

  std::unique_ptr<SharedWeightStore> MakeStore(uint32_t mode = 0600, int64_t ready_wait_ms = kFuseMs) {
    SharedWeightStoreOptions options;
    options.prefix = prefix_;
    options.mode = mode;
    options.ready_wait_ms = ready_wait_ms;
    Result<std::unique_ptr<SharedWeightStore>> store = SharedWeightStore::Create(options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  // Names under /dev/shm that belong to this test.
  std::vector<std::string> Entries() const {
    std::vector<std::string> out;
    DIR* d = ::opendir(kShmDir.c_str());
    if (d == nullptr) return out;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind(prefix_ + "-", 0) == 0) out.push_back(name);
    }
    ::closedir(d);
    return out;
  }
  void Cleanup() {
    for (const std::string& name : Entries()) ::unlink((kShmDir + "/" + name).c_str());
  }

  std::string Region(std::string_view key, uint64_t digest) const {
    return store_->RegionName(key, digest);
  }
  std::string RegionPath(std::string_view key, uint64_t digest) const {
    return kShmDir + Region(key, digest);
  }
  std::string LockPath(std::string_view key, uint64_t digest) const {
    return RegionPath(key, digest) + ".lock";
  }

  // Puts `bytes` at (key, digest) as a holder-free remnant, then expects
  // Materialize to rebuild it (fill runs) and the last release to remove it.
  void ExpectRebuilt(const std::string& what, std::string_view key, uint64_t digest,
                     const std::vector<uint8_t>& bytes) {
    SCOPED_TRACE(what);
    const std::vector<WeightSpec> specs = TestSpecs();
    WriteShm(Region(key, digest), bytes);
    std::atomic<int> calls{0};
    Result<std::unique_ptr<HostFloor>> floor =
        store_->Materialize(key, digest, specs, PatternFill(specs, &calls));
    ASSERT_TRUE(floor.ok()) << floor.status().ToString();
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE((*floor)->filled_here());
    EXPECT_EQ(CheckFloor(**floor, specs), "");
    floor->reset();
    EXPECT_FALSE(PathExists(RegionPath(key, digest)));
  }

  std::string prefix_;
  std::unique_ptr<SharedWeightStore> store_;
};

TEST_F(SharedWeightStoreTest, CreateValidatesOptions) {
  auto create = [](SharedWeightStoreOptions o) { return SharedWeightStore::Create(o).status(); };
  SharedWeightStoreOptions o;
  o.prefix = "";
  EXPECT_EQ(create(o).code(), StatusCode::kInvalidArgument);
  o.prefix = "a/b";
  EXPECT_EQ(create(o).code(), StatusCode::kInvalidArgument);
  o.prefix = std::string("a\0b", 3);
  EXPECT_EQ(create(o).code(), StatusCode::kInvalidArgument);
  o.prefix = std::string(65, 'p');
  EXPECT_EQ(create(o).code(), StatusCode::kInvalidArgument);
  o = {};
  o.mode = 01777;
  EXPECT_EQ(create(o).code(), StatusCode::kInvalidArgument);
  o = {};
  o.shm_dir = "/nonexistent-arbiter-dir";
  EXPECT_EQ(create(o).code(), StatusCode::kInvalidArgument);
  o = {};
  o.ready_wait_ms = -1;
  EXPECT_EQ(create(o).code(), StatusCode::kInvalidArgument);
  o = {};
  o.poll_interval_ms = 0;
  EXPECT_EQ(create(o).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->kind(), "shared");
}

TEST_F(SharedWeightStoreTest, FirstMaterializeFillsAnOwnerOnlyRegion) {
  const std::vector<WeightSpec> specs = TestSpecs();
  std::atomic<int> calls{0};
  Result<std::unique_ptr<HostFloor>> floor =
      store_->Materialize("demo-chat", 0x0123456789abcdefull, specs, PatternFill(specs, &calls));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE((*floor)->filled_here());
  EXPECT_EQ(CheckFloor(**floor, specs), "");
  EXPECT_EQ((*floor)->region_name(), "/" + prefix_ + "-demo-chat-0123456789abcdef");
  EXPECT_EQ((*floor)->region_name(), Region("demo-chat", 0x0123456789abcdefull));
  // Header + table + packed tensors: one page.
  EXPECT_EQ((*floor)->mapped_bytes(), static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(PathMode(RegionPath("demo-chat", 0x0123456789abcdefull)), 0600u);
  EXPECT_EQ(PathMode(LockPath("demo-chat", 0x0123456789abcdefull)), 0600u);
}

TEST_F(SharedWeightStoreTest, ModeIsHonouredRegardlessOfUmask) {
  const std::vector<WeightSpec> specs = TestSpecs();
  const mode_t old = ::umask(077);
  std::unique_ptr<SharedWeightStore> group = MakeStore(0660);
  Result<std::unique_ptr<HostFloor>> a = group->Materialize("g", 1, specs, PatternFill(specs, nullptr));
  ::umask(0);
  Result<std::unique_ptr<HostFloor>> b = store_->Materialize("o", 1, specs, PatternFill(specs, nullptr));
  ::umask(old);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(PathMode(RegionPath("g", 1)), 0660u);
  EXPECT_EQ(PathMode(LockPath("g", 1)), 0660u);
  EXPECT_EQ(PathMode(RegionPath("o", 1)), 0600u);
  EXPECT_EQ(PathMode(LockPath("o", 1)), 0600u);
}

TEST_F(SharedWeightStoreTest, SecondMaterializeAttachesAndLastReleaseUnlinks) {
  const std::vector<WeightSpec> specs = TestSpecs();
  std::atomic<int> calls{0};
  Result<std::unique_ptr<HostFloor>> first =
      store_->Materialize("m", 7, specs, PatternFill(specs, &calls));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Result<std::unique_ptr<HostFloor>> second =
      store_->Materialize("m", 7, specs, PatternFill(specs, &calls));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE((*first)->filled_here());
  EXPECT_FALSE((*second)->filled_here());
  EXPECT_EQ(CheckFloor(**second, specs), "");
  EXPECT_EQ((*second)->mapped_bytes(), (*first)->mapped_bytes());
  for (size_t t = 0; t < specs.size(); ++t) {
    EXPECT_EQ(std::memcmp((*first)->arrays()[t], (*second)->arrays()[t],
                          (*first)->tensor_bytes()[t]),
              0);
  }
  first->reset();  // not the last holder
  EXPECT_TRUE(PathExists(RegionPath("m", 7)));
  EXPECT_TRUE(PathExists(LockPath("m", 7)));
  EXPECT_EQ(CheckFloor(**second, specs), "");
  second->reset();  // the last holder
  EXPECT_FALSE(PathExists(RegionPath("m", 7)));
  EXPECT_FALSE(PathExists(LockPath("m", 7)));
  EXPECT_TRUE(Entries().empty());
}

TEST_F(SharedWeightStoreTest, FillErrorLeavesNothingAndTheNextCallRebuilds) {
  const std::vector<WeightSpec> specs = TestSpecs();
  Result<std::unique_ptr<HostFloor>> failed =
      store_->Materialize("m", 3, specs, [](const std::vector<void*>& arrays) {
        std::memset(arrays[0], 0xee, 8);
        return DataLossError("model.safetensors: short read");
      });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(failed.status().message(), "m: model.safetensors: short read");
  EXPECT_TRUE(Entries().empty());

  EXPECT_THROW(store_->Materialize("m", 3, specs,
                                   [](const std::vector<void*>&) -> Status {
                                     throw std::runtime_error("fill threw");
                                   })
                   .status()
                   .IgnoreError(),
               std::runtime_error);
  EXPECT_TRUE(Entries().empty());

  std::atomic<int> calls{0};
  Result<std::unique_ptr<HostFloor>> floor =
      store_->Materialize("m", 3, specs, PatternFill(specs, &calls));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(CheckFloor(**floor, specs), "");
}

TEST_F(SharedWeightStoreTest, RejectsBadSpecs) {
  auto fill = [](const std::vector<void*>&) { return OkStatus(); };
  Result<std::unique_ptr<HostFloor>> neg =
      store_->Materialize("m", 1, {{"bad.w", DType::kF32, {-1}}}, fill);
  EXPECT_EQ(neg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(neg.status().message(), "'bad.w'")) << neg.status().message();
  EXPECT_EQ(store_->Materialize("", 1, TestSpecs(), fill).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(Entries().empty());
}

TEST_F(SharedWeightStoreTest, ThreadsOfOneProcessFillOnce) {
  const std::vector<WeightSpec> specs = TestSpecs();
  std::atomic<int> calls{0};
  std::vector<std::unique_ptr<HostFloor>> floors(4);
  std::vector<Status> errors(floors.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < floors.size(); ++i) {
    threads.emplace_back([&, i] {
      Result<std::unique_ptr<HostFloor>> r =
          store_->Materialize("m", 9, specs, PatternFill(specs, &calls));
      if (r.ok()) {
        floors[i] = std::move(r).value();
      } else {
        errors[i] = r.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(calls, 1);
  for (size_t i = 0; i < floors.size(); ++i) {
    ASSERT_NE(floors[i], nullptr) << errors[i].ToString();
    EXPECT_EQ(CheckFloor(*floors[i], specs), "");
  }
  floors.clear();
  EXPECT_TRUE(Entries().empty());
}

TEST_F(SharedWeightStoreTest, TwoProcessesFillExactlyOnce) {
  const std::vector<WeightSpec> specs = TestSpecs();
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    const std::string key = "race" + std::to_string(round);
    Child child([&](int in, int out) {
      Result<std::unique_ptr<HostFloor>> floor =
          store_->Materialize(key, 5, specs, PatternFill(specs, nullptr));
      if (!floor.ok()) return WriteByte(out, 'E'), 1;
      if (!CheckFloor(**floor, specs).empty()) return WriteByte(out, 'B'), 2;
      WriteByte(out, (*floor)->filled_here() ? '1' : '0');
      ReadByte(in);  // hold the floor until the parent is done
      return 0;
    });
    std::atomic<int> calls{0};
    Result<std::unique_ptr<HostFloor>> floor =
        store_->Materialize(key, 5, specs, PatternFill(specs, &calls));
    ASSERT_TRUE(floor.ok()) << floor.status().ToString();
    EXPECT_EQ(CheckFloor(**floor, specs), "");
    const int child_report = ReadByte(child.from_child());
    ASSERT_TRUE(child_report == '0' || child_report == '1') << child_report;
    EXPECT_EQ(((*floor)->filled_here() ? 1 : 0) + (child_report == '1' ? 1 : 0), 1);
    EXPECT_EQ(calls, (*floor)->filled_here() ? 1 : 0);
    WriteByte(child.to_child(), 'x');
    EXPECT_EQ(child.Wait(), 0);
    EXPECT_TRUE(PathExists(RegionPath(key, 5)));  // we still hold it
    floor->reset();
    EXPECT_FALSE(PathExists(RegionPath(key, 5)));
    EXPECT_FALSE(PathExists(LockPath(key, 5)));
  }
}

TEST_F(SharedWeightStoreTest, KilledFillerIsRebuilt) {
  const std::vector<WeightSpec> specs = TestSpecs();
  Child child([&](int in, int out) {
    Result<std::unique_ptr<HostFloor>> floor =
        store_->Materialize("m", 11, specs, [&](const std::vector<void*>& arrays) {
          std::memset(arrays[0], 0xab, WeightSpecBytes(specs[0]));  // a partial write
          WriteByte(out, 'F');
          ReadByte(in);  // blocks until killed
          return OkStatus();
        });
    return 3;
  });
  ASSERT_EQ(ReadByte(child.from_child()), 'F');
  EXPECT_TRUE(PathExists(RegionPath("m", 11)));  // the partial region
  ASSERT_EQ(::kill(child.pid(), SIGKILL), 0);
  EXPECT_EQ(child.Wait(), -SIGKILL);
  EXPECT_TRUE(PathExists(RegionPath("m", 11)));  // a ready = 0 remnant

  std::atomic<int> calls{0};
  Result<std::unique_ptr<HostFloor>> floor =
      store_->Materialize("m", 11, specs, PatternFill(specs, &calls));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE((*floor)->filled_here());
  EXPECT_EQ(CheckFloor(**floor, specs), "");
}

TEST_F(SharedWeightStoreTest, StuckFillerGivesDeadlineExceededNamingTheRegion) {
  const std::vector<WeightSpec> specs = TestSpecs();
  Child child([&](int in, int out) {
    WeightFill pattern = PatternFill(specs, nullptr);
    Result<std::unique_ptr<HostFloor>> floor =
        store_->Materialize("m", 13, specs, [&](const std::vector<void*>& arrays) {
          WriteByte(out, 'F');
          ReadByte(in);  // stuck until the parent says go
          return pattern(arrays);
        });
    if (!floor.ok()) return WriteByte(out, 'E'), 1;
    WriteByte(out, (*floor)->filled_here() ? '1' : '0');
    ReadByte(in);  // hold until told to exit
    return 0;
  });
  ASSERT_EQ(ReadByte(child.from_child()), 'F');

  std::unique_ptr<SharedWeightStore> impatient = MakeStore(0600, /*ready_wait_ms=*/200);
  std::atomic<int> calls{0};
  Result<std::unique_ptr<HostFloor>> timed_out =
      impatient->Materialize("m", 13, specs, PatternFill(specs, &calls));
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(timed_out.status().message(), Region("m", 13)))
      << timed_out.status().message();
  EXPECT_TRUE(Contains(timed_out.status().message(), "ready_wait_ms"))
      << timed_out.status().message();
  EXPECT_EQ(calls, 0);

  // Once the filler finishes, the same call attaches.
  WriteByte(child.to_child(), 'g');
  ASSERT_EQ(ReadByte(child.from_child()), '1');
  Result<std::unique_ptr<HostFloor>> floor =
      impatient->Materialize("m", 13, specs, PatternFill(specs, &calls));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_FALSE((*floor)->filled_here());
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(CheckFloor(**floor, specs), "");
  WriteByte(child.to_child(), 'x');
  EXPECT_EQ(child.Wait(), 0);
}

TEST_F(SharedWeightStoreTest, ReadyRegionOfACrashedProcessIsReused) {
  const std::vector<WeightSpec> specs = TestSpecs();
  Child child([&](int, int) {
    Result<std::unique_ptr<HostFloor>> floor =
        store_->Materialize("m", 17, specs, PatternFill(specs, nullptr));
    if (!floor.ok()) return 1;
    ::_exit((*floor)->filled_here() ? 0 : 2);  // "crash": no release
  });
  ASSERT_EQ(child.Wait(), 0);
  ASSERT_TRUE(PathExists(RegionPath("m", 17)));
  std::atomic<int> calls{0};
  Result<std::unique_ptr<HostFloor>> floor =
      store_->Materialize("m", 17, specs, PatternFill(specs, &calls));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_FALSE((*floor)->filled_here());
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(CheckFloor(**floor, specs), "");
}

TEST_F(SharedWeightStoreTest, HandMadeReadyRegionIsAttached) {
  const std::vector<WeightSpec> specs = TestSpecs();
  WriteShm(Region("m", 19), EncodeRegion(19, specs).bytes);
  std::atomic<int> calls{0};
  Result<std::unique_ptr<HostFloor>> floor =
      store_->Materialize("m", 19, specs, PatternFill(specs, &calls));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_FALSE((*floor)->filled_here());
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(CheckFloor(**floor, specs), "");
}

TEST_F(SharedWeightStoreTest, RemnantsAreRebuilt) {
  const std::vector<WeightSpec> specs = TestSpecs();
  const uint64_t d = 23;
  const EncodedRegion good = EncodeRegion(d, specs);

  ExpectRebuilt("zero-length", "m", d, {});
  ExpectRebuilt("header only", "m", d,
                std::vector<uint8_t>(good.bytes.begin(), good.bytes.begin() + 64));
  ExpectRebuilt("truncated", "m", d,
                std::vector<uint8_t>(good.bytes.begin(), good.bytes.end() - 1));
  std::vector<uint8_t> garbage(4096);
  uint32_t x = 12345;
  for (uint8_t& b : garbage) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  ExpectRebuilt("garbage", "m", d, garbage);
  ExpectRebuilt("wrong digest", "m", d, EncodeRegion(d + 1, specs).bytes);
  std::vector<WeightSpec> other_specs = specs;
  other_specs.push_back({"extra", DType::kF32, {4}});
  ExpectRebuilt("foreign layout", "m", d, EncodeRegion(d, other_specs).bytes);

  auto mutated = [&](size_t at, uint64_t v, int n) {
    std::vector<uint8_t> b = good.bytes;
    Put(&b, at, v, n);
    return b;
  };
  ExpectRebuilt("not ready", "m", d, mutated(12, 0, 4));
  ExpectRebuilt("wrong magic", "m", d, mutated(0, 0x4141414141414141ull, 8));
  ExpectRebuilt("region_bytes past the object", "m", d, mutated(24, good.bytes.size() * 2, 8));
  ExpectRebuilt("wrong table offset", "m", d, mutated(64 + 16, good.offsets[1] + 64, 8));
  ExpectRebuilt("wrong table nbytes", "m", d, mutated(64 + 16 + 8, 1 << 30, 8));
  ExpectRebuilt("wrong n_tensors", "m", d, mutated(32, 1000000, 8));
  EXPECT_TRUE(Entries().empty());
}

TEST_F(SharedWeightStoreTest, StaleHolderFreeVersionIsSweptOnAttach) {
  const std::vector<WeightSpec> specs = TestSpecs();
  WriteShm(Region("m", 1), EncodeRegion(1, specs).bytes);        // stale, holder-free
  WriteShm(Region("other", 1), EncodeRegion(1, specs).bytes);    // another key
  WriteShm(Region("m-b", 1), EncodeRegion(1, specs).bytes);      // a key extending "m"
  Result<std::unique_ptr<HostFloor>> floor =
      store_->Materialize("m", 2, specs, PatternFill(specs, nullptr));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_FALSE(PathExists(RegionPath("m", 1)));
  EXPECT_FALSE(PathExists(LockPath("m", 1)));
  EXPECT_TRUE(PathExists(RegionPath("m", 2)));
  EXPECT_TRUE(PathExists(RegionPath("other", 1)));
  EXPECT_TRUE(PathExists(RegionPath("m-b", 1)));
}

TEST_F(SharedWeightStoreTest, StaleVersionHeldByAnotherProcessIsKept) {
  const std::vector<WeightSpec> specs = TestSpecs();
  Child child([&](int in, int out) {
    Result<std::unique_ptr<HostFloor>> floor =
        store_->Materialize("m", 1, specs, PatternFill(specs, nullptr));
    if (!floor.ok()) return WriteByte(out, 'E'), 1;
    WriteByte(out, 'H');
    ReadByte(in);
    floor->reset();  // the last holder: unlinks
    return 0;
  });
  ASSERT_EQ(ReadByte(child.from_child()), 'H');
  Result<std::unique_ptr<HostFloor>> floor =
      store_->Materialize("m", 2, specs, PatternFill(specs, nullptr));
  ASSERT_TRUE(floor.ok()) << floor.status().ToString();
  EXPECT_TRUE(PathExists(RegionPath("m", 1)));  // held: not swept
  WriteByte(child.to_child(), 'x');
  EXPECT_EQ(child.Wait(), 0);
  EXPECT_FALSE(PathExists(RegionPath("m", 1)));
  EXPECT_FALSE(PathExists(LockPath("m", 1)));
}

TEST_F(SharedWeightStoreTest, SweepOrphansRemovesOnlyHolderFreeRegionsOfDeadKeys) {
  const std::vector<WeightSpec> specs = TestSpecs();
  WriteShm(Region("dead", 1), EncodeRegion(1, specs).bytes);
  WriteShm(Region("live", 1), EncodeRegion(1, specs).bytes);
  Result<std::unique_ptr<HostFloor>> held =
      store_->Materialize("held", 1, specs, PatternFill(specs, nullptr));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  // A lock file whose region is gone, and a file that is not a region.
  const int lock_fd = ::open(LockPath("gone", 1).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(lock_fd, 0);
  ::close(lock_fd);
  const std::string stray = kShmDir + "/" + prefix_ + "-not-a-region";
  const int stray_fd = ::open(stray.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(stray_fd, 0);
  ::close(stray_fd);

  Result<std::vector<std::string>> swept = store_->SweepOrphans({"live"});
  ASSERT_TRUE(swept.ok()) << swept.status().ToString();
  EXPECT_EQ(*swept, std::vector<std::string>{Region("dead", 1)});
  EXPECT_FALSE(PathExists(RegionPath("dead", 1)));
  EXPECT_FALSE(PathExists(LockPath("dead", 1)));
  EXPECT_FALSE(PathExists(LockPath("gone", 1)));
  EXPECT_TRUE(PathExists(RegionPath("live", 1)));
  EXPECT_TRUE(PathExists(RegionPath("held", 1)));
  EXPECT_TRUE(PathExists(LockPath("held", 1)));
  EXPECT_TRUE(PathExists(stray));
  EXPECT_EQ(CheckFloor(**held, specs), "");

  // Held regions survive even when no key is live.
  Result<std::vector<std::string>> again = store_->SweepOrphans({});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, std::vector<std::string>{Region("live", 1)});
  EXPECT_TRUE(PathExists(RegionPath("held", 1)));
}

TEST_F(SharedWeightStoreTest, ReleaseThroughAReplacedLockFileUnlinksNothing) {
  const std::vector<WeightSpec> specs = TestSpecs();
  Result<std::unique_ptr<HostFloor>> a = store_->Materialize("m", 29, specs, PatternFill(specs, nullptr));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(::unlink(LockPath("m", 29).c_str()), 0);  // removed by hand
  Result<std::unique_ptr<HostFloor>> b = store_->Materialize("m", 29, specs, PatternFill(specs, nullptr));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_FALSE((*b)->filled_here());
  // a's lock is on the unlinked file: it proves nothing, so a unlinks nothing.
  a->reset();
  EXPECT_TRUE(PathExists(RegionPath("m", 29)));
  EXPECT_EQ(CheckFloor(**b, specs), "");
  b->reset();
  EXPECT_FALSE(PathExists(RegionPath("m", 29)));
}

TEST_F(SharedWeightStoreTest, HostileKeysStayOneNameUnderTheShmDir) {
  const std::vector<WeightSpec> specs = {{"w", DType::kF32, {4}}};
  const std::vector<std::string> keys = {
      "../../x", "/", std::string("a\0b\nc", 5), std::string(10000, 'k'),
      std::string(9999, 'k') + "z", "..", "a/../../etc/passwd"};
  std::vector<std::string> names;
  for (const std::string& key : keys) {
    SCOPED_TRACE(key.size() > 40 ? key.substr(0, 40) : key);
    const uint64_t digest = WeightsDigest(key, specs, 0);
    const std::string name = Region(key, digest);
    ASSERT_FALSE(name.empty());
    EXPECT_EQ(name[0], '/');
    EXPECT_EQ(name.find('/', 1), std::string::npos) << name;
    EXPECT_EQ(name.find('\0'), std::string::npos);
    EXPECT_EQ(name.find('\n'), std::string::npos);
    EXPECT_LE(name.size() - 1 + std::string(".lock").size(), static_cast<size_t>(NAME_MAX));
    names.push_back(name);
    Result<std::unique_ptr<HostFloor>> floor =
        store_->Materialize(key, digest, specs, PatternFill(specs, nullptr));
    ASSERT_TRUE(floor.ok()) << floor.status().ToString();
    EXPECT_EQ((*floor)->region_name(), name);
    struct stat st;
    ASSERT_EQ(::lstat((kShmDir + name).c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    ASSERT_EQ(::lstat((kShmDir + name + ".lock").c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
  }
  // Keys that share their first 64 bytes still get distinct names.
  EXPECT_NE(names[3], names[4]);
}

// ---- ValidateSharedRegion ------------------------------------------------------

// Validates `bytes` from an exact-size heap copy, so ASan sees any read past it.
Result<std::vector<uint64_t>> ValidateCopy(const std::vector<uint8_t>& bytes, size_t size,
                                           uint64_t digest, const std::vector<WeightSpec>& specs) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[size]);
  std::memcpy(copy.get(), bytes.data(), std::min(size, bytes.size()));
  return ValidateSharedRegion(copy.get(), size, digest, specs);
}

TEST(ValidateSharedRegionTest, AcceptsAWellFormedRegion) {
  const std::vector<WeightSpec> specs = TestSpecs();
  const EncodedRegion good = EncodeRegion(77, specs);
  Result<std::vector<uint64_t>> offsets = ValidateCopy(good.bytes, good.bytes.size(), 77, specs);
  ASSERT_TRUE(offsets.ok()) << offsets.status().ToString();
  EXPECT_EQ(*offsets, good.offsets);
  for (uint64_t o : *offsets) EXPECT_EQ(o % kHostFloorAlignment, 0u);
  // No tensors: header only.
  const EncodedRegion empty = EncodeRegion(77, {});
  EXPECT_EQ(empty.bytes.size(), 64u);
  EXPECT_TRUE(ValidateCopy(empty.bytes, 64, 77, {}).ok());
}

TEST(ValidateSharedRegionTest, NamesTheFirstMismatch) {
  const std::vector<WeightSpec> specs = TestSpecs();
  const EncodedRegion good = EncodeRegion(77, specs);
  struct Case {
    std::string expect;
    size_t at;
    uint64_t value;
    int n;
  };
  const uint64_t total = good.bytes.size();
  const std::vector<Case> cases = {
      {"magic", 0, 'X', 1},
      {"version", 8, 2, 4},
      {"not ready", 12, 0, 4},
      {"not ready", 12, 2, 4},
      {"region_bytes", 24, total + 64, 8},
      {"region_bytes", 24, total - 1, 8},
      {"region_bytes", 24, UINT64_MAX, 8},
      {"n_tensors", 32, specs.size() + 1, 8},
      {"n_tensors", 32, UINT64_MAX / 16, 8},
      {"table_offset", 40, 128, 8},
      {"data_offset", 48, good.data_offset + 64, 8},
      {"reserved", 60, 1, 1},
      {"table entry 1 offset", 64 + 16, good.offsets[1] + 64, 8},
      {"table entry 1 offset", 64 + 16, UINT64_MAX, 8},
      {"table entry 4 nbytes", 64 + 4 * 16 + 8, 25, 8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect + " at " + std::to_string(c.at));
    std::vector<uint8_t> bytes = good.bytes;
    Put(&bytes, c.at, c.value, c.n);
    Result<std::vector<uint64_t>> r = ValidateCopy(bytes, bytes.size(), 77, specs);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(r.status().message(), c.expect)) << r.status().message();
  }
  Result<std::vector<uint64_t>> digest = ValidateCopy(good.bytes, total, 78, specs);
  EXPECT_EQ(digest.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(digest.status().message(), "digest")) << digest.status().message();
  Result<std::vector<uint64_t>> header = ValidateCopy(good.bytes, 63, 77, specs);
  EXPECT_EQ(header.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(header.status().message(), "header")) << header.status().message();
  EXPECT_EQ(ValidateSharedRegion(nullptr, 0, 77, specs).status().code(), StatusCode::kDataLoss);
  // Fewer specs than the region holds.
  std::vector<WeightSpec> fewer(specs.begin(), specs.end() - 1);
  EXPECT_EQ(ValidateCopy(good.bytes, total, 77, fewer).status().code(), StatusCode::kDataLoss);
}

TEST(ValidateSharedRegionTest, NeverReadsPastTheMapping) {
  const std::vector<WeightSpec> specs = TestSpecs();
  const EncodedRegion good = EncodeRegion(77, specs);
  for (size_t size = 0; size < good.bytes.size(); ++size) {
    Result<std::vector<uint64_t>> r = ValidateCopy(good.bytes, size, 77, specs);
    ASSERT_FALSE(r.ok()) << size;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  }
  // More bytes than region_bytes (a larger object) are fine.
  std::vector<uint8_t> longer = good.bytes;
  longer.resize(longer.size() + 100, 0);
  EXPECT_TRUE(ValidateCopy(longer, longer.size(), 77, specs).ok());
}

TEST(ValidateSharedRegionTest, InvalidSpecsAreInvalidArgument) {
  const EncodedRegion good = EncodeRegion(77, TestSpecs());
  Result<std::vector<uint64_t>> r =
      ValidateCopy(good.bytes, good.bytes.size(), 77, {{"neg", DType::kF32, {3, -2}}});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "'neg'")) << r.status().message();
}

}  // namespace
}  // namespace arbiter
