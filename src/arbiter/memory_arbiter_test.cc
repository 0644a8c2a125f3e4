#include "arbiter/arbiter/memory_arbiter.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

using std::chrono::milliseconds;

// A fake backend: a named object whose destruction is counted.
struct FakeBackend {
  explicit FakeBackend(std::string n, std::atomic<int>* live) : name(std::move(n)), live(live) {
    live->fetch_add(1);
  }
  ~FakeBackend() { live->fetch_sub(1); }
  std::string name;
  std::atomic<int>* live;
};

// A gate a load can block on; tests open it explicitly (a test "fuse": every
// wait has a deadline so a bug fails instead of hanging).
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool Wait() {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::seconds(10), [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class ArbiterTest : public ::testing::Test {
 protected:
  // Registers `name` whose load counts calls, optionally waits on `gate`,
  // and fails while `fail` is set.
  ModelRegistration Fake(const std::string& name, size_t estimate, size_t measured = 0,
                         Gate* gate = nullptr, std::atomic<bool>* fail = nullptr) {
    ModelRegistration r;
    r.name = name;
    r.capability = Capability::kText;
    r.estimated_bytes = estimate;
    r.load = [this, name, measured, gate, fail]() -> Result<LoadedBackend> {
      load_calls_.fetch_add(1);
      if (gate != nullptr && !gate->Wait()) return InternalError("test gate timed out");
      if (fail != nullptr && fail->load()) return DataLossError("model.safetensors is truncated");
      return LoadedBackend::Of(std::make_shared<FakeBackend>(name, &live_), measured);
    };
    return r;
  }

  static ModelState StateOf(const ArbiterStats& s, const std::string& name) {
    for (const auto& m : s.models) {
      if (m.name == name) return m.state;
    }
    return ModelState::kFailed;
  }

  std::atomic<int> load_calls_{0};
  std::atomic<int> live_{0};
};

TEST_F(ArbiterTest, AcquireLoadsOnceThenReuses) {
  MemoryArbiter arb;
  ASSERT_TRUE(arb.Register(Fake("a", 100)).ok());
  {
    auto h1 = arb.Acquire(Capability::kText, "a", Deadline(milliseconds(1000)));
    ASSERT_TRUE(h1.ok()) << h1.status().ToString();
    auto h2 = arb.Acquire(Capability::kText, "a", Deadline(milliseconds(1000)));
    ASSERT_TRUE(h2.ok());
    EXPECT_EQ(h1->backend<FakeBackend>(), h2->backend<FakeBackend>());
    EXPECT_EQ(h1->backend<FakeBackend>()->name, "a");
    EXPECT_EQ(h1->backend<int>(), nullptr);  // wrong type → nullptr
    EXPECT_EQ(arb.Stats().models[0].refcount, 2);
  }
  ArbiterStats s = arb.Stats();
  EXPECT_EQ(load_calls_.load(), 1);
  EXPECT_EQ(s.models[0].refcount, 0);
  EXPECT_EQ(s.models[0].state, ModelState::kLoaded);  // release never unloads
  EXPECT_EQ(s.resident_bytes, 100u);
  EXPECT_EQ(s.loads, 1u);
}

TEST_F(ArbiterTest, RegistrationErrors) {
  MemoryArbiter arb;
  ASSERT_TRUE(arb.Register(Fake("a", 1)).ok());
  Status dup = arb.Register(Fake("a", 1));
  EXPECT_EQ(dup.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(dup.message().find("\"a\" is already registered"), std::string::npos);
  EXPECT_EQ(arb.Register(Fake("", 1)).code(), StatusCode::kInvalidArgument);

  auto missing = arb.Acquire(Capability::kText, "nope", Deadline(milliseconds(100)));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "model \"nope\" not found");
  auto wrong_cap = arb.Acquire(Capability::kEmbedding, "a", Deadline(milliseconds(100)));
  EXPECT_EQ(wrong_cap.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ArbiterTest, HandleReleaseIsIdempotentAndMoveTransfers) {
  MemoryArbiter arb;
  ASSERT_TRUE(arb.Register(Fake("a", 10)).ok());
  auto h = arb.Acquire(Capability::kText, "a", Deadline(milliseconds(1000)));
  ASSERT_TRUE(h.ok());
  ArbiterHandle moved = std::move(*h);
  EXPECT_FALSE(h->valid());
  EXPECT_TRUE(moved.valid());
  EXPECT_EQ(arb.Stats().models[0].refcount, 1);
  moved.Release();
  moved.Release();
  h->Release();
  EXPECT_EQ(arb.Stats().models[0].refcount, 0);
  EXPECT_EQ(moved.backend<FakeBackend>(), nullptr);
}

TEST_F(ArbiterTest, SingleFlightEightThreadsOneLoad) {
  MemoryArbiter arb;
  Gate gate;
  ASSERT_TRUE(arb.Register(Fake("a", 100, 0, &gate)).ok());
  constexpr int kThreads = 8;
  std::atomic<int> started{0};
  std::vector<FakeBackend*> seen(kThreads, nullptr);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      started.fetch_add(1);
      auto h = arb.Acquire(Capability::kText, "a", Deadline(milliseconds(10000)));
      if (h.ok()) seen[i] = h->backend<FakeBackend>();
    });
  }
  // Open the gate once every thread has at least started; late arrivals
  // reuse the resident model, so one load holds either way.
  while (started.load() < kThreads) std::this_thread::yield();
  gate.Open();
  for (auto& t : threads) t.join();
  EXPECT_EQ(load_calls_.load(), 1);
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_NE(seen[i], nullptr) << i;
    EXPECT_EQ(seen[i], seen[0]);
  }
  EXPECT_EQ(arb.Stats().loads, 1u);
  EXPECT_EQ(arb.Stats().models[0].refcount, 0);
}

TEST_F(ArbiterTest, EvictsIdleLeastRecentlyUsedFirst) {
  MemoryArbiter arb({.budget_bytes = 300});
  for (const char* n : {"a", "b", "c", "d"}) ASSERT_TRUE(arb.Register(Fake(n, 100)).ok());
  auto use = [&](const char* n) {
    auto h = arb.Acquire(Capability::kText, n, Deadline(milliseconds(1000)));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
  };
  use("a");
  use("b");
  use("c");
  use("a");  // a is now most recent; b is the LRU
  use("d");
  ArbiterStats s = arb.Stats();
  EXPECT_EQ(StateOf(s, "b"), ModelState::kReady);
  EXPECT_EQ(StateOf(s, "a"), ModelState::kLoaded);
  EXPECT_EQ(StateOf(s, "c"), ModelState::kLoaded);
  EXPECT_EQ(StateOf(s, "d"), ModelState::kLoaded);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.resident_bytes, 300u);
  EXPECT_EQ(live_.load(), 3);  // b's backend was destroyed
  use("b");                    // next LRU is c
  s = arb.Stats();
  EXPECT_EQ(StateOf(s, "c"), ModelState::kReady);
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(load_calls_.load(), 5);
}

TEST_F(ArbiterTest, HeldModelIsNeverEvicted) {
  MemoryArbiter arb({.budget_bytes = 200});
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(arb.Register(Fake(n, 100)).ok());
  auto a = arb.Acquire(Capability::kText, "a", Deadline(milliseconds(1000)));
  ASSERT_TRUE(a.ok());
  {
    auto b = arb.Acquire(Capability::kText, "b", Deadline(milliseconds(1000)));
    ASSERT_TRUE(b.ok());
  }
  // a is older but held: b must go.
  auto c = arb.Acquire(Capability::kText, "c", Deadline(milliseconds(1000)));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ArbiterStats s = arb.Stats();
  EXPECT_EQ(StateOf(s, "a"), ModelState::kLoaded);
  EXPECT_EQ(StateOf(s, "b"), ModelState::kReady);

  // Both a and c held: b cannot fit; nothing is evicted.
  auto b = arb.Acquire(Capability::kText, "b", Deadline(milliseconds(1000)));
  ASSERT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  const std::string msg = b.status().message();
  EXPECT_NE(msg.find("\"b\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("100 B"), std::string::npos) << msg;
  EXPECT_NE(msg.find("200 B"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"a\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"c\""), std::string::npos) << msg;
  s = arb.Stats();
  EXPECT_EQ(StateOf(s, "a"), ModelState::kLoaded);
  EXPECT_EQ(StateOf(s, "c"), ModelState::kLoaded);
  EXPECT_EQ(s.evictions, 1u);

  // Once c is released it is evictable.
  c->Release();
  auto b2 = arb.Acquire(Capability::kText, "b", Deadline(milliseconds(1000)));
  ASSERT_TRUE(b2.ok()) << b2.status().ToString();
  EXPECT_EQ(StateOf(arb.Stats(), "c"), ModelState::kReady);
}

TEST_F(ArbiterTest, ModelLargerThanBudgetLoadsAloneWithWarning) {
  MemoryArbiter arb({.budget_bytes = 100});
  ASSERT_TRUE(arb.Register(Fake("small", 50)).ok());
  ASSERT_TRUE(arb.Register(Fake("huge", 500)).ok());
  { ASSERT_TRUE(arb.Acquire(Capability::kText, "small", Deadline(milliseconds(100))).ok()); }
  auto h = arb.Acquire(Capability::kText, "huge", Deadline(milliseconds(100)));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ArbiterStats s = arb.Stats();
  EXPECT_EQ(StateOf(s, "small"), ModelState::kReady);
  EXPECT_EQ(s.resident_bytes, 500u);
  // While huge is held, small cannot come in.
  auto small = arb.Acquire(Capability::kText, "small", Deadline(milliseconds(100)));
  EXPECT_EQ(small.status().code(), StatusCode::kResourceExhausted);
}

TEST_F(ArbiterTest, MeasuredBytesReplaceEstimate) {
  MemoryArbiter arb({.budget_bytes = 1000});
  ASSERT_TRUE(arb.Register(Fake("a", 100, 250)).ok());
  auto h = arb.Acquire(Capability::kText, "a", Deadline(milliseconds(100)));
  ASSERT_TRUE(h.ok());
  ArbiterStats s = arb.Stats();
  EXPECT_EQ(s.models[0].bytes, 250u);
  EXPECT_TRUE(s.models[0].bytes_measured);
  EXPECT_EQ(s.resident_bytes, 250u);
}

TEST_F(ArbiterTest, MeasuredOverBudgetEvictsOtherIdleModels) {
  MemoryArbiter arb({.budget_bytes = 300});
  ASSERT_TRUE(arb.Register(Fake("a", 100)).ok());
  ASSERT_TRUE(arb.Register(Fake("b", 100, 250)).ok());  // underestimated
  { ASSERT_TRUE(arb.Acquire(Capability::kText, "a", Deadline(milliseconds(100))).ok()); }
  auto b = arb.Acquire(Capability::kText, "b", Deadline(milliseconds(100)));
  ASSERT_TRUE(b.ok());
  ArbiterStats s = arb.Stats();
  EXPECT_EQ(StateOf(s, "a"), ModelState::kReady);
  EXPECT_EQ(s.resident_bytes, 250u);
}

TEST_F(ArbiterTest, FailedLoadFailsAllWaitersAndIsRetried) {
  MemoryArbiter arb;
  Gate gate;
  std::atomic<bool> fail{true};
  ASSERT_TRUE(arb.Register(Fake("broken", 100, 0, &gate, &fail)).ok());
  constexpr int kThreads = 4;
  std::atomic<int> started{0};
  std::vector<Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      started.fetch_add(1);
      auto h = arb.Acquire(Capability::kText, "broken", Deadline(milliseconds(10000)));
      results[i] = h.status();
    });
  }
  while (started.load() < kThreads) std::this_thread::yield();
  gate.Open();
  for (auto& t : threads) t.join();
  // Threads that arrived after the failure start their own (retry) load, so
  // count failures by load call: every result is the load's error.
  for (const Status& st : results) {
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
    EXPECT_NE(st.message().find("model \"broken\" failed to load"), std::string::npos);
    EXPECT_NE(st.message().find("truncated"), std::string::npos);
  }
  const int failed_calls = load_calls_.load();
  EXPECT_GE(failed_calls, 1);
  ArbiterStats s = arb.Stats();
  EXPECT_EQ(s.models[0].state, ModelState::kFailed);
  EXPECT_NE(s.models[0].last_error.find("truncated"), std::string::npos);
  EXPECT_EQ(s.models[0].load_failures, static_cast<uint64_t>(failed_calls));
  EXPECT_EQ(s.loading_bytes, 0u);

  fail.store(false);
  auto h = arb.Acquire(Capability::kText, "broken", Deadline(milliseconds(1000)));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(load_calls_.load(), failed_calls + 1);
  s = arb.Stats();
  EXPECT_EQ(s.models[0].state, ModelState::kLoaded);
  EXPECT_TRUE(s.models[0].last_error.empty());
}

TEST_F(ArbiterTest, WaitersOfOneFailedLoadShareItsSingleCall) {
  MemoryArbiter arb;
  Gate gate;
  std::atomic<bool> fail{true};
  ASSERT_TRUE(arb.Register(Fake("broken", 100, 0, &gate, &fail)).ok());
  // The loader thread claims the load first (it is blocked on the gate).
  std::thread loader([&] {
    auto h = arb.Acquire(Capability::kText, "broken", Deadline(milliseconds(10000)));
    EXPECT_EQ(h.status().code(), StatusCode::kDataLoss);
  });
  while (arb.Stats().models[0].state != ModelState::kLoading) std::this_thread::yield();
  std::vector<std::thread> waiters;
  std::atomic<int> waiting{0};
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      waiting.fetch_add(1);
      auto h = arb.Acquire(Capability::kText, "broken", Deadline(milliseconds(10000)));
      EXPECT_EQ(h.status().code(), StatusCode::kDataLoss);
    });
  }
  while (waiting.load() < 4) std::this_thread::yield();
  gate.Open();
  loader.join();
  for (auto& t : waiters) t.join();
  // Waiters that entered while kLoading share the one call; a waiter that
  // arrived after the failure retries, so at most 1 + 4 calls, and every
  // retry also fails.
  EXPECT_GE(load_calls_.load(), 1);
  EXPECT_LE(load_calls_.load(), 5);
}

TEST_F(ArbiterTest, DeadlineWhileWaitingForAnotherLoad) {
  MemoryArbiter arb;
  Gate gate;
  ASSERT_TRUE(arb.Register(Fake("slow", 100, 0, &gate)).ok());
  std::thread loader([&] {
    auto h = arb.Acquire(Capability::kText, "slow", Deadline(milliseconds(1)));
    // The loading thread is not bounded by its own deadline.
    EXPECT_TRUE(h.ok()) << h.status().ToString();
  });
  while (arb.Stats().models[0].state != ModelState::kLoading) std::this_thread::yield();
  auto waiter = arb.Acquire(Capability::kText, "slow", Deadline(milliseconds(20)));
  EXPECT_EQ(waiter.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(waiter.status().message().find("\"slow\""), std::string::npos);
  gate.Open();
  loader.join();
  EXPECT_EQ(load_calls_.load(), 1);
  EXPECT_EQ(arb.Stats().models[0].state, ModelState::kLoaded);
}

TEST_F(ArbiterTest, ShutdownRefusesAcquiresAndUnloadsOnRelease) {
  MemoryArbiter arb;
  ASSERT_TRUE(arb.Register(Fake("a", 10)).ok());
  ASSERT_TRUE(arb.Register(Fake("b", 10)).ok());
  { ASSERT_TRUE(arb.Acquire(Capability::kText, "a", Deadline(milliseconds(100))).ok()); }
  auto b = arb.Acquire(Capability::kText, "b", Deadline(milliseconds(100)));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(live_.load(), 2);
  arb.Shutdown();
  EXPECT_EQ(live_.load(), 1);  // idle a unloaded; held b stays
  auto again = arb.Acquire(Capability::kText, "a", Deadline(milliseconds(100)));
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  b->Release();
  EXPECT_EQ(live_.load(), 0);
  EXPECT_EQ(arb.Stats().resident_bytes, 0u);
}

TEST_F(ArbiterTest, LoadExceptionBecomesInternalError) {
  MemoryArbiter arb;
  ModelRegistration r;
  r.name = "throws";
  r.load = []() -> Result<LoadedBackend> { throw std::runtime_error("boom"); };
  ASSERT_TRUE(arb.Register(std::move(r)).ok());
  auto h = arb.Acquire(Capability::kText, "throws", Deadline(milliseconds(100)));
  EXPECT_EQ(h.status().code(), StatusCode::kInternal);
  EXPECT_NE(h.status().message().find("boom"), std::string::npos);
}

TEST(CapabilityTest, Names) {
  EXPECT_EQ(CapabilityName(Capability::kText), "text");
  EXPECT_EQ(*ParseCapability("embedding"), Capability::kEmbedding);
  EXPECT_FALSE(ParseCapability("vision").ok());
  EXPECT_EQ(ModelStateName(ModelState::kFailed), "failed");
}

}  // namespace
}  // namespace arbiter
