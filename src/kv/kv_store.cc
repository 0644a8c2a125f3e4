// kv/kv_store.cc — the disk tier: saved conversation KV under
// <dir>/<model hash>/, expiry by TTL class and a byte budget
// (docs/kv-precache.md "Persistence" and "Keys and names"; a conversation
// id never names a path outside the directory: docs/kv-precache.md "Defects
// of the reference, fixed", safe file names).
//
// Policy, in prose:
//   - The directory is the truth. There is no in-memory index of files:
//     List(), DiskBytes(), Sweep() and budget enforcement list the model
//     subdirectories (readdir + lstat) when they run, so files written by an
//     earlier process, removed by an operator or left by a crash are seen as
//     they are. A listing is cheap next to what a Save writes (MBs of K/V and
//     two fsyncs), and an unlimited budget never lists on Save.
//   - Only regular "*.bin" files of subdirectories named like a model hash
//     are the store's. lstat everywhere: a symlink or a directory with a .bin
//     name is neither followed, counted nor deleted.
//   - Ages are clock->NowUnixMs() − mtime, and Save()/Touch() stamp mtimes
//     from the same clock, so a SimulatedClock drives expiry in tests.
//   - Expired files are removed by Load() (the conversation's own files) and
//     Sweep() (all of them); the budget is enforced after every Save() and in
//     Sweep(), oldest mtime first.
//
// Note [Claims]
//   Every operation on one conversation holds its claim: the key
//   "<model hash>/<safe id>" in claimed_ (under mu_). Save, Load, Remove and
//   Touch wait for the claim (CondVar), so they run one at a time per
//   conversation with their file IO outside mu_. Without this, Save(long)
//   and Save(short) of one id could each delete the other's new file, and a
//   sweep could unlink a path just after a Save renamed a fresh file onto
//   it. Eviction passes (budget, Sweep) only TryClaim the conversation of a
//   victim, skipping it when busy, then re-lstat it under the claim and
//   unlink only if it is still the file they listed (same inode and mtime).
//   A pass never waits for a claim, and a Save holding its claim may wait
//   for evict_mu_, so claims and evict_mu_ cannot deadlock; the file a Save
//   just wrote is claimed by that Save, so its own budget pass never evicts
//   it.
//   evict_mu_ serializes the passes themselves (two passes over the same
//   listing would each free the excess). It is held across their file IO;
//   only passes take it. mu_ is held for set operations only.
#include "arbiter/kv/kv_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/kv/kv_file.h"

namespace arbiter {
namespace {

constexpr std::string_view kBinSuffix = ".bin";
// WriteFileAtomicStreaming's temp files: "<path>.tmp.<pid>.<n>".
constexpr std::string_view kTempInfix = ".bin.tmp.";

constexpr TtlClass kAllClasses[] = {TtlClass::kShort, TtlClass::kLong, TtlClass::kExtended,
                                    TtlClass::kUnclassified};

std::string Join(const std::string& dir, std::string_view name) {
  std::string out = dir;
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

int64_t MtimeMs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
         a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// "<name>.bin.tmp.<pid>.<n>" → "<name>.bin"; "" when `file_name` is not a
// temp file of WriteFileAtomicStreaming.
std::string_view TempTarget(std::string_view file_name) {
  const size_t at = file_name.rfind(kTempInfix);
  if (at == std::string_view::npos || at == 0) return {};
  const std::string_view rest = file_name.substr(at + kTempInfix.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos || !AllDigits(rest.substr(0, dot)) ||
      !AllDigits(rest.substr(dot + 1))) {
    return {};
  }
  return file_name.substr(0, at + kBinSuffix.size());
}

// Whether the process that wrote temp file `file_name` ("….tmp.<pid>.<n>")
// is gone: a temp it left can never be renamed into place.
bool TempWriterGone(std::string_view file_name) {
  const size_t at = file_name.rfind(kTempInfix);
  if (at == std::string_view::npos) return false;
  const std::string_view rest = file_name.substr(at + kTempInfix.size());
  const std::string pid_text(rest.substr(0, rest.find('.')));
  if (pid_text.empty() || pid_text.size() > 9) return false;
  const pid_t pid = static_cast<pid_t>(std::atol(pid_text.c_str()));
  if (pid <= 0 || pid == ::getpid()) return false;
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

// The safe id a "*.bin" file name belongs to: the name without ".bin" and,
// when it has one, without its class.
std::string_view StemOf(std::string_view bin_name) {
  std::string_view stem = bin_name.substr(0, bin_name.size() - kBinSuffix.size());
  if (ParseSlotCacheTtlClass(bin_name) != TtlClass::kUnclassified) {
    stem = stem.substr(0, stem.rfind('.'));
  }
  return stem;
}

std::string ClaimKey(std::string_view model_hash, std::string_view safe_id) {
  std::string key(model_hash);
  key += '/';
  key += safe_id;
  return key;
}

std::string FileName(std::string_view safe_id, TtlClass ttl) {
  if (ttl == TtlClass::kUnclassified) return std::string(safe_id) + std::string(kBinSuffix);
  return SlotCacheFileName(safe_id, ttl);
}

// Sets the mtime (and atime) of a regular file; never follows a symlink.
void StampMtime(const std::string& path, int64_t unix_ms) {
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = unix_ms / 1000;
  ts[0].tv_nsec = ts[1].tv_nsec = (unix_ms % 1000) * 1000000;
  ::utimensat(AT_FDCWD, path.c_str(), ts, AT_SYMLINK_NOFOLLOW);
}

Status ErrnoError(int err, std::string what) {
  what += ": ";
  what += std::strerror(err);
  switch (err) {
    case ENOENT: return NotFoundError(std::move(what));
    case EACCES:
    case EPERM:
    case EROFS: return PermissionDeniedError(std::move(what));
    case ENOSPC:
    case EDQUOT: return ResourceExhaustedError(std::move(what));
    case ENOTDIR: return FailedPreconditionError(std::move(what));
    default: return InternalError(std::move(what));
  }
}

// mkdir -p with mode 0700 for every directory it creates.
Status MakeDirs(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) == 0) return OkStatus();
  int err = errno;
  if (err == ENOENT) {
    std::string parent = dir;
    while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
    const size_t slash = parent.rfind('/');
    if (slash != std::string::npos && slash > 0) {
      parent.resize(slash);
      ARBITER_RETURN_IF_ERROR(MakeDirs(parent));
      if (::mkdir(dir.c_str(), 0700) == 0) return OkStatus();
      err = errno;
    }
  }
  if (err == EEXIST) return OkStatus();  // checked by the caller
  return ErrnoError(err, "create " + dir);
}

}  // namespace

// One file found by Scan().
struct KvStore::ScannedFile {
  std::string model_hash;
  std::string file_name;
  std::string path;
  std::string claim_key;
  TtlClass ttl_class = TtlClass::kUnclassified;
  bool temp = false;  // an atomic write's temp file, not a *.bin
  struct stat st {};
};

// Holds a conversation's claim for a scope (Note [Claims]).
class KvStore::ConversationClaim {
 public:
  ConversationClaim(KvStore* store, std::string key) : store_(store), key_(std::move(key)) {
    store_->Claim(key_);
  }
  ~ConversationClaim() { store_->Unclaim(key_); }
  ConversationClaim(const ConversationClaim&) = delete;
  ConversationClaim& operator=(const ConversationClaim&) = delete;

 private:
  KvStore* const store_;
  const std::string key_;
};

Result<std::unique_ptr<KvStore>> KvStore::Open(KvStoreOptions options) {
  std::string dir = std::move(options.dir);
  if (dir.empty()) return InvalidArgumentError("KV store: [kv] dir is empty");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  Status made = MakeDirs(dir);
  if (!made.ok()) return made.WithPrefix("KV store: cannot create the [kv] dir " + dir);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoError(errno, "KV store: stat " + dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(fmt::format(
        "KV store: the [kv] dir {} exists and is not a directory; point [kv] dir elsewhere", dir));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return ErrnoError(errno, fmt::format("KV store: the [kv] dir {} is not writable", dir));
  }
  Clock* clock = options.clock != nullptr ? options.clock : Clock::Real();
  std::unique_ptr<KvStore> store(
      new KvStore(std::move(dir), options.ttl, options.disk_budget, clock));
  store->RemoveOrphanTemps();
  return store;
}

int KvStore::RemoveOrphanTemps() {
  int removed = 0;
  for (const ScannedFile& f : Scan(/*with_temps=*/true)) {
    if (!f.temp || !TempWriterGone(f.file_name)) continue;
    if (::unlink(f.path.c_str()) == 0) ++removed;
  }
  if (removed > 0) {
    spdlog::info("kv: removed {} temp file(s) of interrupted saves by processes that are gone",
                 removed);
  }
  return removed;
}

KvStore::KvStore(std::string dir, TtlWindows ttl, uint64_t disk_budget, Clock* clock)
    : dir_(std::move(dir)), ttl_(ttl), disk_budget_(disk_budget), clock_(clock) {}

void KvStore::Claim(const std::string& key) {
  MutexLock l(&mu_);
  while (claimed_.count(key) != 0) claim_released_.Wait();
  claimed_.insert(key);
}

bool KvStore::TryClaim(const std::string& key) {
  MutexLock l(&mu_);
  return claimed_.insert(key).second;
}

void KvStore::Unclaim(const std::string& key) {
  {
    MutexLock l(&mu_);
    claimed_.erase(key);
  }
  claim_released_.SignalAll();
}

std::string KvStore::PathFor(std::string_view model_hash, std::string_view conversation_id,
                             TtlClass ttl) const {
  if (!IsModelHash(model_hash)) return {};
  return Join(Join(dir_, model_hash), FileName(SafeFileId(conversation_id), ttl));
}

Result<uint64_t> KvStore::Save(std::string_view conversation_id, TtlClass ttl,
                               const KvSnapshot& snapshot) {
  if (snapshot.kv.size() != snapshot.ExpectedKvBytes()) {
    return InvalidArgumentError(fmt::format(
        "KV store: snapshot has {} KV bytes for {} layers × {} tokens × {} kv_dim of {} "
        "(expected {})",
        snapshot.kv.size(), snapshot.n_layers, snapshot.tokens.size(), snapshot.kv_dim,
        KvTypeName(snapshot.kv_type), snapshot.ExpectedKvBytes()));
  }
  return Save(conversation_id, ttl, snapshot.model_hash, snapshot.Rows());
}

Result<uint64_t> KvStore::Save(std::string_view conversation_id, TtlClass ttl,
                               const std::string& hash, const KvRowsView& rows) {
  if (!IsModelHash(hash)) {
    return InvalidArgumentError(fmt::format(
        "KV store: snapshot model hash \"{}\" is not a model hash (16 lower-case hex chars, "
        "ModelHash())",
        hash));
  }
  if (ttl == TtlClass::kUnclassified) {
    return InvalidArgumentError("KV store: save needs a TTL class (short, long or extended)");
  }
  const std::string safe_id = SafeFileId(conversation_id);
  const std::string model_dir = Join(dir_, hash);
  const std::string path = Join(model_dir, FileName(safe_id, ttl));
  const uint64_t bytes = KvFileBytes(rows);

  ConversationClaim claim(this, ClaimKey(hash, safe_id));
  if (::mkdir(model_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    write_errors_.fetch_add(1);
    return ErrnoError(errno, "KV store: create " + model_dir);
  }
  struct stat st {};
  if (::lstat(model_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(fmt::format(
        "KV store: {} is not a directory (a symlink or a file?); remove it", model_dir));
  }
  // The conversation's files other than `keep` ("" = all of them).
  auto remove_others = [&](const std::string& keep) {
    for (TtlClass t : kAllClasses) {
      const std::string p = Join(model_dir, FileName(safe_id, t));
      if (p == keep) continue;
      struct stat s {};
      if (::lstat(p.c_str(), &s) == 0 && S_ISREG(s.st_mode)) ::unlink(p.c_str());
    }
  };
  if (disk_budget_ != 0 && bytes > disk_budget_) {
    remove_others("");
    return ResourceExhaustedError(fmt::format(
        "KV store: {} would be {} bytes, more than the whole disk budget ([kv] disk_budget) of {} "
        "bytes; not saved (older saved KV of the conversation removed)",
        path, bytes, disk_budget_));
  }
  // A failed write leaves no temp file and keeps the previous file of this
  // class (WriteFileAtomicStreaming); the others are removed only after
  // success.
  if (Status written = WriteKvFile(path, hash, rows); !written.ok()) {
    write_errors_.fetch_add(1);
    return written;
  }
  StampMtime(path, clock_->NowUnixMs());
  remove_others(path);
  if (disk_budget_ != 0) {
    MutexLock evict(&evict_mu_);
    EnforceBudgetLocked(nullptr);
  }
  return bytes;
}

template <typename T, typename Read>
Result<T> KvStore::LoadWith(std::string_view model_hash, std::string_view conversation_id,
                            const Read& read, TtlClass* ttl_class, std::string* path) {
  if (!IsModelHash(model_hash)) {
    return InvalidArgumentError(
        fmt::format("KV store: \"{}\" is not a model hash (16 lower-case hex chars)", model_hash));
  }
  const std::string hash(model_hash);
  const std::string safe_id = SafeFileId(conversation_id);
  const std::string model_dir = Join(dir_, hash);
  ConversationClaim claim(this, ClaimKey(hash, safe_id));
  const int64_t now_ms = clock_->NowUnixMs();
  std::string newest;
  TtlClass newest_class = TtlClass::kUnclassified;
  int64_t newest_mtime_ms = 0;
  for (TtlClass t : kAllClasses) {
    const std::string p = Join(model_dir, FileName(safe_id, t));
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const int64_t mtime_ms = MtimeMs(st);
    if (now_ms - mtime_ms > TtlMs(t, ttl_)) {
      ::unlink(p.c_str());  // expired: absent
      continue;
    }
    if (newest.empty() || mtime_ms > newest_mtime_ms) {
      newest = p;
      newest_class = t;
      newest_mtime_ms = mtime_ms;
    }
  }
  if (newest.empty()) {
    return NotFoundError(fmt::format("KV store: no saved KV for {} in {}", safe_id, model_dir));
  }
  Result<T> loaded = read(newest, hash);
  if (loaded.ok()) {
    *ttl_class = newest_class;
    *path = newest;
    return loaded;
  }
  const Status& st = loaded.status();
  if (st.code() != StatusCode::kDataLoss && st.code() != StatusCode::kFailedPrecondition) {
    return st;  // kNotFound (removed meanwhile by someone else), an IO error: the file is kept
  }
  ::unlink(newest.c_str());
  spdlog::warn("kv: removed unusable saved KV ({})", st.message());  // the message names the path
  return Status(st.code(), st.message() + "; the file was removed (prefill from scratch)");
}

Result<KvLoadResult> KvStore::Load(std::string_view model_hash, std::string_view conversation_id,
                                   std::optional<GgmlType> kv_type) {
  KvLoadResult r;
  auto read = [&](const std::string& path, const std::string& hash) {
    return ReadKvFile(path, hash, kv_type);
  };
  ARBITER_ASSIGN_OR_RETURN(r.snapshot, LoadWith<KvSnapshot>(model_hash, conversation_id, read,
                                                            &r.ttl_class, &r.path));
  return r;
}

Result<KvMappedLoadResult> KvStore::LoadMapped(std::string_view model_hash,
                                               std::string_view conversation_id,
                                               std::optional<GgmlType> kv_type) {
  KvMappedLoadResult r;
  std::string path;
  auto read = [&](const std::string& p, const std::string& hash) {
    return MapKvFile(p, hash, kv_type);
  };
  ARBITER_ASSIGN_OR_RETURN(r.file, LoadWith<MappedKvFile>(model_hash, conversation_id, read,
                                                          &r.ttl_class, &path));
  return r;
}

bool KvStore::Contains(std::string_view model_hash, std::string_view conversation_id) const {
  if (!IsModelHash(model_hash)) return false;
  const std::string safe_id = SafeFileId(conversation_id);
  const std::string model_dir = Join(dir_, model_hash);
  const int64_t now_ms = clock_->NowUnixMs();
  for (TtlClass t : kAllClasses) {
    const std::string p = Join(model_dir, FileName(safe_id, t));
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (now_ms - MtimeMs(st) <= TtlMs(t, ttl_)) return true;
  }
  return false;
}

int KvStore::Remove(std::string_view model_hash, std::string_view conversation_id) {
  if (!IsModelHash(model_hash)) return 0;
  const std::string safe_id = SafeFileId(conversation_id);
  const std::string model_dir = Join(dir_, model_hash);
  ConversationClaim claim(this, ClaimKey(model_hash, safe_id));
  int removed = 0;
  for (TtlClass t : kAllClasses) {
    const std::string p = Join(model_dir, FileName(safe_id, t));
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(p.c_str()) == 0) removed++;
  }
  return removed;
}

void KvStore::Touch(std::string_view model_hash, std::string_view conversation_id) {
  if (!IsModelHash(model_hash)) return;
  const std::string safe_id = SafeFileId(conversation_id);
  const std::string model_dir = Join(dir_, model_hash);
  ConversationClaim claim(this, ClaimKey(model_hash, safe_id));
  const int64_t now_ms = clock_->NowUnixMs();
  for (TtlClass t : kAllClasses) {
    const std::string p = Join(model_dir, FileName(safe_id, t));
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    StampMtime(p, now_ms);
  }
}

std::vector<KvStore::ScannedFile> KvStore::Scan(bool with_temps) const {
  std::vector<ScannedFile> out;
  DIR* top = ::opendir(dir_.c_str());
  if (top == nullptr) return out;
  std::vector<std::string> model_hashes;
  while (const dirent* e = ::readdir(top)) {
    if (IsModelHash(e->d_name)) model_hashes.emplace_back(e->d_name);
  }
  ::closedir(top);
  for (const std::string& hash : model_hashes) {
    const std::string model_dir = Join(dir_, hash);
    struct stat dst {};
    // lstat: a symlinked model directory is not followed.
    if (::lstat(model_dir.c_str(), &dst) != 0 || !S_ISDIR(dst.st_mode)) continue;
    DIR* d = ::opendir(model_dir.c_str());
    if (d == nullptr) continue;
    while (const dirent* e = ::readdir(d)) {
      const std::string_view name = e->d_name;
      ScannedFile f;
      std::string_view bin_name;  // the *.bin name the file is, or is a temp of
      if (EndsWith(name, kBinSuffix) && name.size() > kBinSuffix.size()) {
        bin_name = name;
        f.ttl_class = ParseSlotCacheTtlClass(name);
      } else if (with_temps) {
        bin_name = TempTarget(name);
        f.temp = true;
      }
      if (bin_name.empty()) continue;
      f.path = Join(model_dir, name);
      if (::lstat(f.path.c_str(), &f.st) != 0 || !S_ISREG(f.st.st_mode)) continue;
      f.model_hash = hash;
      f.file_name = std::string(name);
      f.claim_key = ClaimKey(hash, StemOf(bin_name));
      out.push_back(std::move(f));
    }
    ::closedir(d);
  }
  return out;
}

void KvStore::EnforceBudgetLocked(KvSweepResult* result) {
  if (disk_budget_ == 0) return;
  std::vector<ScannedFile> files = Scan(/*with_temps=*/false);
  uint64_t total = 0;
  for (const ScannedFile& f : files) total += static_cast<uint64_t>(f.st.st_size);
  if (total <= disk_budget_) return;
  // Oldest mtime first; ties by path, so the order is deterministic.
  std::sort(files.begin(), files.end(), [](const ScannedFile& a, const ScannedFile& b) {
    if (a.st.st_mtim.tv_sec != b.st.st_mtim.tv_sec) {
      return a.st.st_mtim.tv_sec < b.st.st_mtim.tv_sec;
    }
    if (a.st.st_mtim.tv_nsec != b.st.st_mtim.tv_nsec) {
      return a.st.st_mtim.tv_nsec < b.st.st_mtim.tv_nsec;
    }
    return a.path < b.path;
  });
  for (const ScannedFile& f : files) {
    if (total <= disk_budget_) break;
    if (!TryClaim(f.claim_key)) continue;  // busy: next pass
    struct stat now {};
    bool removed = false;
    if (::lstat(f.path.c_str(), &now) == 0 && S_ISREG(now.st_mode) && SameFile(now, f.st)) {
      removed = ::unlink(f.path.c_str()) == 0;
    }
    Unclaim(f.claim_key);
    if (!removed) continue;
    const uint64_t bytes = static_cast<uint64_t>(f.st.st_size);
    total -= bytes;
    if (result != nullptr) {
      result->over_budget++;
      result->bytes_freed += bytes;
    }
  }
}

KvSweepResult KvStore::Sweep() {
  KvSweepResult result;
  MutexLock evict(&evict_mu_);
  const int64_t now_ms = clock_->NowUnixMs();
  for (const ScannedFile& f : Scan(/*with_temps=*/true)) {
    const int64_t age_ms = now_ms - MtimeMs(f.st);
    const int64_t limit_ms = f.temp ? kKvStaleTempFileMs : TtlMs(f.ttl_class, ttl_);
    if (age_ms <= limit_ms) continue;
    if (!TryClaim(f.claim_key)) continue;  // busy: a write in progress, or next sweep
    struct stat now {};
    bool removed = false;
    if (::lstat(f.path.c_str(), &now) == 0 && S_ISREG(now.st_mode) && SameFile(now, f.st)) {
      removed = ::unlink(f.path.c_str()) == 0;
    }
    Unclaim(f.claim_key);
    if (!removed) continue;
    if (f.temp) {
      result.stale_temp++;
    } else {
      result.expired++;
      result.bytes_freed += static_cast<uint64_t>(f.st.st_size);
    }
  }
  EnforceBudgetLocked(&result);
  return result;
}

std::vector<KvFileInfo> KvStore::List() const {
  const int64_t now_ms = clock_->NowUnixMs();
  std::vector<KvFileInfo> out;
  for (ScannedFile& f : Scan(/*with_temps=*/false)) {
    KvFileInfo info;
    info.model_hash = std::move(f.model_hash);
    info.file_name = std::move(f.file_name);
    info.ttl_class = f.ttl_class;
    info.bytes = static_cast<uint64_t>(f.st.st_size);
    info.age_ms = now_ms - MtimeMs(f.st);
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const KvFileInfo& a, const KvFileInfo& b) {
    if (a.model_hash != b.model_hash) return a.model_hash < b.model_hash;
    return a.file_name < b.file_name;
  });
  return out;
}

uint64_t KvStore::DiskBytes() const {
  uint64_t total = 0;
  for (const ScannedFile& f : Scan(/*with_temps=*/false)) {
    total += static_cast<uint64_t>(f.st.st_size);
  }
  return total;
}

}  // namespace arbiter
