// arbiter/kv/cache_key.h — how KV prefix state is named: cache keys, slot
// ids, the model hash, TTL classes, stable-prefix hashes and the file names
// of saved KV.
//
// Implements docs/kv-precache.md "Keys and names" (the reference's
// resolveLocalCacheKey, deriveSlotId, buildModelHash, slotCacheFileName /
// parseSlotCacheTtlClass, hashStablePrefix; seed 001 "PRECACHE"), with two of
// its defects corrected (docs/kv-precache.md "Defects of the reference,
// fixed"): no slot count in the model hash (resizing `parallel` keeps saved
// KV) and safe file names (names derived from ids can never leave their
// directory).
//
// Example:
//   CacheKeyInputs in;
//   in.conversation_id = "room-42";
//   std::optional<std::string> key = ResolveCacheKey(in);   // "conv:room-42"
//   int slot = DeriveSlotId(*key, /*parallel=*/4);           // in [0, 4)
//   std::string file = SlotCacheFileName(SafeFileId("room-42"), TtlClass::kLong);
//   // "room-42.long.bin"
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

// How long saved KV lives (docs/kv-precache.md "Keys and names", TTL
// classes): short 5 min, long 60 min,
// extended 24 h. kUnclassified is a file name without a class (treated as
// long).
enum class TtlClass { kShort = 0, kLong, kExtended, kUnclassified };

// "short" | "long" | "extended" | "unclassified".
std::string_view TtlClassName(TtlClass ttl);
// Parses "short" | "long" | "extended" (the request field `cache_ttl`).
// Errors: kInvalidArgument listing the names.
Result<TtlClass> ParseTtlClass(std::string_view name);

// The windows of the three classes, in ms ([kv] ttl_short / ttl_long /
// ttl_extended).
struct TtlWindows {
  int64_t short_ms = 300000;      // 5 min
  int64_t long_ms = 3600000;      // 60 min
  int64_t extended_ms = 86400000; // 24 h
};
// The window of `ttl`: short → short_ms; long and unclassified → long_ms;
// extended → extended_ms (long_ms when extended_ms ≤ 0, the reference's
// "or long when unset").
int64_t TtlMs(TtlClass ttl, const TtlWindows& windows = {});

// The separator of every hash preimage here (U+0001), so "ab"+"c" and
// "a"+"bc" never collide.
// The keep-alive re-warms a prewarmed conversation untouched for at least
// this fraction of the short TTL (the reference's KEEPALIVE_STALE_FRACTION;
// docs/kv-precache.md "Prewarm and keep-alive").
inline constexpr double kKeepAliveStaleFraction = 0.8;

inline constexpr char kKeySeparator = '\x01';

// What the saved KV of a model depends on: everything that changes the K/V
// bytes. Not the slot count (docs/kv-precache.md "Defects of the reference,
// fixed": no slot count in the model hash) and not the context size: a
// conversation's KV is valid for any slot of any size that holds it.
struct ModelHashInputs {
  std::string target;        // the model's identity (e.g. its weights digest)
  std::string drafter;       // speculative drafter, "" when none
  std::string cache_type_k;  // K element type, e.g. "f32"
  std::string cache_type_v;  // V element type
  std::string extra;         // anything else that changes K/V
};
// First 16 lower-case hex chars of SHA-256(target SEP drafter SEP
// cache_type_k SEP cache_type_v SEP extra). Names the KV directory
// `<kv dir>/<model hash>/`.
std::string ModelHash(const ModelHashInputs& in);
// Whether `s` has the shape of a ModelHash(): exactly 16 chars of
// [0-9a-f]. Such a string is one path component that is neither "." nor
// "..", so "<kv dir>/<s>/" is a subdirectory of the KV directory.
bool IsModelHash(std::string_view s);

// The slot a cache key maps to (reference deriveSlotId): −1 when parallel
// ≤ 0 or the key is empty; 0 when parallel == 1; else the first 4 bytes of
// SHA-256(key) as a big-endian uint32, mod parallel.
int DeriveSlotId(std::string_view key, int parallel);

// One segment of a prompt (system prompt, tool schema, provider block,
// dialogue ...) and whether it is stable across turns.
struct PromptSegment {
  std::string content;
  bool stable = false;
};
// Hash of the leading stable segments: SHA-256 over each `content SEP`,
// stopping at the first unstable segment; first 16 hex chars. nullopt when
// the first segment is unstable or there are none.
std::optional<std::string> StablePrefixHash(const std::vector<PromptSegment>& segments);

// The signals a request carries for KV reuse.
struct CacheKeyInputs {
  std::string conversation_id;           // request `conversation_id`
  std::vector<PromptSegment> segments;   // the prompt split into segments
  std::string prefix_hash;               // a caller-computed stable-prefix hash
  std::string prompt_cache_key;          // OpenAI `prompt_cache_key`
};
// Precedence (reference resolveLocalCacheKey): "conv:<conversation_id>" →
// "seg:<StablePrefixHash(segments)>" → "pfx:<prefix_hash>" → the raw
// prompt_cache_key → nullopt (no key: the slot with the longest common
// prefix is used).
std::optional<std::string> ResolveCacheKey(const CacheKeyInputs& in);

// A file-name-safe form of an id (docs/kv-precache.md "Defects of the
// reference, fixed": safe file names). Ids of 1..64 bytes of
// [A-Za-z0-9_-] that start with neither '-' nor "h-" are kept as they are,
// so files stay readable; anything else — '/', "..", '.', NUL, spaces,
// non-ASCII, empty, too long, or the reserved "h-" start — becomes "h-" +
// the first 32 hex chars of SHA-256(id). Kept ids never start with "h-", so
// a kept id and a hashed one never collide. The result is one path
// component without '.', so "<SafeFileId>.<class>.bin" can never leave its
// directory.
std::string SafeFileId(std::string_view id);

// "<base>.<ttl>.bin" (reference slotCacheFileName). REQUIRES: ttl is not
// kUnclassified.
std::string SlotCacheFileName(std::string_view base, TtlClass ttl);
// The class encoded in a file name (reference parseSlotCacheTtlClass): the
// last dot component before ".bin" when it is short | long | extended, else
// kUnclassified ("room-1.bin", "room-1", "room.with.dots.bin").
TtlClass ParseSlotCacheTtlClass(std::string_view file_name);

// Deletes the regular files of `dir` whose age (now − mtime) exceeds the
// window of their class (reference eviction sweep; unclassified files live
// as long as `long`). A missing directory → 0. Non-regular entries are
// skipped. `now` is wall-clock time (file mtimes are), in ms since the
// epoch. Returns the number of files deleted.
// Errors: kInternal naming the directory when it cannot be listed.
Result<int> SweepExpiredKvFiles(const std::string& dir, int64_t now_unix_ms,
                                const TtlWindows& windows = {});

}  // namespace arbiter
