// The slot-level KV API of the engine on the `tiny` preset: pinned slots
// (GenerationRequest::slot), Slots / SlotTokens, SaveSlot / RestoreSlot /
// ClearSlot, the prefix copy between slots (engine_impl.h, Note [Prefix
// copy between slots]), and the slot scheduler: ReserveSlot and calls
// within a SlotReservation, the choice (Note [Slot choice]) and the waits
// (Note [Slot waits]: a release or a cancel wakes a waiter without polling;
// a deadline ends the wait). Every "same output" check compares greedy tokens with
// a cold run on a fresh engine. No test asserts wall-clock time: a slot is
// held busy by a call whose CancelFn blocks on a gate, and waits on engine
// state are bounded by a 30 s fuse that turns a hang into a failure.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/base/cancel.h"
#include "arbiter/engine/engine.h"
#include "arbiter/engine/kv_snapshot.h"
#include "engine/internal/engine_impl.h"
#include "tools/model_maker/model_maker.h"
#include "engine/internal/test_model.h"

namespace arbiter {
namespace {

// Polls `pred` every millisecond; false after 30 s (the fuse).
bool Eventually(const std::function<bool()>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Keeps one slot busy: a pinned Generate whose CancelFn, first polled right
// after prefill, blocks until Release() and then cancels. The slot then
// holds exactly the holder's prompt.
class SlotHolder {
 public:
  SlotHolder(Engine& engine, int slot, std::vector<int32_t> prompt) {
    thread_ = std::thread([this, &engine, slot, prompt = std::move(prompt)] {
      GenerationRequest r;
      r.prompt_ids = prompt;
      r.sampling.temperature = 0.0f;
      r.max_tokens = 4;
      r.slot = slot;
      result_ = engine.Generate(r, nullptr, [this] {
        std::unique_lock<std::mutex> l(mu_);
        holding_ = true;
        cv_.notify_all();
        cv_.wait(l, [this] { return released_; });
        return true;
      });
    });
  }
  ~SlotHolder() { Release(); }

  // Blocks until the holder has its slot (at most the fuse).
  bool WaitHolding() {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::seconds(30), [this] { return holding_; });
  }
  // Lets the holder finish and joins it; returns its result.
  const Result<GenerationResult>& Release() {
    {
      std::lock_guard<std::mutex> l(mu_);
      released_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return result_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool holding_ = false;
  bool released_ = false;
  Result<GenerationResult> result_{InternalError("not run")};
  std::thread thread_;
};

class EngineSlotsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(engine_internal::MakeTempDir("arbiter_engine_slots_test_"));
    Status s = MakeModel("tiny", *dir_, 7);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::unique_ptr<Engine> LoadEngine(int n_slots = 2, int n_ctx = 256) {
    EngineOptions o;
    o.n_ctx = n_ctx;
    o.n_slots = n_slots;
    o.prefill_batch = 16;
    Result<std::unique_ptr<Engine>> e = Engine::Load(*dir_, o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static GenerationRequest Greedy(std::vector<int32_t> prompt, int max_tokens, int slot = -1) {
    GenerationRequest r;
    r.prompt_ids = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.slot = slot;
    return r;
  }

  static std::vector<int32_t> Ids(const Engine& e, const std::string& text) {
    return e.tokenizer().Encode(text, /*parse_special=*/false);
  }

  static std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  // Greedy tokens of `prompt` on a fresh engine (nothing cached anywhere).
  static std::vector<int32_t> Cold(const std::vector<int32_t>& prompt, int max_tokens) {
    std::unique_ptr<Engine> e = LoadEngine(1);
    if (e == nullptr) return {};
    Result<GenerationResult> r = e->Generate(Greedy(prompt, max_tokens), nullptr, nullptr);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return {};
    EXPECT_EQ(r->cached_tokens, 0);
    return r->output_ids;
  }

  static std::string* dir_;
};
std::string* EngineSlotsTest::dir_ = nullptr;

constexpr const char* kSystem =
    "You are a careful assistant. Answer briefly, cite nothing, and never invent facts.";

TEST_F(EngineSlotsTest, PinnedSlotIsUsedAndReported) {
  auto e = LoadEngine(/*n_slots=*/3);
  ASSERT_NE(e, nullptr);
  const auto prompt = Ids(*e, "pinned to the last slot");
  Result<GenerationResult> r = e->Generate(Greedy(prompt, 5, /*slot=*/2), nullptr, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->slot, 2);
  EXPECT_EQ(r->cached_tokens, 0);
  EXPECT_EQ(r->copied_tokens, 0);
  // The slot holds the prompt and every fed output (all but the last).
  std::vector<int32_t> held = prompt;
  held.insert(held.end(), r->output_ids.begin(), r->output_ids.end() - 1);
  EXPECT_EQ(e->SlotTokens(2), held);
  EXPECT_TRUE(e->SlotTokens(0).empty());
  EXPECT_TRUE(e->SlotTokens(3).empty());   // out of range
  EXPECT_TRUE(e->SlotTokens(-1).empty());  // out of range

  std::vector<SlotInfo> slots = e->Slots();
  ASSERT_EQ(slots.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(slots[i].index, i);
    EXPECT_FALSE(slots[i].busy);
  }
  EXPECT_EQ(slots[2].n_tokens, static_cast<int>(held.size()));
  EXPECT_EQ(slots[0].n_tokens, 0);
  EXPECT_EQ(slots[0].last_used, 0u);
  EXPECT_GT(slots[2].last_used, 0u);

  // Pinned again to slot 0 with the same prompt: slot 0 is used, its own
  // prefix is empty, and the prefix is copied from slot 2 instead.
  Result<GenerationResult> again = e->Generate(Greedy(prompt, 5, /*slot=*/0), nullptr, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->slot, 0);
  EXPECT_EQ(again->copied_tokens, static_cast<int>(prompt.size()) - 1);
  EXPECT_EQ(again->output_ids, r->output_ids);
  slots = e->Slots();
  EXPECT_GT(slots[0].last_used, slots[2].last_used);

  // An unpinned request reports the slot it ran in: the longest prefix.
  Result<GenerationResult> any = e->Generate(Greedy(held, 2), nullptr, nullptr);
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->slot, 2);
  EXPECT_EQ(any->cached_tokens, static_cast<int>(held.size()) - 1);
  EXPECT_EQ(any->copied_tokens, 0);

  for (int bad : {-2, 3, 100}) {
    Result<GenerationResult> out = e->Generate(Greedy(prompt, 2, bad), nullptr, nullptr);
    ASSERT_FALSE(out.ok()) << "slot " << bad;
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find(std::to_string(bad)), std::string::npos)
        << out.status().message();
  }
}

TEST_F(EngineSlotsTest, PinnedCallWaitsForItsBusySlotAndCanBeCancelled) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const auto held_prompt = Ids(*e, "the holder keeps slot zero");
  SlotHolder holder(*e, 0, held_prompt);
  ASSERT_TRUE(holder.WaitHolding());
  std::vector<SlotInfo> slots = e->Slots();
  EXPECT_TRUE(slots[0].busy);
  EXPECT_EQ(slots[0].n_tokens, 0);  // busy slots report 0
  EXPECT_TRUE(e->SlotTokens(0).empty());
  EXPECT_FALSE(slots[1].busy);

  // Cancelled while waiting: no slot, no output; the slot APIs say kCancelled.
  Result<GenerationResult> cancelled =
      e->Generate(Greedy(Ids(*e, "give up"), 3, /*slot=*/0), nullptr, [] { return true; });
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().ToString();
  EXPECT_EQ(cancelled->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(cancelled->slot, -1);
  EXPECT_TRUE(cancelled->output_ids.empty());
  EXPECT_EQ(e->SaveSlot(0, [] { return true; }).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(e->ClearSlot(0, [] { return true; }).code(), StatusCode::kCancelled);
  KvSnapshot empty = *e->SaveSlot(1, nullptr);
  EXPECT_EQ(e->RestoreSlot(0, empty, [] { return true; }).status().code(),
            StatusCode::kCancelled);

  // A pinned request waits (polling its CancelFn) although slot 1 is free.
  std::atomic<int> polls_while_held{0};
  std::atomic<bool> released{false};
  Result<GenerationResult> waited{InternalError("not run")};
  const auto prompt = Ids(*e, "waiting for slot zero");
  std::thread waiter([&] {
    waited = e->Generate(Greedy(prompt, 4, /*slot=*/0), nullptr, [&] {
      if (!released) ++polls_while_held;
      return false;
    });
  });
  EXPECT_TRUE(Eventually([&] { return polls_while_held >= 2; }));
  slots = e->Slots();
  EXPECT_TRUE(slots[0].busy);
  EXPECT_FALSE(slots[1].busy);
  EXPECT_EQ(slots[1].n_tokens, 0);  // the waiter did not take slot 1
  released = true;
  const Result<GenerationResult>& h = holder.Release();
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->finish_reason, FinishReason::kCancelled);
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(waited->slot, 0);
  EXPECT_EQ(waited->output_ids, Cold(prompt, 4));
  EXPECT_TRUE(e->SlotTokens(1).empty());
}

// A pinned call that has to wait reserves its slot: when the slot frees, an
// unpinned call that was also waiting does not take it (which would also
// overwrite the prefix the pinned call came for).
TEST_F(EngineSlotsTest, PinnedWaiterIsNotOvertakenByAnUnpinnedWaiter) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> held0 = Ids(*e, "slot zero keeps this conversation going");
  SlotHolder h0(*e, 0, held0);
  ASSERT_TRUE(h0.WaitHolding());
  SlotHolder h1(*e, 1, Ids(*e, "slot one is busy too"));
  ASSERT_TRUE(h1.WaitHolding());

  // Both wait: the pinned one for slot 0, the unpinned one for any slot.
  std::atomic<bool> released{false};
  std::atomic<int> pinned_polls{0}, unpinned_polls{0};
  const std::vector<int32_t> pinned_prompt = Concat(held0, Ids(*e, " and more"));
  Result<GenerationResult> pinned{InternalError("not run")}, unpinned{InternalError("not run")};
  std::thread pinned_thread([&] {
    pinned = e->Generate(Greedy(pinned_prompt, 3, 0), nullptr, [&] {
      if (!released) ++pinned_polls;
      return false;
    });
  });
  std::thread unpinned_thread([&] {
    unpinned = e->Generate(Greedy(Ids(*e, "anything will do"), 3), nullptr, [&] {
      if (!released) ++unpinned_polls;
      return false;
    });
  });
  ASSERT_TRUE(Eventually([&] { return pinned_polls >= 1 && unpinned_polls >= 1; }));
  released = true;
  ASSERT_TRUE(h0.Release().ok());
  pinned_thread.join();  // slot 1 stays busy, so the unpinned call can only have had slot 0
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  EXPECT_EQ(pinned->slot, 0);
  // Slot 0 still held h0's prompt: nobody ran in it in between.
  EXPECT_EQ(pinned->cached_tokens, static_cast<int>(held0.size()));
  EXPECT_EQ(pinned->copied_tokens, 0);
  ASSERT_TRUE(h1.Release().ok());
  unpinned_thread.join();
  ASSERT_TRUE(unpinned.ok()) << unpinned.status().ToString();
  EXPECT_GE(unpinned->slot, 0);
}

// VisitSlot shows, in place, exactly the rows SaveSlot copies out.
TEST_F(EngineSlotsTest, VisitSlotViewsWhatSaveSlotCopies) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const auto prompt = Ids(*e, "The quick brown fox jumps over the lazy dog");
  ASSERT_TRUE(e->Generate(Greedy(prompt, 6, 1), nullptr, nullptr).ok());
  Result<KvSnapshot> saved = e->SaveSlot(1, nullptr);
  ASSERT_TRUE(saved.ok());
  const KvRowsView want = saved->Rows();
  int visits = 0;
  Status st = e->VisitSlot(
      1,
      [&](const KvRowsView& rows) -> Status {
        ++visits;
        EXPECT_EQ(rows.n_layers, want.n_layers);
        EXPECT_EQ(rows.kv_dim, want.kv_dim);
        EXPECT_EQ(std::vector<int32_t>(rows.tokens, rows.tokens + rows.n_tokens), saved->tokens);
        EXPECT_TRUE(e->SlotTokens(1).empty());  // held while visited
        const size_t n = rows.n_tokens * rows.kv_dim;
        for (uint32_t l = 0; l < rows.n_layers; ++l) {
          EXPECT_EQ(std::vector<float>(rows.k[l], rows.k[l] + n),
                    std::vector<float>(want.k[l], want.k[l] + n)) << "K of layer " << l;
          EXPECT_EQ(std::vector<float>(rows.v[l], rows.v[l] + n),
                    std::vector<float>(want.v[l], want.v[l] + n)) << "V of layer " << l;
        }
        return OkStatus();
      },
      nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(visits, 1);
  EXPECT_EQ(e->SlotTokens(1), saved->tokens);  // unchanged afterwards
  // The visitor's error comes back; a bad slot is refused.
  EXPECT_EQ(e->VisitSlot(1, [](const KvRowsView&) { return DataLossError("disk full"); }, nullptr)
                .code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(e->VisitSlot(7, [](const KvRowsView&) { return OkStatus(); }, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(EngineSlotsTest, SaveClearRestoreReusesThePrefixWithSameOutput) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const auto prompt = Ids(*e, "The quick brown fox jumps over the lazy dog");
  const std::vector<int32_t> cold = Cold(prompt, 10);
  Result<GenerationResult> first = e->Generate(Greedy(prompt, 10, 0), nullptr, nullptr);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->output_ids, cold);
  const std::vector<int32_t> held = e->SlotTokens(0);
  ASSERT_EQ(held.size(), prompt.size() + 9);

  Result<KvSnapshot> saved = e->SaveSlot(0, nullptr);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const ModelConfig& c = e->config();
  EXPECT_TRUE(saved->model_hash.empty());
  EXPECT_EQ(saved->n_layers, static_cast<uint32_t>(c.num_hidden_layers));
  const uint32_t kv_dim = saved->kv_dim;
  EXPECT_GT(kv_dim, 0u);
  EXPECT_EQ(saved->tokens, held);
  EXPECT_EQ(saved->kv_type, GgmlType::kF16);  // the default KV type
  EXPECT_EQ(saved->kv.size(), size_t{2} * saved->n_layers * held.size() * kv_dim * 2);
  EXPECT_EQ(e->SlotTokens(0), held);  // saving leaves the slot as it was
  const uint64_t last_used = e->Slots()[0].last_used;

  ASSERT_TRUE(e->ClearSlot(0, nullptr).ok());
  EXPECT_TRUE(e->SlotTokens(0).empty());
  EXPECT_EQ(e->Slots()[0].n_tokens, 0);
  EXPECT_EQ(e->Slots()[0].last_used, 0u);

  Result<int> restored = e->RestoreSlot(0, *saved, nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_EQ(*restored, static_cast<int>(held.size()));
  EXPECT_EQ(e->SlotTokens(0), held);
  EXPECT_GT(e->Slots()[0].last_used, last_used);
  // Bit-identical K/V round trip.
  Result<KvSnapshot> again = e->SaveSlot(0, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tokens, saved->tokens);
  EXPECT_EQ(again->kv, saved->kv);

  Result<GenerationResult> reused = e->Generate(Greedy(prompt, 10, 0), nullptr, nullptr);
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(reused->cached_tokens, static_cast<int>(prompt.size()) - 1);
  EXPECT_EQ(reused->timings.prefill_tokens, 1);
  EXPECT_EQ(reused->copied_tokens, 0);
  EXPECT_EQ(reused->output_ids, cold);

  // A continuation reuses the whole restored state.
  ASSERT_EQ(e->RestoreSlot(0, *saved, nullptr).status().code(), StatusCode::kOk);
  const std::vector<int32_t> longer = Concat(held, Ids(*e, " and then"));
  Result<GenerationResult> cont = e->Generate(Greedy(longer, 6, 0), nullptr, nullptr);
  ASSERT_TRUE(cont.ok());
  EXPECT_EQ(cont->cached_tokens, static_cast<int>(held.size()));
  EXPECT_EQ(cont->output_ids, Cold(longer, 6));
}

TEST_F(EngineSlotsTest, RestoreIntoAnotherSlotAndAnotherEngine) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const auto prompt = Ids(*e, "alpha beta gamma delta epsilon zeta eta theta");
  const std::vector<int32_t> cold = Cold(prompt, 8);
  ASSERT_TRUE(e->Generate(Greedy(prompt, 8, 0), nullptr, nullptr).ok());
  Result<KvSnapshot> saved = e->SaveSlot(0, nullptr);
  ASSERT_TRUE(saved.ok());
  ASSERT_TRUE(e->RestoreSlot(1, *saved, nullptr).ok());
  ASSERT_TRUE(e->ClearSlot(0, nullptr).ok());
  EXPECT_EQ(e->SlotTokens(1), saved->tokens);

  // Unpinned: the restored slot has the longest prefix.
  Result<GenerationResult> r = e->Generate(Greedy(prompt, 8), nullptr, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->slot, 1);
  EXPECT_EQ(r->cached_tokens, static_cast<int>(prompt.size()) - 1);
  EXPECT_EQ(r->copied_tokens, 0);
  EXPECT_EQ(r->output_ids, cold);

  // Another engine of the same model accepts the snapshot too.
  auto other = LoadEngine(/*n_slots=*/1);
  ASSERT_NE(other, nullptr);
  Result<int> n = other->RestoreSlot(0, *saved, nullptr);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  Result<GenerationResult> o = other->Generate(Greedy(prompt, 8), nullptr, nullptr);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->cached_tokens, static_cast<int>(prompt.size()) - 1);
  EXPECT_EQ(o->output_ids, cold);
}

// RestoreSlot from a KvSnapshotView over memory that is not a KvSnapshot
// (as a mapped KV file): same result as from the snapshot; a view whose
// kv_floats does not match is refused and the slot kept.
TEST_F(EngineSlotsTest, RestoreFromAViewOfForeignMemory) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const auto prompt = Ids(*e, "a view over bytes that belong to someone else");
  const std::vector<int32_t> cold = Cold(prompt, 6);
  ASSERT_TRUE(e->Generate(Greedy(prompt, 6, 0), nullptr, nullptr).ok());
  Result<KvSnapshot> saved = e->SaveSlot(0, nullptr);
  ASSERT_TRUE(saved.ok());
  const std::vector<int32_t> tokens = saved->tokens;     // plain buffers
  const std::vector<uint8_t> kv(saved->kv.begin(), saved->kv.end());
  const uint32_t kv_dim = saved->kv_dim;
  saved = KvSnapshot{};  // the snapshot is gone
  KvSnapshotView view;
  view.n_layers = e->SaveSlot(1, nullptr)->n_layers;
  view.kv_dim = kv_dim;
  view.kv_type = e->kv_type();
  view.tokens = tokens.data();
  view.n_tokens = tokens.size();
  view.kv = kv.data();
  view.kv_bytes = kv.size() - 1;
  const std::vector<int32_t> held = e->SlotTokens(1);
  Result<int> bad = e->RestoreSlot(1, view, nullptr);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->SlotTokens(1), held);
  view.kv_bytes = kv.size();
  Result<int> n = e->RestoreSlot(1, view, nullptr);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, static_cast<int>(tokens.size()));
  EXPECT_EQ(e->SlotTokens(1), tokens);
  ASSERT_TRUE(e->ClearSlot(0, nullptr).ok());
  Result<GenerationResult> r = e->Generate(Greedy(prompt, 6, 1), nullptr, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->cached_tokens, static_cast<int>(prompt.size()) - 1);
  EXPECT_EQ(r->output_ids, cold);
}

TEST_F(EngineSlotsTest, RestoreRejectsBadSnapshotsAndKeepsTheSlot) {
  auto e = LoadEngine(/*n_slots=*/2, /*n_ctx=*/64);
  ASSERT_NE(e, nullptr);
  const auto prompt = Ids(*e, "a slot that must survive bad restores");
  ASSERT_TRUE(e->Generate(Greedy(prompt, 4, 0), nullptr, nullptr).ok());
  const std::vector<int32_t> held = e->SlotTokens(0);
  Result<KvSnapshot> good = e->SaveSlot(0, nullptr);
  ASSERT_TRUE(good.ok());
  const uint32_t L = good->n_layers, D = good->kv_dim;
  const int vocab = e->config().vocab_size;

  // A snapshot of `n` tokens (all id 1) with a matching kv size.
  auto sized = [&](size_t n) {
    KvSnapshot s;
    s.n_layers = L;
    s.kv_dim = D;
    s.kv_type = good->kv_type;
    s.tokens.assign(n, 1);
    s.kv.assign(s.ExpectedKvBytes(), 0);
    return s;
  };
  struct Case {
    const char* name;
    KvSnapshot snapshot;
    std::vector<std::string> words;  // the field and both values
  };
  std::vector<Case> cases;
  {
    KvSnapshot s = *good;
    s.n_layers = L + 1;
    cases.push_back({"n_layers", s, {"n_layers", std::to_string(L + 1), std::to_string(L)}});
  }
  {
    KvSnapshot s = *good;
    s.kv_dim = D * 2;
    cases.push_back({"kv_dim", s, {"kv_dim", std::to_string(D * 2), std::to_string(D)}});
  }
  {
    KvSnapshot s = *good;
    s.kv.pop_back();
    cases.push_back({"kv size", s,
                     {"kv", std::to_string(good->kv.size() - 1), std::to_string(good->kv.size())}});
  }
  {
    KvSnapshot s = *good;
    s.kv_type = GgmlType::kF32;  // an f32 snapshot into the default f16 engine
    s.kv.resize(s.ExpectedKvBytes());
    cases.push_back({"kv_type", s, {"kv_type", "f32", "f16"}});
  }
  cases.push_back({"too many tokens", sized(64), {"n_tokens", "64", "63"}});
  {
    KvSnapshot s = *good;
    s.tokens[3] = vocab;
    cases.push_back({"token too large", s, {"tokens[3]", std::to_string(vocab)}});
  }
  {
    KvSnapshot s = *good;
    s.tokens.back() = -1;
    cases.push_back({"negative token", s, {"-1", std::to_string(vocab)}});
  }
  for (const Case& c : cases) {
    Result<int> r = e->RestoreSlot(0, c.snapshot, nullptr);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.name;
    for (const std::string& w : c.words) {
      EXPECT_NE(r.status().message().find(w), std::string::npos)
          << c.name << ": '" << w << "' not in: " << r.status().message();
    }
    EXPECT_EQ(e->SlotTokens(0), held) << c.name;
  }
  // The slot still serves its prefix.
  Result<GenerationResult> g = e->Generate(Greedy(prompt, 4, 0), nullptr, nullptr);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->cached_tokens, static_cast<int>(prompt.size()) - 1);

  // n_ctx − 1 tokens is the most a slot takes.
  Result<int> full = e->RestoreSlot(1, sized(63), nullptr);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_EQ(*full, 63);

  // Bad slot indices, for every slot call.
  for (int bad : {-1, 2}) {
    EXPECT_EQ(e->RestoreSlot(bad, *good, nullptr).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(e->SaveSlot(bad, nullptr).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(e->ClearSlot(bad, nullptr).code(), StatusCode::kInvalidArgument);
  }
}

TEST_F(EngineSlotsTest, SaveOfAnEmptySlotRestoresEmpty) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  Result<KvSnapshot> empty = e->SaveSlot(1, nullptr);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->n_tokens(), 0u);
  EXPECT_TRUE(empty->kv.empty());
  EXPECT_EQ(empty->n_layers, static_cast<uint32_t>(e->config().num_hidden_layers));
  EXPECT_GT(empty->kv_dim, 0u);

  ASSERT_TRUE(e->Generate(Greedy(Ids(*e, "something to forget"), 3, 0), nullptr, nullptr).ok());
  ASSERT_FALSE(e->SlotTokens(0).empty());
  Result<int> n = e->RestoreSlot(0, *empty, nullptr);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 0);
  EXPECT_TRUE(e->SlotTokens(0).empty());
  EXPECT_EQ(e->Slots()[0].n_tokens, 0);
}

TEST_F(EngineSlotsTest, PrefixIsCopiedFromAnotherSlotInsteadOfRecomputed) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> system = Ids(*e, kSystem);
  const std::vector<int32_t> user = Ids(*e, " What is the capital of France?");
  const std::vector<int32_t> prompt = Concat(system, user);
  const std::vector<int32_t> cold = Cold(prompt, 8);

  // The system prefix is computed once, in slot 0.
  Result<GenerationResult> warm = e->Generate(Greedy(system, 1, 0), nullptr, nullptr);
  ASSERT_TRUE(warm.ok());
  ASSERT_EQ(e->SlotTokens(0), system);

  Result<GenerationResult> r = e->Generate(Greedy(prompt, 8, 1), nullptr, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->slot, 1);
  EXPECT_EQ(r->copied_tokens, static_cast<int>(system.size()));
  EXPECT_EQ(r->cached_tokens, static_cast<int>(system.size()));
  EXPECT_EQ(r->timings.prefill_tokens, static_cast<int>(user.size()));
  EXPECT_EQ(r->output_ids, cold);
  EXPECT_EQ(e->SlotTokens(0), system);  // the source is left as it was
  EXPECT_FALSE(e->Slots()[0].busy);

  // The whole prompt held elsewhere: one token is still computed.
  ASSERT_TRUE(e->ClearSlot(1, nullptr).ok());
  Result<GenerationResult> same = e->Generate(Greedy(system, 8, 1), nullptr, nullptr);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->copied_tokens, static_cast<int>(system.size()) - 1);
  EXPECT_EQ(same->cached_tokens, static_cast<int>(system.size()) - 1);
  EXPECT_EQ(same->timings.prefill_tokens, 1);
  EXPECT_EQ(same->output_ids, Cold(system, 8));
}

TEST_F(EngineSlotsTest, CopyBringsOnlyTheRowsBeyondTheSlotsOwnPrefix) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> system = Ids(*e, kSystem);
  ASSERT_GT(system.size(), 8u);
  const size_t own = system.size() / 2;
  // Slot 1 holds the first half of the system prefix, then something else.
  std::vector<int32_t> diverged(system.begin(), system.begin() + own);
  diverged = Concat(diverged, Ids(*e, " Unrelated words follow here."));
  ASSERT_NE(diverged[own], system[own]);
  ASSERT_TRUE(e->Generate(Greedy(diverged, 1, 1), nullptr, nullptr).ok());
  ASSERT_TRUE(e->Generate(Greedy(system, 1, 0), nullptr, nullptr).ok());

  const std::vector<int32_t> prompt = Concat(system, Ids(*e, " Hello!"));
  Result<GenerationResult> r = e->Generate(Greedy(prompt, 8, 1), nullptr, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->cached_tokens, static_cast<int>(system.size()));
  EXPECT_EQ(r->copied_tokens, static_cast<int>(system.size() - own));
  EXPECT_EQ(r->timings.prefill_tokens, static_cast<int>(prompt.size() - system.size()));
  EXPECT_EQ(r->output_ids, Cold(prompt, 8));

  // Nothing longer elsewhere: no copy.
  Result<GenerationResult> again = e->Generate(Greedy(prompt, 8, 1), nullptr, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->copied_tokens, 0);
  EXPECT_EQ(again->cached_tokens, static_cast<int>(prompt.size()) - 1);
}

TEST_F(EngineSlotsTest, NoCopyFromABusySlot) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> system = Ids(*e, kSystem);
  const std::vector<int32_t> prompt = Concat(system, Ids(*e, " Tell me a joke."));
  ASSERT_TRUE(e->Generate(Greedy(system, 1, 0), nullptr, nullptr).ok());
  // Slot 0 is busy running a prompt that also starts with the system prefix.
  SlotHolder holder(*e, 0, Concat(system, Ids(*e, " Something else.")));
  ASSERT_TRUE(holder.WaitHolding());
  Result<GenerationResult> r = e->Generate(Greedy(prompt, 6, 1), nullptr, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->slot, 1);
  EXPECT_EQ(r->copied_tokens, 0);
  EXPECT_EQ(r->cached_tokens, 0);
  EXPECT_EQ(r->timings.prefill_tokens, static_cast<int>(prompt.size()));
  ASSERT_TRUE(holder.Release().ok());
  EXPECT_EQ(r->output_ids, Cold(prompt, 6));
}

// 4 threads on 2 slots mix pinned and unpinned Generate (prompts sharing a
// prefix, so copies happen), SaveSlot, RestoreSlot of earlier snapshots and
// ClearSlot, in a fixed-seed random order per thread. Every generation must
// match its cold output, whatever mix of own prefix, copied rows and
// restored state it started from. Run under TSan in CI.
TEST_F(EngineSlotsTest, FourThreadStressMixingGenerateSaveRestore) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> system = Ids(*e, kSystem);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(Concat(system, Ids(*e, " Question " + std::to_string(i) + "?")));
  }
  prompts.push_back(system);
  for (const auto& p : prompts) expected.push_back(Cold(p, 4));

  constexpr int kThreads = 4;
  constexpr int kOps = 16;
  std::atomic<int> generations{0}, copies{0}, saves{0}, restores{0}, clears{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      std::vector<KvSnapshot> kept;
      for (int op = 0; op < kOps; ++op) {
        const int kind = static_cast<int>(rng() % 10);
        const int slot = static_cast<int>(rng() % 2);
        if (kind < 5) {  // 0-2 pinned, 3-4 unpinned
          const size_t p = rng() % prompts.size();
          const int pin = kind < 3 ? slot : -1;
          Result<GenerationResult> r = e->Generate(Greedy(prompts[p], 4, pin), nullptr, nullptr);
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          EXPECT_EQ(r->output_ids, expected[p]) << "thread " << t << " op " << op;
          if (pin >= 0) {
            EXPECT_EQ(r->slot, pin);
          }
          EXPECT_LE(r->copied_tokens, r->cached_tokens);
          EXPECT_LE(r->cached_tokens, static_cast<int>(prompts[p].size()) - 1);
          ++generations;
          if (r->copied_tokens > 0) ++copies;
        } else if (kind < 7) {
          Result<KvSnapshot> s = e->SaveSlot(slot, nullptr);
          ASSERT_TRUE(s.ok()) << s.status().ToString();
          EXPECT_EQ(s->kv.size(), s->ExpectedKvBytes());
          kept.push_back(std::move(*s));
          ++saves;
        } else if (kind < 9 && !kept.empty()) {
          const KvSnapshot& s = kept[rng() % kept.size()];
          Result<int> n = e->RestoreSlot(slot, s, nullptr);
          ASSERT_TRUE(n.ok()) << n.status().ToString();
          EXPECT_EQ(*n, static_cast<int>(s.n_tokens()));
          ++restores;
        } else {
          ASSERT_TRUE(e->ClearSlot(slot, nullptr).ok());
          ++clears;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(generations.load(), 0);
  EXPECT_GT(saves.load(), 0);
  for (const SlotInfo& s : e->Slots()) {
    EXPECT_FALSE(s.busy);
    EXPECT_EQ(s.n_tokens, static_cast<int>(e->SlotTokens(s.index).size()));
  }
  // Afterwards, every prompt still gives its cold output from any slot state.
  for (size_t p = 0; p < prompts.size(); ++p) {
    Result<GenerationResult> r = e->Generate(Greedy(prompts[p], 4, static_cast<int>(p % 2)),
                                             nullptr, nullptr);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->output_ids, expected[p]);
  }
  std::printf("[ stress ] %d generations (%d with a copy), %d saves, %d restores, %d clears\n",
              generations.load(), copies.load(), saves.load(), restores.load(), clears.load());
}

// Two threads, pinned to slots 1 and 2, clear their slot and generate from
// prompts sharing the system prefix, so they copy it from slot 0 (at times
// both at once) or from each other; a third thread saves slot 0 meanwhile. Slot 0 is never
// leased for writing, so every save must be bit-identical to the first.
TEST_F(EngineSlotsTest, ConcurrentCopiesFromOneSourceWhileItIsSaved) {
  auto e = LoadEngine(/*n_slots=*/3);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> system = Ids(*e, kSystem);
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(Concat(system, Ids(*e, " Topic " + std::to_string(i) + ".")));
    expected.push_back(Cold(prompts.back(), 3));
  }
  ASSERT_TRUE(e->Generate(Greedy(system, 1, 0), nullptr, nullptr).ok());
  Result<KvSnapshot> original = e->SaveSlot(0, nullptr);
  ASSERT_TRUE(original.ok());

  std::atomic<int> copies{0};
  std::vector<std::thread> threads;
  for (int slot = 1; slot <= 2; ++slot) {
    threads.emplace_back([&, slot] {
      std::mt19937 rng(77 + slot);
      for (int op = 0; op < 8; ++op) {
        ASSERT_TRUE(e->ClearSlot(slot, nullptr).ok());
        const size_t p = rng() % prompts.size();
        Result<GenerationResult> r = e->Generate(Greedy(prompts[p], 3, slot), nullptr, nullptr);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_EQ(r->slot, slot);
        EXPECT_EQ(r->output_ids, expected[p]) << "slot " << slot << " op " << op;
        // Cleared just before: whatever is cached was copied, from slot 0
        // or from the other thread's slot when it held the same prompt (a
        // slot busy at that moment is no source; then nothing may be).
        EXPECT_EQ(r->copied_tokens, r->cached_tokens);
        if (r->copied_tokens > 0) {
          EXPECT_GE(r->copied_tokens, static_cast<int>(system.size()));
          ++copies;
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (int op = 0; op < 8; ++op) {
      Result<KvSnapshot> s = e->SaveSlot(0, nullptr);
      ASSERT_TRUE(s.ok());
      EXPECT_EQ(s->tokens, original->tokens);
      EXPECT_TRUE(s->kv == original->kv) << "slot 0 changed while other slots copied from it";
    }
  });
  for (auto& th : threads) th.join();
  EXPECT_EQ(e->SlotTokens(0), system);
  std::printf("[ copies ] %d of 16 generations copied the system prefix\n", copies.load());
}

// ---------------------------------------------------------------------------
// The slot scheduler: ReserveSlot and calls within a SlotReservation.

engine_internal::SlotWaitStats WaitStats(const Engine& e) {
  return dynamic_cast<const engine_internal::EngineImpl&>(e).slot_wait_stats();
}

std::chrono::steady_clock::time_point InAnHour() {
  return std::chrono::steady_clock::now() + std::chrono::hours(1);
}

// Several steps on one slot without a second wait; the reservation's tokens
// follow them and are published on release; misuse is refused.
TEST_F(EngineSlotsTest, StepsRunWithinAReservationAndArePublishedOnRelease) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const auto prompt = Ids(*e, "The quick brown fox jumps over the lazy dog");
  Result<SlotReservation> r = e->ReserveSlot({.slot = 1}, kNoDeadline, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->held());
  EXPECT_EQ(r->slot(), 1);
  EXPECT_TRUE(r->tokens().empty());
  EXPECT_FALSE(r->owned());
  EXPECT_TRUE(e->Slots()[1].busy);
  EXPECT_FALSE(e->Slots()[0].busy);

  Result<GenerationResult> g = e->Generate(*r, Greedy(prompt, 5), nullptr, nullptr);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->slot, 1);
  EXPECT_EQ(g->output_ids, Cold(prompt, 5));
  std::vector<int32_t> held = prompt;
  held.insert(held.end(), g->output_ids.begin(), g->output_ids.end() - 1);
  EXPECT_EQ(r->tokens(), held);
  EXPECT_TRUE(e->SlotTokens(1).empty());  // busy: in flux for everybody else
  Result<KvSnapshot> saved = e->SaveSlot(*r);
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(saved->tokens, held);
  ASSERT_TRUE(e->ClearSlot(*r).ok());
  EXPECT_TRUE(r->tokens().empty());
  Result<int> restored = e->RestoreSlot(*r, saved->View());
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(*restored, static_cast<int>(held.size()));
  bool visited = false;
  ASSERT_TRUE(e->VisitSlot(*r, [&](const KvRowsView& rows) {
                 visited = rows.n_tokens == held.size();
                 return OkStatus();
               }).ok());
  EXPECT_TRUE(visited);
  // A second turn within the same reservation reuses the slot's prefix.
  Result<GenerationResult> again =
      e->Generate(*r, Greedy(Concat(held, Ids(*e, " again")), 2, /*slot=*/1), nullptr, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->cached_tokens, static_cast<int>(held.size()));
  EXPECT_EQ(e->Generate(*r, Greedy(prompt, 2, /*slot=*/0), nullptr, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  r->set_owned(true);
  const std::vector<int32_t> published = r->tokens();
  r->Release();
  EXPECT_FALSE(r->held());
  EXPECT_EQ(r->slot(), -1);
  std::vector<SlotInfo> slots = e->Slots();
  EXPECT_FALSE(slots[1].busy);
  EXPECT_TRUE(slots[1].owned);
  EXPECT_GT(slots[1].last_used, 0u);
  EXPECT_EQ(e->SlotTokens(1), published);

  // Misuse: a released reservation, another engine's, a slot out of range.
  EXPECT_EQ(e->SaveSlot(*r).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(e->Generate(*r, Greedy(prompt, 2), nullptr, nullptr).status().code(),
            StatusCode::kFailedPrecondition);
  auto other = LoadEngine(/*n_slots=*/1);
  ASSERT_NE(other, nullptr);
  Result<SlotReservation> foreign = other->ReserveSlot({.slot = 0}, kNoDeadline, nullptr);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(e->ClearSlot(*foreign).code(), StatusCode::kFailedPrecondition);
  for (int bad : {-2, 2}) {
    Result<SlotReservation> out = e->ReserveSlot({.slot = bad}, kNoDeadline, nullptr);
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // Moving a reservation moves the hold; the moved-from one releases nothing.
  Result<SlotReservation> a = e->ReserveSlot({.slot = 0}, kNoDeadline, nullptr);
  ASSERT_TRUE(a.ok());
  SlotReservation b = std::move(*a);
  EXPECT_FALSE(a->held());
  a->Release();
  EXPECT_TRUE(e->Slots()[0].busy);
  b = SlotReservation();  // releases slot 0
  EXPECT_FALSE(e->Slots()[0].busy);
}

// Note [Slot choice]: longest prefix; ties: an unowned slot before an owned
// one, whatever their age; then the least recently used.
TEST_F(EngineSlotsTest, UnpinnedTieTakesAnUnownedSlotBeforeTheLeastRecentlyUsed) {
  auto e = LoadEngine(/*n_slots=*/3);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> base = Ids(*e, "Shared opening words");
  // Fill slots 0, 1, 2 in that order (slot 2 most recent); own 0 and 2.
  for (int s : {0, 1, 2}) {
    Result<SlotReservation> r = e->ReserveSlot({.slot = s}, kNoDeadline, nullptr);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(
        e->Generate(*r, Greedy(Concat(base, Ids(*e, " variant " + std::to_string(s))), 1),
                    nullptr, nullptr)
            .ok());
    r->set_owned(s != 1);
  }
  const std::vector<int32_t> probe = Concat(base, Ids(*e, " something else"));
  std::vector<size_t> lcp;
  for (int s = 0; s < 3; ++s) {
    const std::vector<int32_t> t = e->SlotTokens(s);
    size_t n = 0;
    while (n < t.size() && n < probe.size() && t[n] == probe[n]) ++n;
    lcp.push_back(n);
  }
  ASSERT_EQ(lcp[0], lcp[1]);
  ASSERT_EQ(lcp[1], lcp[2]);  // a three-way tie on the prefix
  std::vector<SlotInfo> slots = e->Slots();
  ASSERT_LT(slots[0].last_used, slots[1].last_used);  // LRU alone would say slot 0
  {
    Result<SlotReservation> r = e->ReserveSlot({.prompt = probe}, kNoDeadline, nullptr);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->slot(), 1);  // the one nobody owns
    EXPECT_FALSE(r->owned());
    r->set_owned(true);
  }
  // Every slot owned now: the least recently used of the tie.
  Result<SlotReservation> r = e->ReserveSlot({.prompt = probe}, kNoDeadline, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->slot(), 0);
  EXPECT_TRUE(r->owned());
  // The longest prefix still beats ownership.
  r->Release();
  const std::vector<int32_t> two = e->SlotTokens(2);
  Result<SlotReservation> longest = e->ReserveSlot({.prompt = two}, kNoDeadline, nullptr);
  ASSERT_TRUE(longest.ok());
  EXPECT_EQ(longest->slot(), 2);
}

// Note [Slot waits]: a waiter with a token (no predicate) sleeps until a
// release wakes it; nothing polls meanwhile.
TEST_F(EngineSlotsTest, AWaiterWakesOnReleaseWithoutPolling) {
  auto e = LoadEngine(/*n_slots=*/1);
  ASSERT_NE(e, nullptr);
  Result<SlotReservation> held = e->ReserveSlot({.slot = 0}, kNoDeadline, nullptr);
  ASSERT_TRUE(held.ok());
  CancelSource never;
  Result<SlotReservation> got{InternalError("not run")};
  std::thread waiter([&] {
    got = e->ReserveSlot({.prompt = Ids(*e, "anything")}, InAnHour(), never.token());
  });
  ASSERT_TRUE(Eventually([&] { return WaitStats(*e).waiting == 1; }));
  // Room for a poller to show itself: one polling every
  // Cancellation::kCancelPollMs would wake about six times here.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const engine_internal::SlotWaitStats during = WaitStats(*e);
  EXPECT_EQ(during.waiting, 1);
  EXPECT_LE(during.wakeups, 1u);  // one spurious wake-up allowed
  held->Release();
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->slot(), 0);
  const engine_internal::SlotWaitStats after = WaitStats(*e);
  EXPECT_EQ(after.waiting, 0);
  EXPECT_LE(after.wakeups, during.wakeups + 2);
}

// A cancel from another thread wakes a waiter whose deadline is an hour
// away; the pinned waiter's claim on its slot goes with it.
TEST_F(EngineSlotsTest, ACancelFromAnotherThreadWakesAWaiterWithAnHourLongDeadline) {
  auto e = LoadEngine(/*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  Result<SlotReservation> held = e->ReserveSlot({.slot = 0}, kNoDeadline, nullptr);
  ASSERT_TRUE(held.ok());
  CancelSource source;
  Result<SlotReservation> got{InternalError("not run")};
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    got = e->ReserveSlot({.slot = 0}, InAnHour(), source.token());
    returned = true;
  });
  ASSERT_TRUE(Eventually([&] { return WaitStats(*e).waiting == 1; }));
  EXPECT_FALSE(returned);
  source.Cancel();
  // Generous bound (the fuse): the point is that it returns at all, long
  // before its deadline, with nobody releasing the slot.
  ASSERT_TRUE(Eventually([&] { return returned.load(); }));
  waiter.join();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kCancelled);
  EXPECT_NE(got.status().message().find("slot 0"), std::string::npos) << got.status().message();
  EXPECT_LE(WaitStats(*e).wakeups, 2u);
  EXPECT_TRUE(e->Slots()[0].busy);
  // The cancelled waiter left no claim: once free, slot 0 goes to an
  // unpinned caller again.
  held->Release();
  Result<SlotReservation> a = e->ReserveSlot({}, kNoDeadline, nullptr);
  Result<SlotReservation> b = e->ReserveSlot({}, kNoDeadline, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->slot(), b->slot());

  // Already cancelled and the slot busy: no wait at all.
  CancelSource done;
  done.Cancel();
  Result<SlotReservation> c = e->ReserveSlot({}, InAnHour(), done.token());
  EXPECT_EQ(c.status().code(), StatusCode::kCancelled);
  // Generate through the token: cancelled while waiting (no slot, no output).
  Result<GenerationResult> g = e->Generate(Greedy(Ids(*e, "late"), 2), nullptr, done.token());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(g->slot, -1);
}

TEST_F(EngineSlotsTest, ADeadlineEndsTheWaitWithDeadlineExceeded) {
  auto e = LoadEngine(/*n_slots=*/1);
  ASSERT_NE(e, nullptr);
  {
    // Only when it has to wait: a free slot is taken even past the deadline.
    Result<SlotReservation> past =
        e->ReserveSlot({}, std::chrono::steady_clock::now() - std::chrono::seconds(1), nullptr);
    ASSERT_TRUE(past.ok()) << past.status().ToString();
  }
  Result<SlotReservation> held = e->ReserveSlot({.slot = 0}, kNoDeadline, nullptr);
  ASSERT_TRUE(held.ok());
  for (int slot : {-1, 0}) {
    Result<SlotReservation> late = e->ReserveSlot(
        {.slot = slot}, std::chrono::steady_clock::now() + std::chrono::milliseconds(30), nullptr);
    ASSERT_FALSE(late.ok());
    EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded) << late.status().ToString();
  }
  // A predicate-only Cancellation still meets its deadline.
  Result<SlotReservation> polled =
      e->ReserveSlot({}, std::chrono::steady_clock::now() + std::chrono::milliseconds(30),
                     [] { return false; });
  EXPECT_EQ(polled.status().code(), StatusCode::kDeadlineExceeded);
  held->Release();
  EXPECT_TRUE(e->ReserveSlot({.slot = 0}, kNoDeadline, nullptr).ok());
}

// Token-based cancellation during decode: checked before every sampled
// token, like a CancelFn.
TEST_F(EngineSlotsTest, ATokenCancelsDuringDecode) {
  auto e = LoadEngine(/*n_slots=*/1);
  ASSERT_NE(e, nullptr);
  CancelSource source;
  int deltas = 0;
  Result<GenerationResult> g = e->Generate(
      Greedy(Ids(*e, "tell me a long story about a fox"), 64),
      [&](std::string_view) {
        if (++deltas == 1) source.Cancel();
        return true;
      },
      source.token());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->finish_reason, FinishReason::kCancelled);
  EXPECT_LT(g->output_ids.size(), 64u);
  EXPECT_EQ(g->slot, 0);
}

}  // namespace
}  // namespace arbiter
