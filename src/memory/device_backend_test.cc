// DeviceBackend: one contract suite run against every implementation
// (STYLE.md rule 13), then what is specific to cpu and fake, and copy
// tickets (Note [Device copies]).
#include "arbiter/memory/device_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace arbiter {
namespace {

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

class DeviceBackendContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<DeviceBackend> Make(uint64_t heap_bytes) {
    Result<std::unique_ptr<DeviceBackend>> b = MakeDeviceBackend(GetParam(), heap_bytes);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::move(b).value() : nullptr;
  }
  DeviceRegion MustRegion(DeviceBackend& d, uint64_t bytes) {
    Result<DeviceRegion> r = d.AllocateRegion(bytes);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : DeviceRegion{};
  }
};

TEST_P(DeviceBackendContractTest, Properties) {
  std::unique_ptr<DeviceBackend> d = Make(1 << 20);
  ASSERT_NE(d, nullptr);
  const DeviceProperties& p = d->properties();
  EXPECT_EQ(d->name(), GetParam());
  EXPECT_EQ(p.heap_bytes, 1u << 20);
  EXPECT_EQ(p.max_allocation_bytes, 1u << 20);
  EXPECT_GE(p.alignment_bytes, 1u);
  EXPECT_EQ(p.alignment_bytes & (p.alignment_bytes - 1), 0u);
  EXPECT_EQ(p.host_visible, GetParam() == "cpu");
  EXPECT_EQ(p.unified_memory, GetParam() == "cpu");
  EXPECT_FALSE(d->QueryMemory().has_value());  // neither has a driver report
}

TEST_P(DeviceBackendContractTest, RegionsAreBoundedByTheHeapAndTheLargestAllocation) {
  std::unique_ptr<DeviceBackend> d = Make(1 << 16);
  ASSERT_NE(d, nullptr);
  DeviceRegion a = MustRegion(*d, 40000);
  EXPECT_NE(a.id, 0u);
  EXPECT_EQ(a.size_bytes, 40000u);
  EXPECT_EQ(a.host != nullptr, d->properties().host_visible);
  // 40000 + 30000 > 65536: the heap is full.
  Result<DeviceRegion> over = d->AllocateRegion(30000);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(over.status().message(), "30000 bytes")) << over.status().message();
  DeviceRegion b = MustRegion(*d, 20000);
  EXPECT_NE(b.id, a.id);
  EXPECT_EQ(d->AllocateRegion(0).status().code(), StatusCode::kInvalidArgument);
  Result<DeviceRegion> huge = d->AllocateRegion(1 << 17);
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(huge.status().message(), "largest allocation")) << huge.status().message();
  ASSERT_TRUE(d->FreeRegion(a.id).ok());
  EXPECT_EQ(d->FreeRegion(a.id).code(), StatusCode::kNotFound);  // twice
  MustRegion(*d, 30000);  // the freed room is usable again
  EXPECT_TRUE(d->FreeRegion(b.id).ok());
}

TEST_P(DeviceBackendContractTest, CopiesInsideARegionSucceed) {
  std::unique_ptr<DeviceBackend> d = Make(8192);
  ASSERT_NE(d, nullptr);
  DeviceRegion r = MustRegion(*d, 4096);
  std::vector<uint8_t> buf(4096, 7);
  EXPECT_TRUE(d->CopyToDevice(r.id, 0, buf.data(), buf.size()).Wait().ok());
  EXPECT_TRUE(d->CopyToDevice(r.id, 4000, buf.data(), 96).Wait().ok());
  EXPECT_TRUE(d->CopyFromDevice(r.id, 100, buf.data(), 200).Wait().ok());
  EXPECT_TRUE(d->CopyToDevice(r.id, 4096, buf.data(), 0).Wait().ok());  // empty, at the end
}

TEST_P(DeviceBackendContractTest, CopyErrorsSurfaceAtWait) {
  std::unique_ptr<DeviceBackend> d = Make(8192);
  ASSERT_NE(d, nullptr);
  DeviceRegion r = MustRegion(*d, 4096);
  std::vector<uint8_t> buf(8192, 1);
  CopyTicket t = d->CopyToDevice(r.id, 4000, buf.data(), 97);
  Status s = t.Wait();
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(Contains(s.message(), "4096")) << s.message();
  EXPECT_EQ(t.Wait().code(), StatusCode::kOutOfRange);  // again: the same result
  EXPECT_EQ(d->CopyFromDevice(r.id, 4097, buf.data(), 0).Wait().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(d->CopyToDevice(r.id, 0, buf.data(), 8192).Wait().code(), StatusCode::kOutOfRange);
  // offset + size would wrap around 2^64.
  EXPECT_EQ(d->CopyToDevice(r.id, UINT64_MAX, buf.data(), 2).Wait().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(d->CopyToDevice(r.id + 100, 0, buf.data(), 1).Wait().code(), StatusCode::kNotFound);
  EXPECT_EQ(d->HostPointer(r.id, 4096), nullptr);
  EXPECT_EQ(d->HostPointer(r.id + 100, 0), nullptr);
}

TEST_P(DeviceBackendContractTest, DiscardChecksItsRange) {
  std::unique_ptr<DeviceBackend> d = Make(1 << 16);
  ASSERT_NE(d, nullptr);
  DeviceRegion r = MustRegion(*d, 1 << 16);
  EXPECT_TRUE(d->Discard(r.id, 0, 1 << 16).ok());
  EXPECT_TRUE(d->Discard(r.id, 100, 10).ok());  // no whole page inside: nothing to do
  EXPECT_EQ(d->Discard(r.id, 1 << 16, 1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(d->Discard(r.id, UINT64_MAX, 2).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(d->Discard(r.id + 1, 0, 1).code(), StatusCode::kNotFound);
}

TEST_P(DeviceBackendContractTest, EmptyHeap) {
  std::unique_ptr<DeviceBackend> d = Make(0);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->properties().heap_bytes, 0u);
  EXPECT_FALSE(d->AllocateRegion(1).ok());
  uint8_t b = 0;
  EXPECT_EQ(d->CopyToDevice(1, 0, &b, 1).Wait().code(), StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, DeviceBackendContractTest,
                         ::testing::Values("cpu", "fake"),
                         [](const auto& info) { return info.param; });

TEST(CpuDeviceBackendTest, RoundTripsBytesAndExposesHostPointers) {
  Result<std::unique_ptr<DeviceBackend>> d = MakeDeviceBackend("cpu", 1 << 16);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  Result<DeviceRegion> r = (*d)->AllocateRegion(1 << 16);
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> in(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 31 + 5);
  CopyTicket t = (*d)->CopyToDevice(r->id, 512, in.data(), in.size());
  EXPECT_TRUE(t.ready());  // the cpu device copies before returning
  ASSERT_TRUE(t.Wait().ok());
  std::vector<uint8_t> out(in.size());
  ASSERT_TRUE((*d)->CopyFromDevice(r->id, 512, out.data(), out.size()).Wait().ok());
  EXPECT_EQ(in, out);
  auto* p = static_cast<uint8_t*>((*d)->HostPointer(r->id, 512));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p, static_cast<uint8_t*>(r->host) + 512);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r->host) % 4096, 0u);
  EXPECT_EQ(std::memcmp(p, in.data(), in.size()), 0);
}

TEST(CpuDeviceBackendTest, DiscardZeroesWholePagesOnlyAndKeepsNeighbours) {
  Result<std::unique_ptr<CpuDeviceBackend>> made = CpuDeviceBackend::Create(4 * 4096);
  ASSERT_TRUE(made.ok());
  CpuDeviceBackend& d = **made;
  Result<DeviceRegion> r = d.AllocateRegion(4 * 4096);
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> ones(4 * 4096, 1);
  ASSERT_TRUE(d.CopyToDevice(r->id, 0, ones.data(), ones.size()).Wait().ok());
  // [100, 3 × 4096 + 50): only pages 1 and 2 lie wholly inside.
  ASSERT_TRUE(d.Discard(r->id, 100, 3 * 4096 - 50).ok());
  const uint8_t* p = static_cast<const uint8_t*>(r->host);
  EXPECT_EQ(p[0], 1);
  EXPECT_EQ(p[4095], 1);
  EXPECT_EQ(p[4096], 0);
  EXPECT_EQ(p[3 * 4096 - 1], 0);
  EXPECT_EQ(p[3 * 4096], 1);
}

// Note [Arena huge pages]: a region of 2 MiB or more starts on a 2 MiB
// boundary; Discard still frees exactly the whole 4 KiB pages inside a range,
// also across and inside huge pages. Without huge pages it behaves the same.
TEST(CpuDeviceBackendTest, LargeRegionIsHugePageAlignedAndDiscardsBasePages) {
  constexpr uint64_t kHuge = CpuDeviceBackend::kHugePageBytes;
  for (bool huge_pages : {true, false}) {
    SCOPED_TRACE(huge_pages ? "huge pages" : "base pages");
    Result<std::unique_ptr<CpuDeviceBackend>> made =
        CpuDeviceBackend::Create(3 * kHuge + 4096, huge_pages);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    CpuDeviceBackend& d = **made;
    Result<DeviceRegion> r = d.AllocateRegion(3 * kHuge + 4096);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (huge_pages) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(r->host) % kHuge, 0u);
    }
    std::vector<uint8_t> ones(r->size_bytes, 1);
    ASSERT_TRUE(d.CopyToDevice(r->id, 0, ones.data(), ones.size()).Wait().ok());  // last byte too
    // [4096 + 10, 4096 + 2 MiB + 4096): whole pages [8192, 2 MiB + 8192).
    ASSERT_TRUE(d.Discard(r->id, 4096 + 10, kHuge + 4096 - 10).ok());
    const uint8_t* p = static_cast<const uint8_t*>(r->host);
    EXPECT_EQ(p[0], 1);
    EXPECT_EQ(p[8191], 1);
    EXPECT_EQ(p[8192], 0);
    EXPECT_EQ(p[kHuge], 0);
    EXPECT_EQ(p[kHuge + 8191], 0);
    EXPECT_EQ(p[kHuge + 8192], 1);
    EXPECT_EQ(p[3 * kHuge + 4095], 1);
    // A whole huge page, then written again: reads back what was written.
    ASSERT_TRUE(d.Discard(r->id, kHuge, kHuge).ok());
    EXPECT_EQ(p[2 * kHuge - 1], 0);
    EXPECT_EQ(p[2 * kHuge], 1);
    ASSERT_TRUE(d.CopyToDevice(r->id, kHuge, ones.data(), kHuge).Wait().ok());
    EXPECT_EQ(p[kHuge], 1);
    EXPECT_EQ(p[2 * kHuge - 1], 1);
  }
}

bool IsMapped(const void* p) {
  unsigned char c = 0;
  return ::mincore(const_cast<void*>(p), 1, &c) == 0;  // ENOMEM once unmapped
}

TEST(CpuDeviceBackendTest, FreeRegionUnmapsAndTheDestructorFreesTheRest) {
  const void* first = nullptr;
  const void* second = nullptr;
  {
    Result<std::unique_ptr<CpuDeviceBackend>> made =
        CpuDeviceBackend::Create(8 << 20, /*huge_pages=*/true, 4 << 20);
    ASSERT_TRUE(made.ok());
    CpuDeviceBackend& d = **made;
    EXPECT_EQ(d.properties().max_allocation_bytes, 4u << 20);
    Result<DeviceRegion> a = d.AllocateRegion(4 << 20);
    Result<DeviceRegion> b = d.AllocateRegion(4 << 20);
    ASSERT_TRUE(a.ok() && b.ok());
    first = a->host;
    second = b->host;
    std::memset(a->host, 1, 4 << 20);
    std::memset(b->host, 1, 4 << 20);
    EXPECT_EQ(d.allocated_bytes(), 8u << 20);
    ASSERT_TRUE(d.FreeRegion(a->id).ok());
    EXPECT_FALSE(IsMapped(first));
    EXPECT_TRUE(IsMapped(second));
    EXPECT_EQ(d.allocated_bytes(), 4u << 20);
    EXPECT_EQ(d.live_regions(), 1u);
  }
  EXPECT_FALSE(IsMapped(second));
  EXPECT_EQ(CpuDeviceBackend::Create(1 << 20, true, 2 << 20).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(FakeDeviceBackendTest, TerabyteRegionCountsCopiesWithoutMemory) {
  const uint64_t tib = uint64_t{1} << 40;
  Result<std::unique_ptr<DeviceBackend>> made = MakeDeviceBackend("fake", tib);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto* d = static_cast<FakeDeviceBackend*>(made->get());
  Result<DeviceRegion> r = d->AllocateRegion(tib);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->host, nullptr);
  EXPECT_EQ(d->HostPointer(r->id, 0), nullptr);
  // The source is never read: a copy of 512 GiB "from" one byte is fine.
  const uint8_t one = 1;
  ASSERT_TRUE(d->CopyToDevice(r->id, tib / 2, &one, tib / 2).Wait().ok());
  uint8_t sink = 0;
  ASSERT_TRUE(d->CopyFromDevice(r->id, 0, &sink, 4096).Wait().ok());
  FakeDeviceStats s = d->stats();
  EXPECT_EQ(s.copies_to_device, 1u);
  EXPECT_EQ(s.bytes_to_device, tib / 2);
  EXPECT_EQ(s.copies_from_device, 1u);
  EXPECT_EQ(s.bytes_from_device, 4096u);
  EXPECT_EQ(s.failed_copies, 0u);
  EXPECT_EQ(s.live_regions, 1u);
  EXPECT_EQ(s.live_region_bytes, tib);
}

TEST(FakeDeviceBackendTest, FailsTheNthCopyOnlyAtItsWait) {
  FakeDeviceBackend d(1 << 20);
  Result<DeviceRegion> r = d.AllocateRegion(1 << 20);
  ASSERT_TRUE(r.ok());
  const DeviceRegionId id = r->id;
  const uint8_t b = 0;
  d.FailNthCopy(3, StatusCode::kUnavailable);
  EXPECT_TRUE(d.CopyToDevice(id, 0, &b, 1).Wait().ok());
  EXPECT_TRUE(d.CopyToDevice(id, 1, &b, 1).Wait().ok());
  CopyTicket third = d.CopyToDevice(id, 2, &b, 1);
  Status s = third.Wait();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(s.message(), "injected")) << s.message();
  EXPECT_TRUE(d.CopyToDevice(id, 3, &b, 1).Wait().ok());
  EXPECT_EQ(d.stats().copies_to_device, 3u);
  EXPECT_EQ(d.stats().failed_copies, 1u);

  d.FailNthCopy(1, StatusCode::kInternal);
  EXPECT_EQ(d.CopyToDevice(id, 0, &b, 1).Wait().code(), StatusCode::kInternal);
  d.FailNthCopy(2, StatusCode::kInternal);
  d.FailNthCopy(0, StatusCode::kInternal);  // cancelled
  EXPECT_TRUE(d.CopyToDevice(id, 0, &b, 1).Wait().ok());
  EXPECT_TRUE(d.CopyToDevice(id, 0, &b, 1).Wait().ok());
}

TEST(FakeDeviceBackendTest, AsyncCopiesCompleteWhenTheDeviceSaysSo) {
  FakeDeviceBackend d(1 << 20);
  Result<DeviceRegion> r = d.AllocateRegion(4096);
  ASSERT_TRUE(r.ok());
  const uint8_t b = 0;
  d.SetAsyncCopies(true);
  d.FailNthCopy(2, StatusCode::kUnavailable);
  std::vector<CopyTicket> tickets;
  tickets.push_back(d.CopyToDevice(r->id, 0, &b, 1));
  tickets.push_back(d.CopyToDevice(r->id, 1, &b, 1));   // the injected failure
  tickets.push_back(d.CopyToDevice(r->id, 8192, &b, 1));  // out of range
  for (const CopyTicket& t : tickets) EXPECT_FALSE(t.ready());
  EXPECT_EQ(d.stats().pending_copies, 3u);
  // A waiter blocks until the device completes the copies.
  std::atomic<bool> returned{false};
  Status waited;
  std::thread waiter([&] {
    waited = WaitAll(tickets);
    returned = true;
  });
  EXPECT_FALSE(returned.load());  // nothing completed: it cannot have returned
  EXPECT_EQ(d.CompletePendingCopies(), 3u);
  waiter.join();
  EXPECT_TRUE(returned.load());
  EXPECT_EQ(waited.code(), StatusCode::kUnavailable);  // the first error in order
  for (const CopyTicket& t : tickets) EXPECT_TRUE(t.ready());
  EXPECT_TRUE(tickets[0].Wait().ok());
  EXPECT_EQ(tickets[2].Wait().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(d.stats().pending_copies, 0u);
  EXPECT_EQ(d.CompletePendingCopies(), 0u);
  d.SetAsyncCopies(false);
  EXPECT_TRUE(d.CopyToDevice(r->id, 0, &b, 1).ready());
}

TEST(FakeDeviceBackendTest, InjectedAllocationFailureAndMemoryReport) {
  FakeDeviceBackend d(FakeDeviceOptions{.heap_bytes = 1 << 20,
                                        .max_allocation_bytes = 1 << 16,
                                        .alignment_bytes = 256,
                                        .host_visible = true});
  EXPECT_EQ(d.properties().max_allocation_bytes, 1u << 16);
  EXPECT_EQ(d.properties().alignment_bytes, 256u);
  EXPECT_TRUE(d.properties().host_visible);
  d.FailNthAllocation(2);
  EXPECT_TRUE(d.AllocateRegion(100).ok());
  Result<DeviceRegion> second = d.AllocateRegion(100);
  EXPECT_EQ(second.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(d.AllocateRegion(100).ok());
  EXPECT_EQ(d.stats().live_regions, 2u);
  EXPECT_FALSE(d.QueryMemory().has_value());
  d.SetMemoryReport(DeviceMemoryReport{.usage_bytes = 3 << 20, .budget_bytes = 7 << 20});
  std::optional<DeviceMemoryReport> m = d.QueryMemory();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->usage_bytes, 3u << 20);
  EXPECT_EQ(m->budget_bytes, 7u << 20);
}

TEST(CopyTicketTest, DefaultAndDoneTickets) {
  CopyTicket ok;
  EXPECT_TRUE(ok.ready());
  EXPECT_TRUE(ok.Wait().ok());
  CopyTicket failed = CopyTicket::Done(InternalError("boom"));
  EXPECT_TRUE(failed.ready());
  EXPECT_EQ(failed.Wait().code(), StatusCode::kInternal);
  CopyTicket copy = failed;  // shares the completion
  EXPECT_EQ(copy.Wait().message(), "boom");
  EXPECT_EQ(WaitAll({ok, failed, CopyTicket::Done(UnavailableError("later"))}).code(),
            StatusCode::kInternal);
  EXPECT_TRUE(WaitAll({}).ok());
}

TEST(MakeDeviceBackendTest, UnknownKindListsTheKnownOnes) {
  Result<std::unique_ptr<DeviceBackend>> d = MakeDeviceBackend("cuda", 1024);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(d.status().message(), "\"cuda\"")) << d.status().message();
  EXPECT_TRUE(Contains(d.status().message(), "cpu, fake")) << d.status().message();
}

TEST(MakeDeviceBackendTest, OversizedHeapsAndRegionsFailCleanly) {
  Result<std::unique_ptr<DeviceBackend>> fake = MakeDeviceBackend("fake", UINT64_MAX);
  ASSERT_FALSE(fake.ok());
  EXPECT_EQ(fake.status().code(), StatusCode::kInvalidArgument);
  // A cpu heap is address space mapped per region: 2^62 bytes cannot be
  // mapped on any machine this runs on, so the region fails, cleanly.
  Result<std::unique_ptr<DeviceBackend>> cpu = MakeDeviceBackend("cpu", uint64_t{1} << 62);
  ASSERT_TRUE(cpu.ok());
  Result<DeviceRegion> r = (*cpu)->AllocateRegion(uint64_t{1} << 62);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(r.status().message(), "cpu device")) << r.status().message();
  // The failed region left nothing allocated.
  EXPECT_TRUE((*cpu)->AllocateRegion(1 << 20).ok());
}

}  // namespace
}  // namespace arbiter
