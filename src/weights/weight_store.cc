// weights/weight_store.cc — host-RAM floors: PrivateWeightStore (anonymous
// memory per process) and SharedWeightStore (one POSIX shared-memory region
// per (key, digest) per node). The header is the contract; these notes say
// how the code keeps it. Where each tensor goes and what makes a region
// READY is region_format.cc's (Note [Layout] there).
//
// Note [Lock files]
//   The flock on "<shm dir>/<name>.lock" is the only synchronization
//   between processes; the region itself carries no lock. Holders keep a
//   shared flock for the floor's lifetime, the creator holds the exclusive
//   one from the remnant check to ready = 1, a releaser or sweeper takes
//   the exclusive one (non-blocking) to prove there is no holder before it
//   unlinks. Every lock is taken with LOCK_NB: a blocking request would wait
//   forever behind a stuck filler (docs/weights.md, 'Unbounded wait for a
//   stuck filler'); Materialize polls instead and gives up at
//   ready_wait_ms.
//   Lock files are unlinked with their region (the reference never removes
//   them). That is safe because every locker, after each successful flock,
//   checks that its fd is still the file at the path (fstat vs lstat, same
//   device and inode) and otherwise drops the lock, reopens and retries: a
//   lock on an unlinked inode excludes nobody, so it is never acted on. The
//   path only changes under an exclusive lock of the file at the path, which
//   no holder's shared lock allows. Each Materialize opens its own fd (its
//   own open file description), so two floors in one process hold
//   independent flocks and see each other like two processes do.
//   Opening never uses O_CREAT on an existing file (O_CREAT|O_EXCL first,
//   then a plain open): Linux's fs.protected_regular refuses O_CREAT on
//   another user's file in the sticky /dev/shm even when the mode allows it.
//   O_NOFOLLOW|O_NONBLOCK and an S_ISREG check keep a planted symlink or FIFO
//   from redirecting or hanging the open.
//
// Note [Downgrade]
//   The creator turns its exclusive flock into a shared one with flock(fd,
//   LOCK_SH) on the same fd. flock(2) does not promise the conversion is
//   atomic; Linux performs it under one spinlock (no other lock can be
//   granted in between), and where it is not atomic the only effect is that
//   a sweeper may unlink the fresh region in the gap: this floor keeps its
//   mapping, its release sees the lock file replaced and unlinks nothing,
//   and the next Materialize builds a new region. Sharing is lost, never
//   data.
//
// Note [Recovery]
//   Whatever the exclusive winner finds that is not READY — no object, a
//   zero-length object (a crash between create and ftruncate:
//   docs/weights.md, 'Zero-length remnants'), a truncated one, a corrupt or
//   foreign header, ready = 0 after a crashed fill — it unlinks and
//   rebuilds: create with O_CREAT|O_EXCL, fchmod to the store's mode (so
//   the umask neither widens nor narrows it: docs/weights.md, 'Permissions
//   of shared regions'), ftruncate, fallocate (tmpfs then reports a full /dev/shm as ENOSPC
//   instead of a SIGBUS in the middle of the fill), header with ready = 0
//   and the table, fill, msync, ready = 1 last, msync. A fill error or an
//   allocation error unlinks the region and its lock file before returning
//   (nothing partial is kept); only a process that dies mid-fill leaves
//   ready = 0 behind, which the next winner rebuilds. Filled arrays are made
//   read-only (mprotect) and attachers map PROT_READ, so a stray write
//   faults instead of corrupting every process's weights.
//
// Note [No mutex]
//   Neither store has mutable state (options are const), so there is nothing
//   to guard: thread safety comes from each call owning its fds and
//   mappings, and from flock treating two open file descriptions in one
//   process like two processes. HostFloor is thread-compatible.
#include "arbiter/weights/weight_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include "arbiter/base/clock.h"
#include "arbiter/base/fd.h"
#include "arbiter/base/size.h"
#include "arbiter/weights/region_format.h"
#include "weights/internal/region_format.h"

namespace arbiter {
namespace {

using weights_internal::CheckedSpecBytes;
using weights_internal::ComputeLayout;
using weights_internal::DigestHex;
using weights_internal::kDigestHexChars;
using weights_internal::Layout;
using weights_internal::MarkRegionReady;
using weights_internal::PageBytes;
using weights_internal::WriteRegionHeader;

constexpr size_t kMaxSanitizedKeyBytes = 64;
constexpr size_t kMaxPrefixBytes = 64;
constexpr std::string_view kLockSuffix = ".lock";
// Lock-file reopen attempts per lock request before it reports "busy" (each
// one means the file was unlinked between our open and our flock).
constexpr int kMaxLockReopens = 64;

// Callers only pass sizes they already bounded by INT64_MAX.
uint64_t PageRound(uint64_t bytes) { return (bytes + PageBytes() - 1) / PageBytes() * PageBytes(); }

std::string ErrnoText(int err) { return std::strerror(err); }

// `a` then `b`. Appended, not a + b: gcc 12 raises a false -Wrestrict on
// operator+(const char*, string&&) (GCC bug 105329).
std::string Concat(std::string_view a, std::string_view b) {
  std::string out(a);
  out += b;
  return out;
}

std::string ModeText(uint32_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", mode & 07777);
  return buf;
}

// Fills the HostFloor fields shared by both stores.
class FloorBase : public HostFloor {
 protected:
  void SetLayout(const uint8_t* base, const Layout& layout, uint64_t mapped_bytes, bool filled_here,
                 std::string region_name) {
    arrays_.clear();
    arrays_.reserve(layout.offsets.size());
    for (uint64_t offset : layout.offsets) arrays_.push_back(base + offset);
    tensor_bytes_ = layout.nbytes;
    payload_bytes_ = layout.payload_bytes;
    mapped_bytes_ = mapped_bytes;
    filled_here_ = filled_here;
    region_name_ = std::move(region_name);
  }
};

// Runs `fill` over the writable arrays of `base` laid out as `layout`.
Status RunFill(std::string_view key, uint8_t* base, const Layout& layout, const WeightFill& fill) {
  std::vector<void*> arrays;
  arrays.reserve(layout.offsets.size());
  for (uint64_t offset : layout.offsets) arrays.push_back(base + offset);
  Status s = fill(arrays);
  if (!s.ok()) return s.WithPrefix(key);
  return OkStatus();
}

// ---- private floors ------------------------------------------------------------

class PrivateHostFloor final : public FloorBase {
 public:
  PrivateHostFloor(Mapping mapping, const Layout& layout) : mapping_(std::move(mapping)) {
    SetLayout(mapping_.data(), layout, mapping_.size_bytes(), /*filled_here=*/true, "");
  }

 private:
  Mapping mapping_;
};

// ---- shared regions: names -----------------------------------------------------

std::string SanitizeKey(std::string_view key) {
  std::string out;
  const size_t n = std::min(key.size(), kMaxSanitizedKeyBytes);
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const char c = key[i];
    const bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
    out.push_back(keep ? c : '_');
  }
  return out;
}

bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// "<prefix>-<sanitized key>-<hex>": the region's file name in the shm dir.
std::string BaseName(const std::string& prefix, std::string_view key, uint64_t digest) {
  return prefix + "-" + SanitizeKey(key) + "-" + DigestHex(digest);
}

// Splits a directory entry "<prefix>-<sanitized key>-<16 hex>[.lock]".
struct ParsedEntry {
  std::string base;  // without ".lock"
  std::string sanitized_key;
  std::string digest_hex;
  bool is_lock = false;
};

bool ParseEntry(const std::string& prefix, std::string_view name, ParsedEntry* out) {
  out->is_lock = name.size() > kLockSuffix.size() &&
                 name.substr(name.size() - kLockSuffix.size()) == kLockSuffix;
  std::string_view base = out->is_lock ? name.substr(0, name.size() - kLockSuffix.size()) : name;
  const size_t head = prefix.size() + 1;
  if (base.size() < head + 1 + 1 + kDigestHexChars) return false;
  if (base.substr(0, prefix.size()) != prefix || base[prefix.size()] != '-') return false;
  const size_t hex_at = base.size() - kDigestHexChars;
  if (base[hex_at - 1] != '-' || !IsLowerHex(base.substr(hex_at))) return false;
  out->base = std::string(base);
  out->sanitized_key = std::string(base.substr(head, hex_at - 1 - head));
  out->digest_hex = std::string(base.substr(hex_at));
  return !out->sanitized_key.empty();
}

// ---- shared regions: lock files (Note [Lock files]) ----------------------------

struct LockFile {
  UniqueFd fd;
  std::string path;
  uint32_t mode = 0600;
};

Status LockOpenError(const std::string& path, uint32_t mode, int err) {
  if (err == EACCES || err == EPERM) {
    return PermissionDeniedError("lock file " + path + " is not accessible: " + ErrnoText(err) +
                                 " (this store creates lock files with mode " + ModeText(mode) +
                                 "); run as the user that created it, or give the workers a "
                                 "shared group and mode 0660");
  }
  if (err == ENOSPC || err == ENOMEM) {
    return ResourceExhaustedError("cannot create lock file " + path + ": " + ErrnoText(err) +
                                  "; free space in the shm directory");
  }
  return InternalError("cannot open lock file " + path + ": " + ErrnoText(err) +
                       "; check that the shm directory is a writable tmpfs and that nothing "
                       "else (a directory, a symlink) sits at that path");
}

// Opens (creating with `mode` when absent) the lock file at `path`.
Result<LockFile> OpenLockFile(const std::string& path, uint32_t mode) {
  for (int attempt = 0; attempt < kMaxLockReopens; ++attempt) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd >= 0) {
      UniqueFd owned(fd);
      if (::fchmod(fd, mode) != 0) {
        const int err = errno;
        ::unlink(path.c_str());
        return LockOpenError(path, mode, err);
      }
      return LockFile{std::move(owned), path, mode};
    }
    if (errno != EEXIST) return LockOpenError(path, mode, errno);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
      if (errno == ENOENT) continue;  // unlinked between the two opens
      return LockOpenError(path, mode, errno);
    }
    UniqueFd owned(fd);
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      return InternalError("lock file " + path +
                           " is not a regular file; remove it (no arbiter process creates one)");
    }
    return LockFile{std::move(owned), path, mode};
  }
  return InternalError("lock file " + path + " kept disappearing while being opened (" +
                       std::to_string(kMaxLockReopens) + " attempts); retry");
}

// True when `fd` is the file currently at `path`.
bool IsCurrent(int fd, const std::string& path) {
  struct stat by_fd, by_path;
  if (::fstat(fd, &by_fd) != 0 || ::lstat(path.c_str(), &by_path) != 0) return false;
  return by_fd.st_dev == by_path.st_dev && by_fd.st_ino == by_path.st_ino;
}

// Takes `op` (LOCK_SH or LOCK_EX) without blocking on the lock file that is
// at lock->path, reopening it when the fd's file was unlinked or replaced.
// Returns false when another open file description holds a conflicting lock.
Result<bool> TryLock(LockFile* lock, int op) {
  for (int attempt = 0; attempt < kMaxLockReopens; ++attempt) {
    if (::flock(lock->fd.get(), op | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EWOULDBLOCK) return false;
      return InternalError("flock on " + lock->path + " failed: " + ErrnoText(err));
    }
    if (IsCurrent(lock->fd.get(), lock->path)) return true;
    // A lock on an unlinked file excludes nobody: drop it, open the current one.
    lock->fd.reset();
    ARBITER_ASSIGN_OR_RETURN(LockFile fresh, OpenLockFile(lock->path, lock->mode));
    lock->fd = std::move(fresh.fd);
  }
  return false;  // the file keeps being replaced: report busy, the caller's deadline bounds it
}

void Unlock(const LockFile& lock) { ::flock(lock.fd.get(), LOCK_UN); }

// REQUIRES: `lock` holds LOCK_EX. See Note [Downgrade].
Status Downgrade(const LockFile& lock) {
  while (::flock(lock.fd.get(), LOCK_SH) != 0) {
    if (errno != EINTR) {
      return InternalError("flock(LOCK_SH) on " + lock.path + " failed: " + ErrnoText(errno));
    }
  }
  return OkStatus();
}

// ---- shared regions: attach, create, release -----------------------------------

struct RegionNames {
  std::string region;     // "/<base>" for shm_open
  std::string path;       // "<shm dir>/<base>"
  std::string lock_path;  // "<shm dir>/<base>.lock"
};

RegionNames NamesOf(const SharedWeightStoreOptions& options, const std::string& base) {
  return RegionNames{"/" + base, options.shm_dir + "/" + base,
                     options.shm_dir + "/" + base + std::string(kLockSuffix)};
}

Status RegionAccessError(const RegionNames& names, uint32_t mode, int err, std::string_view what) {
  std::string owner;
  struct stat st;
  if (::stat(names.path.c_str(), &st) == 0) {
    owner = " (it has mode " + ModeText(st.st_mode) + ", owner uid " + std::to_string(st.st_uid) +
            "; this store uses mode " + ModeText(mode) + ")";
  }
  return PermissionDeniedError("cannot " + std::string(what) + " shared region " + names.region +
                               " (" + names.path + "): " + ErrnoText(err) + owner +
                               "; run as the user that created it, or give the workers a shared "
                               "group and mode 0660");
}

// Maps the region read-only when it is READY for `specs`. kNotFound (absent)
// and kDataLoss (not READY: short, corrupt, foreign, ready = 0) mean "build
// it"; other codes are errors to return.
Result<Mapping> AttachReady(const RegionNames& names, uint32_t mode, uint64_t digest,
                            const std::vector<WeightSpec>& specs, const Layout& layout) {
  const int fd = ::shm_open(names.region.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFoundError("shared region " + names.region + " does not exist");
    if (err == EACCES || err == EPERM) return RegionAccessError(names, mode, err, "open");
    return InternalError("shm_open(" + names.region + ") failed: " + ErrnoText(err));
  }
  UniqueFd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return InternalError("fstat of shared region " + names.region + " failed: " + ErrnoText(errno));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < layout.total_bytes) {
    return DataLossError("shared region " + names.region + " is " + std::to_string(size) +
                         " bytes; the layout needs " + std::to_string(layout.total_bytes) +
                         " (a zero-length or truncated remnant)");
  }
  // Map exactly what the layout needs: nothing past it is ever read.
  Result<Mapping> mapped = Mapping::Map(static_cast<size_t>(layout.total_bytes), PROT_READ,
                                        MAP_SHARED, fd, Concat("shared region ", names.region));
  if (!mapped.ok()) {
    return ResourceExhaustedError("cannot map shared region " + names.region + " (" +
                                  FormatSize(layout.total_bytes) +
                                  "): " + mapped.status().message());
  }
  Mapping mapping = std::move(mapped).value();
  Result<std::vector<size_t>> valid =
      ValidateSharedRegion(mapping.data(), mapping.size_bytes(), digest, specs);
  if (!valid.ok()) {
    return DataLossError("shared region " + names.region + " is not READY: " +
                         valid.status().message());
  }
  return mapping;
}

bool MeansRebuild(const Status& s) {
  return s.code() == StatusCode::kNotFound || s.code() == StatusCode::kDataLoss;
}

// Unlinks the region and its lock file. REQUIRES: `lock` holds LOCK_EX on
// the file at its path (so no process holds the region).
void UnlinkRegionAndLock(const RegionNames& names) {
  ::shm_unlink(names.region.c_str());
  ::unlink(names.lock_path.c_str());
}

Status CreateError(std::string_view key, const RegionNames& names, uint64_t bytes, int err,
                   std::string_view step) {
  if (err == ENOSPC || err == ENOMEM || err == EFBIG) {
    return ResourceExhaustedError(std::string(key) + ": cannot allocate shared region " +
                                  names.region + " of " + FormatSize(bytes) + " (" +
                                  std::to_string(bytes) + " bytes): " + std::string(step) + ": " +
                                  ErrnoText(err) +
                                  "; free host memory or space in the shm file system (/dev/shm "
                                  "size), or use the private store");
  }
  return InternalError(std::string(key) + ": cannot create shared region " + names.region + ": " +
                       std::string(step) + ": " + ErrnoText(err));
}

// Builds the region from scratch (Note [Recovery]) and returns its mapping,
// read-only, READY. REQUIRES: `lock` holds LOCK_EX on the current lock file.
// On any error (or an exception from `fill`) the region and the lock file
// are unlinked.
Result<Mapping> CreateAndFill(std::string_view key, const RegionNames& names, uint32_t mode,
                              uint64_t digest, const Layout& layout, const WeightFill& fill) {
  struct Abandon {  // unlinks the partial region unless disarmed
    const RegionNames* names;
    bool armed = true;
    ~Abandon() {
      if (armed) UnlinkRegionAndLock(*names);
    }
  } abandon{&names};

  const uint64_t total = layout.total_bytes;
  int fd = -1;
  for (int attempt = 0; attempt < 2 && fd < 0; ++attempt) {
    if (::shm_unlink(names.region.c_str()) != 0 && errno != ENOENT) {
      const int err = errno;
      if (err == EACCES || err == EPERM) {
        abandon.armed = false;  // not ours to remove
        return RegionAccessError(names, mode, err, "remove the stale");
      }
      return InternalError("cannot remove the stale shared region " + names.region + ": " +
                           ErrnoText(err));
    }
    fd = ::shm_open(names.region.c_str(), O_RDWR | O_CREAT | O_EXCL, mode);
    if (fd < 0 && errno != EEXIST) {
      const int err = errno;
      if (err == EACCES || err == EPERM) return RegionAccessError(names, mode, err, "create");
      return CreateError(key, names, total, err, "shm_open");
    }
  }
  if (fd < 0) {
    return InternalError("shared region " + names.region +
                         " reappeared right after it was removed; a process that does not "
                         "take the lock file " + names.lock_path + " is creating it");
  }
  UniqueFd owned(fd);
  if (::fchmod(fd, mode) != 0) return CreateError(key, names, total, errno, "fchmod");
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    return CreateError(key, names, total, errno, "ftruncate");
  }
  // Reserve the pages now: a full tmpfs is an error here, not a SIGBUS in fill.
  if (total > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(total)) != 0 &&
      errno != EOPNOTSUPP && errno != ENOSYS) {
    return CreateError(key, names, total, errno, "fallocate");
  }
  Result<Mapping> mapped = Mapping::Map(static_cast<size_t>(total), PROT_READ | PROT_WRITE,
                                        MAP_SHARED, fd, Concat("shared region ", names.region));
  if (!mapped.ok()) {
    if (mapped.status().code() == StatusCode::kResourceExhausted) {
      return ResourceExhaustedError(std::string(key) + ": cannot allocate shared region " +
                                    names.region + " of " + FormatSize(total) + " (" +
                                    std::to_string(total) + " bytes): " +
                                    mapped.status().message() +
                                    "; free host memory or space in the shm file system "
                                    "(/dev/shm size), or use the private store");
    }
    return InternalError(std::string(key) + ": cannot create shared region " + names.region +
                         ": " + mapped.status().message());
  }
  Mapping mapping = std::move(mapped).value();
  owned.reset();

  uint8_t* base = mapping.data();
  WriteRegionHeader(base, digest, layout);  // ready = 0 until the fill is synced

  ARBITER_RETURN_IF_ERROR(RunFill(key, base, layout, fill));

  if (::msync(base, mapping.size_bytes(), MS_SYNC) != 0) {
    return CreateError(key, names, total, errno, "msync");
  }
  MarkRegionReady(base);  // last: no reader sees a partial region as READY
  if (::msync(base, mapping.size_bytes(), MS_SYNC) != 0) {
    return CreateError(key, names, total, errno, "msync");
  }
  ::mprotect(base, mapping.size_bytes(), PROT_READ);
  abandon.armed = false;
  return mapping;
}

class SharedHostFloor final : public FloorBase {
 public:
  SharedHostFloor(Mapping mapping, LockFile lock, RegionNames names, const Layout& layout,
                  bool filled_here)
      : mapping_(std::move(mapping)), lock_(std::move(lock)), names_(std::move(names)) {
    SetLayout(mapping_.data(), layout, PageRound(mapping_.size_bytes()), filled_here,
              names_.region);
  }

  // Detaches; the last holder on the node unlinks the region and lock file.
  ~SharedHostFloor() override {
    mapping_.reset();
    if (::flock(lock_.fd.get(), LOCK_EX | LOCK_NB) == 0 &&
        IsCurrent(lock_.fd.get(), lock_.path)) {
      UnlinkRegionAndLock(names_);
    }
    // Closing the fd drops our lock.
  }

 private:
  Mapping mapping_;
  LockFile lock_;
  RegionNames names_;
};

// Unlinks the region `base` (or, with !region_exists, only its lock file)
// when no process holds it. Returns true when it unlinked the region.
bool UnlinkIfHolderFree(const SharedWeightStoreOptions& options, const std::string& base,
                        bool region_exists) {
  const RegionNames names = NamesOf(options, base);
  Result<LockFile> lock = OpenLockFile(names.lock_path, options.mode);
  if (!lock.ok()) return false;
  Result<bool> exclusive = TryLock(&*lock, LOCK_EX);
  if (!exclusive.ok() || !*exclusive) return false;
  bool unlinked = false;
  if (region_exists) unlinked = ::shm_unlink(names.region.c_str()) == 0;
  ::unlink(names.lock_path.c_str());
  return unlinked;
}

Result<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    if (err == EACCES) {
      return PermissionDeniedError("cannot list the shm directory " + dir + ": " + ErrnoText(err));
    }
    return InternalError("cannot list the shm directory " + dir + ": " + ErrnoText(err));
  }
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

// After an attach: unlink holder-free regions of the same sanitized key with
// another digest (stale versions). Best effort.
void SweepStaleVersions(const SharedWeightStoreOptions& options, std::string_view key,
                        uint64_t digest) {
  Result<std::vector<std::string>> entries = ListDir(options.shm_dir);
  if (!entries.ok()) return;
  const std::string sanitized = SanitizeKey(key);
  const std::string ours = DigestHex(digest);
  for (const std::string& name : *entries) {
    ParsedEntry e;
    if (!ParseEntry(options.prefix, name, &e) || e.is_lock) continue;
    if (e.sanitized_key != sanitized || e.digest_hex == ours) continue;
    UnlinkIfHolderFree(options, e.base, /*region_exists=*/true);
  }
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

// ---- public functions ----------------------------------------------------------

size_t WeightSpecBytes(const WeightSpec& spec) {
  Result<size_t> bytes = CheckedSpecBytes(spec, 0);
  return bytes.ok() ? *bytes : std::numeric_limits<size_t>::max();
}

// ---- PrivateWeightStore --------------------------------------------------------

Result<std::unique_ptr<HostFloor>> PrivateWeightStore::Materialize(
    std::string_view key, uint64_t digest, const std::vector<WeightSpec>& specs,
    const WeightFill& fill) {
  (void)digest;  // names shared regions only
  if (key.empty()) {
    return InvalidArgumentError("private weight store: empty key; pass the model's name");
  }
  if (!fill) return InvalidArgumentError(std::string(key) + ": no fill callback");
  Result<Layout> computed = ComputeLayout(specs, /*with_header=*/false);
  if (!computed.ok()) return computed.status().WithPrefix(key);
  const Layout& layout = *computed;
  // mmap refuses length 0; a floor of 0 bytes still gets one page so that
  // every array pointer is non-null.
  const uint64_t length = PageRound(std::max<uint64_t>(layout.total_bytes, 1));
  Result<Mapping> mapped =
      Mapping::Map(static_cast<size_t>(length), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, Concat("host floor of ", key));
  if (!mapped.ok()) {
    return ResourceExhaustedError(std::string(key) + ": cannot allocate a host floor of " +
                                  FormatSize(layout.total_bytes) + " (" +
                                  std::to_string(layout.total_bytes) +
                                  " bytes): " + mapped.status().message() +
                                  "; free host memory or unpin models");
  }
  Mapping mapping = std::move(mapped).value();
  ARBITER_RETURN_IF_ERROR(RunFill(key, mapping.data(), layout, fill));
  ::mprotect(mapping.data(), mapping.size_bytes(), PROT_READ);
  return std::unique_ptr<HostFloor>(new PrivateHostFloor(std::move(mapping), layout));
}

// ---- SharedWeightStore ---------------------------------------------------------

Result<std::unique_ptr<SharedWeightStore>> SharedWeightStore::Create(
    SharedWeightStoreOptions options) {
  if (options.prefix.empty() || options.prefix.size() > kMaxPrefixBytes ||
      SanitizeKey(options.prefix) != options.prefix) {
    return InvalidArgumentError("shared weight store: prefix \"" + SanitizeKey(options.prefix) +
                                "\" (" + std::to_string(options.prefix.size()) +
                                " bytes) must be 1-" + std::to_string(kMaxPrefixBytes) +
                                " bytes of [A-Za-z0-9._-] (no '/')");
  }
  if ((options.mode & ~uint32_t{0777}) != 0) {
    return InvalidArgumentError("shared weight store: mode " + ModeText(options.mode) +
                                " has bits outside 0777; use 0600 or 0660");
  }
  struct stat st;
  if (options.shm_dir.empty() || ::stat(options.shm_dir.c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return InvalidArgumentError("shared weight store: shm_dir \"" + options.shm_dir +
                                "\" is not a directory; use the directory where shm_open "
                                "regions appear (/dev/shm on Linux)");
  }
  if (options.ready_wait_ms < 0 || options.poll_interval_ms < 1) {
    return InvalidArgumentError("shared weight store: ready_wait_ms (" +
                                std::to_string(options.ready_wait_ms) +
                                ") must be >= 0 and poll_interval_ms (" +
                                std::to_string(options.poll_interval_ms) + ") >= 1");
  }
  return std::unique_ptr<SharedWeightStore>(new SharedWeightStore(std::move(options)));
}

std::string SharedWeightStore::RegionName(std::string_view key, uint64_t digest) const {
  // Appended, not "/" + BaseName(...): gcc 12 raises a false -Wrestrict on
  // operator+(const char*, string&&) (GCC bug 105329).
  std::string name = "/";
  name += BaseName(options_.prefix, key, digest);
  return name;
}

Result<std::unique_ptr<HostFloor>> SharedWeightStore::Materialize(
    std::string_view key, uint64_t digest, const std::vector<WeightSpec>& specs,
    const WeightFill& fill) {
  if (key.empty()) {
    return InvalidArgumentError("shared weight store: empty key; pass the model's name");
  }
  if (!fill) return InvalidArgumentError(std::string(key) + ": no fill callback");
  Result<Layout> computed = ComputeLayout(specs, /*with_header=*/true);
  if (!computed.ok()) return computed.status().WithPrefix(key);
  const Layout& layout = *computed;
  RegionNames names = NamesOf(options_, BaseName(options_.prefix, key, digest));
  ARBITER_ASSIGN_OR_RETURN(LockFile lock, OpenLockFile(names.lock_path, options_.mode));

  auto make_floor = [&](Mapping mapping, bool filled_here) -> Result<std::unique_ptr<HostFloor>> {
    std::unique_ptr<HostFloor> floor(new SharedHostFloor(std::move(mapping), std::move(lock),
                                                         names, layout, filled_here));
    SweepStaleVersions(options_, key, digest);
    return floor;
  };

  Clock* clock = Clock::Real();
  const int64_t deadline_ms = clock->NowMs() + options_.ready_wait_ms;
  std::string not_ready = "it does not exist";
  for (;;) {
    // 1. A READY region: attach under a shared lock and keep the lock.
    ARBITER_ASSIGN_OR_RETURN(bool shared, TryLock(&lock, LOCK_SH));
    if (shared) {
      Result<Mapping> attached = AttachReady(names, options_.mode, digest, specs, layout);
      if (attached.ok()) return make_floor(std::move(attached).value(), /*filled_here=*/false);
      if (!MeansRebuild(attached.status())) return attached.status();
      not_ready = attached.status().message();
      Unlock(lock);
    }
    // 2. Not READY (or a filler holds it): build it if no one else holds it.
    ARBITER_ASSIGN_OR_RETURN(bool exclusive, TryLock(&lock, LOCK_EX));
    if (exclusive) {
      Result<Mapping> attached = AttachReady(names, options_.mode, digest, specs, layout);
      bool filled_here = false;
      if (!attached.ok()) {
        if (!MeansRebuild(attached.status())) return attached.status();
        attached = CreateAndFill(key, names, options_.mode, digest, layout, fill);
        if (!attached.ok()) return attached.status();  // unlinked; closing the fd unlocks
        filled_here = true;
      }
      ARBITER_RETURN_IF_ERROR(Downgrade(lock));
      return make_floor(std::move(attached).value(), filled_here);
    }
    // 3. Refused: another process fills it, or holds a region we cannot use.
    const int64_t now_ms = clock->NowMs();
    if (now_ms >= deadline_ms) {
      return DeadlineExceededError(
          std::string(key) + ": shared region " + names.region + " was not READY within " +
          std::to_string(options_.ready_wait_ms) + " ms while another process holds its lock " +
          names.lock_path + " (last look: " + not_ready +
          "). If a process is still filling it, wait or raise ready_wait_ms; if it is stuck, "
          "stop it (fuser " + names.lock_path + "), or remove " + names.path + " and " +
          names.lock_path + " once no process uses them");
    }
    const int64_t sleep_ms = std::min(options_.poll_interval_ms, deadline_ms - now_ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
}

Result<std::vector<std::string>> SharedWeightStore::SweepOrphans(
    const std::set<std::string>& live_keys) {
  std::set<std::string> live;
  for (const std::string& key : live_keys) live.insert(SanitizeKey(key));
  ARBITER_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDir(options_.shm_dir));
  std::sort(entries.begin(), entries.end());  // a region before its ".lock"
  std::vector<std::string> unlinked;
  for (const std::string& name : entries) {
    ParsedEntry e;
    if (!ParseEntry(options_.prefix, name, &e) || live.count(e.sanitized_key) != 0) continue;
    const RegionNames names = NamesOf(options_, e.base);
    if (e.is_lock) {
      // A lock file whose region is gone (a crash between the two unlinks).
      if (PathExists(names.lock_path) && !PathExists(names.path)) {
        UnlinkIfHolderFree(options_, e.base, /*region_exists=*/false);
      }
      continue;
    }
    if (UnlinkIfHolderFree(options_, e.base, /*region_exists=*/true)) {
      unlinked.push_back(names.region);
    }
  }
  return unlinked;
}

}  // namespace arbiter
