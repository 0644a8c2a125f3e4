// [[models]] served by the backends layer as MemoryArbiter registrations;
// see backend_models.h and Note [Measured footprints] there.
//
// Note [Process models under the budget]
// A process model's charge is its process group's RSS (RssAnon + RssFile +
// RssShmem of every process in the group, from /proc), read when it became
// healthy and then every second by the watcher, which resizes the arbiter's
// entry (kind `model`). When a reading leaves the ledger over its budget the
// runtime's reclaim policy is asked for room (it evicts idle models by
// priority); when that cannot make room the child is stopped and unloaded,
// logged as over budget. A child that exits on its own is logged with its
// exit status and the tail of its stderr, unloaded, and counted as a crash;
// the next acquire starts it again after a backoff (1 s doubling to 30 s
// while crashes keep coming within a minute of each other).
#include "arbiter/runtime/backend_models.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/buffer_memory.h"
#include "arbiter/base/clip.h"
#include "arbiter/base/size.h"
#include "arbiter/memory/system_memory.h"
#include "arbiter/runtime/models.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kWatchPeriodMs = 1000;
constexpr int64_t kFirstBackoffMs = 1000;
constexpr int64_t kMaxBackoffMs = 30000;
// Flite's voices are compiled into its libraries and eSpeak NG's data is a
// few MiB: estimates until the first measurement.
constexpr size_t kFliteEstimateBytes = 16u << 20;
constexpr size_t kEspeakEstimateBytes = 16u << 20;

// Note [Measured footprints]: one measured load or first run at a time.
Mutex& MeasureMutex() {
  static Mutex mu;
  return mu;
}

// RssAnon + RssShmem and RssFile of the process, after a heap trim.
struct Footprint {
  uint64_t own = 0;
  uint64_t file = 0;
};
Footprint ReadFootprint() {
  TrimProcessHeap();
  Result<ProcessMemoryInfo> m = ReadProcessMemory();
  if (!m.ok()) return {};
  return {m->anon_bytes + m->shmem_bytes, m->file_bytes};
}
uint64_t Grown(uint64_t before, uint64_t after) { return after > before ? after - before : 0; }

PocketSphinxOptions SphinxOptions(const ModelEntry& e) {
  PocketSphinxOptions o;
  if (!e.path.empty()) o.model_dir = e.path;
  return o;
}

TesseractOptions OcrOptions(const ModelEntry& e) {
  TesseractOptions o;
  o.language = e.language;
  o.tessdata_dir = e.path;
  return o;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Loads an in-process backend (not a process model).
Status LoadInProcess(BackendModel* m) {
  const ModelEntry& e = m->entry;
  switch (e.engine) {
    case ModelEngine::kPocketSphinx: {
      if (e.capability == Capability::kVad) {
        ARBITER_ASSIGN_OR_RETURN(m->vad, PocketSphinxVad::Load(SphinxOptions(e)));
      } else {
        ARBITER_ASSIGN_OR_RETURN(m->asr, PocketSphinxAsr::Load(SphinxOptions(e)));
      }
      return OkStatus();
    }
    case ModelEngine::kFlite: {
      ARBITER_ASSIGN_OR_RETURN(m->tts, LoadFliteTts());
      return OkStatus();
    }
    case ModelEngine::kEspeakNg: {
      ARBITER_ASSIGN_OR_RETURN(m->tts, LoadEspeakNgTts(e.path));
      return OkStatus();
    }
    case ModelEngine::kTesseract: {
      ARBITER_ASSIGN_OR_RETURN(m->ocr, TesseractOcr::Load(OcrOptions(e)));
      return OkStatus();
    }
    case ModelEngine::kBuiltin:
    case ModelEngine::kProcess:
      break;
  }
  return InternalError(fmt::format("model \"{}\": engine {} is not an in-process backend", e.name,
                                   ModelEngineName(e.engine)));
}

Result<LoadedBackend> LoadProcess(const ModelEntry& e, Capability capability,
                                  const std::shared_ptr<BackendContext>& context) {
  if (context->supervisor() == nullptr) {
    return FailedPreconditionError(
        fmt::format("model \"{}\": no process supervisor (no state directory)", e.name));
  }
  if (int64_t delay = context->RestartDelayMs(e.name); delay > 0) {
    spdlog::info("model \"{}\": restarting its process in {} ms (it crashed)", e.name, delay);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  }
  ProcessModelSpec spec;
  spec.name = e.name;
  spec.command = e.process.argv;
  spec.health = e.process.health;
  spec.ready_timeout_ms = e.process.ready_timeout_ms;
  auto m = std::make_shared<BackendModel>();
  m->entry = e;
  context->CountStart(e.name);
  ARBITER_ASSIGN_OR_RETURN(m->process, context->supervisor()->Start(spec));
  m->measured_bytes = m->process->MeasureRssBytes();
  spdlog::info("model \"{}\": process {} healthy on 127.0.0.1:{}, RSS {}", e.name,
               m->process->pid(), m->process->port(), FormatSize(m->measured_bytes));
  context->Watch(capability, m);
  const size_t bytes = std::max<size_t>(m->measured_bytes, 1);
  std::shared_ptr<BackendModel> owned(std::move(m));
  LoadedBackend b = LoadedBackend::Of(std::move(owned), bytes);
  return b;
}

Result<LoadedBackend> LoadBackend(const ModelEntry& e, Capability capability,
                                  const std::shared_ptr<BackendContext>& context) {
  if (e.engine == ModelEngine::kProcess) return LoadProcess(e, capability, context);
  auto m = std::make_shared<BackendModel>();
  m->entry = e;
  {
    MutexLock l(&MeasureMutex());
    const Footprint before = ReadFootprint();
    ARBITER_RETURN_IF_ERROR(LoadInProcess(m.get()));
    const Footprint after = ReadFootprint();
    m->file_bytes = Grown(before.file, after.file);
    m->measured_bytes = Grown(before.own, after.own) + m->file_bytes;
  }
  context->AddFileBytes(static_cast<int64_t>(m->file_bytes));
  // A reading of 0 (pages another load had already faulted in) still
  // charges something: the estimate from the files, at most.
  const size_t bytes = m->measured_bytes > 0
                           ? m->measured_bytes
                           : std::max<size_t>(1, std::min<size_t>(EstimateBackendBytes(e), 1 << 20));
  // Freed on unload: the backend's memory goes back to the OS (Note [Where
  // freed memory goes] in base/buffer_memory.cc).
  std::shared_ptr<BackendModel> owned(m.get(), [keep = m, context](BackendModel*) mutable {
    context->AddFileBytes(-static_cast<int64_t>(keep->file_bytes));
    keep.reset();
    TrimProcessHeap();
  });
  spdlog::info("model \"{}\" ({}): measured {}", e.name, ModelEngineName(e.engine),
               FormatSize(bytes));
  return LoadedBackend::Of(std::move(owned), bytes);
}

Result<std::any> RunJob(BackendModel* m, BackendJob& job) {
  switch (job.kind) {
    case BackendJob::Kind::kTranscribe: {
      if (m->asr == nullptr) break;
      ARBITER_ASSIGN_OR_RETURN(Transcript t, m->asr->Transcribe(job.audio->samples, job.cancelled));
      return std::any(std::move(t));
    }
    case BackendJob::Kind::kVad: {
      if (m->vad == nullptr) break;
      ARBITER_ASSIGN_OR_RETURN(std::vector<SpeechSegment> s,
                               m->vad->Detect(job.audio->samples, job.cancelled));
      return std::any(std::move(s));
    }
    case BackendJob::Kind::kSpeak: {
      if (m->tts == nullptr) break;
      std::string voice = job.voice.empty() ? m->tts->default_voice() : job.voice;
      const std::vector<std::string> voices = m->tts->voices();
      if (std::find(voices.begin(), voices.end(), voice) == voices.end()) {
        std::string list;
        for (const std::string& v : voices) list += (list.empty() ? "" : ", ") + v;
        return InvalidArgumentError(
            fmt::format("\"voice\" \"{}\" is not one of model \"{}\"'s voices: {}", voice,
                        m->entry.name, list),
            ErrorReason::kInvalidRequest);
      }
      SpeechStart start{m->tts->sample_rate(voice), voice};
      bool started = false;
      bool stopped = false;
      PcmSink sink = [&](std::span<const int16_t> pcm) {
        if (!started) {
          started = true;
          if (!job.on_start(start)) {
            stopped = true;
            return false;
          }
        }
        if (!job.sink(pcm)) {
          stopped = true;
          return false;
        }
        return true;
      };
      Status st = m->tts->Synthesize(job.text, voice, job.speed, sink, job.cancelled);
      // What the pieces freed (Note [Speech in pieces] in
      // backends/speech_pieces.cc) goes back to the OS now, not at the
      // model's unload: the ledger charges the model's footprint only.
      TrimProcessHeap();
      if (!st.ok() && !stopped) return st;
      if (!started && !stopped) job.on_start(start);  // no audio at all: still answer
      return std::any(start);
    }
    case BackendJob::Kind::kDescribe: {
      if (m->ocr == nullptr) break;
      ARBITER_ASSIGN_OR_RETURN(OcrResult r, m->ocr->Recognize(*job.image, job.cancelled));
      return std::any(std::move(r));
    }
  }
  return InternalError(fmt::format("model \"{}\" ({}) cannot run this request", m->entry.name,
                                   ModelEngineName(m->entry.engine)));
}

}  // namespace

size_t EstimateBackendBytes(const ModelEntry& e) {
  switch (e.engine) {
    case ModelEngine::kPocketSphinx:
      return e.capability == Capability::kVad ? PocketSphinxVad::EstimateBytes(SphinxOptions(e))
                                              : PocketSphinxAsr::EstimateBytes(SphinxOptions(e));
    case ModelEngine::kFlite: return kFliteEstimateBytes;
    case ModelEngine::kEspeakNg: return kEspeakEstimateBytes;
    case ModelEngine::kTesseract: return TesseractOcr::EstimateBytes(OcrOptions(e));
    case ModelEngine::kProcess: return e.process.estimated_bytes;
    case ModelEngine::kBuiltin: break;
  }
  return 0;
}

CapabilityRegistration BackendCapabilityRegistration(Capability capability,
                                                     const std::vector<ModelEntry>& entries,
                                                     std::shared_ptr<BackendContext> context) {
  auto models = std::make_shared<std::map<std::string, ModelEntry>>();
  auto estimates = std::make_shared<std::map<std::string, size_t>>();
  CapabilityRegistration r;
  r.capability = capability;
  r.charge_kind = ChargeKind::kModel;
  r.swap_same_role = false;
  for (const ModelEntry& e : entries) {
    if (e.capability != capability || e.engine == ModelEngine::kBuiltin) continue;
    models->emplace(e.name, e);
    (*estimates)[e.name] = EstimateBackendBytes(e);
    r.model_keys.push_back(e.name);
  }
  SetPerModelFields(&r, models, estimates, std::nullopt);
  r.queue_max_for = [models](const std::string& key) -> std::optional<size_t> {
    auto it = models->find(key);
    if (it == models->end()) return std::nullopt;
    return static_cast<size_t>(it->second.queue);
  };
  r.load = [models, capability, context](const std::string& key) -> Result<LoadedBackend> {
    auto it = models->find(key);
    if (it == models->end()) {
      return NotFoundError(fmt::format("model \"{}\" not found", ClipInput(key)));
    }
    return LoadBackend(it->second, capability, context);
  };
  r.run = [context](const ArbiterHandle& h, std::any& payload) -> Result<std::any> {
    BackendModel* m = h.backend<BackendModel>();
    auto* job = std::any_cast<std::shared_ptr<BackendJob>>(&payload);
    if (m == nullptr || job == nullptr || *job == nullptr) {
      return InternalError("a backend run without its model or job");
    }
    if (m->refreshed || m->process != nullptr) return RunJob(m, **job);
    // Note [Measured footprints]: the first run is measured too.
    Result<std::any> out = InternalError("unreachable");
    uint64_t grown = 0;
    {
      MutexLock l(&MeasureMutex());
      const Footprint before = ReadFootprint();
      out = RunJob(m, **job);
      const Footprint after = ReadFootprint();
      const uint64_t file = Grown(before.file, after.file);
      grown = Grown(before.own, after.own) + file;
      m->file_bytes += file;
      context->AddFileBytes(static_cast<int64_t>(file));
    }
    m->refreshed = true;
    if (grown > 0) {
      m->measured_bytes += grown;
      context->Remeasured(h.capability(), h.model_key(), m->measured_bytes);
      spdlog::info("model \"{}\": measured {} after its first run (+{})", m->entry.name,
                   FormatSize(m->measured_bytes), FormatSize(grown));
    }
    return out;
  };
  return r;
}

CapabilityRegistration MergeRegistrations(CapabilityRegistration builtin,
                                          CapabilityRegistration backends,
                                          const std::vector<std::string>& order) {
  if (backends.model_keys.empty()) return builtin;
  if (builtin.model_keys.empty()) {
    backends.model_keys = order;
    return backends;
  }
  auto side = std::make_shared<std::set<std::string>>(backends.model_keys.begin(),
                                                      backends.model_keys.end());
  auto a = std::make_shared<CapabilityRegistration>(std::move(builtin));
  auto b = std::make_shared<CapabilityRegistration>(std::move(backends));
  CapabilityRegistration r;
  r.capability = a->capability;
  r.charge_kind = a->charge_kind;
  r.swap_same_role = a->swap_same_role;
  r.model_keys = order;
  auto pick = [side, a, b](const std::string& key) -> const CapabilityRegistration& {
    return side->count(key) != 0 ? *b : *a;
  };
  r.estimate_bytes = [pick](const std::string& key) -> size_t {
    const CapabilityRegistration& s = pick(key);
    return s.estimate_bytes ? s.estimate_bytes(key) : s.estimated_bytes;
  };
  r.role_for = [pick](const std::string& key) -> std::optional<ResidentRole> {
    const CapabilityRegistration& s = pick(key);
    return s.role_for ? s.role_for(key) : s.resident_role;
  };
  r.charge_kind_for = [pick](const std::string& key) -> std::optional<ChargeKind> {
    return pick(key).charge_kind;
  };
  r.idle_ttl_for = [pick](const std::string& key) -> std::optional<int64_t> {
    const CapabilityRegistration& s = pick(key);
    return s.idle_ttl_for ? s.idle_ttl_for(key) : s.idle_ttl_ms;
  };
  r.swap_same_role_for = [pick](const std::string& key) -> std::optional<bool> {
    const CapabilityRegistration& s = pick(key);
    if (s.swap_same_role_for) {
      if (std::optional<bool> v = s.swap_same_role_for(key)) return v;
    }
    return s.swap_same_role;
  };
  r.queue_max_for = [pick](const std::string& key) -> std::optional<size_t> {
    const CapabilityRegistration& s = pick(key);
    if (s.queue_max_for) return s.queue_max_for(key);
    return s.queue_max;
  };
  r.load = [pick](const std::string& key) { return pick(key).load(key); };
  r.unload = [a, b](const std::string& key, LoadedBackend backend) {
    const CapabilityRegistration& s = backend.type == typeid(BackendModel) ? *b : *a;
    if (s.unload) s.unload(key, std::move(backend));  // hand the reference on
  };
  r.run = [a, b](const ArbiterHandle& h, std::any& payload) -> Result<std::any> {
    const CapabilityRegistration& s = h.backend<BackendModel>() != nullptr ? *b : *a;
    if (!s.run) return FailedPreconditionError("this model has no queued runs");
    return s.run(h, payload);
  };
  return r;
}

// ---- BackendContext: the process watcher ----------------------------------

BackendContext::BackendContext(ProcessSupervisor* supervisor, MemoryLedger* ledger)
    : supervisor_(supervisor), ledger_(ledger) {}

BackendContext::~BackendContext() { Stop(); }

void BackendContext::Bind(MemoryArbiter* arbiter,
                          std::function<bool(const std::string&)> make_room) {
  arbiter_ = arbiter;
  make_room_ = std::move(make_room);
}

void BackendContext::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void BackendContext::Watch(Capability capability, std::weak_ptr<BackendModel> model) {
  std::shared_ptr<BackendModel> m = model.lock();
  if (m == nullptr) return;
  MutexLock l(&mu_);
  if (stop_) return;
  ProcessModelStats& s = stats_[m->entry.name];
  s.name = m->entry.name;
  s.rss_bytes = m->measured_bytes;
  watched_.push_back({capability, m->entry.name, std::move(model)});
  if (!thread_.joinable()) thread_ = std::thread([this] { WatchLoop(); });
}

int64_t BackendContext::RestartDelayMs(const std::string& model) {
  MutexLock l(&mu_);
  auto it = stats_.find(model);
  auto last = last_crash_ms_.find(model);
  if (it == stats_.end() || it->second.crashes == 0 || last == last_crash_ms_.end()) return 0;
  const int64_t since = NowMs() - last->second;
  if (since > 60000) return 0;
  const int shift = static_cast<int>(std::min<uint64_t>(it->second.crashes - 1, 5));
  const int64_t backoff = std::min(kMaxBackoffMs, kFirstBackoffMs << shift);
  return std::max<int64_t>(0, backoff - since);
}

void BackendContext::CountStart(const std::string& model) {
  MutexLock l(&mu_);
  stats_[model].name = model;
  stats_[model].starts++;
}

bool BackendContext::Remeasured(Capability capability, const std::string& model, size_t bytes) {
  if (arbiter_ == nullptr) return true;
  (void)arbiter_->UpdateResidentBytes(capability, model, bytes);
  auto over = [this] {
    return ledger_ != nullptr && ledger_->budget_bytes() > 0 &&
           ledger_->charged_bytes() > ledger_->budget_bytes();
  };
  if (!over()) return true;
  if (make_room_) make_room_(model);
  return !over();
}

uint64_t BackendContext::OutsideBytes() const {
  uint64_t out = static_cast<uint64_t>(std::max<int64_t>(0, file_bytes_.load()));
  MutexLock l(&mu_);
  for (const auto& [name, s] : stats_) out += s.rss_bytes;
  return out;
}

std::vector<ProcessModelStats> BackendContext::ProcessStats() const {
  MutexLock l(&mu_);
  std::vector<ProcessModelStats> out;
  for (const auto& [name, s] : stats_) out.push_back(s);
  return out;
}

void BackendContext::WatchLoop() {
  for (;;) {
    {
      MutexLock l(&mu_);
      if (stop_) return;
      wake_.WaitUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(kWatchPeriodMs));
      if (stop_) return;
    }
    WatchOnce();
  }
}

void BackendContext::WatchOnce() {
  std::vector<Watched> watched;
  {
    MutexLock l(&mu_);
    // Drop the freed ones.
    watched_.erase(std::remove_if(watched_.begin(), watched_.end(),
                                  [](const Watched& w) { return w.model.expired(); }),
                   watched_.end());
    watched = watched_;
  }
  for (const Watched& w : watched) {
    std::shared_ptr<BackendModel> m = w.model.lock();
    if (m == nullptr || m->process == nullptr) continue;
    bool unload = false;
    if (!m->process->alive()) {
      std::optional<ProcessExit> exit = m->process->exit();
      std::string why = exit ? (exit->signal != 0 ? fmt::format("killed by signal {}", exit->signal)
                                                  : fmt::format("exit {}", exit->exit_code))
                             : "exited";
      if (exit && !exit->stderr_tail.empty()) why += ": " + exit->stderr_tail;
      spdlog::error("model \"{}\": its process {} died ({}); the next request restarts it",
                    w.name, m->process->pid(), why);
      {
        MutexLock l(&mu_);
        stats_[w.name].crashes++;
        stats_[w.name].last_exit = why;
        stats_[w.name].rss_bytes = 0;
        last_crash_ms_[w.name] = NowMs();
      }
      unload = true;
    } else {
      const uint64_t rss = m->process->MeasureRssBytes();
      {
        MutexLock l(&mu_);
        stats_[w.name].rss_bytes = rss;
      }
      if (arbiter_ != nullptr && rss > 0) {
        if (!Remeasured(w.capability, w.name, rss)) {
          spdlog::error("model \"{}\": its process grew to {} and the budget cannot hold it; "
                        "stopped (over budget)",
                        w.name, FormatSize(rss));
          {
            MutexLock l(&mu_);
            stats_[w.name].over_budget_stops++;
          }
          m->process->Stop();
          unload = true;
        }
      }
    }
    if (unload && arbiter_ != nullptr) {
      m.reset();  // the watcher holds no reference while the arbiter frees it
      Result<bool> r = arbiter_->Unload(w.capability, w.name, Deadline(std::chrono::seconds(30)));
      if (!r.ok()) spdlog::warn("model \"{}\": unload after its process ended: {}", w.name,
                                r.status().message());
    }
  }
}

}  // namespace arbiter
