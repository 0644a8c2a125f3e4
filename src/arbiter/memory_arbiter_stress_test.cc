// Concurrency stress test for MemoryArbiter. `make
// test-tsan` runs it under ThreadSanitizer; it also runs in the plain and
// ASan builds (label unit).
//
// Six threads each run a fixed number of operations chosen by their own
// seeded generator (the choices are deterministic per thread; the
// interleaving is not): acquire with short deadlines, hold briefly, Retain,
// release; Preload; Unload; Request() through the queues; pressure from the
// bridge source and HandlePressure(); ReapIdle() with idle TTLs; event
// listeners subscribed and dropped; Stats()/ResidentSnapshot() readers; and
// external charges on the shared ledger. Loads sometimes fail and sometimes
// take a moment; the budget holds about three models, so fit evictions and
// same-role swaps happen all the time.
//
// Checked while running: a handle's backend is alive and intact (its unload
// has not run; `value` is a plain int the unload callable overwrites, so an
// unload racing with a holder is also a TSan report); each Stats() snapshot
// is self-consistent. Checked at the end (threads joined, Stop(), then
// Shutdown()): per key, model_load events == model_unload events + resident;
// nothing held; charged == Σ resident bytes; after Shutdown nothing is
// resident, the ledger is empty, every backend object was constructed by a
// successful load and destroyed exactly once, and every successful load was
// unloaded exactly once.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <any>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/clock.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/memory/memory_pressure.h"

namespace arbiter {
namespace {

using namespace std::chrono_literals;
constexpr size_t kMB = size_t{1} << 20;
constexpr int kThreads = 6;
constexpr int kOpsPerThread = 1500;
constexpr int kKeys = 3;
// A fuse for waits that must end (a future of a queued request).
constexpr auto kFuse = 60s;

struct Counters {
  std::atomic<int> constructed{0};
  std::atomic<int> destroyed{0};
  std::atomic<int> load_ok{0};
  std::atomic<int> load_failed{0};
  std::atomic<int> unload_calls{0};
  std::atomic<int> violations{0};
  std::atomic<int> acquires_ok{0};
  std::atomic<uint64_t> load_calls{0};
};

int ValueFor(const std::string& resident_key) {
  return static_cast<int>(std::hash<std::string>()(resident_key) & 0x7fffffff);
}

struct StressBackend {
  StressBackend(Counters* c, std::string k) : counters(c), key(std::move(k)), value(ValueFor(key)) {
    counters->constructed++;
  }
  ~StressBackend() { counters->destroyed++; }
  Counters* counters;
  std::string key;
  int value;  // plain on purpose: read by holders, overwritten by unload
  std::atomic<bool> alive{true};
};

// True when the handle's backend is the intact object of its key.
bool BackendIntact(const ArbiterHandle& h) {
  const StressBackend* b = h.backend<StressBackend>();
  return b != nullptr && b->alive.load() &&
         b->value == ValueFor(ResidentKey(h.capability(), h.model_key()));
}

// Per-key counts of model_load / model_unload events.
class EventCounts {
 public:
  void On(const ArbiterEvent& e) {
    std::lock_guard<std::mutex> l(mu_);
    const std::string rk = ResidentKey(e.capability, e.model_key);
    if (e.type == ArbiterEventType::kModelLoad) loads_[rk]++;
    if (e.type == ArbiterEventType::kModelUnload) unloads_[rk]++;
    if (e.type == ArbiterEventType::kCapabilityRun) runs_++;
  }
  std::map<std::string, int> loads() {
    std::lock_guard<std::mutex> l(mu_);
    return loads_;
  }
  std::map<std::string, int> unloads() {
    std::lock_guard<std::mutex> l(mu_);
    return unloads_;
  }
  int runs() {
    std::lock_guard<std::mutex> l(mu_);
    return runs_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> loads_, unloads_;
  int runs_ = 0;
};

// The injected load failures log errors by design; keep the output short.
class QuietLogs {
 public:
  QuietLogs() : old_(spdlog::get_level()) { spdlog::set_level(spdlog::level::off); }
  ~QuietLogs() { spdlog::set_level(old_); }

 private:
  spdlog::level::level_enum old_;
};

class ArbiterStressTest : public ::testing::TestWithParam<bool> {
 protected:
  CapabilityRegistration Reg(Capability cap, size_t estimate_mb) {
    CapabilityRegistration r;
    r.capability = cap;
    r.estimated_bytes = estimate_mb * kMB;
    r.load = [this, cap](const std::string& key) -> Result<LoadedBackend> {
      const uint64_t n = counters_.load_calls++;
      if (n % 4 == 1) std::this_thread::sleep_for(std::chrono::microseconds(500));  // slow load
      if (n % 9 == 4) {
        counters_.load_failed++;
        return DataLossError("weights truncated");
      }
      const std::string rk = ResidentKey(cap, key);
      counters_.load_ok++;
      // "m2" measures 1.5x its estimate: the measured size overshoots.
      const size_t measured = key == "m2" ? Estimate(cap) * 3 / 2 : 0;
      return LoadedBackend::Of(std::make_shared<StressBackend>(&counters_, rk), measured);
    };
    r.unload = [this](const std::string&, LoadedBackend b) {
      auto* backend = static_cast<StressBackend*>(b.object.get());
      if (!backend->alive.exchange(false)) counters_.violations++;  // unloaded twice
      backend->value = -1;
      counters_.unload_calls++;
    };
    r.run = [](const ArbiterHandle& h, std::any& request) -> Result<std::any> {
      if (!BackendIntact(h)) return InternalError("backend not intact in run");
      if (std::any_cast<int>(request) % 5 == 0) return InternalError("run failed");
      return std::any(h.backend<StressBackend>()->value);
    };
    return r;
  }
  static size_t Estimate(Capability cap) {
    switch (cap) {
      case Capability::kText:
        return 150 * kMB;
      case Capability::kEmbedding:
        return 80 * kMB;
      case Capability::kVisionDescribe:
        return 120 * kMB;
      case Capability::kImageGen:
        return 160 * kMB;
      case Capability::kTranscribe:
        return 100 * kMB;
      case Capability::kSpeak:
        return 90 * kMB;
      case Capability::kVad:
        return 20 * kMB;
    }
    return 0;
  }

  Counters counters_;
  EventCounts events_;
};

// One thread's operations.
void Worker(MemoryArbiter& a, BridgePressureSource& bridge, SimulatedClock& clock,
            MemoryLedger& ledger, Counters& counters, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::future<Result<std::any>>> requests;
  std::vector<MemoryCharge> external;
  auto check = [&](const ArbiterHandle& h) {
    if (!BackendIntact(h)) counters.violations++;
  };
  for (int op = 0; op < kOpsPerThread; ++op) {
    const auto cap = static_cast<Capability>(rng() % kCapabilityCount);
    const std::string key = "m" + std::to_string(rng() % kKeys);
    const uint32_t r = rng();
    switch (rng() % 16) {
      case 0:
      case 1:
      case 2:
      case 3:
      case 4: {  // acquire, hold briefly, maybe retain, release
        Result<ArbiterHandle> h = a.Acquire(cap, key, Deadline(20ms));
        if (!h.ok()) break;
        counters.acquires_ok++;
        check(*h);
        if (r % 3 == 0) {
          Result<ArbiterHandle> second = h->Retain();
          if (!second.ok()) {
            counters.violations++;
            break;
          }
          h->Release();
          std::this_thread::yield();
          check(*second);
        } else if (r % 3 == 1) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));  // work while held
          check(*h);
        }
        break;
      }
      case 5:
        (void)a.Preload(cap, key);
        break;
      case 6:
        (void)a.Unload(cap, key, Deadline(5ms));
        break;
      case 7:
      case 8:
        requests.push_back(a.Request(cap, key, std::any(static_cast<int>(r % 100))));
        break;
      case 9: {  // pressure, mostly nominal so work proceeds
        const auto level = r % 8 == 0   ? MemoryPressureLevel::kCritical
                           : r % 8 <= 2 ? MemoryPressureLevel::kLow
                                        : MemoryPressureLevel::kNominal;
        if (r % 2 == 0) {
          bridge.Dispatch(level, 512 * kMB);
        } else {
          MemoryPressureEvent ev;
          ev.level = level;
          ev.source = "stress";
          a.HandlePressure(ev);
        }
        break;
      }
      case 10:
        clock.AdvanceMs(r % 8);
        (void)a.ReapIdle();
        break;
      case 11: {  // a listener that comes and goes; sometimes one that throws
        // Shared, not on this stack: another thread's Emit() may still be
        // running the listener after Reset() returns (Reset does not wait).
        auto seen = std::make_shared<std::atomic<int>>(0);
        ArbiterEventSubscription sub = a.OnEvent([seen, r](const ArbiterEvent&) {
          (*seen)++;
          if (r % 4 == 0) throw std::runtime_error("listener failure");
        });
        std::this_thread::yield();
        sub.Reset();
        break;
      }
      case 12: {  // readers: each snapshot is self-consistent
        const ArbiterStats s = a.Stats();
        size_t resident = 0, loading = 0;
        int resident_models = 0;
        for (const ModelStats& m : s.models) {
          if (m.refcount < 0) counters.violations++;
          if (m.refcount > 0 && m.state != ModelState::kLoaded) counters.violations++;
          if (m.state == ModelState::kLoaded) {
            resident += m.bytes;
            resident_models++;
          }
          if (m.state == ModelState::kLoading) loading += m.bytes;
        }
        if (resident != s.resident_bytes || loading != s.loading_bytes ||
            resident_models != s.resident_models) {
          counters.violations++;
        }
        for (const ResidentEntryInfo& e : a.ResidentSnapshot()) {
          if (e.refcount < 0 || e.bytes == 0) counters.violations++;
        }
        break;
      }
      case 13: {  // another layer's charge on the same ledger
        Result<MemoryCharge> c = ledger.TryCharge("external", ChargeKind::kKvSlot, (r % 64) * kMB);
        if (c.ok()) external.push_back(std::move(c).value());
        break;
      }
      case 14:
        if (!external.empty())
          external.erase(external.begin() + static_cast<long>(r % external.size()));
        break;
      case 15:
        if (requests.size() > 4) {
          for (auto& f : requests) {
            if (f.wait_for(kFuse) != std::future_status::ready) counters.violations++;
          }
          requests.clear();
        }
        break;
    }
  }
  for (auto& f : requests) {
    if (f.wait_for(kFuse) != std::future_status::ready) {
      counters.violations++;
      continue;
    }
    Result<std::any> result = f.get();
    if (!result.ok() && result.status().message().find("not intact") != std::string::npos) {
      counters.violations++;
    }
  }
}

TEST_P(ArbiterStressTest, ConcurrentOperationsKeepInvariants) {
  QuietLogs quiet;
  const bool refuse_over_budget = GetParam();
  SimulatedClock clock(1000);
  BridgePressureSource bridge;
  MemoryLedger ledger(420 * kMB);  // about three models
  {
    MemoryArbiterOptions o;
    o.ledger = &ledger;
    o.clock = &clock;
    o.pressure_source = &bridge;
    o.drain_timeout_ms = 30;
    o.idle_check_interval_ms = 2;  // the reaper thread runs too
    o.request_acquire_timeout_ms = 200;
    o.refuse_over_budget = refuse_over_budget;
    MemoryArbiter a(o);
    for (size_t i = 0; i < kCapabilityCount; ++i) {
      const auto cap = static_cast<Capability>(i);
      CapabilityRegistration r = Reg(cap, Estimate(cap) / kMB);
      if (cap == Capability::kTranscribe) r.idle_ttl_ms = 5;
      if (cap == Capability::kSpeak) {
        r.idle_ttl_ms = 10;
        r.swap_same_role = false;  // several speak keys coexist
      }
      ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
    }
    ArbiterEventSubscription sub = a.OnEvent([this](const ArbiterEvent& e) { events_.On(e); });
    ASSERT_TRUE(a.Start().ok());

    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back(Worker, std::ref(a), std::ref(bridge), std::ref(clock), std::ref(ledger),
                           std::ref(counters_), 1000u + static_cast<uint32_t>(t));
    }
    for (std::thread& t : threads) t.join();
    a.Stop();  // joins the reaper: no unload is in progress past this point
    a.HandlePressure(MemoryPressureEvent{});  // nominal

    EXPECT_EQ(counters_.violations.load(), 0);
    const std::vector<ResidentEntryInfo> resident = a.ResidentSnapshot();
    size_t resident_bytes = 0;
    std::map<std::string, int> resident_count;
    for (const ResidentEntryInfo& r : resident) {
      EXPECT_EQ(r.refcount, 0) << r.resident_key;
      resident_bytes += r.bytes;
      resident_count[r.resident_key]++;
    }
    EXPECT_EQ(ledger.charged_bytes(), resident_bytes);
    const ArbiterStats s = a.Stats();
    EXPECT_EQ(s.loading_bytes, 0u);
    EXPECT_EQ(s.resident_bytes, resident_bytes);
    std::map<std::string, int> loads = events_.loads(), unloads = events_.unloads();
    for (const auto& [key, n] : loads) {
      EXPECT_EQ(n, unloads[key] + resident_count[key]) << key;
    }
    EXPECT_EQ(s.loads, static_cast<uint64_t>(counters_.load_ok.load()));
    EXPECT_EQ(s.load_failures, static_cast<uint64_t>(counters_.load_failed.load()));
    std::printf("stress: %llu loads, %d failed, %llu evictions, %d runs, %d acquires ok\n",
                (unsigned long long)s.loads, counters_.load_failed.load(),
                (unsigned long long)s.evictions, events_.runs(), counters_.acquires_ok.load());
    // The run exercised what it is meant to.
    EXPECT_GT(s.evictions, 0u);
    EXPECT_GT(counters_.load_failed.load(), 0);
    EXPECT_GT(events_.runs(), 0);

    a.Shutdown();
    EXPECT_TRUE(a.ResidentSnapshot().empty());
    EXPECT_EQ(ledger.charged_bytes(), 0u);
    EXPECT_TRUE(ledger.Snapshot().by_owner.empty());
    loads = events_.loads();
    unloads = events_.unloads();
    int total_loads = 0;
    for (const auto& [key, n] : loads) {
      EXPECT_EQ(n, unloads[key]) << key;
      total_loads += n;
    }
    EXPECT_EQ(total_loads, counters_.load_ok.load());
    EXPECT_EQ(counters_.unload_calls.load(), counters_.load_ok.load());
    EXPECT_EQ(counters_.constructed.load(), counters_.load_ok.load());
    EXPECT_EQ(counters_.destroyed.load(), counters_.constructed.load());
  }
  EXPECT_EQ(counters_.violations.load(), 0);
  EXPECT_EQ(counters_.destroyed.load(), counters_.constructed.load());
}

INSTANTIATE_TEST_SUITE_P(BestEffortAndRefusing, ArbiterStressTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "RefuseOverBudget" : "BestEffort";
                         });

}  // namespace
}  // namespace arbiter
