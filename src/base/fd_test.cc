#include "arbiter/base/fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

namespace arbiter {
namespace {

namespace fs = std::filesystem;

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

// msync on an unmapped page fails with ENOMEM: a probe that needs no fault.
bool IsMapped(void* addr) {
  return ::msync(addr, static_cast<size_t>(::sysconf(_SC_PAGESIZE)), MS_ASYNC) == 0;
}

int OpenDevNull() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

TEST(UniqueFdTest, ClosesOnDestruction) {
  const int raw = OpenDevNull();
  ASSERT_GE(raw, 0);
  {
    UniqueFd fd(raw);
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(fd.get(), raw);
  }
  EXPECT_FALSE(IsOpen(raw));
}

TEST(UniqueFdTest, MoveTransfersOwnership) {
  const int raw = OpenDevNull();
  UniqueFd a(raw);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(b.get(), raw);
  UniqueFd c;
  const int other = OpenDevNull();
  c.reset(other);
  c = std::move(b);  // closes `other`, takes `raw`
  EXPECT_FALSE(IsOpen(other));
  EXPECT_EQ(c.get(), raw);
  EXPECT_TRUE(IsOpen(raw));
  c.reset();
  EXPECT_FALSE(IsOpen(raw));
  EXPECT_FALSE(c.valid());
}

TEST(UniqueFdTest, ReleaseHandsTheFdOver) {
  const int raw = OpenDevNull();
  int released;
  {
    UniqueFd fd(raw);
    released = fd.release();
    EXPECT_FALSE(fd.valid());
  }
  EXPECT_EQ(released, raw);
  EXPECT_TRUE(IsOpen(raw));
  ::close(raw);
}

TEST(UniqueFdTest, CloseReportsTheResult) {
  UniqueFd fd(OpenDevNull());
  const int raw = fd.get();
  EXPECT_EQ(fd.Close(), 0);
  EXPECT_FALSE(fd.valid());
  EXPECT_FALSE(IsOpen(raw));
  EXPECT_EQ(fd.Close(), 0);  // empty: nothing to close
  UniqueFd negative(-5);
  EXPECT_FALSE(negative.valid());
  EXPECT_EQ(negative.get(), -1);
}

TEST(UniqueFdTest, OpenErrorsNameThePath) {
  const std::string path = "/nonexistent-arbiter-dir/file";
  Result<UniqueFd> fd = UniqueFd::Open(path.c_str(), O_RDONLY);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kNotFound);
  EXPECT_NE(fd.status().message().find(path), std::string::npos);
}

TEST(MappingTest, MapsAndUnmapsOnDestruction) {
  void* addr;
  {
    Result<Mapping> m =
        Mapping::Map(4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, "test");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_TRUE(m->valid());
    EXPECT_EQ(m->size_bytes(), 4096u);
    std::memset(m->data(), 0x5a, m->size_bytes());
    addr = m->data();
    EXPECT_TRUE(IsMapped(addr));
  }
  EXPECT_FALSE(IsMapped(addr));
}

TEST(MappingTest, MoveKeepsTheAddressAndUnmapsOnce) {
  Result<Mapping> m =
      Mapping::Map(8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, "test");
  ASSERT_TRUE(m.ok());
  uint8_t* addr = m->data();
  addr[0] = 7;
  Mapping a = std::move(m).value();
  Mapping b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.size_bytes(), 0u);
  EXPECT_EQ(b.data(), addr);
  EXPECT_EQ(b.data()[0], 7);
  Mapping c;
  c = std::move(b);
  EXPECT_EQ(c.data(), addr);
  c.reset();
  EXPECT_FALSE(IsMapped(addr));
  EXPECT_FALSE(c.valid());
}

TEST(MappingTest, ReleaseHandsTheRegionOver) {
  Result<Mapping> m =
      Mapping::Map(4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, "test");
  ASSERT_TRUE(m.ok());
  const size_t size = m->size_bytes();
  void* addr = m->release();
  EXPECT_FALSE(m->valid());
  m = Mapping();  // destroying the empty owner unmaps nothing
  EXPECT_TRUE(IsMapped(addr));
  ::munmap(addr, size);
}

TEST(MappingTest, MapsAFileThatOutlivesItsFd) {
  const fs::path path = fs::temp_directory_path() /
                        ("arbiter_fd_test_" + std::to_string(::getpid()) + ".bin");
  {
    UniqueFd w(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    ASSERT_TRUE(w.valid());
    ASSERT_EQ(::write(w.get(), "mapped", 6), 6);
  }
  Result<UniqueFd> fd = UniqueFd::Open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_TRUE(fd.ok());
  Result<Mapping> m = Mapping::Map(6, PROT_READ, MAP_PRIVATE, fd->get(), path.string());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  fd->reset();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), 6), "mapped");
  fs::remove(path);
}

TEST(MappingTest, ErrorsNameWhatWasMapped) {
  Result<Mapping> empty =
      Mapping::Map(0, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, "host floor of chat");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("host floor of chat"), std::string::npos);

  // A write-only fd cannot back a readable mapping: EACCES.
  const fs::path path = fs::temp_directory_path() /
                        ("arbiter_fd_test_wo_" + std::to_string(::getpid()) + ".bin");
  UniqueFd w(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  ASSERT_TRUE(w.valid());
  ASSERT_EQ(::ftruncate(w.get(), 4096), 0);
  Result<Mapping> bad = Mapping::Map(4096, PROT_READ, MAP_SHARED, w.get(), path.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(bad.status().message().find(path.string()), std::string::npos);
  fs::remove(path);
}

TEST(ErrnoToStatusTest, CanonicalCodes) {
  EXPECT_EQ(ErrnoToStatus(ENOENT, "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EACCES, "x").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ENOMEM, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EISDIR, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoToStatus(EIO, "read f").code(), StatusCode::kInternal);
  EXPECT_EQ(ErrnoToStatus(EIO, "read f").message().rfind("read f: ", 0), 0u);
}

}  // namespace
}  // namespace arbiter
