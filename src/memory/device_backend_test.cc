// DeviceBackend: one contract suite run against every implementation
// (STYLE.md rule 13), then what is specific to cpu and fake.
#include "arbiter/memory/device_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace arbiter {
namespace {

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

class DeviceBackendContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<DeviceBackend> Make(uint64_t arena_bytes) {
    Result<std::unique_ptr<DeviceBackend>> b = MakeDeviceBackend(GetParam(), arena_bytes);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::move(b).value() : nullptr;
  }
};

TEST_P(DeviceBackendContractTest, NameAndArena) {
  std::unique_ptr<DeviceBackend> d = Make(1 << 20);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->name(), GetParam());
  EXPECT_EQ(d->arena_bytes(), 1u << 20);
  EXPECT_NE(d->base(), 0u);
  EXPECT_EQ(d->base() % 4096, 0u);
}

TEST_P(DeviceBackendContractTest, CopiesInsideTheArenaSucceed) {
  std::unique_ptr<DeviceBackend> d = Make(4096);
  ASSERT_NE(d, nullptr);
  std::vector<uint8_t> buf(4096, 7);
  EXPECT_TRUE(d->CopyToDevice(0, buf.data(), buf.size()).ok());
  EXPECT_TRUE(d->CopyToDevice(4000, buf.data(), 96).ok());
  EXPECT_TRUE(d->CopyFromDevice(100, buf.data(), 200).ok());
  EXPECT_TRUE(d->CopyToDevice(4096, buf.data(), 0).ok());  // empty copy at the end
}

TEST_P(DeviceBackendContractTest, CopiesOutsideTheArenaAreOutOfRange) {
  std::unique_ptr<DeviceBackend> d = Make(4096);
  ASSERT_NE(d, nullptr);
  std::vector<uint8_t> buf(8192, 1);
  Status s = d->CopyToDevice(4000, buf.data(), 97);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(Contains(s.message(), "4096")) << s.message();
  EXPECT_EQ(d->CopyFromDevice(4097, buf.data(), 0).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(d->CopyToDevice(0, buf.data(), 8192).code(), StatusCode::kOutOfRange);
  // offset + size would wrap around 2^64.
  EXPECT_EQ(d->CopyToDevice(UINT64_MAX, buf.data(), 2).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(d->HostPointer(4096), nullptr);
}

TEST_P(DeviceBackendContractTest, DiscardChecksItsRange) {
  std::unique_ptr<DeviceBackend> d = Make(1 << 16);
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->Discard(0, 1 << 16).ok());
  EXPECT_TRUE(d->Discard(100, 10).ok());  // no whole page inside: nothing to do
  EXPECT_EQ(d->Discard(1 << 16, 1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(d->Discard(UINT64_MAX, 2).code(), StatusCode::kOutOfRange);
}

TEST_P(DeviceBackendContractTest, EmptyArena) {
  std::unique_ptr<DeviceBackend> d = Make(0);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->arena_bytes(), 0u);
  uint8_t b = 0;
  EXPECT_TRUE(d->CopyToDevice(0, &b, 0).ok());
  EXPECT_EQ(d->CopyToDevice(0, &b, 1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(d->HostPointer(0), nullptr);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, DeviceBackendContractTest,
                         ::testing::Values("cpu", "fake"),
                         [](const auto& info) { return info.param; });

TEST(CpuDeviceBackendTest, RoundTripsBytesAndExposesHostPointers) {
  Result<std::unique_ptr<DeviceBackend>> d = MakeDeviceBackend("cpu", 1 << 16);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  std::vector<uint8_t> in(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 31 + 5);
  ASSERT_TRUE((*d)->CopyToDevice(512, in.data(), in.size()).ok());
  std::vector<uint8_t> out(in.size());
  ASSERT_TRUE((*d)->CopyFromDevice(512, out.data(), out.size()).ok());
  EXPECT_EQ(in, out);
  auto* p = static_cast<uint8_t*>((*d)->HostPointer(512));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p), (*d)->base() + 512);
  EXPECT_EQ(std::memcmp(p, in.data(), in.size()), 0);
}

TEST(CpuDeviceBackendTest, DiscardZeroesWholePagesOnlyAndKeepsNeighbours) {
  Result<std::unique_ptr<CpuDeviceBackend>> made = CpuDeviceBackend::Create(4 * 4096);
  ASSERT_TRUE(made.ok());
  CpuDeviceBackend& d = **made;
  std::vector<uint8_t> ones(4 * 4096, 1);
  ASSERT_TRUE(d.CopyToDevice(0, ones.data(), ones.size()).ok());
  // [100, 3 × 4096 + 50): only pages 1 and 2 lie wholly inside.
  ASSERT_TRUE(d.Discard(100, 3 * 4096 - 50).ok());
  const uint8_t* p = static_cast<const uint8_t*>(d.HostPointer(0));
  EXPECT_EQ(p[0], 1);
  EXPECT_EQ(p[4095], 1);
  EXPECT_EQ(p[4096], 0);
  EXPECT_EQ(p[3 * 4096 - 1], 0);
  EXPECT_EQ(p[3 * 4096], 1);
}

// Note [Arena huge pages]: an arena of 2 MiB or more starts on a 2 MiB
// boundary; Discard still frees exactly the whole 4 KiB pages inside a range,
// also across and inside huge pages. Without huge pages it behaves the same.
TEST(CpuDeviceBackendTest, LargeArenaIsHugePageAlignedAndDiscardsBasePages) {
  constexpr uint64_t kHuge = CpuDeviceBackend::kHugePageBytes;
  for (bool huge_pages : {true, false}) {
    SCOPED_TRACE(huge_pages ? "huge pages" : "base pages");
    Result<std::unique_ptr<CpuDeviceBackend>> made =
        CpuDeviceBackend::Create(3 * kHuge + 4096, huge_pages);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    CpuDeviceBackend& d = **made;
    EXPECT_EQ(d.arena_bytes(), 3 * kHuge + 4096);
    if (huge_pages) {
      EXPECT_EQ(d.base() % kHuge, 0u);
    }
    std::vector<uint8_t> ones(d.arena_bytes(), 1);
    ASSERT_TRUE(d.CopyToDevice(0, ones.data(), ones.size()).ok());  // the last byte too
    // [4096 + 10, 4096 + 2 MiB + 4096): whole pages [8192, 2 MiB + 8192).
    ASSERT_TRUE(d.Discard(4096 + 10, kHuge + 4096 - 10).ok());
    const uint8_t* p = static_cast<const uint8_t*>(d.HostPointer(0));
    EXPECT_EQ(p[0], 1);
    EXPECT_EQ(p[8191], 1);
    EXPECT_EQ(p[8192], 0);
    EXPECT_EQ(p[kHuge], 0);
    EXPECT_EQ(p[kHuge + 8191], 0);
    EXPECT_EQ(p[kHuge + 8192], 1);
    EXPECT_EQ(p[3 * kHuge + 4095], 1);
    // A whole huge page, then written again: reads back what was written.
    ASSERT_TRUE(d.Discard(kHuge, kHuge).ok());
    EXPECT_EQ(p[2 * kHuge - 1], 0);
    EXPECT_EQ(p[2 * kHuge], 1);
    ASSERT_TRUE(d.CopyToDevice(kHuge, ones.data(), kHuge).ok());
    EXPECT_EQ(p[kHuge], 1);
    EXPECT_EQ(p[2 * kHuge - 1], 1);
  }
}

TEST(FakeDeviceBackendTest, TerabyteArenaCountsCopiesWithoutMemory) {
  const uint64_t tib = uint64_t{1} << 40;
  Result<std::unique_ptr<DeviceBackend>> made = MakeDeviceBackend("fake", tib);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto* d = static_cast<FakeDeviceBackend*>(made->get());
  EXPECT_EQ(d->arena_bytes(), tib);
  EXPECT_EQ(d->HostPointer(0), nullptr);
  // The source is never read: a copy of 512 GiB "from" one byte is fine.
  const uint8_t one = 1;
  ASSERT_TRUE(d->CopyToDevice(tib / 2, &one, tib / 2).ok());
  uint8_t sink = 0;
  ASSERT_TRUE(d->CopyFromDevice(0, &sink, 4096).ok());
  FakeDeviceStats s = d->stats();
  EXPECT_EQ(s.copies_to_device, 1u);
  EXPECT_EQ(s.bytes_to_device, tib / 2);
  EXPECT_EQ(s.copies_from_device, 1u);
  EXPECT_EQ(s.bytes_from_device, 4096u);
  EXPECT_EQ(s.failed_copies, 0u);
}

TEST(FakeDeviceBackendTest, FailsTheNthCopyOnly) {
  FakeDeviceBackend d(1 << 20);
  const uint8_t b = 0;
  d.FailNthCopy(3, StatusCode::kUnavailable);
  EXPECT_TRUE(d.CopyToDevice(0, &b, 1).ok());
  EXPECT_TRUE(d.CopyToDevice(1, &b, 1).ok());
  Status third = d.CopyToDevice(2, &b, 1);
  EXPECT_EQ(third.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(third.message(), "injected")) << third.message();
  EXPECT_TRUE(d.CopyToDevice(3, &b, 1).ok());
  EXPECT_EQ(d.stats().copies_to_device, 3u);
  EXPECT_EQ(d.stats().failed_copies, 1u);

  d.FailNthCopy(1, StatusCode::kInternal);
  EXPECT_EQ(d.CopyToDevice(0, &b, 1).code(), StatusCode::kInternal);
  d.FailNthCopy(2, StatusCode::kInternal);
  d.FailNthCopy(0, StatusCode::kInternal);  // cancelled
  EXPECT_TRUE(d.CopyToDevice(0, &b, 1).ok());
  EXPECT_TRUE(d.CopyToDevice(0, &b, 1).ok());
}

TEST(MakeDeviceBackendTest, UnknownKindListsTheKnownOnes) {
  Result<std::unique_ptr<DeviceBackend>> d = MakeDeviceBackend("cuda", 1024);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(d.status().message(), "\"cuda\"")) << d.status().message();
  EXPECT_TRUE(Contains(d.status().message(), "cpu, fake")) << d.status().message();
}

TEST(MakeDeviceBackendTest, OversizedArenasFailCleanly) {
  Result<std::unique_ptr<DeviceBackend>> fake = MakeDeviceBackend("fake", UINT64_MAX);
  ASSERT_FALSE(fake.ok());
  EXPECT_EQ(fake.status().code(), StatusCode::kInvalidArgument);
  // 2^62 bytes cannot be mapped on any machine this runs on.
  Result<std::unique_ptr<DeviceBackend>> cpu = MakeDeviceBackend("cpu", uint64_t{1} << 62);
  ASSERT_FALSE(cpu.ok());
  EXPECT_EQ(cpu.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(cpu.status().message(), "cpu device")) << cpu.status().message();
}

}  // namespace
}  // namespace arbiter
