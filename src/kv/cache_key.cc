// kv/cache_key.cc — cache keys, slot ids, model hash, TTL classes and KV file
// names (docs/kv-precache.md "Keys and names").
//
// Every hash here is SHA-256 (arbiter/base/hash.h) over fields joined by
// kKeySeparator (U+0001), printed as lower-case hex and cut to 16 chars: the
// reference's scheme, so keys computed here agree with its documented
// values. File names go through SafeFileId, so nothing a client sends can
// name a path outside the KV directory.
#include "arbiter/kv/cache_key.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "arbiter/base/hash.h"

namespace arbiter {
namespace {

constexpr size_t kShortHashChars = 16;
constexpr size_t kMaxKeptIdBytes = 64;
constexpr size_t kHashedIdChars = 32;

std::string Hex16(const Sha256Digest& d) { return HexEncode(d).substr(0, kShortHashChars); }

bool IsKeptIdChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '-';
}

}  // namespace

std::string_view TtlClassName(TtlClass ttl) {
  switch (ttl) {
    case TtlClass::kShort: return "short";
    case TtlClass::kLong: return "long";
    case TtlClass::kExtended: return "extended";
    case TtlClass::kUnclassified: return "unclassified";
  }
  return "unclassified";
}

Result<TtlClass> ParseTtlClass(std::string_view name) {
  for (TtlClass t : {TtlClass::kShort, TtlClass::kLong, TtlClass::kExtended}) {
    if (TtlClassName(t) == name) return t;
  }
  return InvalidArgumentError(
      fmt::format("unknown cache TTL class \"{}\"; expected short, long or extended", name));
}

int64_t TtlMs(TtlClass ttl, const TtlWindows& w) {
  switch (ttl) {
    case TtlClass::kShort: return w.short_ms;
    case TtlClass::kExtended: return w.extended_ms > 0 ? w.extended_ms : w.long_ms;
    case TtlClass::kLong:
    case TtlClass::kUnclassified: return w.long_ms;
  }
  return w.long_ms;
}

std::string ModelHash(const ModelHashInputs& in) {
  Sha256 h;
  const char sep = kKeySeparator;
  h.Update(in.target);
  h.Update(&sep, 1);
  h.Update(in.drafter);
  h.Update(&sep, 1);
  h.Update(in.cache_type_k);
  h.Update(&sep, 1);
  h.Update(in.cache_type_v);
  h.Update(&sep, 1);
  h.Update(in.extra);
  return Hex16(h.Finish());
}

bool IsModelHash(std::string_view s) {
  if (s.size() != kShortHashChars) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

int DeriveSlotId(std::string_view key, int parallel) {
  if (parallel <= 0 || key.empty()) return -1;
  if (parallel == 1) return 0;
  const Sha256Digest d = Sha256Of(key);
  const uint32_t v = (uint32_t{d[0]} << 24) | (uint32_t{d[1]} << 16) | (uint32_t{d[2]} << 8) |
                     uint32_t{d[3]};
  return static_cast<int>(v % static_cast<uint32_t>(parallel));
}

std::optional<std::string> StablePrefixHash(const std::vector<PromptSegment>& segments) {
  Sha256 h;
  bool any = false;
  const char sep = kKeySeparator;
  for (const PromptSegment& s : segments) {
    if (!s.stable) break;
    h.Update(s.content);
    h.Update(&sep, 1);
    any = true;
  }
  if (!any) return std::nullopt;
  return Hex16(h.Finish());
}

std::optional<std::string> ResolveCacheKey(const CacheKeyInputs& in) {
  if (!in.conversation_id.empty()) return "conv:" + in.conversation_id;
  if (std::optional<std::string> seg = StablePrefixHash(in.segments)) return "seg:" + *seg;
  if (!in.prefix_hash.empty()) return "pfx:" + in.prefix_hash;
  if (!in.prompt_cache_key.empty()) return in.prompt_cache_key;
  return std::nullopt;
}

std::string SafeFileId(std::string_view id) {
  bool keep = !id.empty() && id.size() <= kMaxKeptIdBytes && id.front() != '-' &&
              id.substr(0, 2) != "h-";
  for (size_t i = 0; keep && i < id.size(); ++i) keep = IsKeptIdChar(id[i]);
  if (keep) return std::string(id);
  return "h-" + HexEncode(Sha256Of(id)).substr(0, kHashedIdChars);
}

std::string SlotCacheFileName(std::string_view base, TtlClass ttl) {
  return fmt::format("{}.{}.bin", base, TtlClassName(ttl));
}

TtlClass ParseSlotCacheTtlClass(std::string_view file_name) {
  constexpr std::string_view kBin = ".bin";
  if (file_name.size() <= kBin.size() ||
      file_name.substr(file_name.size() - kBin.size()) != kBin) {
    return TtlClass::kUnclassified;
  }
  const std::string_view stem = file_name.substr(0, file_name.size() - kBin.size());
  const size_t dot = stem.rfind('.');
  if (dot == std::string_view::npos) return TtlClass::kUnclassified;
  Result<TtlClass> t = ParseTtlClass(stem.substr(dot + 1));
  return t.ok() ? *t : TtlClass::kUnclassified;
}

Result<int> SweepExpiredKvFiles(const std::string& dir, int64_t now_unix_ms,
                                const TtlWindows& windows) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return 0;
  if (ec) return InternalError(fmt::format("cannot list KV directory {}: {}", dir, ec.message()));
  int deleted = 0;
  for (const fs::directory_entry& e : it) {
    const std::string path = e.path().string();
    struct stat sb {};
    // lstat: a symlink is not a regular file and is never followed.
    if (::lstat(path.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    const int64_t mtime_ms =
        static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000 + sb.st_mtim.tv_nsec / 1000000;
    const TtlClass ttl = ParseSlotCacheTtlClass(e.path().filename().string());
    if (now_unix_ms - mtime_ms > TtlMs(ttl, windows)) {
      if (::unlink(path.c_str()) == 0) deleted++;
    }
  }
  return deleted;
}

}  // namespace arbiter
