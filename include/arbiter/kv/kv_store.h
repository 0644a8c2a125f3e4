// arbiter/kv/kv_store.h — the disk tier of the KV precache: one directory of
// saved conversation KV per model, with TTL classes and a byte budget.
//
// Implements docs/kv-precache.md: the file names of "Keys and names", the
// persist/restore and the eviction sweep of "Persistence" ("missing or
// corrupt KV files always fall back to a cold prefill"), with two of the
// reference's defects fixed (docs/kv-precache.md "Defects of the reference,
// fixed"): safe file names (a conversation id can never name a path outside
// its model's directory) and no slot count in the model hash (saved KV
// survives resizing `parallel`).
//
// Layout:
//   <dir>/                                   the [kv] dir, created 0700
//     <model hash>/                          16 lower-case hex (ModelHash())
//       <SafeFileId(conversation id)>.<short|long|extended>.bin   kv_file.h v1
//       <...>.bin.tmp.<pid>.<n>              an atomic write in progress
//                                            (or left by a crash)
// Only regular "*.bin" files in model-hash subdirectories belong to the
// store: they are listed, counted against the budget, expired and evicted.
// Anything else in <dir> — other names, directories, symlinks, sockets — is
// never followed, counted or deleted.
//
// Time: a file's age is clock->NowUnixMs() − its mtime. Save() and Touch()
// stamp the mtime with clock->NowUnixMs(), so with a SimulatedClock every
// age is on the simulated timeline.
//
// Example:
//   KvStoreOptions o;
//   o.dir = "/var/lib/arbiter/kv";
//   o.disk_budget = 8ull << 30;
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> store, KvStore::Open(o));
//   snapshot.model_hash = ModelHash(inputs);
//   ARBITER_RETURN_IF_ERROR(store->Save("room-42", TtlClass::kLong, snapshot).status());
//   Result<KvLoadResult> r = store->Load(snapshot.model_hash, "room-42");
//   if (!r.ok()) { /* any error: prefill from scratch */ }
//
// Thread safety: thread-safe. Operations on one conversation (model hash +
// conversation id) are serialized: a Save, Load, Remove or Touch of it waits
// for the one in progress, so a Load never sees a half-done Save and two
// Saves of different classes cannot delete each other's file. Operations on
// different conversations run their file IO in parallel. Budget enforcement
// and Sweep run one at a time and skip the files of conversations busy at
// that moment (they are looked at again on the next pass). No lock is held
// across file IO except the one that serializes those eviction passes.
// Lifetime: the clock must outlive the store.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"
#include "arbiter/engine/kv_snapshot.h"
#include "arbiter/kv/cache_key.h"
#include "arbiter/kv/kv_file.h"

namespace arbiter {

// Temp files of an interrupted atomic write older than this are removed by
// Sweep() (1 min; a write in progress is younger, and its conversation is
// busy, so it is skipped anyway).
inline constexpr int64_t kKvStaleTempFileMs = 60000;

struct KvStoreOptions {
  std::string dir;           // the [kv] dir; created (0700) if missing
  TtlWindows ttl;            // per-class windows (cache_key.h)
  uint64_t disk_budget = 0;  // bytes of *.bin under dir; 0 = unlimited
  Clock* clock = nullptr;    // null → Clock::Real(); ages use clock->NowUnixMs()
};

// One saved file (List()).
struct KvFileInfo {
  std::string model_hash;  // the subdirectory
  std::string file_name;   // "<safe id>.<class>.bin"
  TtlClass ttl_class;      // kUnclassified for files without a class
  uint64_t bytes = 0;
  int64_t age_ms = 0;  // now − mtime (negative for an mtime in the future)
};

// What a Sweep() removed.
struct KvSweepResult {
  int expired = 0;           // *.bin files past their class's window
  int over_budget = 0;       // *.bin files evicted, oldest first, for the disk budget
  uint64_t bytes_freed = 0;  // bytes of those *.bin files
  int stale_temp = 0;        // leftover temp files (not in bytes_freed)
};

// A restored conversation (Load()).
struct KvLoadResult {
  KvSnapshot snapshot;  // validated; snapshot.model_hash == the model hash asked for
  TtlClass ttl_class = TtlClass::kUnclassified;  // the class of the file it came from
  std::string path;                              // that file
};

// A restored conversation, mapped (LoadMapped()).
struct KvMappedLoadResult {
  MappedKvFile file;  // validated; file.model_hash() == the model hash asked for
  TtlClass ttl_class = TtlClass::kUnclassified;  // the class of the file
};

class KvStore {
 public:
  // Creates `options.dir` (and missing parents, mode 0700) if needed.
  // Errors (messages name the dir): kInvalidArgument for an empty dir;
  // kFailedPrecondition when it exists and is not a directory; the OS error
  // (kPermissionDenied, ...) when it cannot be created or is not writable.
  static Result<std::unique_ptr<KvStore>> Open(KvStoreOptions options);

  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // <dir>/<model_hash>/<SafeFileId(conversation_id)>.<class>.bin, or
  // <dir>/<model_hash>/<SafeFileId(conversation_id)>.bin for kUnclassified.
  // Can never leave <dir>/<model_hash>/: the id goes through SafeFileId.
  // Returns "" when model_hash is not IsModelHash() (it would be a path
  // component chosen by the caller).
  std::string PathFor(std::string_view model_hash, std::string_view conversation_id,
                      TtlClass ttl) const;

  // Writes `snapshot` as the conversation's file of class `ttl`, atomically
  // (WriteKvFile: a crash leaves the old file or the new one, never a
  // partial one), stamps its mtime with the clock, removes the
  // conversation's files of the other classes (and an unclassified one),
  // then enforces disk_budget: other files are removed oldest mtime first
  // until the *.bin total fits, never the file just written.
  // When the file alone would exceed disk_budget nothing is written, the
  // conversation's existing files are removed (they are older than this
  // state) and kResourceExhausted is returned.
  // Returns the bytes written (KvFileBytes(snapshot)).
  // Errors: kInvalidArgument when snapshot.model_hash is not IsModelHash(),
  // ttl is kUnclassified, or WriteKvFile rejects the snapshot;
  // kResourceExhausted as above; kFailedPrecondition when <dir>/<model hash>
  // exists and is not a directory (e.g. a symlink); the file-system error
  // of the write (the previous file, if any, is kept).
  Result<uint64_t> Save(std::string_view conversation_id, TtlClass ttl, const KvSnapshot& snapshot)
      EXCLUDES(mu_, evict_mu_);
  // The same from rows viewed in place (Engine::VisitSlot: a slot saved
  // without a snapshot), for model `model_hash`; same checks and errors.
  Result<uint64_t> Save(std::string_view conversation_id, TtlClass ttl,
                        const std::string& model_hash, const KvRowsView& rows);

  // The conversation's newest file (by mtime) among its short, long,
  // extended and unclassified ("<safe id>.bin") files, validated with
  // ReadKvFile(path, model_hash, kv_type) (nullopt: any KV type). Files
  // past their class's window count as absent and are removed.
  // Errors: kInvalidArgument when model_hash is not IsModelHash();
  // kNotFound when there is no (unexpired) file; kDataLoss (corrupt,
  // truncated) or kFailedPrecondition (another model's file, or K/V of
  // another type than `kv_type`) — the file is
  // REMOVED, a warning is logged, and the message names the path and the
  // problem; another read error (e.g. kPermissionDenied) as it is, the file
  // kept. On any error the caller prefills from scratch.
  Result<KvLoadResult> Load(std::string_view model_hash, std::string_view conversation_id,
                            std::optional<GgmlType> kv_type = std::nullopt) EXCLUDES(mu_);
  // The same file choice, validation and errors (a bad file is removed), but
  // the file is mapped, not copied (MapKvFile): a restore copies its K/V
  // once, straight into the slot. The mapping outlives a later Save (rename
  // over it), Remove or Sweep of the conversation: it keeps the data it
  // validated.
  Result<KvMappedLoadResult> LoadMapped(std::string_view model_hash,
                                        std::string_view conversation_id,
                                        std::optional<GgmlType> kv_type = std::nullopt)
      EXCLUDES(mu_);

  // Whether the conversation has a regular, unexpired file (not validated).
  // False for an invalid model hash.
  bool Contains(std::string_view model_hash, std::string_view conversation_id) const;

  // Deletes the conversation's files (all classes and unclassified); returns
  // how many. 0 for an invalid model hash.
  int Remove(std::string_view model_hash, std::string_view conversation_id) EXCLUDES(mu_);

  // Sets the mtime of the conversation's files to now (keep-alive: a
  // conversation in use is neither expired nor the budget's oldest).
  // Nothing for an invalid model hash or when it has no file.
  void Touch(std::string_view model_hash, std::string_view conversation_id) EXCLUDES(mu_);

  // Over every model-hash subdirectory: removes *.bin files past their
  // class's window (SweepExpiredKvFiles semantics: age > window,
  // unclassified = long), then, over budget, the oldest *.bin files until the
  // total fits; also temp files of an interrupted write older than
  // kKvStaleTempFileMs. Files of conversations busy at that moment are
  // skipped. Directories that cannot be listed are skipped.
  KvSweepResult Sweep() EXCLUDES(mu_, evict_mu_);

  // Saves that failed to write (mkdir, write, fsync, rename: e.g. a full
  // disk) since Open(); a refusal for the disk budget is not counted.
  uint64_t write_errors() const { return write_errors_.load(); }

  // Every *.bin file, sorted by model hash, then file name.
  std::vector<KvFileInfo> List() const;
  // Σ bytes of those files.
  uint64_t DiskBytes() const;

  const std::string& dir() const { return dir_; }
  uint64_t disk_budget() const { return disk_budget_; }
  const TtlWindows& ttl() const { return ttl_; }

 private:
  class ConversationClaim;
  struct ScannedFile;

  KvStore(std::string dir, TtlWindows ttl, uint64_t disk_budget, Clock* clock);

  // Load and LoadMapped with `read` (ReadKvFile or MapKvFile).
  template <typename T, typename Read>
  Result<T> LoadWith(std::string_view model_hash, std::string_view conversation_id,
                     const Read& read, TtlClass* ttl_class, std::string* path) EXCLUDES(mu_);

  // Per-conversation serialization (see the .cc's Note [Claims]). `key` is
  // "<model hash>/<safe id>".
  void Claim(const std::string& key) EXCLUDES(mu_);
  bool TryClaim(const std::string& key) EXCLUDES(mu_);
  void Unclaim(const std::string& key) EXCLUDES(mu_);

  // Unlinks the temp files of interrupted saves whose writing process is
  // gone (killed mid-save: they can never be renamed into place), at Open,
  // rather than a minute later in Sweep(); returns how many.
  int RemoveOrphanTemps() EXCLUDES(mu_);

  // Every regular *.bin (and temp) file of the valid model subdirectories.
  std::vector<ScannedFile> Scan(bool with_temps) const;
  // Removes the oldest files not of a busy conversation until the *.bin
  // total fits disk_budget_. REQUIRES: evict_mu_ held.
  void EnforceBudgetLocked(KvSweepResult* result) REQUIRES(evict_mu_) EXCLUDES(mu_);

  const std::string dir_;
  const TtlWindows ttl_;
  const uint64_t disk_budget_;
  Clock* const clock_;
  std::atomic<uint64_t> write_errors_{0};

  // Serializes eviction passes (Save's budget enforcement, Sweep): two
  // passes over the same listing would evict twice. Held across their file
  // IO; nothing else takes it. Taken before mu_.
  Mutex evict_mu_ ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  CondVar claim_released_{&mu_};
  std::set<std::string, std::less<>> claimed_ GUARDED_BY(mu_);
};

}  // namespace arbiter
