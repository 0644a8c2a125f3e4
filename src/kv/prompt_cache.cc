// kv/prompt_cache.cc — the host tier of the KV precache: LRU over KV
// snapshots within a byte capacity and the MemoryLedger, spilling to disk.
//
// Policy, in prose:
//   - lru_ holds the entries from most (front) to least (back) recently put;
//     index_ maps each key to its node. Both change together under mu_, and
//     bytes_ == Σ entry bytes ≤ capacity_bytes_.
//   - Each entry owns a MemoryCharge of its bytes. Charges are taken and
//     released under mu_ (the ledger is the innermost lock and never calls
//     out), so when mu_ is free the ledger's charges from this cache add up
//     to bytes_, and a TryCharge retried after an eviction sees the room.
//   - "Evict under the lock, free and call out outside it": entries leaving
//     the cache are unlinked under mu_ into local vectors; the spill
//     callback runs, and snapshots are freed, after mu_ is released.
//   - Put() evicts from the back: first while over capacity, then while the
//     ledger refuses. Expired victims are dropped rather than spilled, in
//     every path (Put, Spill, SpillModel): their TTL is over, and a spill
//     would give them a fresh lifetime on disk.
//   - A replaced entry (same key) is dropped first: the new snapshot
//     supersedes it, and spilling it could put the older state on disk
//     after the newer one.
#include "arbiter/kv/prompt_cache.h"

#include <utility>

namespace arbiter {
namespace {

// Unambiguous: the length prefix keeps ("ab", "c") and ("a", "bc") apart.
std::string Key(const std::string& model_key, const std::string& conversation_id) {
  std::string key = std::to_string(model_key.size());
  key += ':';
  key += model_key;
  key += conversation_id;
  return key;
}

}  // namespace

std::string PromptCacheLedgerOwner(const std::string& model_key) {
  return "prompt_cache:" + model_key;
}

PromptCache::PromptCache(PromptCacheOptions options)
    : capacity_bytes_(options.capacity_bytes),
      ledger_(options.ledger),
      ttl_(options.ttl),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      spill_(std::move(options.spill)) {}

PromptCache::~PromptCache() = default;

bool PromptCache::ExpiredLocked(const Entry& e, int64_t now_ms) const {
  return now_ms - e.put_ms > TtlMs(e.ttl_class, ttl_);
}

void PromptCache::RemoveLocked(List::iterator it, std::vector<Entry>* out) {
  it->charge.Release();
  bytes_ -= it->bytes;
  index_.erase(Key(it->model_key, it->conversation_id));
  out->push_back(std::move(*it));
  lru_.erase(it);
}

uint64_t PromptCache::PushOutLocked(List::iterator it, int64_t now_ms, std::vector<Entry>* spills,
                                    std::vector<Entry>* dropped) {
  const uint64_t bytes = it->bytes;
  if (ExpiredLocked(*it, now_ms)) {
    counters_.expired++;
    RemoveLocked(it, dropped);
  } else {
    counters_.spilled++;
    RemoveLocked(it, spills);
  }
  return bytes;
}

void PromptCache::CallSpill(std::vector<Entry>* spills) {
  if (!spill_) return;
  for (Entry& e : *spills) {
    spill_(e.model_key, e.conversation_id, e.ttl_class, std::move(e.snapshot));
  }
}

bool PromptCache::Put(const std::string& model_key, const std::string& conversation_id,
                      TtlClass ttl, KvSnapshot snapshot) {
  const uint64_t bytes = snapshot.MemoryBytes();
  const std::string key = Key(model_key, conversation_id);
  // Declared before the lock: destroyed (snapshots freed) after it is released.
  std::vector<Entry> spills;
  std::vector<Entry> dropped;
  bool kept = false;
  {
    MutexLock l(&mu_);
    const int64_t now_ms = clock_->NowMs();
    counters_.puts++;
    auto found = index_.find(key);
    if (found != index_.end()) RemoveLocked(found->second, &dropped);

    MemoryCharge charge;
    bool fits = capacity_bytes_ != 0 && bytes <= capacity_bytes_;
    if (fits) {
      while (bytes_ + bytes > capacity_bytes_) {
        PushOutLocked(std::prev(lru_.end()), now_ms, &spills, &dropped);
      }
    }
    if (fits && ledger_ != nullptr) {
      const std::string owner = PromptCacheLedgerOwner(model_key);
      for (;;) {
        Result<MemoryCharge> c = ledger_->TryCharge(owner, ChargeKind::kPromptCache, bytes);
        if (c.ok()) {
          charge = std::move(*c);
          break;
        }
        // Hopeless even with this cache empty: keep the others.
        const uint64_t available = ledger_->available_bytes();
        const bool could_fit = bytes <= bytes_ || available >= bytes - bytes_;
        if (lru_.empty() || !could_fit) {
          fits = false;
          break;
        }
        PushOutLocked(std::prev(lru_.end()), now_ms, &spills, &dropped);
      }
    }
    if (fits) {
      lru_.push_front(Entry{model_key, conversation_id, ttl, std::move(snapshot), bytes, now_ms,
                            std::move(charge)});
      index_[key] = lru_.begin();
      bytes_ += bytes;
      kept = true;
    } else {
      counters_.spilled++;
      spills.push_back(Entry{model_key, conversation_id, ttl, std::move(snapshot), bytes, now_ms,
                             MemoryCharge()});
    }
  }
  CallSpill(&spills);
  return kept;
}

std::optional<KvSnapshot> PromptCache::Take(const std::string& model_key,
                                            const std::string& conversation_id) {
  std::vector<Entry> dropped;  // freed after the lock is released
  MutexLock l(&mu_);
  auto found = index_.find(Key(model_key, conversation_id));
  if (found == index_.end()) {
    counters_.misses++;
    return std::nullopt;
  }
  List::iterator it = found->second;
  if (ExpiredLocked(*it, clock_->NowMs())) {
    counters_.misses++;
    counters_.expired++;
    RemoveLocked(it, &dropped);
    return std::nullopt;
  }
  counters_.hits++;
  KvSnapshot out = std::move(it->snapshot);
  RemoveLocked(it, &dropped);
  return out;
}

bool PromptCache::Contains(const std::string& model_key, const std::string& conversation_id) const {
  MutexLock l(&mu_);
  auto found = index_.find(Key(model_key, conversation_id));
  return found != index_.end() && !ExpiredLocked(*found->second, clock_->NowMs());
}

int PromptCache::TokensOf(const std::string& model_key, const std::string& conversation_id) const {
  MutexLock l(&mu_);
  auto found = index_.find(Key(model_key, conversation_id));
  if (found == index_.end() || ExpiredLocked(*found->second, clock_->NowMs())) return 0;
  return static_cast<int>(found->second->snapshot.n_tokens());
}

void PromptCache::Erase(const std::string& model_key, const std::string& conversation_id) {
  std::vector<Entry> dropped;
  MutexLock l(&mu_);
  auto found = index_.find(Key(model_key, conversation_id));
  if (found != index_.end()) RemoveLocked(found->second, &dropped);
}

uint64_t PromptCache::Spill(uint64_t bytes) {
  std::vector<Entry> spills;
  std::vector<Entry> dropped;
  uint64_t freed = 0;
  {
    MutexLock l(&mu_);
    const int64_t now_ms = clock_->NowMs();
    while (freed < bytes && !lru_.empty()) {
      freed += PushOutLocked(std::prev(lru_.end()), now_ms, &spills, &dropped);
    }
  }
  CallSpill(&spills);
  return freed;
}

uint64_t PromptCache::SpillModel(const std::string& model_key) {
  std::vector<Entry> spills;
  std::vector<Entry> dropped;
  uint64_t freed = 0;
  {
    MutexLock l(&mu_);
    const int64_t now_ms = clock_->NowMs();
    // From the least recently used, so the callback sees them in LRU order.
    for (auto it = lru_.end(); it != lru_.begin();) {
      --it;
      if (it->model_key != model_key) continue;
      auto victim = it;
      ++it;  // past the victim (toward the back), valid after erasing it
      freed += PushOutLocked(victim, now_ms, &spills, &dropped);
    }
  }
  CallSpill(&spills);
  return freed;
}

int PromptCache::PurgeExpired() {
  std::vector<Entry> dropped;
  MutexLock l(&mu_);
  const int64_t now_ms = clock_->NowMs();
  int purged = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (ExpiredLocked(*it, now_ms)) {
      counters_.expired++;
      RemoveLocked(it, &dropped);
      purged++;
    }
    it = next;
  }
  return purged;
}

uint64_t PromptCache::bytes() const {
  MutexLock l(&mu_);
  return bytes_;
}

size_t PromptCache::size() const {
  MutexLock l(&mu_);
  return lru_.size();
}

std::vector<PromptCacheEntryInfo> PromptCache::Entries() const {
  MutexLock l(&mu_);
  const int64_t now_ms = clock_->NowMs();
  std::vector<PromptCacheEntryInfo> out;
  out.reserve(lru_.size());
  for (const Entry& e : lru_) {
    out.push_back(PromptCacheEntryInfo{e.model_key, e.conversation_id, e.ttl_class,
                                       static_cast<int>(e.snapshot.n_tokens()), e.bytes,
                                       now_ms - e.put_ms});
  }
  return out;
}

PromptCache::Counters PromptCache::counters() const {
  MutexLock l(&mu_);
  return counters_;
}

}  // namespace arbiter
