// arbiter/runtime/backend_models.h — [[models]] served by the `backends`
// layer (PocketSphinx, Flite, eSpeak NG, Tesseract, external processes) as
// MemoryArbiter registrations (issue 14 points 1 and 3).
//
// A capability has one registration (MemoryArbiter's contract); its models
// may be built-in engines and backends side by side (a process-backed chat
// model beside demo-chat), so MergeRegistrations joins the engine
// registration of a capability with its backend one, dispatching each model
// key to the side that owns it.
//
// Note [Measured footprints]
// A backend's cost is measured, not guessed: each load runs under one
// process-wide lock (two measured loads never overlap, so neither blurs the
// other's figure), between two reads of the process's RssAnon + RssFile
// (heap trimmed first: Note [Where freed memory goes] in
// base/buffer_memory.cc); the difference is the model's bytes, charged to
// the ledger under its resident key with kind `model`. Before the first
// load the estimate is the model files' size. After the model's first run
// the reading is refreshed the same way around that run (lazy allocations:
// PocketSphinx's search structures, Tesseract's line recognizer), and the
// arbiter's entry is resized (MemoryArbiter::UpdateResidentBytes). A process
// model is measured from /proc every second instead (its process group's
// RSS) — see ProcessWatch in backend_models.cc.
//
// Thread safety: the registration's callables are thread-safe; each loaded
// backend is thread-compatible and used by its key's one queue worker.
#pragma once

#include <any>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/backends/pocketsphinx.h"
#include "arbiter/backends/process_model.h"
#include "arbiter/backends/tesseract_ocr.h"
#include "arbiter/backends/tts.h"
#include "arbiter/base/cancel.h"
#include "arbiter/base/mutex.h"
#include "arbiter/formats/audio.h"
#include "arbiter/formats/image.h"
#include "arbiter/runtime/config.h"
#include "arbiter/runtime/modalities.h"

namespace arbiter {

// One loaded backend model: exactly one of the engine pointers is set,
// matching entry.engine. The arbiter's handle gives it as
// backend<BackendModel>().
struct BackendModel {
  ModelEntry entry;
  std::unique_ptr<PocketSphinxAsr> asr;       // transcribe
  std::unique_ptr<PocketSphinxVad> vad;       // vad
  std::unique_ptr<TtsEngine> tts;             // speak
  std::unique_ptr<TesseractOcr> ocr;          // vision-describe
  std::unique_ptr<ProcessModel> process;      // engine = process
  size_t measured_bytes = 0;                  // Note [Measured footprints]
  // The part of measured_bytes that is file-backed pages (RssFile): charged,
  // but outside the process's RssAnon + RssShmem that the ledger is
  // compared with (BackendContext::OutsideBytes).
  size_t file_bytes = 0;
  bool refreshed = false;                     // first-run refresh done (queue worker only)
};

// One queued run of a backend model (the payload of MemoryArbiter::Request,
// as std::shared_ptr<BackendJob>); the result's std::any holds the type
// named per kind.
struct BackendJob {
  enum class Kind { kTranscribe, kVad, kSpeak, kDescribe };
  Kind kind = Kind::kTranscribe;
  Cancellation cancelled;
  std::shared_ptr<const DecodedAudio> audio;  // transcribe → Transcript; vad → vector<SpeechSegment>
  std::string text, voice;                    // speak → SpeechStart (after the sink ran)
  double speed = 1.0;
  std::function<bool(const SpeechStart&)> on_start;  // speak: before the first samples
  PcmSink sink;                                // speak
  std::shared_ptr<const GrayImage> image;      // describe → OcrResult
};

// Counters of one process-backed model (metrics, status).
struct ProcessModelStats {
  std::string name;
  uint64_t starts = 0;
  uint64_t crashes = 0;            // exits not asked for
  uint64_t over_budget_stops = 0;  // stopped because the budget could not hold it
  uint64_t rss_bytes = 0;          // last measurement (0 when not running)
  std::string last_exit;           // "exit 3: <stderr tail>" of the last crash
};

// Shared by every backend registration of one runtime: the process
// supervisor and the watcher of process models (ProcessWatch: RSS every
// second → the ledger; crashes; over budget). Thread-safe.
class BackendContext {
 public:
  // `supervisor` may be null when no process model is configured.
  BackendContext(ProcessSupervisor* supervisor, MemoryLedger* ledger);
  ~BackendContext();  // Stop()
  BackendContext(const BackendContext&) = delete;
  BackendContext& operator=(const BackendContext&) = delete;

  // REQUIRES: before the first load. `make_room(model)` is the runtime's
  // reclaim policy for a charge that grew: true when the ledger is within
  // its budget again.
  void Bind(MemoryArbiter* arbiter, std::function<bool(const std::string&)> make_room);
  // Stops the watcher (before the arbiter shuts down). Idempotent.
  void Stop();

  ProcessSupervisor* supervisor() const { return supervisor_; }
  MemoryArbiter* arbiter() const { return arbiter_; }
  // A loaded model's size measured again (first run, a child's RSS):
  // resizes its entry (MemoryArbiter::UpdateResidentBytes) and, when that
  // leaves the ledger over its budget, asks the reclaim policy for room
  // (idle models are evicted; this one is held by its caller or measured as
  // a child). False when the ledger is still over budget.
  bool Remeasured(Capability capability, const std::string& model, size_t bytes);
  // Watches a loaded process model until it is freed.
  void Watch(Capability capability, std::weak_ptr<BackendModel> model);
  // Backoff before restarting `model` after crashes (0 without a crash).
  int64_t RestartDelayMs(const std::string& model);
  void CountStart(const std::string& model);
  std::vector<ProcessModelStats> ProcessStats() const;
  // Bytes charged to the ledger that are not in this process's RssAnon +
  // RssShmem: the file-backed part of loaded backends and the RSS of
  // process models' children (docs/memory.md "The ledger is the truth").
  uint64_t OutsideBytes() const;
  void AddFileBytes(int64_t delta) { file_bytes_.fetch_add(delta); }
  // One pass of the watcher (tests call it directly).
  void WatchOnce();

 private:
  struct Watched {
    Capability capability;
    std::string name;
    std::weak_ptr<BackendModel> model;
  };
  void WatchLoop();

  ProcessSupervisor* const supervisor_;
  MemoryLedger* const ledger_;
  MemoryArbiter* arbiter_ = nullptr;
  std::function<bool(const std::string&)> make_room_;
  mutable Mutex mu_;
  CondVar wake_{&mu_};
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<Watched> watched_ GUARDED_BY(mu_);
  std::map<std::string, ProcessModelStats> stats_ GUARDED_BY(mu_);
  std::map<std::string, int64_t> last_crash_ms_ GUARDED_BY(mu_);
  std::thread thread_;  // started by the first Watch()
  std::atomic<int64_t> file_bytes_{0};
};

// The file size estimate of a backend entry (Note [Measured footprints]).
size_t EstimateBackendBytes(const ModelEntry& entry);

// The registration of `capability` for its entries whose engine is not
// builtin (empty model_keys when there are none).
CapabilityRegistration BackendCapabilityRegistration(Capability capability,
                                                     const std::vector<ModelEntry>& entries,
                                                     std::shared_ptr<BackendContext> context);

// One registration serving both: keys of `backends` go to its callables,
// every other key to `builtin`'s. model_keys keep configuration order as
// given by `order`.
CapabilityRegistration MergeRegistrations(CapabilityRegistration builtin,
                                          CapabilityRegistration backends,
                                          const std::vector<std::string>& order);

}  // namespace arbiter
