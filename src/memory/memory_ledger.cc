// MemoryLedger: the books of the process's one byte budget.
//
// Policy, in prose:
//   - Every live MemoryCharge has exactly one Record in `live_`, keyed by an
//     id that is never reused. The aggregates (charged_bytes_, by_kind_,
//     by_owner_) are updated in the same critical section as `live_`, so at
//     every instant charged_bytes_ == Σ live_[*].bytes == Σ by_kind_ ==
//     Σ by_owner_[*].total_bytes.
//   - Refusable operations (TryCharge, growing Resize) check the budget and
//     update the books under one lock acquisition, so two threads cannot
//     both pass the check and jointly overshoot.
//   - Unconditional operations (Charge, ForceResize) may overshoot; they
//     count an over-commit. Nothing is ever revoked: the ledger only keeps
//     books, the owners (arbiter, caches) decide what to evict.
//   - The ledger never calls out while holding mu_ and no other lock is taken
//     under it, so it is always the innermost lock.
#include "arbiter/memory/memory_ledger.h"

#include <cassert>
#include <limits>

#include "arbiter/base/size.h"

namespace arbiter {

std::string_view ChargeKindName(ChargeKind kind) {
  switch (kind) {
    case ChargeKind::kDeviceWeights: return "device_weights";
    case ChargeKind::kHostFloor: return "host_floor";
    case ChargeKind::kKvSlot: return "kv_slot";
    case ChargeKind::kPromptCache: return "prompt_cache";
    case ChargeKind::kVisionCache: return "vision_cache";
    case ChargeKind::kScratch: return "scratch";
    case ChargeKind::kModel: return "model";
    case ChargeKind::kOther: return "other";
  }
  return "other";
}

// ---------------------------------------------------------------------------
// MemoryCharge

MemoryCharge::MemoryCharge(MemoryCharge&& other) noexcept
    : ledger_(std::exchange(other.ledger_, nullptr)),
      id_(std::exchange(other.id_, 0)),
      owner_(std::move(other.owner_)),
      kind_(std::exchange(other.kind_, ChargeKind::kOther)),
      bytes_(std::exchange(other.bytes_, 0)) {
  other.owner_.clear();
}

MemoryCharge& MemoryCharge::operator=(MemoryCharge&& other) noexcept {
  if (this != &other) {
    Release();
    ledger_ = std::exchange(other.ledger_, nullptr);
    id_ = std::exchange(other.id_, 0);
    owner_ = std::move(other.owner_);
    other.owner_.clear();
    kind_ = std::exchange(other.kind_, ChargeKind::kOther);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void MemoryCharge::Release() {
  if (ledger_ == nullptr) return;
  ledger_->ReleaseCharge(id_);
  ledger_ = nullptr;
  id_ = 0;
  owner_.clear();
  kind_ = ChargeKind::kOther;
  bytes_ = 0;
}

Status MemoryCharge::Resize(size_t new_bytes) {
  if (ledger_ == nullptr) {
    return FailedPreconditionError("MemoryCharge::Resize on a released or empty charge");
  }
  ARBITER_RETURN_IF_ERROR(ledger_->ResizeCharge(id_, new_bytes, /*force=*/false));
  bytes_ = new_bytes;
  return OkStatus();
}

void MemoryCharge::ForceResize(size_t new_bytes) {
  if (ledger_ == nullptr) return;
  ledger_->ResizeCharge(id_, new_bytes, /*force=*/true).IgnoreError();  // never fails
  bytes_ = new_bytes;
}

// ---------------------------------------------------------------------------
// MemoryLedger

MemoryLedger::MemoryLedger(size_t budget_bytes) : budget_bytes_(budget_bytes) {}

MemoryLedger::~MemoryLedger() {
  MutexLock l(&mu_);
  assert(live_.empty() && "MemoryLedger destroyed with live charges");
}

bool MemoryLedger::FitsLocked(size_t extra) const {
  if (budget_bytes_ == 0 || extra == 0) return true;
  if (charged_bytes_ >= budget_bytes_) return false;
  return extra <= budget_bytes_ - charged_bytes_;
}

bool MemoryLedger::OverLocked() const {
  return budget_bytes_ != 0 && charged_bytes_ > budget_bytes_;
}

MemoryLedgerSnapshot::OwnerUsage& MemoryLedger::AddLocked(const std::string& owner,
                                                          ChargeKind kind, size_t bytes) {
  assert(charged_bytes_ <= std::numeric_limits<size_t>::max() - bytes);
  charged_bytes_ += bytes;
  over_budget_hint_.store(OverLocked(), std::memory_order_relaxed);
  if (charged_bytes_ > peak_bytes_) peak_bytes_ = charged_bytes_;
  by_kind_[static_cast<size_t>(kind)] += bytes;
  MemoryLedgerSnapshot::OwnerUsage& usage = by_owner_[owner];
  usage.by_kind[static_cast<size_t>(kind)] += bytes;
  usage.total_bytes += bytes;
  return usage;
}

MemoryLedgerSnapshot::OwnerUsage& MemoryLedger::SubLocked(const std::string& owner,
                                                          ChargeKind kind, size_t bytes) {
  assert(charged_bytes_ >= bytes);
  charged_bytes_ -= bytes;
  over_budget_hint_.store(OverLocked(), std::memory_order_relaxed);
  by_kind_[static_cast<size_t>(kind)] -= bytes;
  auto it = by_owner_.find(owner);
  assert(it != by_owner_.end());
  it->second.by_kind[static_cast<size_t>(kind)] -= bytes;
  it->second.total_bytes -= bytes;
  return it->second;
}

Status MemoryLedger::ExhaustedLocked(const std::string& owner, ChargeKind kind, size_t bytes,
                                     std::string_view what) {
  ++refusals_;
  // Built with append(): GCC 12 warns (-Wrestrict, a false positive) on
  // `literal + std::string` chains at -O3.
  std::string msg = "memory budget exhausted: ";
  msg.append(what).append(" ").append(std::to_string(bytes)).append(" bytes (");
  msg.append(FormatSize(bytes)).append(") of ").append(ChargeKindName(kind));
  msg.append(" for owner \"").append(owner).append("\" would exceed the budget of ");
  msg.append(std::to_string(budget_bytes_)).append(" bytes (").append(FormatSize(budget_bytes_));
  msg.append("); ").append(std::to_string(charged_bytes_)).append(" bytes (");
  msg.append(FormatSize(charged_bytes_));
  msg.append(") already charged. Release or evict something, or raise [memory] budget.");
  return ResourceExhaustedError(std::move(msg));
}

Result<MemoryCharge> MemoryLedger::TryCharge(std::string owner, ChargeKind kind,
                                             size_t bytes) {
  MutexLock l(&mu_);
  if (!FitsLocked(bytes)) return ExhaustedLocked(owner, kind, bytes, "charging");
  const uint64_t id = next_id_++;
  ++AddLocked(owner, kind, bytes).live_charges;
  live_.emplace(id, Record{owner, kind, bytes});
  return MemoryCharge(this, id, std::move(owner), kind, bytes);
}

MemoryCharge MemoryLedger::Charge(std::string owner, ChargeKind kind, size_t bytes) {
  MutexLock l(&mu_);
  const uint64_t id = next_id_++;
  ++AddLocked(owner, kind, bytes).live_charges;
  if (bytes > 0 && OverLocked()) ++over_commits_;
  live_.emplace(id, Record{owner, kind, bytes});
  return MemoryCharge(this, id, std::move(owner), kind, bytes);
}

void MemoryLedger::ReleaseCharge(uint64_t id) {
  MutexLock l(&mu_);
  auto it = live_.find(id);
  assert(it != live_.end() && "MemoryCharge released twice or from another ledger");
  if (it == live_.end()) return;
  const Record& rec = it->second;
  if (--SubLocked(rec.owner, rec.kind, rec.bytes).live_charges == 0) by_owner_.erase(rec.owner);
  live_.erase(it);
}

Status MemoryLedger::ResizeCharge(uint64_t id, size_t new_bytes, bool force) {
  MutexLock l(&mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return InternalError("MemoryLedger: resize of an unknown charge");
  Record& rec = it->second;
  if (new_bytes > rec.bytes) {
    const uint64_t growth = new_bytes - rec.bytes;
    if (!force && !FitsLocked(growth)) {
      return ExhaustedLocked(rec.owner, rec.kind, growth,
                             "growing a charge from " + std::to_string(rec.bytes) + " to " +
                                 std::to_string(new_bytes) + " bytes needs");
    }
    AddLocked(rec.owner, rec.kind, growth);
    if (OverLocked()) ++over_commits_;
  } else {
    SubLocked(rec.owner, rec.kind, rec.bytes - new_bytes);
  }
  rec.bytes = new_bytes;
  return OkStatus();
}

void MemoryLedger::SetBudget(size_t budget_bytes) {
  MutexLock l(&mu_);
  budget_bytes_ = budget_bytes;
  over_budget_hint_.store(OverLocked(), std::memory_order_relaxed);
}

size_t MemoryLedger::budget_bytes() const {
  MutexLock l(&mu_);
  return budget_bytes_;
}

size_t MemoryLedger::charged_bytes() const {
  MutexLock l(&mu_);
  return charged_bytes_;
}

size_t MemoryLedger::available_bytes() const {
  MutexLock l(&mu_);
  if (budget_bytes_ == 0) return std::numeric_limits<size_t>::max();
  return charged_bytes_ >= budget_bytes_ ? 0 : budget_bytes_ - charged_bytes_;
}

MemoryLedgerSnapshot MemoryLedger::Snapshot() const {
  MutexLock l(&mu_);
  MemoryLedgerSnapshot s;
  s.budget_bytes = budget_bytes_;
  s.charged_bytes = charged_bytes_;
  s.peak_bytes = peak_bytes_;
  s.over_budget_bytes = OverLocked() ? charged_bytes_ - budget_bytes_ : 0;
  s.live_charges = live_.size();
  s.over_commits = over_commits_;
  s.refusals = refusals_;
  s.by_kind = by_kind_;
  s.runtime_bytes = runtime_bytes_;
  s.by_owner = std::map<std::string, MemoryLedgerSnapshot::OwnerUsage>(by_owner_.begin(),
                                                                      by_owner_.end());
  return s;
}

void MemoryLedger::SetRuntimeBytes(size_t bytes) {
  MutexLock l(&mu_);
  runtime_bytes_ = bytes;
}

size_t MemoryLedger::runtime_bytes() const {
  MutexLock l(&mu_);
  return runtime_bytes_;
}

// ---------------------------------------------------------------------------
// ResolveBudget

Result<uint64_t> ResolveBudget(std::optional<std::string> budget_text,
                               std::string headroom_text, size_t total_ram_bytes) {
  Result<uint64_t> headroom = ParseSize(headroom_text, total_ram_bytes);
  if (!headroom.ok()) {
    return InvalidArgumentError("[memory] headroom = \"" + headroom_text +
                                "\" is not a valid size: " + headroom.status().message());
  }
  if (budget_text.has_value()) {
    Result<uint64_t> budget = ParseSize(*budget_text, total_ram_bytes);
    if (!budget.ok()) {
      return InvalidArgumentError("[memory] budget = \"" + *budget_text +
                                  "\" is not a valid size: " + budget.status().message());
    }
    if (*budget == 0) {
      return InvalidArgumentError("[memory] budget = \"" + *budget_text +
                                  "\" must be greater than 0; omit it to use total RAM minus "
                                  "[memory] headroom");
    }
    return *budget;
  }
  if (*headroom >= total_ram_bytes) {
    return InvalidArgumentError("[memory] headroom = \"" + headroom_text + "\" (" +
                                FormatSize(*headroom) + ") leaves no budget out of " +
                                FormatSize(total_ram_bytes) +
                                " of RAM; lower it or set [memory] budget");
  }
  return total_ram_bytes - *headroom;
}

}  // namespace arbiter
