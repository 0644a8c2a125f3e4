#include "arbiter/base/hash.h"

#include <gtest/gtest.h>

namespace arbiter {
namespace {

TEST(HashTest, Sha256KnownVectors) {
  // FIPS 180-4 examples.
  EXPECT_EQ(HexEncode(Sha256Of("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HexEncode(Sha256Of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(HashTest, Sha256Incremental) {
  Sha256 h;
  h.Update("a");
  h.Update("bc");
  EXPECT_EQ(h.Finish(), Sha256Of("abc"));
}

TEST(HashTest, Xxh3StableAndSeeded) {
  EXPECT_EQ(Xxh3_64("abc", 3), Xxh3_64("abc", 3));
  EXPECT_NE(Xxh3_64("abc", 3), Xxh3_64("abd", 3));
  EXPECT_NE(Xxh3_64("abc", 3, 1), Xxh3_64("abc", 3, 2));
}

}  // namespace
}  // namespace arbiter
