#include "arbiter/memory/memory_ledger.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <atomic>
#include <limits>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

namespace arbiter {
namespace {

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(ChargeKindTest, Names) {
  EXPECT_EQ(ChargeKindName(ChargeKind::kDeviceWeights), "device_weights");
  EXPECT_EQ(ChargeKindName(ChargeKind::kHostFloor), "host_floor");
  EXPECT_EQ(ChargeKindName(ChargeKind::kKvSlot), "kv_slot");
  EXPECT_EQ(ChargeKindName(ChargeKind::kPromptCache), "prompt_cache");
  EXPECT_EQ(ChargeKindName(ChargeKind::kVisionCache), "vision_cache");
  EXPECT_EQ(ChargeKindName(ChargeKind::kScratch), "scratch");
  EXPECT_EQ(ChargeKindName(ChargeKind::kOther), "other");
  EXPECT_EQ(static_cast<size_t>(ChargeKind::kOther) + 1, kChargeKindCount);
}

TEST(MemoryLedgerTest, TryChargeWithinBudgetAndRaiiRelease) {
  MemoryLedger ledger(1000);
  {
    Result<MemoryCharge> c = ledger.TryCharge("text::demo-chat", ChargeKind::kDeviceWeights, 600);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->bytes(), 600u);
    EXPECT_EQ(c->owner(), "text::demo-chat");
    EXPECT_EQ(c->kind(), ChargeKind::kDeviceWeights);
    EXPECT_FALSE(c->released());
    EXPECT_EQ(ledger.charged_bytes(), 600u);
    EXPECT_EQ(ledger.available_bytes(), 400u);
  }
  EXPECT_EQ(ledger.charged_bytes(), 0u);
  EXPECT_EQ(ledger.Snapshot().peak_bytes, 600u);
  EXPECT_TRUE(ledger.Snapshot().by_owner.empty());
}

TEST(MemoryLedgerTest, TryChargeExactlyToBudgetSucceeds) {
  MemoryLedger ledger(1000);
  Result<MemoryCharge> a = ledger.TryCharge("a", ChargeKind::kKvSlot, 400);
  Result<MemoryCharge> b = ledger.TryCharge("b", ChargeKind::kKvSlot, 600);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(ledger.charged_bytes(), 1000u);
  EXPECT_EQ(ledger.available_bytes(), 0u);
  // A 0-byte charge always fits.
  EXPECT_TRUE(ledger.TryCharge("c", ChargeKind::kOther, 0).ok());
}

TEST(MemoryLedgerTest, TryChargeOverBudgetIsResourceExhaustedWithDetails) {
  MemoryLedger ledger(1000);
  Result<MemoryCharge> a = ledger.TryCharge("text::demo-chat", ChargeKind::kDeviceWeights, 700);
  ASSERT_TRUE(a.ok());
  Result<MemoryCharge> b = ledger.TryCharge("conv-42", ChargeKind::kPromptCache, 301);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  const std::string msg = b.status().message();
  EXPECT_TRUE(Contains(msg, "conv-42")) << msg;
  EXPECT_TRUE(Contains(msg, "prompt_cache")) << msg;
  EXPECT_TRUE(Contains(msg, "301")) << msg;
  EXPECT_TRUE(Contains(msg, "1000")) << msg;  // budget
  EXPECT_TRUE(Contains(msg, "700")) << msg;   // charged
  EXPECT_EQ(ledger.charged_bytes(), 700u);    // nothing charged on failure
  EXPECT_EQ(ledger.Snapshot().refusals, 1u);
}

TEST(MemoryLedgerTest, HugeTryChargeDoesNotOverflow) {
  MemoryLedger ledger(1000);
  Result<MemoryCharge> a = ledger.TryCharge("a", ChargeKind::kOther, 10);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(ledger.TryCharge("b", ChargeKind::kOther, std::numeric_limits<uint64_t>::max()).ok());
  EXPECT_EQ(ledger.charged_bytes(), 10u);
}

TEST(MemoryLedgerTest, UnlimitedBudgetNeverRefuses) {
  MemoryLedger ledger(0);
  Result<MemoryCharge> a = ledger.TryCharge("a", ChargeKind::kOther, 1ull << 50);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->Resize(1ull << 51).ok());
  EXPECT_EQ(ledger.available_bytes(), std::numeric_limits<uint64_t>::max());
  MemoryLedgerSnapshot s = ledger.Snapshot();
  EXPECT_EQ(s.budget_bytes, 0u);
  EXPECT_EQ(s.over_budget_bytes, 0u);
  EXPECT_EQ(s.over_commits, 0u);
}

TEST(MemoryLedgerTest, UnconditionalChargeIsRecordedAsOverCommit) {
  // The documented exception: one model larger than the whole budget.
  MemoryLedger ledger(1000);
  MemoryCharge big = ledger.Charge("text::huge", ChargeKind::kDeviceWeights, 1500);
  EXPECT_EQ(ledger.charged_bytes(), 1500u);
  MemoryLedgerSnapshot s = ledger.Snapshot();
  EXPECT_EQ(s.over_budget_bytes, 500u);
  EXPECT_EQ(s.over_commits, 1u);
  EXPECT_EQ(ledger.available_bytes(), 0u);
  // While over budget, TryCharge refuses anything but 0 bytes.
  EXPECT_EQ(ledger.TryCharge("x", ChargeKind::kOther, 1).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(ledger.TryCharge("x", ChargeKind::kOther, 0).ok());
  big.Release();
  s = ledger.Snapshot();
  EXPECT_EQ(s.charged_bytes, 0u);
  EXPECT_EQ(s.over_budget_bytes, 0u);
  EXPECT_EQ(s.over_commits, 1u);  // history is kept
  EXPECT_EQ(s.peak_bytes, 1500u);
}

TEST(MemoryLedgerTest, ChargeWithinBudgetIsNotAnOverCommit) {
  MemoryLedger ledger(1000);
  MemoryCharge c = ledger.Charge("a", ChargeKind::kScratch, 1000);
  EXPECT_EQ(ledger.Snapshot().over_commits, 0u);
}

TEST(MemoryLedgerTest, ReleaseIsIdempotent) {
  MemoryLedger ledger(1000);
  MemoryCharge a = ledger.Charge("a", ChargeKind::kOther, 100);
  MemoryCharge b = ledger.Charge("b", ChargeKind::kOther, 200);
  a.Release();
  a.Release();
  EXPECT_TRUE(a.released());
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_EQ(ledger.charged_bytes(), 200u);
}

TEST(MemoryLedgerTest, MoveTransfersOwnershipOfTheCharge) {
  MemoryLedger ledger(1000);
  MemoryCharge a = ledger.Charge("a", ChargeKind::kOther, 100);
  MemoryCharge b(std::move(a));
  EXPECT_TRUE(a.released());  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_EQ(b.bytes(), 100u);
  EXPECT_EQ(ledger.charged_bytes(), 100u);
  MemoryCharge c = ledger.Charge("c", ChargeKind::kOther, 50);
  c = std::move(b);  // releases c's 50, takes b's 100
  EXPECT_EQ(ledger.charged_bytes(), 100u);
  EXPECT_EQ(c.owner(), "a");
  MemoryCharge empty;
  EXPECT_TRUE(empty.released());
  c = std::move(empty);
  EXPECT_EQ(ledger.charged_bytes(), 0u);
}

TEST(MemoryLedgerTest, ResizeShrinksAndGrowsWithinBudget) {
  MemoryLedger ledger(1000);
  Result<MemoryCharge> c = ledger.TryCharge("text::m", ChargeKind::kDeviceWeights, 500);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Resize(300).ok());  // measured smaller than the estimate
  EXPECT_EQ(c->bytes(), 300u);
  EXPECT_EQ(ledger.charged_bytes(), 300u);
  ASSERT_TRUE(c->Resize(1000).ok());
  EXPECT_EQ(ledger.charged_bytes(), 1000u);
}

TEST(MemoryLedgerTest, ResizePastBudgetFailsAndLeavesTheChargeUnchanged) {
  MemoryLedger ledger(1000);
  Result<MemoryCharge> a = ledger.TryCharge("a", ChargeKind::kKvSlot, 500);
  Result<MemoryCharge> b = ledger.TryCharge("b", ChargeKind::kKvSlot, 400);
  ASSERT_TRUE(a.ok() && b.ok());
  Status s = a->Resize(700);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s.message(), "\"a\"")) << s.message();
  EXPECT_EQ(a->bytes(), 500u);
  EXPECT_EQ(ledger.charged_bytes(), 900u);
}

TEST(MemoryLedgerTest, ForceResizeOvercommits) {
  MemoryLedger ledger(1000);
  Result<MemoryCharge> a = ledger.TryCharge("a", ChargeKind::kDeviceWeights, 900);
  ASSERT_TRUE(a.ok());
  a->ForceResize(1200);
  EXPECT_EQ(a->bytes(), 1200u);
  MemoryLedgerSnapshot s = ledger.Snapshot();
  EXPECT_EQ(s.charged_bytes, 1200u);
  EXPECT_EQ(s.over_budget_bytes, 200u);
  EXPECT_EQ(s.over_commits, 1u);
  a->ForceResize(100);
  EXPECT_EQ(ledger.charged_bytes(), 100u);
  EXPECT_EQ(ledger.Snapshot().over_commits, 1u);
}

TEST(MemoryLedgerTest, ResizeOnReleasedChargeIsFailedPrecondition) {
  MemoryLedger ledger(1000);
  MemoryCharge a = ledger.Charge("a", ChargeKind::kOther, 1);
  a.Release();
  EXPECT_EQ(a.Resize(5).code(), StatusCode::kFailedPrecondition);
  a.ForceResize(5);  // no-op
  EXPECT_EQ(ledger.charged_bytes(), 0u);
  MemoryCharge empty;
  EXPECT_EQ(empty.Resize(5).code(), StatusCode::kFailedPrecondition);
}

TEST(MemoryLedgerTest, SetBudgetNeverRevokesCharges) {
  MemoryLedger ledger(1000);
  Result<MemoryCharge> a = ledger.TryCharge("a", ChargeKind::kOther, 800);
  ASSERT_TRUE(a.ok());
  ledger.SetBudget(500);
  EXPECT_EQ(ledger.budget_bytes(), 500u);
  EXPECT_EQ(ledger.charged_bytes(), 800u);
  EXPECT_EQ(ledger.Snapshot().over_budget_bytes, 300u);
  EXPECT_FALSE(ledger.TryCharge("b", ChargeKind::kOther, 1).ok());
  ledger.SetBudget(0);
  EXPECT_TRUE(ledger.TryCharge("b", ChargeKind::kOther, 1ull << 40).ok());
}

TEST(MemoryLedgerTest, SnapshotBreaksDownByKindAndOwner) {
  MemoryLedger ledger(10000);
  MemoryCharge w = ledger.Charge("text::demo-chat", ChargeKind::kDeviceWeights, 3000);
  MemoryCharge kv = ledger.Charge("text::demo-chat", ChargeKind::kKvSlot, 500);
  MemoryCharge pc = ledger.Charge("conv-1", ChargeKind::kPromptCache, 200);
  MemoryCharge vc1 = ledger.Charge("vision_cache", ChargeKind::kVisionCache, 40);
  MemoryCharge vc2 = ledger.Charge("vision_cache", ChargeKind::kVisionCache, 60);
  MemoryCharge zero = ledger.Charge("idle", ChargeKind::kScratch, 0);
  MemoryLedgerSnapshot s = ledger.Snapshot();
  EXPECT_EQ(s.budget_bytes, 10000u);
  EXPECT_EQ(s.charged_bytes, 3800u);
  EXPECT_EQ(s.live_charges, 6u);
  EXPECT_EQ(s.kind_bytes(ChargeKind::kDeviceWeights), 3000u);
  EXPECT_EQ(s.kind_bytes(ChargeKind::kKvSlot), 500u);
  EXPECT_EQ(s.kind_bytes(ChargeKind::kPromptCache), 200u);
  EXPECT_EQ(s.kind_bytes(ChargeKind::kVisionCache), 100u);
  EXPECT_EQ(s.kind_bytes(ChargeKind::kHostFloor), 0u);
  ASSERT_EQ(s.by_owner.size(), 4u);
  const auto& chat = s.by_owner.at("text::demo-chat");
  EXPECT_EQ(chat.total_bytes, 3500u);
  EXPECT_EQ(chat.live_charges, 2u);
  EXPECT_EQ(chat.by_kind[static_cast<size_t>(ChargeKind::kDeviceWeights)], 3000u);
  EXPECT_EQ(chat.by_kind[static_cast<size_t>(ChargeKind::kKvSlot)], 500u);
  EXPECT_EQ(s.by_owner.at("vision_cache").total_bytes, 100u);
  EXPECT_EQ(s.by_owner.at("idle").live_charges, 1u);  // 0-byte charges are listed
  vc1.Release();
  vc2.Release();
  EXPECT_EQ(ledger.Snapshot().by_owner.count("vision_cache"), 0u);
}

// ---------------------------------------------------------------------------
// ResolveBudget

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kMiB = 1ull << 20;

TEST(ResolveBudgetTest, DefaultIsTotalMinusDefaultHeadroom) {
  Result<uint64_t> b = ResolveBudget(std::nullopt, std::string(kDefaultMemoryHeadroom), 16 * kGiB);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b, 16 * kGiB - 1536 * kMiB);
}

TEST(ResolveBudgetTest, HeadroomMayBeAPercentOfRam) {
  Result<uint64_t> b = ResolveBudget(std::nullopt, "25%", 16 * kGiB);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b, 12 * kGiB);
}

TEST(ResolveBudgetTest, ExplicitBudgetInBytesOrPercentWins) {
  EXPECT_EQ(*ResolveBudget("2GiB", "1536MiB", 16 * kGiB), 2 * kGiB);
  EXPECT_EQ(*ResolveBudget("75%", "1536MiB", 16 * kGiB), 12 * kGiB);
  EXPECT_EQ(*ResolveBudget("1048576", "1536MiB", 16 * kGiB), kMiB);
  // A set budget does not depend on the headroom fitting.
  EXPECT_EQ(*ResolveBudget("1GiB", "1536MiB", kGiB), kGiB);
}

TEST(ResolveBudgetTest, InvalidBudgetNamesTheKey) {
  Result<uint64_t> b = ResolveBudget("lots", "1536MiB", 16 * kGiB);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(b.status().message(), "[memory] budget")) << b.status().message();
  EXPECT_TRUE(Contains(b.status().message(), "lots")) << b.status().message();
  EXPECT_EQ(ResolveBudget("150%", "1536MiB", 16 * kGiB).status().code(),
            StatusCode::kInvalidArgument);
  Result<uint64_t> zero = ResolveBudget("0", "1536MiB", 16 * kGiB);
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(Contains(zero.status().message(), "[memory] budget"));
}

TEST(ResolveBudgetTest, InvalidHeadroomNamesTheKeyEvenWithABudget) {
  for (const std::optional<std::string>& budget :
       {std::optional<std::string>(), std::optional<std::string>("2GiB")}) {
    Result<uint64_t> b = ResolveBudget(budget, "a bit", 16 * kGiB);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(b.status().message(), "[memory] headroom")) << b.status().message();
  }
}

TEST(ResolveBudgetTest, HeadroomAtOrAboveTotalIsAnError) {
  for (const char* headroom : {"16GiB", "17GiB", "100%"}) {
    Result<uint64_t> b = ResolveBudget(std::nullopt, headroom, 16 * kGiB);
    ASSERT_FALSE(b.ok()) << headroom;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(b.status().message(), "[memory] headroom")) << b.status().message();
  }
  EXPECT_FALSE(ResolveBudget(std::nullopt, "1536MiB", 0).ok());
}

// ---------------------------------------------------------------------------
// Properties (rapidcheck) and concurrency.

enum OpType { kTryCharge = 0, kCharge, kResize, kForceResize, kRelease, kMoveAssign, kOpTypes };
using Op = std::tuple<int, uint64_t, size_t, int>;  // type, bytes, index, kind

rc::Gen<std::vector<Op>> GenOps(int n_types) {
  return rc::gen::container<std::vector<Op>>(
      rc::gen::tuple(rc::gen::inRange(0, n_types), rc::gen::inRange<uint64_t>(0, 1500),
                     rc::gen::inRange<size_t>(0, 1000),
                     rc::gen::inRange(0, static_cast<int>(kChargeKindCount))));
}

// Σ live charges == charged, for any interleaving of every operation,
// including the unconditional ones.
RC_GTEST_PROP(MemoryLedgerProperty, ChargedEqualsSumOfLiveCharges, ()) {
  const uint64_t budget = *rc::gen::inRange<uint64_t>(0, 5000);
  const std::vector<Op> ops = *GenOps(kOpTypes);
  MemoryLedger ledger(budget);
  std::vector<MemoryCharge> charges;
  for (const auto& [type, bytes, index, kind_index] : ops) {
    const ChargeKind kind = static_cast<ChargeKind>(kind_index);
    const std::string owner = "owner-" + std::to_string(index % 5);
    MemoryCharge* target = charges.empty() ? nullptr : &charges[index % charges.size()];
    switch (type) {
      case kTryCharge: {
        Result<MemoryCharge> c = ledger.TryCharge(owner, kind, bytes);
        if (c.ok()) charges.push_back(std::move(*c));
        break;
      }
      case kCharge:
        charges.push_back(ledger.Charge(owner, kind, bytes));
        break;
      case kResize:
        if (target != nullptr) target->Resize(bytes).IgnoreError();
        break;
      case kForceResize:
        if (target != nullptr) target->ForceResize(bytes);
        break;
      case kRelease:
        if (target != nullptr) target->Release();
        break;
      case kMoveAssign:
        if (charges.size() >= 2) charges[index % charges.size()] = std::move(charges.back());
        if (!charges.empty()) charges.pop_back();
        break;
    }
    uint64_t sum = 0;
    for (const MemoryCharge& c : charges) sum += c.bytes();
    RC_ASSERT(ledger.charged_bytes() == sum);
  }
  const MemoryLedgerSnapshot s = ledger.Snapshot();
  uint64_t kind_sum = 0;
  for (uint64_t b : s.by_kind) kind_sum += b;
  uint64_t owner_sum = 0;
  for (const auto& [owner, usage] : s.by_owner) owner_sum += usage.total_bytes;
  RC_ASSERT(kind_sum == s.charged_bytes);
  RC_ASSERT(owner_sum == s.charged_bytes);
  RC_ASSERT(s.peak_bytes >= s.charged_bytes);
  charges.clear();
  RC_ASSERT(ledger.charged_bytes() == 0u);
  RC_ASSERT(ledger.Snapshot().by_owner.empty());
}

// With only the refusable operations, charged never exceeds the budget, and
// a refusal happens exactly when the request would not fit.
RC_GTEST_PROP(MemoryLedgerProperty, TryChargeNeverExceedsBudget, ()) {
  const uint64_t budget = *rc::gen::inRange<uint64_t>(1, 5000);
  // Only kTryCharge (0), kCharge→ mapped to TryCharge, kResize (2).
  const std::vector<Op> ops = *GenOps(kForceResize);
  MemoryLedger ledger(budget);
  std::vector<MemoryCharge> charges;
  for (const auto& [type, bytes, index, kind_index] : ops) {
    const uint64_t before = ledger.charged_bytes();
    if (type == kResize && !charges.empty()) {
      MemoryCharge& c = charges[index % charges.size()];
      const uint64_t old_bytes = c.bytes();
      const bool fits = bytes <= old_bytes || before - old_bytes + bytes <= budget;
      Status s = c.Resize(bytes);
      RC_ASSERT(s.ok() == fits);
      if (!s.ok()) RC_ASSERT(s.code() == StatusCode::kResourceExhausted);
    } else if (type == kResize) {
      continue;
    } else {
      Result<MemoryCharge> c =
          ledger.TryCharge("o", static_cast<ChargeKind>(kind_index), bytes);
      RC_ASSERT(c.ok() == (before + bytes <= budget));
      if (c.ok()) {
        charges.push_back(std::move(*c));
      } else {
        RC_ASSERT(ledger.charged_bytes() == before);
      }
    }
    if (index % 7 == 0 && !charges.empty()) charges.erase(charges.begin());
    RC_ASSERT(ledger.charged_bytes() <= budget);
  }
  RC_ASSERT(ledger.Snapshot().peak_bytes <= budget);
  RC_ASSERT(ledger.Snapshot().over_commits == 0u);
}

TEST(MemoryLedgerConcurrencyTest, FourThreadsChargingEndAtZeroAndNeverExceedBudget) {
  constexpr uint64_t kBudget = 10000;
  MemoryLedger ledger(kBudget);
  std::atomic<uint64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&ledger, &granted, t] {
      std::mt19937_64 rng(1234 + t);  // fixed seeds (STYLE.md rule 13)
      std::vector<MemoryCharge> mine;
      const std::string owner = "thread-" + std::to_string(t);
      for (int i = 0; i < 5000; ++i) {
        const uint64_t bytes = rng() % 1500;
        switch (rng() % 4) {
          case 0:
          case 1: {
            Result<MemoryCharge> c = ledger.TryCharge(owner, ChargeKind::kKvSlot, bytes);
            if (c.ok()) {
              mine.push_back(std::move(*c));
              granted.fetch_add(1);
            }
            break;
          }
          case 2:
            if (!mine.empty()) mine[rng() % mine.size()].Resize(bytes).IgnoreError();
            break;
          case 3:
            if (!mine.empty()) {
              mine[rng() % mine.size()] = std::move(mine.back());
              mine.pop_back();
            }
            break;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  MemoryLedgerSnapshot s = ledger.Snapshot();
  EXPECT_EQ(s.charged_bytes, 0u);
  EXPECT_EQ(s.live_charges, 0u);
  EXPECT_TRUE(s.by_owner.empty());
  EXPECT_LE(s.peak_bytes, kBudget);  // TryCharge/Resize never overshot
  EXPECT_GT(granted.load(), 0u);
}

TEST(MemoryLedgerConcurrencyTest, UnconditionalChargesFromFourThreadsEndAtZero) {
  MemoryLedger ledger(100);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&ledger, t] {
      std::mt19937_64 rng(99 + t);
      for (int i = 0; i < 2000; ++i) {
        MemoryCharge c = ledger.Charge("t" + std::to_string(t), ChargeKind::kScratch, rng() % 64);
        c.ForceResize(rng() % 64);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(ledger.charged_bytes(), 0u);
  EXPECT_TRUE(ledger.Snapshot().by_owner.empty());
}

// ---------------------------------------------------------------------------
// Memory domains (Note [Memory domains])

TEST(MemoryDomainTest, HostIsAlwaysThereAndTheDefault) {
  MemoryLedger ledger(1000);
  EXPECT_EQ(ledger.FindDomain("host"), kHostDomain);
  EXPECT_EQ(ledger.DomainName(kHostDomain), "host");
  Result<MemoryCharge> c = ledger.TryCharge("a", ChargeKind::kKvSlot, 100);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->domain(), kHostDomain);
  const MemoryLedgerSnapshot s = ledger.Snapshot();
  ASSERT_EQ(s.domains.size(), 1u);
  const MemoryDomainSnapshot& host = s.domains.at("host");
  EXPECT_EQ(host.name, "host");
  EXPECT_EQ(host.charged_bytes, s.charged_bytes);
  EXPECT_EQ(host.budget_bytes, 1000u);
  EXPECT_EQ(host.by_owner.size(), 1u);
  EXPECT_EQ(s.name, "host");
}

TEST(MemoryDomainTest, RegisterRejectsBadAndDuplicateNames) {
  MemoryLedger ledger;
  EXPECT_EQ(ledger.RegisterDomain("", {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger.RegisterDomain("host", {}).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(ledger.RegisterDomain("vulkan:0", {}).ok());
  Result<MemoryDomain> again = ledger.RegisterDomain("vulkan:0", {});
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(again.status().message(), "vulkan:0"));
  for (size_t i = 2; i < kMaxMemoryDomains; ++i) {
    ASSERT_TRUE(ledger.RegisterDomain("vulkan:" + std::to_string(i), {}).ok());
  }
  EXPECT_EQ(ledger.RegisterDomain("one-too-many", {}).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(MemoryDomainTest, EachDomainRefusesAgainstItsOwnBudget) {
  MemoryLedger ledger(1000);
  Result<MemoryDomain> gpu = ledger.RegisterDomain("vulkan:0", {.budget_bytes = 500});
  ASSERT_TRUE(gpu.ok());
  EXPECT_FALSE(gpu->is_host());
  EXPECT_EQ(ledger.FindDomain("vulkan:0"), *gpu);
  // The host is full; the device is not, and vice versa.
  Result<MemoryCharge> h = ledger.TryCharge("m", ChargeKind::kHostFloor, 1000);
  ASSERT_TRUE(h.ok());
  Result<MemoryCharge> d = ledger.TryCharge(*gpu, "m", ChargeKind::kDeviceWeights, 400);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->domain(), *gpu);
  EXPECT_EQ(ledger.charged_bytes(), 1000u);        // host: the device's bytes are not RAM
  EXPECT_EQ(ledger.charged_bytes(*gpu), 400u);
  EXPECT_EQ(ledger.available_bytes(*gpu), 100u);
  EXPECT_EQ(ledger.available_bytes(), 0u);

  Result<MemoryCharge> refused = ledger.TryCharge(*gpu, "conv-7", ChargeKind::kKvSlot, 101);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  const std::string msg = refused.status().message();
  EXPECT_TRUE(Contains(msg, "vulkan:0")) << msg;
  EXPECT_TRUE(Contains(msg, "[devices.\"vulkan:0\"] budget")) << msg;
  EXPECT_TRUE(Contains(msg, "500")) << msg;
  EXPECT_FALSE(ledger.TryCharge("x", ChargeKind::kOther, 1).ok());

  const MemoryLedgerSnapshot s = ledger.Snapshot();
  EXPECT_EQ(s.refusals, 1u);  // host
  EXPECT_EQ(s.domains.at("vulkan:0").refusals, 1u);
  EXPECT_EQ(s.domains.at("vulkan:0").kind_bytes(ChargeKind::kDeviceWeights), 400u);
  EXPECT_EQ(s.kind_bytes(ChargeKind::kDeviceWeights), 0u);
  EXPECT_EQ(s.domains.at("vulkan:0").by_owner.at("m").total_bytes, 400u);
  EXPECT_EQ(s.by_owner.at("m").total_bytes, 1000u);
  EXPECT_FALSE(s.domains.at("vulkan:0").inside_host);

  // Growth is refused per domain too, and Release gives the device back.
  EXPECT_EQ(d->Resize(501).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(d->Resize(500).ok());
  d->Release();
  EXPECT_EQ(ledger.charged_bytes(*gpu), 0u);
  EXPECT_EQ(ledger.Snapshot().domains.at("vulkan:0").peak_bytes, 500u);
  EXPECT_TRUE(ledger.Snapshot().domains.at("vulkan:0").by_owner.empty());
}

TEST(MemoryDomainTest, InsideHostChargesCountAgainstBothBudgets) {
  MemoryLedger ledger(1000);
  Result<MemoryDomain> lvp =
      ledger.RegisterDomain("vulkan:0", {.budget_bytes = 600, .inside_host = true});
  ASSERT_TRUE(lvp.ok());
  Result<MemoryCharge> host = ledger.TryCharge("floor", ChargeKind::kHostFloor, 300);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(ledger.available_bytes(*lvp), 600u);  // its own room is the smaller one
  Result<MemoryCharge> dev = ledger.TryCharge(*lvp, "m", ChargeKind::kDeviceWeights, 500);
  ASSERT_TRUE(dev.ok());
  // The host's books hold the device's charge: RSS truth.
  EXPECT_EQ(ledger.charged_bytes(), 800u);
  EXPECT_EQ(ledger.charged_bytes(*lvp), 500u);
  EXPECT_EQ(ledger.available_bytes(*lvp), 100u);
  EXPECT_EQ(ledger.available_bytes(), 200u);

  // The device's own budget bounds its share...
  Result<MemoryCharge> own = ledger.TryCharge(*lvp, "kv", ChargeKind::kKvSlot, 101);
  ASSERT_FALSE(own.ok());
  EXPECT_TRUE(Contains(own.status().message(), "[devices.\"vulkan:0\"] budget"))
      << own.status().message();
  // ...and the host budget bounds the total: room in the device, none in RAM.
  ledger.SetBudget(*lvp, 0);
  EXPECT_EQ(ledger.available_bytes(*lvp), 200u);
  Result<MemoryCharge> total = ledger.TryCharge(*lvp, "kv", ChargeKind::kKvSlot, 201);
  ASSERT_FALSE(total.ok());
  const std::string msg = total.status().message();
  EXPECT_TRUE(Contains(msg, "host")) << msg;
  EXPECT_TRUE(Contains(msg, "vulkan:0")) << msg;
  EXPECT_TRUE(Contains(msg, "[memory] budget")) << msg;
  // A host charge is refused by the device's bytes too.
  EXPECT_FALSE(ledger.TryCharge("x", ChargeKind::kOther, 201).ok());

  const MemoryLedgerSnapshot s = ledger.Snapshot();
  EXPECT_EQ(s.refusals, 2u);                              // host: total + x
  EXPECT_EQ(s.domains.at("vulkan:0").refusals, 1u);       // own
  EXPECT_TRUE(s.domains.at("vulkan:0").inside_host);
  EXPECT_EQ(s.kind_bytes(ChargeKind::kDeviceWeights), 500u);
  EXPECT_EQ(s.by_owner.at("m").total_bytes, 500u);
  EXPECT_EQ(s.live_charges, 2u);
  EXPECT_EQ(s.domains.at("vulkan:0").live_charges, 1u);
  EXPECT_EQ(s.domains.at("host").charged_bytes, s.charged_bytes);

  // An unconditional charge over both budgets is an over-commit in both.
  ledger.SetBudget(*lvp, 600);
  MemoryCharge forced = ledger.Charge(*lvp, "m", ChargeKind::kScratch, 300);
  EXPECT_TRUE(ledger.OverBudgetHint());
  EXPECT_TRUE(ledger.OverBudgetHint(*lvp));
  const MemoryLedgerSnapshot o = ledger.Snapshot();
  EXPECT_EQ(o.over_commits, 1u);
  EXPECT_EQ(o.over_budget_bytes, 100u);
  EXPECT_EQ(o.domains.at("vulkan:0").over_commits, 1u);
  EXPECT_EQ(o.domains.at("vulkan:0").over_budget_bytes, 200u);
  forced.Release();
  EXPECT_FALSE(ledger.OverBudgetHint());
  EXPECT_FALSE(ledger.OverBudgetHint(*lvp));
  dev->Release();
  EXPECT_EQ(ledger.charged_bytes(), 300u);
  EXPECT_EQ(ledger.charged_bytes(*lvp), 0u);
  EXPECT_EQ(ledger.Snapshot().by_owner.count("m"), 0u);
}

TEST(MemoryDomainTest, ShortfallsNameTheDomainsThatNeedRoom) {
  MemoryLedger ledger(1000);
  Result<MemoryDomain> gpu = ledger.RegisterDomain("vulkan:0", {.budget_bytes = 500});
  Result<MemoryDomain> lvp =
      ledger.RegisterDomain("vulkan:1", {.budget_bytes = 400, .inside_host = true});
  ASSERT_TRUE(gpu.ok() && lvp.ok());
  MemoryCharge a = ledger.Charge(*gpu, "a", ChargeKind::kDeviceWeights, 450);
  MemoryCharge b = ledger.Charge("b", ChargeKind::kHostFloor, 700);
  MemoryCharge c = ledger.Charge(*lvp, "c", ChargeKind::kDeviceWeights, 250);
  EXPECT_TRUE(ledger.Shortfalls(*gpu, 50).empty());
  std::vector<DomainShortfall> g = ledger.Shortfalls(*gpu, 80);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].domain, *gpu);
  EXPECT_EQ(g[0].name, "vulkan:0");
  EXPECT_EQ(g[0].bytes, 30u);
  // vulkan:1 has 150 of its own but the host (950 charged) only 50.
  std::vector<DomainShortfall> l = ledger.Shortfalls(*lvp, 200);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].name, "vulkan:1");
  EXPECT_EQ(l[0].bytes, 50u);
  EXPECT_EQ(l[1].domain, kHostDomain);
  EXPECT_EQ(l[1].bytes, 150u);
  std::vector<DomainShortfall> l2 = ledger.Shortfalls(*lvp, 100);
  ASSERT_EQ(l2.size(), 1u);
  EXPECT_EQ(l2[0].domain, kHostDomain);
  // Over budget: the shortfall includes the overshoot.
  ledger.SetBudget(*gpu, 400);
  ASSERT_EQ(ledger.Shortfalls(*gpu, 10).size(), 1u);
  EXPECT_EQ(ledger.Shortfalls(*gpu, 10)[0].bytes, 60u);
  // A charge of nothing fits a domain within its budget, and not one over
  // it: the overshoot is what must be freed (the reclaimer's bytes = 0).
  EXPECT_TRUE(ledger.Shortfalls(*lvp, 0).empty());
  ASSERT_EQ(ledger.Shortfalls(*gpu, 0).size(), 1u);
  EXPECT_EQ(ledger.Shortfalls(*gpu, 0)[0].bytes, 50u);
  ledger.SetBudget(900);
  std::vector<DomainShortfall> h = ledger.Shortfalls(*lvp, 0);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].domain, kHostDomain);
  EXPECT_EQ(h[0].bytes, 50u);
}

TEST(MemoryDomainTest, RuntimeBytesAndBudgetsArePerDomain) {
  MemoryLedger ledger(1000);
  Result<MemoryDomain> lvp =
      ledger.RegisterDomain("vulkan:0", {.budget_bytes = 100, .inside_host = true});
  ASSERT_TRUE(lvp.ok());
  ledger.SetRuntimeBytes(77);
  ledger.SetRuntimeBytes(*lvp, 33);
  EXPECT_EQ(ledger.runtime_bytes(), 77u);  // not added to the host's: RSS holds it
  EXPECT_EQ(ledger.runtime_bytes(*lvp), 33u);
  ledger.SetBudget(*lvp, 200);
  EXPECT_EQ(ledger.budget_bytes(*lvp), 200u);
  EXPECT_EQ(ledger.budget_bytes(), 1000u);
  const MemoryDomainSnapshot d = ledger.DomainSnapshot(*lvp);
  EXPECT_EQ(d.name, "vulkan:0");
  EXPECT_EQ(d.runtime_bytes, 33u);
  EXPECT_EQ(d.budget_bytes, 200u);
}

TEST(MemoryDomainTest, MoveKeepsTheDomain) {
  MemoryLedger ledger;
  Result<MemoryDomain> gpu = ledger.RegisterDomain("vulkan:0", {});
  ASSERT_TRUE(gpu.ok());
  MemoryCharge a = ledger.Charge(*gpu, "a", ChargeKind::kKvSlot, 10);
  MemoryCharge b = std::move(a);
  EXPECT_EQ(b.domain(), *gpu);
  EXPECT_EQ(a.domain(), kHostDomain);  // NOLINT(bugprone-use-after-move): documented empty
  b = MemoryCharge();
  EXPECT_EQ(ledger.charged_bytes(*gpu), 0u);
}

TEST(MemoryDomainTest, UnknownDomainIsRefused) {
  MemoryLedger a, b;
  Result<MemoryDomain> other = b.RegisterDomain("vulkan:0", {});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(a.TryCharge(*other, "x", ChargeKind::kOther, 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a.budget_bytes(*other), 0u);
  EXPECT_FALSE(a.OverBudgetHint(*other));
  EXPECT_EQ(a.DomainName(*other), "");
}

// Four threads charge the host, a separate device and a device inside the
// host; no budget is ever exceeded and every book ends at zero.
TEST(MemoryLedgerConcurrencyTest, DomainsFromFourThreadsHoldEveryBudget) {
  constexpr uint64_t kHostBudget = 10000, kGpuBudget = 3000, kLvpBudget = 4000;
  MemoryLedger ledger(kHostBudget);
  const MemoryDomain gpu = *ledger.RegisterDomain("vulkan:0", {.budget_bytes = kGpuBudget});
  const MemoryDomain lvp =
      *ledger.RegisterDomain("vulkan:1", {.budget_bytes = kLvpBudget, .inside_host = true});
  const MemoryDomain domains[] = {kHostDomain, gpu, lvp};
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(4321 + t);  // fixed seeds (STYLE.md rule 13)
      std::vector<MemoryCharge> mine;
      const std::string owner = "thread-" + std::to_string(t);
      for (int i = 0; i < 4000; ++i) {
        const uint64_t bytes = rng() % 1200;
        switch (rng() % 4) {
          case 0:
          case 1: {
            Result<MemoryCharge> c =
                ledger.TryCharge(domains[rng() % 3], owner, ChargeKind::kKvSlot, bytes);
            if (c.ok()) mine.push_back(std::move(*c));
            break;
          }
          case 2:
            if (!mine.empty()) mine[rng() % mine.size()].Resize(bytes).IgnoreError();
            break;
          case 3:
            if (!mine.empty()) {
              mine[rng() % mine.size()] = std::move(mine.back());
              mine.pop_back();
            }
            break;
        }
        if (ledger.OverBudgetHint() || ledger.OverBudgetHint(gpu) || ledger.OverBudgetHint(lvp)) {
          over = true;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_FALSE(over.load());
  const MemoryLedgerSnapshot s = ledger.Snapshot();
  for (const auto& [name, d] : s.domains) {
    EXPECT_EQ(d.charged_bytes, 0u) << name;
    EXPECT_EQ(d.live_charges, 0u) << name;
    EXPECT_TRUE(d.by_owner.empty()) << name;
    EXPECT_LE(d.peak_bytes, d.budget_bytes) << name;
    EXPECT_GT(d.peak_bytes, 0u) << name;
  }
}

TEST(ResolveDeviceBudgetTest, DefaultIsHeapMinusHeadroomClampedByHeapBudget) {
  constexpr uint64_t kGiB = 1ull << 30;
  EXPECT_EQ(*ResolveDeviceBudget("vulkan:0", std::nullopt, "1GiB", 80 * kGiB, std::nullopt),
            79 * kGiB);
  EXPECT_EQ(*ResolveDeviceBudget("vulkan:0", std::nullopt, "1GiB", 80 * kGiB, 50 * kGiB),
            50 * kGiB);
  EXPECT_EQ(*ResolveDeviceBudget("vulkan:0", std::nullopt, "10%", 10 * kGiB, std::nullopt),
            9 * kGiB);
  EXPECT_EQ(*ResolveDeviceBudget("vulkan:0", "70GiB", "1GiB", 80 * kGiB, 10 * kGiB), 70 * kGiB);
  EXPECT_EQ(*ResolveDeviceBudget("vulkan:0", "50%", "1GiB", 80 * kGiB, std::nullopt), 40 * kGiB);
  EXPECT_EQ(ResolveDeviceBudget("vulkan:0", std::nullopt, "1GiB", 80 * kGiB, 0).status().code(),
            StatusCode::kUnavailable);
}

TEST(ResolveDeviceBudgetTest, ErrorsNameTheKey) {
  constexpr uint64_t kGiB = 1ull << 30;
  Result<uint64_t> big = ResolveDeviceBudget("vulkan:0", "81GiB", "1GiB", 80 * kGiB, {});
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(Contains(big.status().message(), "[devices.\"vulkan:0\"].budget"))
      << big.status().message();
  Result<uint64_t> bad = ResolveDeviceBudget("vulkan:1", std::nullopt, "lots", 80 * kGiB, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "[devices.\"vulkan:1\"].headroom"));
  Result<uint64_t> none = ResolveDeviceBudget("vulkan:0", std::nullopt, "2GiB", 2 * kGiB, {});
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(Contains(none.status().message(), "headroom"));
  EXPECT_FALSE(ResolveDeviceBudget("vulkan:0", "0", "1GiB", 80 * kGiB, {}).ok());
}

}  // namespace
}  // namespace arbiter
