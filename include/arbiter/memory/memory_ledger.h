// arbiter/memory/memory_ledger.h — the one byte budget of the process.
//
// Every byte held for models is charged to one MemoryLedger with an owner
// (a model's resident key such as "text::demo-chat", a conversation id,
// "vision_cache", ...) and a ChargeKind. Implements docs/architecture.md
// "One budget, one owner" and docs/memory.md "The budget and the ledger"
// (the reference's production budget: total RAM − headroom; the budget
// holds at every instant: docs/memory.md "Fixed defects of the reference").
//
// Concepts:
//   - A charge is a move-only RAII token (MemoryCharge). Destroying it, or
//     calling Release(), uncharges its bytes. Invariant, at every instant:
//       charged_bytes == Σ bytes of live charges.
//   - TryCharge() refuses (kResourceExhausted) a charge that would take the
//     ledger past its budget, so while only TryCharge()/Resize() are used,
//       charged_bytes ≤ budget_bytes.
//   - Charge() and ForceResize() are unconditional. They exist for the one
//     documented exception — a single model larger than the whole budget —
//     and for measured sizes that came out larger than the estimate after
//     the memory is already in use. The overshoot is recorded
//     (Snapshot().over_budget_bytes, over_commits) so it is reported, never
//     hidden. Callers log it; the ledger does no logging.
//   - Budget 0 means unlimited (nothing is ever refused).
//   - Lowering the budget with SetBudget() never revokes charges; it can
//     leave the ledger over budget, which is reported the same way.
//
// Example:
//   MemoryLedger ledger(8ull << 30);
//   ARBITER_ASSIGN_OR_RETURN(MemoryCharge weights,
//       ledger.TryCharge("text::demo-chat", ChargeKind::kDeviceWeights,
//                        estimated_bytes));
//   ... load ...
//   ARBITER_RETURN_IF_ERROR(weights.Resize(measured_bytes));
//   // `weights` uncharges when it goes out of scope.
//
// Thread safety: MemoryLedger is thread-safe (one mutex; every method takes
// it briefly and never calls out while holding it, so it can be called with
// other components' locks held — it is always the innermost lock).
// MemoryCharge is thread-compatible: one owner; move it, don't share it.
// Lifetime: the ledger must outlive every MemoryCharge it returned.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"

namespace arbiter {

// What a charge is for. Keep in sync with ChargeKindName() and
// kChargeKindCount.
enum class ChargeKind {
  kDeviceWeights = 0,  // compute-ready weights in the device arena
  kHostFloor,          // host copy of weights (private or shared memory)
  kKvSlot,             // a slot's KV cache
  kPromptCache,        // saved prompt/KV prefixes held in RAM
  kVisionCache,        // VisionEmbeddingCache entries
  kScratch,            // activations / compute scratch
  kModel,              // a backend's or child process's measured footprint
  kOther,
};
inline constexpr size_t kChargeKindCount = 8;

// "device_weights" | "host_floor" | "kv_slot" | "prompt_cache" |
// "vision_cache" | "scratch" | "model" | "other".
std::string_view ChargeKindName(ChargeKind kind);

// Bytes per kind, indexed by static_cast<size_t>(ChargeKind).
using ChargeKindBytes = std::array<size_t, kChargeKindCount>;

// A point-in-time copy of the ledger's books (STYLE.md rule 9).
struct MemoryLedgerSnapshot {
  size_t budget_bytes = 0;       // 0 = unlimited
  size_t charged_bytes = 0;      // Σ live charges
  size_t peak_bytes = 0;         // max charged_bytes since construction
  size_t over_budget_bytes = 0;  // max(0, charged − budget); 0 if unlimited
  uint64_t live_charges = 0;       // number of live MemoryCharge tokens
  // Calls to Charge()/ForceResize() that added bytes and left the ledger
  // over its budget.
  uint64_t over_commits = 0;
  // Times TryCharge()/Resize() were refused with kResourceExhausted.
  uint64_t refusals = 0;
  ChargeKindBytes by_kind{};  // indexed by static_cast<size_t>(ChargeKind)
  // The process's own memory that no model owns (SetRuntimeBytes): part of
  // the ledger's view of the process, not of charged_bytes, not against the
  // budget.
  size_t runtime_bytes = 0;

  struct OwnerUsage {
    ChargeKindBytes by_kind{};
    size_t total_bytes = 0;
    uint64_t live_charges = 0;  // an owner with live 0-byte charges is listed
  };
  std::map<std::string, OwnerUsage> by_owner;  // owners with live charges

  size_t kind_bytes(ChargeKind kind) const { return by_kind[static_cast<size_t>(kind)]; }
};

class MemoryLedger;

// A move-only token for bytes charged to a MemoryLedger. Destruction or
// Release() uncharges. A default-constructed or moved-from token is empty
// (released() is true) and its methods do nothing.
//
// Thread safety: thread-compatible; the ledger it points to is thread-safe.
class MemoryCharge {
 public:
  MemoryCharge() = default;
  ~MemoryCharge() { Release(); }
  MemoryCharge(MemoryCharge&& other) noexcept;
  MemoryCharge& operator=(MemoryCharge&& other) noexcept;
  MemoryCharge(const MemoryCharge&) = delete;
  MemoryCharge& operator=(const MemoryCharge&) = delete;

  // Uncharges the bytes. Idempotent.
  void Release();
  bool released() const { return ledger_ == nullptr; }

  // Changes the charged size (e.g. estimate → measured). Shrinking always
  // succeeds. Growing fails with kResourceExhausted, leaving the charge
  // unchanged, if the growth would take the ledger past its budget.
  // Errors: kFailedPrecondition on a released/empty token.
  Status Resize(size_t new_bytes);
  // Like Resize() but never refused; an overshoot counts as an over-commit.
  // Does nothing on a released/empty token.
  void ForceResize(size_t new_bytes);

  // 0 / "" / kOther on a released token.
  size_t bytes() const { return bytes_; }
  const std::string& owner() const { return owner_; }
  ChargeKind kind() const { return kind_; }

 private:
  friend class MemoryLedger;
  MemoryCharge(MemoryLedger* ledger, uint64_t id, std::string owner, ChargeKind kind,
               size_t bytes)
      : ledger_(ledger), id_(id), owner_(std::move(owner)), kind_(kind), bytes_(bytes) {}

  MemoryLedger* ledger_ = nullptr;  // null when empty/released
  uint64_t id_ = 0;
  std::string owner_;
  ChargeKind kind_ = ChargeKind::kOther;
  size_t bytes_ = 0;
};

// The byte budget. See the file comment.
class MemoryLedger {
 public:
  // `budget_bytes` 0 means unlimited.
  explicit MemoryLedger(size_t budget_bytes = 0);
  // REQUIRES: no live charges (every MemoryCharge destroyed or released).
  ~MemoryLedger();
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  // Charges `bytes` to `owner` if charged + bytes ≤ budget (always, when
  // unlimited). A 0-byte charge always succeeds.
  // Errors: kResourceExhausted naming the owner, kind, bytes, budget and
  // what is charged; nothing is charged then.
  Result<MemoryCharge> TryCharge(std::string owner, ChargeKind kind, size_t bytes)
      EXCLUDES(mu_);

  // Charges unconditionally. If this takes the ledger past its budget it is
  // counted in Snapshot().over_commits and shows in over_budget_bytes; the
  // caller should log it (docs/memory.md "Fixed defects of the reference":
  // the budget holds at every instant; an overshoot is logged and reported).
  // REQUIRES: charged + bytes fits in size_t.
  MemoryCharge Charge(std::string owner, ChargeKind kind, size_t bytes) EXCLUDES(mu_);

  // Replaces the budget (0 = unlimited). Existing charges stay; the ledger
  // may then be over budget until they are released.
  void SetBudget(size_t budget_bytes) EXCLUDES(mu_);

  size_t budget_bytes() const EXCLUDES(mu_);
  size_t charged_bytes() const EXCLUDES(mu_);
  // Bytes TryCharge() could still grant now: budget − charged, 0 when over
  // budget, SIZE_MAX when unlimited.
  size_t available_bytes() const EXCLUDES(mu_);

  MemoryLedgerSnapshot Snapshot() const EXCLUDES(mu_);

  // The process's own resident memory that no charge covers (binary,
  // tokenizers, thread stacks, BLAS and HTTP buffers), as measured by the
  // runtime (docs/memory.md "The ledger is the truth"). Reported next to
  // charged_bytes so charged + runtime can be compared with the process's
  // RSS; never counted against the budget (the headroom covers it).
  void SetRuntimeBytes(size_t bytes) EXCLUDES(mu_);
  size_t runtime_bytes() const EXCLUDES(mu_);

  // Lock-free: whether charged > budget (budget ≠ 0) as of the last change.
  // A hint for hot paths (the MemoryArbiter's acquire fast path takes its
  // slow path, which evicts to fit, while it is true); a concurrent change
  // may not be visible yet.
  bool OverBudgetHint() const {
    return over_budget_hint_.load(std::memory_order_relaxed);
  }

 private:
  friend class MemoryCharge;

  struct Record {
    std::string owner;
    ChargeKind kind;
    size_t bytes;
  };

  // Called by MemoryCharge.
  void ReleaseCharge(uint64_t id) EXCLUDES(mu_);
  Status ResizeCharge(uint64_t id, size_t new_bytes, bool force) EXCLUDES(mu_);

  // Whether `extra` more bytes fit under the budget.
  bool FitsLocked(size_t extra) const REQUIRES(mu_);
  // Adds/subtracts `bytes` for `owner`/`kind` in every aggregate.
  // Both return the owner's usage.
  MemoryLedgerSnapshot::OwnerUsage& AddLocked(const std::string& owner, ChargeKind kind,
                                              size_t bytes) REQUIRES(mu_);
  MemoryLedgerSnapshot::OwnerUsage& SubLocked(const std::string& owner, ChargeKind kind,
                                              size_t bytes) REQUIRES(mu_);
  bool OverLocked() const REQUIRES(mu_);
  Status ExhaustedLocked(const std::string& owner, ChargeKind kind, size_t bytes,
                         std::string_view what) REQUIRES(mu_);

  mutable Mutex mu_;
  size_t budget_bytes_ GUARDED_BY(mu_);
  size_t charged_bytes_ GUARDED_BY(mu_) = 0;
  size_t peak_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t over_commits_ GUARDED_BY(mu_) = 0;
  uint64_t refusals_ GUARDED_BY(mu_) = 0;
  size_t runtime_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  ChargeKindBytes by_kind_ GUARDED_BY(mu_){};
  // Hashed (charge/release are O(1) with many owners, e.g. 1000 resident
  // models); Snapshot() sorts it into MemoryLedgerSnapshot::by_owner.
  std::unordered_map<std::string, MemoryLedgerSnapshot::OwnerUsage> by_owner_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Record> live_ GUARDED_BY(mu_);
  // Mirror of OverLocked(), written under mu_ at every change of charged or
  // budget, read without it by OverBudgetHint().
  std::atomic<bool> over_budget_hint_{false};
};

// The default headroom reserve, the reference's 1536 MB (docs/memory.md "The
// budget and the ledger").
inline constexpr std::string_view kDefaultMemoryHeadroom = "1536MiB";

// Resolves the process budget from the `[memory]` config keys.
//   - `budget_text` set: ParseSize(budget_text, total_ram_bytes), so "75%"
//     is 75% of RAM. Must be > 0.
//   - unset: total_ram_bytes − ParseSize(headroom_text, total_ram_bytes).
// The headroom is validated even when a budget is set: an invalid value is an
// error, never a silent default (as in the reference; docs/config.md
// "[memory]").
// Errors: kInvalidArgument naming the key ("[memory] budget" /
// "[memory] headroom") for unparsable sizes, a zero budget, or (budget unset)
// a headroom ≥ total RAM.
Result<uint64_t> ResolveBudget(std::optional<std::string> budget_text,
                               std::string headroom_text, size_t total_ram_bytes);

}  // namespace arbiter
