#include "arbiter/base/file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace arbiter {
namespace {

namespace fs = std::filesystem;

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("arbiter_file_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(FileTest, AtomicWriteThenMapAndRead) {
  const std::string p = (dir_ / "a.bin").string();
  ASSERT_TRUE(WriteFileAtomic(p, "hello").ok());
  auto m = MappedFile::Open(p);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), "hello");
  EXPECT_EQ(*ReadFile(p), "hello");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(FileTest, FailedWriteLeavesOldFileAndNoTemp) {
  const std::string p = (dir_ / "a.bin").string();
  ASSERT_TRUE(WriteFileAtomic(p, "good").ok());
  Status s = WriteFileAtomicStreaming(p, [](const auto& append) {
    Status a = append("partial", 7);
    if (!a.ok()) return a;
    return DataLossError("writer failed midway");
  });
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(*ReadFile(p), "good");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// Appends of odd sizes across several 4 MiB writeback chunks (Note
// [Writeback while writing]) land in order, byte for byte.
TEST_F(FileTest, LargeStreamingWriteIsExact) {
  const std::string p = (dir_ / "big.bin").string();
  std::string data(9 * (size_t{1} << 20) + 12345, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131) >> 3);
  Status s = WriteFileAtomicStreaming(p, [&](const auto& append) -> Status {
    size_t off = 0;
    for (size_t piece : {size_t{7}, size_t{4} << 20, size_t{1}, (size_t{3} << 20) + 999}) {
      ARBITER_RETURN_IF_ERROR(append(data.data() + off, piece));
      off += piece;
    }
    return append(data.data() + off, data.size() - off);
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  Result<std::string> back = ReadFile(p);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == data);
}

TEST_F(FileTest, ErrorsNameThePath) {
  const std::string p = (dir_ / "missing.bin").string();
  auto m = MappedFile::Open(p);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find(p), std::string::npos);
  auto d = MappedFile::Open(dir_.string());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteFileAtomic(p, std::string(100, 'x')).ok());
  EXPECT_EQ(ReadFile(p, 10).status().code(), StatusCode::kResourceExhausted);
}

TEST_F(FileTest, EmptyFileMaps) {
  const std::string p = (dir_ / "empty").string();
  ASSERT_TRUE(WriteFileAtomic(p, "").ok());
  auto m = MappedFile::Open(p);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 0u);
}

}  // namespace
}  // namespace arbiter
