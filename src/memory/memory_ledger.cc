// MemoryLedger: the books of the process's byte budgets, one per memory
// domain (Note [Memory domains] in the header).
//
// Policy, in prose:
//   - Every live MemoryCharge has exactly one Record in `live_`, keyed by an
//     id that is never reused, naming its domain. The aggregates of every
//     book in the record's chain (its domain's, and the host's when that
//     domain is inside the host) are updated in the same critical section as
//     `live_`, so at every instant, per book B:
//       B.charged_bytes == Σ bytes of live records whose chain holds B
//                       == Σ B.by_kind == Σ B.by_owner[*].total_bytes.
//   - Refusable operations (TryCharge, growing Resize) check every budget of
//     the chain and
//     update the books under one lock acquisition, so two threads cannot
//     both pass the check and jointly overshoot.
//   - Unconditional operations (Charge, ForceResize) may overshoot; they
//     count an over-commit. Nothing is ever revoked: the ledger only keeps
//     books, the owners (arbiter, caches) decide what to evict.
//   - The ledger never calls out while holding mu_ and no other lock is taken
//     under it, so it is always the innermost lock.
#include "arbiter/memory/memory_ledger.h"

#include <algorithm>
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
      domain_(std::exchange(other.domain_, kHostDomain)),
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
    domain_ = std::exchange(other.domain_, kHostDomain);
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
  domain_ = kHostDomain;
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

MemoryLedger::MemoryLedger(size_t budget_bytes) {
  MutexLock l(&mu_);
  domains_.reserve(kMaxMemoryDomains);
  Books& host = domains_.emplace_back();
  host.name = std::string(kHostDomainName);
  host.budget_bytes = budget_bytes;
}

MemoryLedger::~MemoryLedger() {
  MutexLock l(&mu_);
  assert(live_.empty() && "MemoryLedger destroyed with live charges");
}

// ---- Domains

Result<MemoryDomain> MemoryLedger::RegisterDomain(std::string name,
                                                  MemoryDomainOptions options) {
  if (name.empty() || name == kHostDomainName || name.size() > 64) {
    return InvalidArgumentError("memory domain name \"" + name.substr(0, 64) +
                                "\" is invalid: it must be 1 to 64 bytes and not \"host\"");
  }
  MutexLock l(&mu_);
  for (const Books& b : domains_) {
    if (b.name == name) {
      return AlreadyExistsError("memory domain \"" + name + "\" is already registered");
    }
  }
  if (domains_.size() >= kMaxMemoryDomains) {
    return ResourceExhaustedError("memory domain \"" + name + "\": a ledger holds at most " +
                                  std::to_string(kMaxMemoryDomains) + " domains");
  }
  const auto index = static_cast<uint32_t>(domains_.size());
  Books& b = domains_.emplace_back();
  b.name = std::move(name);
  b.inside_host = options.inside_host;
  b.budget_bytes = options.budget_bytes;
  UpdateHintLocked(index);
  return MemoryDomain(index);
}

std::optional<MemoryDomain> MemoryLedger::FindDomain(std::string_view name) const {
  MutexLock l(&mu_);
  for (size_t i = 0; i < domains_.size(); ++i) {
    if (domains_[i].name == name) return MemoryDomain(static_cast<uint32_t>(i));
  }
  return std::nullopt;
}

std::string MemoryLedger::DomainName(MemoryDomain domain) const {
  MutexLock l(&mu_);
  return KnownLocked(domain) ? domains_[domain.index()].name : std::string();
}

// ---- Books

namespace {

bool Over(size_t charged, size_t budget) { return budget != 0 && charged > budget; }

// Whether `extra` more bytes fit under the budget.
bool Fits(size_t charged, size_t budget, size_t extra) {
  if (budget == 0 || extra == 0) return true;
  if (charged >= budget) return false;
  return extra <= budget - charged;
}

size_t Room(size_t charged, size_t budget) {
  if (budget == 0) return std::numeric_limits<size_t>::max();
  return charged >= budget ? 0 : budget - charged;
}

}  // namespace

size_t MemoryLedger::ChainLocked(uint32_t d, Books* out[2]) {
  out[0] = &domains_[d];
  if (d != 0 && domains_[d].inside_host) {
    out[1] = &domains_[0];
    return 2;
  }
  return 1;
}

MemoryLedger::Books* MemoryLedger::RefuserLocked(uint32_t d, size_t extra) {
  Books& own = domains_[d];
  if (!Fits(own.charged_bytes, own.budget_bytes, extra)) return &own;
  if (d != 0 && own.inside_host) {
    Books& host = domains_[0];
    if (!Fits(host.charged_bytes, host.budget_bytes, extra)) return &host;
  }
  return nullptr;
}

void MemoryLedger::UpdateHintLocked(uint32_t d) {
  const Books& b = domains_[d];
  over_budget_hint_[d].store(Over(b.charged_bytes, b.budget_bytes), std::memory_order_relaxed);
}

void MemoryLedger::AddLocked(const Record& rec, size_t bytes, int live,
                             bool count_over_commit) {
  Books* chain[2];
  const size_t n = ChainLocked(rec.domain, chain);
  for (size_t i = 0; i < n; ++i) {
    Books& b = *chain[i];
    assert(b.charged_bytes <= std::numeric_limits<size_t>::max() - bytes);
    b.charged_bytes += bytes;
    if (b.charged_bytes > b.peak_bytes) b.peak_bytes = b.charged_bytes;
    b.by_kind[static_cast<size_t>(rec.kind)] += bytes;
    MemoryDomainSnapshot::OwnerUsage& usage = b.by_owner[rec.owner];
    usage.by_kind[static_cast<size_t>(rec.kind)] += bytes;
    usage.total_bytes += bytes;
    usage.live_charges += live;
    b.live_charges += live;
    if (count_over_commit && Over(b.charged_bytes, b.budget_bytes)) ++b.over_commits;
  }
  UpdateHintLocked(rec.domain);
  if (n == 2) UpdateHintLocked(0);
}

void MemoryLedger::SubLocked(const Record& rec, size_t bytes, int live) {
  Books* chain[2];
  const size_t n = ChainLocked(rec.domain, chain);
  for (size_t i = 0; i < n; ++i) {
    Books& b = *chain[i];
    assert(b.charged_bytes >= bytes);
    b.charged_bytes -= bytes;
    b.by_kind[static_cast<size_t>(rec.kind)] -= bytes;
    b.live_charges -= live;
    auto it = b.by_owner.find(rec.owner);
    assert(it != b.by_owner.end());
    it->second.by_kind[static_cast<size_t>(rec.kind)] -= bytes;
    it->second.total_bytes -= bytes;
    it->second.live_charges -= live;
    if (it->second.live_charges == 0) b.by_owner.erase(it);
  }
  UpdateHintLocked(rec.domain);
  if (n == 2) UpdateHintLocked(0);
}

Status MemoryLedger::ExhaustedLocked(Books& refuser, uint32_t d, const std::string& owner,
                                     ChargeKind kind, size_t bytes, std::string_view what) {
  ++refuser.refusals;
  const Books& own = domains_[d];
  const bool host = &refuser == &domains_[0];
  // Built with append(): GCC 12 warns (-Wrestrict, a false positive) on
  // `literal + std::string` chains at -O3.
  std::string msg = "memory budget exhausted: ";
  if (d != 0) msg.append("domain \"").append(own.name).append("\": ");
  msg.append(what).append(" ").append(std::to_string(bytes)).append(" bytes (");
  msg.append(FormatSize(bytes)).append(") of ").append(ChargeKindName(kind));
  msg.append(" for owner \"").append(owner).append("\" would exceed the ");
  if (d != 0) {
    msg.append(host ? "host" : "\"" + refuser.name + "\"").append(" ");
    if (host) msg.append("(\"").append(own.name).append("\" is host memory) ");
  }
  msg.append("budget of ").append(std::to_string(refuser.budget_bytes)).append(" bytes (");
  msg.append(FormatSize(refuser.budget_bytes)).append("); ");
  msg.append(std::to_string(refuser.charged_bytes)).append(" bytes (");
  msg.append(FormatSize(refuser.charged_bytes));
  msg.append(") already charged. Release or evict something, or raise ");
  if (host) {
    msg.append("[memory] budget.");
  } else {
    msg.append("[devices.\"").append(refuser.name).append("\"] budget.");
  }
  return ResourceExhaustedError(std::move(msg));
}

Result<MemoryCharge> MemoryLedger::TryCharge(MemoryDomain domain, std::string owner,
                                             ChargeKind kind, size_t bytes) {
  MutexLock l(&mu_);
  if (!KnownLocked(domain)) {
    return InvalidArgumentError("MemoryLedger::TryCharge: unknown memory domain #" +
                                std::to_string(domain.index()));
  }
  const uint32_t d = domain.index();
  if (Books* refuser = RefuserLocked(d, bytes)) {
    return ExhaustedLocked(*refuser, d, owner, kind, bytes, "charging");
  }
  const uint64_t id = next_id_++;
  auto [it, inserted] = live_.emplace(id, Record{d, owner, kind, bytes});
  AddLocked(it->second, bytes, /*live=*/1, /*count_over_commit=*/false);
  return MemoryCharge(this, id, domain, std::move(owner), kind, bytes);
}

MemoryCharge MemoryLedger::Charge(MemoryDomain domain, std::string owner, ChargeKind kind,
                                  size_t bytes) {
  MutexLock l(&mu_);
  assert(KnownLocked(domain) && "MemoryLedger::Charge in an unknown domain");
  if (!KnownLocked(domain)) return MemoryCharge();
  const uint64_t id = next_id_++;
  auto [it, inserted] = live_.emplace(id, Record{domain.index(), owner, kind, bytes});
  AddLocked(it->second, bytes, /*live=*/1, /*count_over_commit=*/bytes > 0);
  return MemoryCharge(this, id, domain, std::move(owner), kind, bytes);
}

void MemoryLedger::ReleaseCharge(uint64_t id) {
  MutexLock l(&mu_);
  auto it = live_.find(id);
  assert(it != live_.end() && "MemoryCharge released twice or from another ledger");
  if (it == live_.end()) return;
  SubLocked(it->second, it->second.bytes, /*live=*/1);
  live_.erase(it);
}

Status MemoryLedger::ResizeCharge(uint64_t id, size_t new_bytes, bool force) {
  MutexLock l(&mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return InternalError("MemoryLedger: resize of an unknown charge");
  Record& rec = it->second;
  if (new_bytes > rec.bytes) {
    const size_t growth = new_bytes - rec.bytes;
    if (!force) {
      if (Books* refuser = RefuserLocked(rec.domain, growth)) {
        return ExhaustedLocked(*refuser, rec.domain, rec.owner, rec.kind, growth,
                               "growing a charge from " + std::to_string(rec.bytes) + " to " +
                                   std::to_string(new_bytes) + " bytes needs");
      }
    }
    AddLocked(rec, growth, /*live=*/0, /*count_over_commit=*/true);
  } else {
    SubLocked(rec, rec.bytes - new_bytes, /*live=*/0);
  }
  rec.bytes = new_bytes;
  return OkStatus();
}

void MemoryLedger::SetBudget(MemoryDomain domain, size_t budget_bytes) {
  MutexLock l(&mu_);
  if (!KnownLocked(domain)) return;
  domains_[domain.index()].budget_bytes = budget_bytes;
  UpdateHintLocked(domain.index());
}

size_t MemoryLedger::budget_bytes(MemoryDomain domain) const {
  MutexLock l(&mu_);
  return KnownLocked(domain) ? domains_[domain.index()].budget_bytes : 0;
}

size_t MemoryLedger::charged_bytes(MemoryDomain domain) const {
  MutexLock l(&mu_);
  return KnownLocked(domain) ? domains_[domain.index()].charged_bytes : 0;
}

size_t MemoryLedger::available_bytes(MemoryDomain domain) const {
  MutexLock l(&mu_);
  if (!KnownLocked(domain)) return 0;
  const Books& own = domains_[domain.index()];
  size_t room = Room(own.charged_bytes, own.budget_bytes);
  if (!domain.is_host() && own.inside_host) {
    room = std::min(room, Room(domains_[0].charged_bytes, domains_[0].budget_bytes));
  }
  return room;
}

std::vector<DomainShortfall> MemoryLedger::Shortfalls(MemoryDomain domain, size_t bytes) const {
  MutexLock l(&mu_);
  std::vector<DomainShortfall> out;
  if (!KnownLocked(domain)) return out;
  auto check = [&](uint32_t d) {
    mu_.AssertHeld();
    const Books& b = domains_[d];
    // charged + bytes ≤ budget: unlike Fits(), a charge of 0 does not fit a
    // domain that is over its budget (the reclaimer's "bytes = 0").
    if (b.budget_bytes == 0 ||
        (b.charged_bytes <= b.budget_bytes && bytes <= b.budget_bytes - b.charged_bytes)) {
      return;
    }
    // charged + bytes − budget, saturating (budget ≠ 0 here).
    size_t short_by = bytes - Room(b.charged_bytes, b.budget_bytes);  // room is 0 when over
    if (b.charged_bytes > b.budget_bytes) {
      const size_t over = b.charged_bytes - b.budget_bytes;
      short_by = over > std::numeric_limits<size_t>::max() - short_by
                     ? std::numeric_limits<size_t>::max()
                     : short_by + over;
    }
    out.push_back(DomainShortfall{MemoryDomain(d), b.name, short_by});
  };
  check(domain.index());
  if (!domain.is_host() && domains_[domain.index()].inside_host) check(0);
  return out;
}

MemoryDomainSnapshot MemoryLedger::SnapshotLocked(const Books& b) const {
  MemoryDomainSnapshot s;
  s.name = b.name;
  s.inside_host = b.inside_host;
  s.budget_bytes = b.budget_bytes;
  s.charged_bytes = b.charged_bytes;
  s.peak_bytes = b.peak_bytes;
  s.over_budget_bytes = Over(b.charged_bytes, b.budget_bytes) ? b.charged_bytes - b.budget_bytes
                                                              : 0;
  s.live_charges = b.live_charges;
  s.over_commits = b.over_commits;
  s.refusals = b.refusals;
  s.by_kind = b.by_kind;
  s.runtime_bytes = b.runtime_bytes;
  s.by_owner =
      std::map<std::string, MemoryDomainSnapshot::OwnerUsage>(b.by_owner.begin(), b.by_owner.end());
  return s;
}

MemoryLedgerSnapshot MemoryLedger::Snapshot() const {
  MutexLock l(&mu_);
  MemoryLedgerSnapshot s;
  for (const Books& b : domains_) s.domains.emplace(b.name, SnapshotLocked(b));
  static_cast<MemoryDomainSnapshot&>(s) = s.domains.at(std::string(kHostDomainName));
  return s;
}

MemoryDomainSnapshot MemoryLedger::DomainSnapshot(MemoryDomain domain) const {
  MutexLock l(&mu_);
  if (!KnownLocked(domain)) return MemoryDomainSnapshot();
  return SnapshotLocked(domains_[domain.index()]);
}

void MemoryLedger::SetRuntimeBytes(MemoryDomain domain, size_t bytes) {
  MutexLock l(&mu_);
  if (KnownLocked(domain)) domains_[domain.index()].runtime_bytes = bytes;
}

size_t MemoryLedger::runtime_bytes(MemoryDomain domain) const {
  MutexLock l(&mu_);
  return KnownLocked(domain) ? domains_[domain.index()].runtime_bytes : 0;
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

Result<uint64_t> ResolveDeviceBudget(std::string_view name,
                                     std::optional<std::string> budget_text,
                                     std::string headroom_text, uint64_t heap_bytes,
                                     std::optional<uint64_t> heap_budget_bytes) {
  const std::string key = "[devices.\"" + std::string(name) + "\"].";
  Result<uint64_t> headroom = ParseSize(headroom_text, heap_bytes);
  if (!headroom.ok()) {
    return InvalidArgumentError(key + "headroom = \"" + headroom_text +
                                "\" is not a valid size: " + headroom.status().message());
  }
  if (budget_text.has_value()) {
    Result<uint64_t> budget = ParseSize(*budget_text, heap_bytes);
    if (!budget.ok()) {
      return InvalidArgumentError(key + "budget = \"" + *budget_text +
                                  "\" is not a valid size: " + budget.status().message());
    }
    if (*budget == 0 || *budget > heap_bytes) {
      return InvalidArgumentError(key + "budget = \"" + *budget_text + "\" (" +
                                  FormatSize(*budget) + ") must be greater than 0 and at most " +
                                  "the device's heap of " + FormatSize(heap_bytes));
    }
    return *budget;
  }
  if (*headroom >= heap_bytes) {
    return InvalidArgumentError(key + "headroom = \"" + headroom_text + "\" (" +
                                FormatSize(*headroom) + ") leaves no budget out of the " +
                                FormatSize(heap_bytes) + " heap; lower it or set " + key +
                                "budget");
  }
  uint64_t budget = heap_bytes - *headroom;
  if (heap_budget_bytes.has_value()) {
    if (*heap_budget_bytes == 0) {
      return UnavailableError("device " + std::string(name) +
                              ": the driver reports no memory left to give (heapBudget 0); "
                              "free memory used by other processes, or set " + key + "budget");
    }
    budget = std::min(budget, *heap_budget_bytes);
  }
  return budget;
}

}  // namespace arbiter
