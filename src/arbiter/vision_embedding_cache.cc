// VisionEmbeddingCache: LRU + TTL over projected vision tokens.
//
// Policy, in prose:
//   - `lru_` holds the entries from least (front) to most (back) recently
//     used; `index_` maps each hash to its list node. Both change together
//     under mu_, so index_.size() == lru_.size() and every hash appears once.
//   - Get() and Set() move an entry to the back. Set() then evicts from the
//     front while size > capacity; the new entry is at the back and
//     capacity ≥ 1, so it is never its own victim.
//   - Expiry is lazy (Get() deletes what it finds expired) plus explicit
//     PurgeExpired(), which the arbiter calls on memory pressure
//     (MemoryArbiter::HandlePressure).
//   - Ledger: each entry owns a MemoryCharge of its bytes. A new hash is
//     charged with TryCharge(); a replacement grows or shrinks the old
//     entry's charge with Resize(), so only the difference must fit. When the
//     ledger refuses, expired entries go first, then live entries LRU-first
//     (never the entry being replaced), retrying after each. Charges are
//     released under mu_ (bookkeeping only, so the retry sees the room);
//     buffers are dropped after mu_ is released ("evict under the lock, free
//     outside it").
#include "arbiter/arbiter/vision_embedding_cache.h"

#include <algorithm>
#include <utility>

#include "arbiter/base/hash.h"

namespace arbiter {

std::string HashFrame(std::string_view model_family, const void* normalized_bytes,
                      size_t size_bytes) {
  Sha256 h;
  const std::string prefix = std::to_string(model_family.size()) + ":";
  h.Update(prefix);
  h.Update(model_family);
  h.Update(normalized_bytes, size_bytes);
  return HexEncode(h.Finish());
}

VisionEmbeddingCache::VisionEmbeddingCache(Options options)
    : capacity_(std::max<int64_t>(1, options.capacity)),
      default_ttl_ms_(std::max<int64_t>(0, options.default_ttl_ms)),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      ledger_(options.ledger) {}

VisionEmbeddingCache::~VisionEmbeddingCache() = default;

void VisionEmbeddingCache::RemoveLocked(List::iterator it, std::vector<Entry>* graveyard) {
  it->charge.Release();
  stats_.bytes -= it->bytes;
  index_.erase(it->hash);
  graveyard->push_back(std::move(*it));
  lru_.erase(it);
}

std::optional<VisionEmbedding> VisionEmbeddingCache::Get(const std::string& hash) {
  std::vector<Entry> graveyard;  // destroyed after the lock is dropped
  MutexLock l(&mu_);
  auto found = index_.find(hash);
  if (found == index_.end()) {
    ++stats_.misses;
    return std::nullopt;
  }
  List::iterator it = found->second;
  if (it->expires_at_ms <= clock_->NowMs()) {
    ++stats_.misses;
    ++stats_.expirations;
    RemoveLocked(it, &graveyard);
    return std::nullopt;
  }
  lru_.splice(lru_.end(), lru_, it);  // touch: now most recently used
  ++stats_.hits;
  return it->value;
}

Status VisionEmbeddingCache::Set(const std::string& hash, VisionEmbedding entry,
                                 std::optional<int64_t> ttl_ms) {
  const size_t n = entry.tokens != nullptr ? entry.tokens->size() : 0;
  const bool overflow =
      entry.hidden_size != 0 && entry.token_count > SIZE_MAX / entry.hidden_size;
  const bool other_result = entry.tokens == nullptr && entry.result != nullptr;
  if (!other_result &&
      (entry.tokens == nullptr || overflow || n != entry.token_count * entry.hidden_size)) {
    // The reference's wording. Built with append(): GCC 12 warns
    // (-Wrestrict, a false positive) on `literal + std::string` at -O3.
    std::string msg = "[vision-embedding-cache] token buffer length ";
    msg.append(entry.tokens == nullptr ? std::string("(null)") : std::to_string(n));
    msg.append(" does not match tokenCount*hiddenSize (").append(std::to_string(entry.token_count));
    msg.append("*").append(std::to_string(entry.hidden_size)).append(") for entry ").append(hash);
    return InvalidArgumentError(std::move(msg));
  }
  const size_t bytes = other_result ? entry.result_bytes : n * sizeof(float);
  const int64_t ttl = ttl_ms.has_value() && *ttl_ms > 0 ? *ttl_ms : default_ttl_ms_;

  std::vector<Entry> graveyard;  // destroyed after the lock is dropped
  MutexLock l(&mu_);
  const int64_t now_ms = clock_->NowMs();
  auto found = index_.find(hash);
  List::iterator old = found != index_.end() ? found->second : lru_.end();

  // Charge the ledger, making room from our own entries if refused.
  MemoryCharge charge;
  if (ledger_ != nullptr) {
    bool expired_purged = false;
    for (;;) {
      Status s;
      if (old != lru_.end()) {
        s = old->charge.Resize(bytes);
      } else {
        Result<MemoryCharge> c =
            ledger_->TryCharge(std::string(kVisionCacheLedgerOwner), ChargeKind::kVisionCache, bytes);
        if (c.ok()) charge = std::move(*c);
        s = c.status();
      }
      if (s.ok()) break;
      if (s.code() != StatusCode::kResourceExhausted) return s;
      // Make room: expired entries first, then the least recently used.
      bool removed = false;
      if (!expired_purged) {
        expired_purged = true;
        for (auto it = lru_.begin(); it != lru_.end();) {
          auto next = std::next(it);
          if (it != old && it->expires_at_ms <= now_ms) {
            ++stats_.expirations;
            RemoveLocked(it, &graveyard);
            removed = true;
          }
          it = next;
        }
      }
      if (!removed) {
        auto victim = lru_.begin();
        if (victim == old) ++victim;
        if (victim == lru_.end()) {
          ++stats_.ledger_refusals;
          return s.WithPrefix("vision-embedding-cache: cannot cache entry " + hash);
        }
        ++stats_.evictions;
        RemoveLocked(victim, &graveyard);
      }
    }
  }

  if (old != lru_.end()) {
    if (ledger_ != nullptr) charge = std::move(old->charge);  // already resized
    RemoveLocked(old, &graveyard);
  }
  lru_.push_back(Entry{hash, std::move(entry), now_ms + ttl, bytes, std::move(charge)});
  index_[hash] = std::prev(lru_.end());
  stats_.bytes += bytes;
  while (lru_.size() > static_cast<size_t>(capacity_)) {
    ++stats_.evictions;
    RemoveLocked(lru_.begin(), &graveyard);
  }
  return OkStatus();
}

size_t VisionEmbeddingCache::size() const {
  MutexLock l(&mu_);
  return lru_.size();
}

std::vector<VisionCacheEntryInfo> VisionEmbeddingCache::Snapshot() const {
  MutexLock l(&mu_);
  std::vector<VisionCacheEntryInfo> out;
  out.reserve(lru_.size());
  for (const Entry& e : lru_) out.push_back({e.hash, e.bytes, e.expires_at_ms});
  return out;
}

VisionCacheStats VisionEmbeddingCache::Stats() const {
  MutexLock l(&mu_);
  VisionCacheStats s = stats_;
  s.entries = lru_.size();
  return s;
}

void VisionEmbeddingCache::Clear() {
  std::vector<Entry> graveyard;
  MutexLock l(&mu_);
  while (!lru_.empty()) RemoveLocked(lru_.begin(), &graveyard);
}

size_t VisionEmbeddingCache::PurgeExpired(int64_t now_ms) {
  std::vector<Entry> graveyard;
  MutexLock l(&mu_);
  size_t removed = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (it->expires_at_ms <= now_ms) {
      RemoveLocked(it, &graveyard);
      ++removed;
    }
    it = next;
  }
  stats_.expirations += removed;
  return removed;
}

size_t VisionEmbeddingCache::PurgeExpired() { return PurgeExpired(clock_->NowMs()); }

}  // namespace arbiter
