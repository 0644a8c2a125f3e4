// arbiter/arbiter/vision_embedding_cache.h — content-addressed LRU + TTL
// cache of vision results: projected vision-language tokens, or any other
// result of a vision model (OCR text and boxes) with its size in bytes.
//
// The vision-embedding cache of the reference memory arbiter
// (docs/memory-arbiter.md): its constants and semantics are kept (below),
// ledger charging is ours.
//
// A vision model's projector turns normalized pixels into tokens the text
// decoder consumes. The same frame (a pasted screenshot, an idle screen) is
// often projected again; callers hash the normalized input with HashFrame()
// and consult Get() before paying the projector, then Set() the result.
//
// Semantics (kept from the reference):
//   - Capacity in entries (default 32, clamped ≥ 1); LRU eviction while over
//     capacity after a Set().
//   - Each entry expires at set-time + TTL. Set()'s ttl_ms is used when > 0,
//     otherwise the default TTL (default 300 000 ms, clamped ≥ 0; a default
//     of 0 makes such entries expire immediately). An entry is expired when
//     expires_at_ms ≤ now.
//   - Get(): miss → nullopt; expired → the entry is deleted, nullopt; hit →
//     moved to most-recently-used and the same shared buffer is returned.
//   - Set() replaces an entry under the same hash.
//   - RAM only; nothing survives the process.
// Additions of ours:
//   - Entries are charged to an optional MemoryLedger (owner "vision_cache",
//     kind kVisionCache, bytes = token_count × hidden_size × sizeof(float),
//     or result_bytes for another result)
//     and uncharged when evicted, expired, replaced or cleared. When the
//     ledger refuses a charge, Set() first evicts this cache's own LRU
//     entries; if the entry still does not fit, Set() fails with
//     kResourceExhausted and nothing is cached (callers go on without the
//     cache). Each entry is charged its full size even when two entries
//     share one buffer.
//
// Example:
//   VisionEmbeddingCache cache({.clock = clock, .ledger = &ledger});
//   std::string key = HashFrame("qwen3-vl", normalized_pixels);
//   if (std::optional<VisionEmbedding> hit = cache.Get(key)) {
//     decoder.Run(*hit->tokens, hit->token_count, hit->hidden_size);
//   } else {
//     VisionEmbedding e = projector.Run(normalized_pixels);
//     cache.Set(key, e).IgnoreError();   // a full ledger only costs a miss
//   }
//
// Thread safety: thread-safe (one mutex). Lock order: the cache's mutex is
// taken before the ledger's; the ledger never calls back. Buffers of evicted
// entries are freed after the cache's lock is dropped.
// Lifetime: the Clock and the MemoryLedger (when given) must outlive the
// cache. Returned buffers are shared_ptrs and stay valid after eviction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"
#include "arbiter/memory/memory_ledger.h"

namespace arbiter {

// Defaults (the reference's).
inline constexpr int64_t kVisionCacheDefaultCapacity = 32;        // entries
inline constexpr int64_t kVisionCacheDefaultTtlMs = 300000;       // 5 minutes
inline constexpr std::string_view kVisionCacheLedgerOwner = "vision_cache";

// The vision result of one frame: projected tokens, or (tokens null) any
// other result.
struct VisionEmbedding {
  // [token_count, hidden_size], row-major float32. Shared: a hit returns the
  // very buffer that was Set().
  std::shared_ptr<const std::vector<float>> tokens;
  size_t token_count = 0;
  size_t hidden_size = 0;
  // Used when `tokens` is null: the result object (its type is the
  // caller's, e.g. an OcrResult) and the bytes it holds, charged as such.
  std::shared_ptr<const void> result;
  size_t result_bytes = 0;
};

// One row of VisionEmbeddingCache::Snapshot().
struct VisionCacheEntryInfo {
  std::string hash;
  size_t bytes = 0;           // tokens->size() * sizeof(float)
  int64_t expires_at_ms = 0;  // on the cache's Clock timeline
};

// Counters since construction.
struct VisionCacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;           // absent or expired on Get()
  uint64_t expirations = 0;      // entries removed because their TTL passed
  uint64_t evictions = 0;        // entries removed for capacity or the ledger
  uint64_t ledger_refusals = 0;  // Set() calls refused by the ledger
  size_t entries = 0;
  uint64_t bytes = 0;            // Σ entry bytes
};

// Key of a frame for `model_family`: lower-case hex SHA-256 of
//   decimal(len(model_family)) ‖ ":" ‖ model_family ‖ normalized_bytes.
// The length prefix keeps ("ab", "c…") and ("a", "bc…") apart. The bytes
// must already be normalized (downscaled to the model's input resolution,
// padded, channel order fixed) so two encodings of one image share a key.
std::string HashFrame(std::string_view model_family, const void* normalized_bytes,
                      size_t size_bytes);
inline std::string HashFrame(std::string_view model_family, std::string_view normalized_bytes) {
  return HashFrame(model_family, normalized_bytes.data(), normalized_bytes.size());
}

class VisionEmbeddingCache {
 public:
  struct Options {
    int64_t capacity = kVisionCacheDefaultCapacity;      // clamped ≥ 1
    int64_t default_ttl_ms = kVisionCacheDefaultTtlMs;   // clamped ≥ 0
    Clock* clock = nullptr;                              // null: Clock::Real()
    MemoryLedger* ledger = nullptr;                      // null: not charged
  };

  VisionEmbeddingCache() : VisionEmbeddingCache(Options{}) {}
  explicit VisionEmbeddingCache(Options options);
  // Uncharges every entry.
  ~VisionEmbeddingCache();
  VisionEmbeddingCache(const VisionEmbeddingCache&) = delete;
  VisionEmbeddingCache& operator=(const VisionEmbeddingCache&) = delete;

  // The entry for `hash` if present and not expired (then it becomes the
  // most recently used). An expired entry is deleted.
  std::optional<VisionEmbedding> Get(const std::string& hash) EXCLUDES(mu_);

  // Inserts or replaces the entry for `hash`, expiring at now + ttl
  // (ttl_ms when > 0, else the default), then evicts LRU entries while over
  // capacity.
  // Errors: kInvalidArgument when both `tokens` and `result` are null, or
  // `tokens`' length ≠
  // token_count × hidden_size (message contains "does not match
  // tokenCount*hiddenSize"); kResourceExhausted when the ledger cannot hold
  // the entry even after evicting this cache's other entries. On error the
  // cache is unchanged except for those evictions, and an old entry under
  // `hash` is kept.
  Status Set(const std::string& hash, VisionEmbedding entry,
             std::optional<int64_t> ttl_ms = std::nullopt) EXCLUDES(mu_);

  size_t size() const EXCLUDES(mu_);
  // Entries from least to most recently used.
  std::vector<VisionCacheEntryInfo> Snapshot() const EXCLUDES(mu_);
  VisionCacheStats Stats() const EXCLUDES(mu_);
  // Removes every entry.
  void Clear() EXCLUDES(mu_);
  // Removes entries with expires_at_ms ≤ now_ms; returns how many.
  size_t PurgeExpired(int64_t now_ms) EXCLUDES(mu_);
  // PurgeExpired(clock->NowMs()).
  size_t PurgeExpired() EXCLUDES(mu_);

  int64_t capacity() const { return capacity_; }
  int64_t default_ttl_ms() const { return default_ttl_ms_; }

 private:
  struct Entry {
    std::string hash;
    VisionEmbedding value;
    int64_t expires_at_ms = 0;
    size_t bytes = 0;
    MemoryCharge charge;  // empty without a ledger
  };
  using List = std::list<Entry>;  // front = LRU, back = MRU

  // Unlinks `it` and moves the entry into `graveyard`, to be destroyed
  // (buffer freed, charge released) after mu_ is dropped.
  void RemoveLocked(List::iterator it, std::vector<Entry>* graveyard) REQUIRES(mu_);

  const int64_t capacity_;
  const int64_t default_ttl_ms_;
  Clock* const clock_;
  MemoryLedger* const ledger_;

  mutable Mutex mu_;
  List lru_ GUARDED_BY(mu_);
  std::unordered_map<std::string, List::iterator> index_ GUARDED_BY(mu_);
  VisionCacheStats stats_ GUARDED_BY(mu_);
};

}  // namespace arbiter
