// arbiter/memory/memory_ledger.h — the byte budgets of the process, one per memory domain.
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
//   - The books are kept per memory domain (Note [Memory domains]): "host"
//     (RAM; always present, the default of every call that names none) and
//     one per device, registered with RegisterDomain(). Each domain has its
//     own budget and figures; the rules above hold per domain. The host-only
//     forms (TryCharge(owner, ...), budget_bytes(), Snapshot()'s top-level
//     fields, ...) mean the host, so a CPU-only process is unchanged by them.
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
//   ARBITER_ASSIGN_OR_RETURN(MemoryDomain gpu,
//       ledger.RegisterDomain("vulkan:0", {.budget_bytes = 70ull << 30}));
//   ARBITER_ASSIGN_OR_RETURN(MemoryCharge kv,
//       ledger.TryCharge(gpu, "text::demo-chat", ChargeKind::kKvSlot, kv_bytes));
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
#include <vector>

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

// Note [Memory domains]
// A memory domain is one pool of memory with one budget: "host" (the
// process's RAM; index 0, always present) or a device ("vulkan:0", ...)
// registered by RegisterDomain(). Every charge lives in exactly one domain
// (MemoryCharge::domain()), and each domain keeps complete books of its own:
// budget, charged, peak, refusals, over-commits, by kind, by owner, and
// runtime bytes (the process's own memory there that no charge covers: for
// the host what the runtime measures from RSS, for a device its fixed cost —
// pipelines, pools, staging buffers — measured when it is opened).
//
// A device whose memory *is* host RAM (lavapipe; the unified memory of
// phones and integrated GPUs) is registered inside the host
// (MemoryDomainOptions::inside_host). Its domain nests in the host's:
//   - a charge in it is entered in its own books *and* in the host's
//     (charged, peak, by_kind, by_owner, live charges), so the host's
//     charged_bytes stays the whole of the RAM the ledger accounts for and
//     can be compared with the process's RSS;
//   - TryCharge() and a growing Resize() there must fit under both budgets:
//     the device's own budget bounds only the device's share of RAM, the
//     host budget bounds the total. A refusal is counted in, and its error
//     names, the domain whose budget refused (the device's is checked
//     first);
//   - Charge()/ForceResize() count an over-commit in each domain they leave
//     over its budget; OverBudgetHint(host) sees the nested charges;
//   - available_bytes() of the nested domain is the smaller of its own and
//     the host's room: what TryCharge() there could grant now;
//   - its runtime bytes are not added to the host's: the host's figure is
//     measured from the process's RSS, which holds them already.
// Domains not inside the host are disjoint from it. Summing charged_bytes
// over domains therefore double-counts nested ones: sum the domains whose
// inside_host is false.
//
// The reclaim policy asks "which domain needs room, and how much" with
// Shortfalls(domain, bytes): the budgets a charge of `bytes` in `domain`
// would break now, and by how many bytes each. Freeing a charge of a nested
// domain frees host room too; freeing a host charge does not help a device.
//
// Domains are never unregistered (a ledger holds at most kMaxMemoryDomains);
// a device closed and opened again finds its domain with FindDomain().

// Names one domain of a MemoryLedger: the host (the default value) or a
// device domain returned by MemoryLedger::RegisterDomain(). A plain value;
// meaningful only for the ledger that returned it (kHostDomain for any).
class MemoryDomain {
 public:
  constexpr MemoryDomain() = default;  // the host
  constexpr bool is_host() const { return index_ == 0; }
  // 0 for the host; devices 1, 2, ... in registration order.
  constexpr uint32_t index() const { return index_; }
  friend constexpr bool operator==(MemoryDomain a, MemoryDomain b) { return a.index_ == b.index_; }
  friend constexpr bool operator!=(MemoryDomain a, MemoryDomain b) { return a.index_ != b.index_; }

 private:
  friend class MemoryLedger;
  explicit constexpr MemoryDomain(uint32_t index) : index_(index) {}
  uint32_t index_ = 0;
};

inline constexpr MemoryDomain kHostDomain{};
inline constexpr std::string_view kHostDomainName = "host";
// Domains per ledger, the host included.
inline constexpr size_t kMaxMemoryDomains = 16;

struct MemoryDomainOptions {
  size_t budget_bytes = 0;  // 0 = unlimited
  // The device's memory is host RAM: Note [Memory domains].
  bool inside_host = false;
};

// How far one domain's budget is from holding a charge (Shortfalls()).
struct DomainShortfall {
  MemoryDomain domain;
  std::string name;
  size_t bytes = 0;  // bytes to free in `domain` before the charge fits
};

// A point-in-time copy of one domain's books (STYLE.md rule 9).
struct MemoryDomainSnapshot {
  std::string name{kHostDomainName};
  bool inside_host = false;  // Note [Memory domains]
  size_t budget_bytes = 0;       // 0 = unlimited
  size_t charged_bytes = 0;      // Σ live charges
  size_t peak_bytes = 0;         // max charged_bytes since construction
  size_t over_budget_bytes = 0;  // max(0, charged − budget); 0 if unlimited
  uint64_t live_charges = 0;     // number of live MemoryCharge tokens
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

// A point-in-time copy of the ledger's books: the fields inherited from
// MemoryDomainSnapshot are the host's (as before domains existed), and
// `domains` holds every domain by name, "host" included (equal to the
// top-level fields), all taken under one lock.
struct MemoryLedgerSnapshot : MemoryDomainSnapshot {
  std::map<std::string, MemoryDomainSnapshot> domains;
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
  // unchanged, if the growth would take its domain past its budget (or, for
  // a domain inside the host, the host past its own).
  // Errors: kFailedPrecondition on a released/empty token.
  Status Resize(size_t new_bytes);
  // Like Resize() but never refused; an overshoot counts as an over-commit.
  // Does nothing on a released/empty token.
  void ForceResize(size_t new_bytes);

  // 0 / "" / kOther / the host on a released token.
  size_t bytes() const { return bytes_; }
  const std::string& owner() const { return owner_; }
  ChargeKind kind() const { return kind_; }
  MemoryDomain domain() const { return domain_; }

 private:
  friend class MemoryLedger;
  MemoryCharge(MemoryLedger* ledger, uint64_t id, MemoryDomain domain, std::string owner,
               ChargeKind kind, size_t bytes)
      : ledger_(ledger),
        id_(id),
        domain_(domain),
        owner_(std::move(owner)),
        kind_(kind),
        bytes_(bytes) {}

  MemoryLedger* ledger_ = nullptr;  // null when empty/released
  uint64_t id_ = 0;
  MemoryDomain domain_;
  std::string owner_;
  ChargeKind kind_ = ChargeKind::kOther;
  size_t bytes_ = 0;
};

// The byte budget. See the file comment.
class MemoryLedger {
 public:
  // `budget_bytes` is the host's; 0 means unlimited.
  explicit MemoryLedger(size_t budget_bytes = 0);
  // REQUIRES: no live charges (every MemoryCharge destroyed or released).
  ~MemoryLedger();
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  // ---- Domains (Note [Memory domains]) ----

  // Adds a device domain with its own books and budget.
  // Errors: kInvalidArgument for an empty name, "host", or a name over 64
  // bytes; kAlreadyExists if `name` is registered (use FindDomain());
  // kResourceExhausted past kMaxMemoryDomains.
  Result<MemoryDomain> RegisterDomain(std::string name, MemoryDomainOptions options)
      EXCLUDES(mu_);
  // The domain called `name` ("host" included), if registered.
  std::optional<MemoryDomain> FindDomain(std::string_view name) const EXCLUDES(mu_);
  // "host", the registered name, or "" for a domain this ledger never
  // returned.
  std::string DomainName(MemoryDomain domain) const EXCLUDES(mu_);

  // ---- Charging ----
  // REQUIRES for every method taking a MemoryDomain: the host, or a domain
  // this ledger's RegisterDomain() returned. TryCharge() answers
  // kInvalidArgument otherwise; the getters answer 0 / false; Charge()
  // asserts and returns an empty token.

  // Charges `bytes` to `owner` in the host domain if charged + bytes ≤
  // budget (always, when unlimited). A 0-byte charge always succeeds.
  // Errors: kResourceExhausted naming the owner, kind, bytes, budget and
  // what is charged; nothing is charged then.
  Result<MemoryCharge> TryCharge(std::string owner, ChargeKind kind, size_t bytes)
      EXCLUDES(mu_) {
    return TryCharge(kHostDomain, std::move(owner), kind, bytes);
  }
  // The same in `domain`; for a domain inside the host the charge must also
  // fit the host budget. The error names the domain that refused.
  Result<MemoryCharge> TryCharge(MemoryDomain domain, std::string owner, ChargeKind kind,
                                 size_t bytes) EXCLUDES(mu_);

  // Charges unconditionally (in the host, or in `domain`). Each domain it
  // takes past its budget counts it in Snapshot().over_commits and shows it
  // in over_budget_bytes; the caller should log it (docs/memory.md "Fixed
  // defects of the reference": the budget holds at every instant; an
  // overshoot is logged and reported).
  // REQUIRES: charged + bytes fits in size_t.
  MemoryCharge Charge(std::string owner, ChargeKind kind, size_t bytes) EXCLUDES(mu_) {
    return Charge(kHostDomain, std::move(owner), kind, bytes);
  }
  MemoryCharge Charge(MemoryDomain domain, std::string owner, ChargeKind kind, size_t bytes)
      EXCLUDES(mu_);

  // ---- Budgets and figures; the forms without a domain mean the host ----

  // Replaces the budget (0 = unlimited). Existing charges stay; the domain
  // may then be over budget until they are released.
  void SetBudget(size_t budget_bytes) EXCLUDES(mu_) { SetBudget(kHostDomain, budget_bytes); }
  void SetBudget(MemoryDomain domain, size_t budget_bytes) EXCLUDES(mu_);

  size_t budget_bytes() const EXCLUDES(mu_) { return budget_bytes(kHostDomain); }
  size_t budget_bytes(MemoryDomain domain) const EXCLUDES(mu_);
  // The host's includes the charges of domains inside it.
  size_t charged_bytes() const EXCLUDES(mu_) { return charged_bytes(kHostDomain); }
  size_t charged_bytes(MemoryDomain domain) const EXCLUDES(mu_);
  // Bytes TryCharge() in the domain could still grant now: budget − charged,
  // 0 when over budget, SIZE_MAX when unlimited; for a domain inside the
  // host, also at most the host's.
  size_t available_bytes() const EXCLUDES(mu_) { return available_bytes(kHostDomain); }
  size_t available_bytes(MemoryDomain domain) const EXCLUDES(mu_);

  // The budgets a charge of `bytes` in `domain` would break now, each with
  // the bytes to free there first: `domain` first, then (inside the host)
  // the host. Empty when the charge fits: charged + bytes ≤ budget in each
  // (so bytes = 0 names every one of them that is over its budget). For the
  // reclaim policy.
  std::vector<DomainShortfall> Shortfalls(MemoryDomain domain, size_t bytes) const
      EXCLUDES(mu_);

  // Every domain's books under one lock; the top-level fields are the host's.
  MemoryLedgerSnapshot Snapshot() const EXCLUDES(mu_);
  // One domain's books (a default, host-named snapshot for an unknown one).
  MemoryDomainSnapshot DomainSnapshot(MemoryDomain domain) const EXCLUDES(mu_);

  // The process's own memory in the domain that no charge covers. For the
  // host: its resident memory (binary, tokenizers, thread stacks, BLAS and
  // HTTP buffers) as measured by the runtime (docs/memory.md "The ledger is
  // the truth"); for a device: its fixed cost, measured when it is opened.
  // Reported next to charged_bytes so charged + runtime can be compared with
  // what the OS or driver reports; never counted against the budget (the
  // headroom covers it).
  void SetRuntimeBytes(size_t bytes) EXCLUDES(mu_) { SetRuntimeBytes(kHostDomain, bytes); }
  void SetRuntimeBytes(MemoryDomain domain, size_t bytes) EXCLUDES(mu_);
  size_t runtime_bytes() const EXCLUDES(mu_) { return runtime_bytes(kHostDomain); }
  size_t runtime_bytes(MemoryDomain domain) const EXCLUDES(mu_);

  // Lock-free: whether charged > budget (budget ≠ 0) in the domain as of
  // the last change (the host's counts the charges of domains inside it).
  // A hint for hot paths (the MemoryArbiter's acquire fast path takes its
  // slow path, which evicts to fit, while it is true); a concurrent change
  // may not be visible yet.
  bool OverBudgetHint() const { return OverBudgetHint(kHostDomain); }
  bool OverBudgetHint(MemoryDomain domain) const {
    return domain.index() < kMaxMemoryDomains &&
           over_budget_hint_[domain.index()].load(std::memory_order_relaxed);
  }

 private:
  friend class MemoryCharge;

  struct Record {
    uint32_t domain;
    std::string owner;
    ChargeKind kind;
    size_t bytes;
  };

  // One domain's books. `domains_[0]` is the host.
  struct Books {
    std::string name;
    bool inside_host = false;
    size_t budget_bytes = 0;
    size_t charged_bytes = 0;
    size_t peak_bytes = 0;
    uint64_t over_commits = 0;
    uint64_t refusals = 0;
    uint64_t live_charges = 0;
    size_t runtime_bytes = 0;
    ChargeKindBytes by_kind{};
    // Hashed (charge/release are O(1) with many owners, e.g. 1000 resident
    // models); snapshots sort it into MemoryDomainSnapshot::by_owner.
    std::unordered_map<std::string, MemoryDomainSnapshot::OwnerUsage> by_owner;
  };

  // Called by MemoryCharge.
  void ReleaseCharge(uint64_t id) EXCLUDES(mu_);
  Status ResizeCharge(uint64_t id, size_t new_bytes, bool force) EXCLUDES(mu_);

  bool KnownLocked(MemoryDomain domain) const REQUIRES(mu_) {
    return domain.index() < domains_.size();
  }
  // The books a charge in domain `d` is entered in: d's, then the host's
  // when d is inside it. Returns how many of out[0..1] it filled.
  size_t ChainLocked(uint32_t d, Books* out[2]) REQUIRES(mu_);
  // The first of d's chain whose budget does not hold `extra` more bytes,
  // or null.
  Books* RefuserLocked(uint32_t d, size_t extra) REQUIRES(mu_);
  // Adds/subtracts `bytes` (and `live` charges) for `owner`/`kind` in every
  // book of d's chain. Add returns whether it left any of them over budget
  // and counts an over-commit in those when `count_over_commit`.
  void AddLocked(const Record& rec, size_t bytes, int live, bool count_over_commit)
      REQUIRES(mu_);
  void SubLocked(const Record& rec, size_t bytes, int live) REQUIRES(mu_);
  void UpdateHintLocked(uint32_t d) REQUIRES(mu_);
  Status ExhaustedLocked(Books& refuser, uint32_t d, const std::string& owner,
                         ChargeKind kind, size_t bytes, std::string_view what) REQUIRES(mu_);
  MemoryDomainSnapshot SnapshotLocked(const Books& b) const REQUIRES(mu_);

  mutable Mutex mu_;
  std::vector<Books> domains_ GUARDED_BY(mu_);  // [0] = host; append-only
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, Record> live_ GUARDED_BY(mu_);
  // Per domain index: a mirror of "charged > budget ≠ 0", written under mu_
  // at every change of that domain's charged or budget, read without it by
  // OverBudgetHint(). A fixed array, so registration never moves it.
  std::array<std::atomic<bool>, kMaxMemoryDomains> over_budget_hint_{};
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

// The default headroom a device's default budget leaves below its heap.
inline constexpr std::string_view kDefaultDeviceHeadroom = "512MiB";

// Resolves a device domain's budget from its `[devices."NAME"]` keys when
// the device is opened (sizes in bytes; percentages are of `heap_bytes`).
//   - `budget_text` set: ParseSize(budget_text, heap_bytes); must be > 0 and
//     ≤ heap_bytes.
//   - unset: heap_bytes − headroom, clamped to `heap_budget_bytes` (the
//     driver's VK_EXT_memory_budget heapBudget) where the driver reports
//     one.
// Errors: kInvalidArgument naming the key ([devices."NAME"].budget /
// .headroom) for unparsable sizes, a zero budget or one larger than the
// heap, or (budget unset) a headroom ≥ the heap; kUnavailable when the
// driver's heapBudget is 0 (nothing left to give).
Result<uint64_t> ResolveDeviceBudget(std::string_view name,
                                     std::optional<std::string> budget_text,
                                     std::string headroom_text, uint64_t heap_bytes,
                                     std::optional<uint64_t> heap_budget_bytes);

}  // namespace arbiter
