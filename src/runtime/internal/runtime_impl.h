// The Runtime's implementation (arbiter/runtime/runtime.h): members in
// construction order; runtime.cc builds, serves the admin and status
// operations and runs the KV maintenance thread, text.cc the generation,
// embedding and prewarm operations.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/base/mutex.h"
#include "arbiter/memory/system_memory.h"
#include "arbiter/runtime/kv_service.h"
#include "arbiter/runtime/models.h"
#include "arbiter/runtime/pressure.h"
#include "arbiter/runtime/runtime.h"

namespace arbiter {
class GrammarVocabulary;  // arbiter/engine/grammar.h
}  // namespace arbiter

namespace arbiter::runtime_internal {

class RuntimeImpl final : public Runtime {
 public:
  explicit RuntimeImpl(Config config);
  ~RuntimeImpl() override;

  // Builds everything (Runtime::Create's order); REQUIRES: called once.
  arbiter::Status Build();

  void Shutdown() override;
  const Config& config() const override { return config_; }
  std::vector<std::pair<std::string, Capability>> ModelNames() const override;
  Result<std::unique_ptr<TextGeneration>> StartText(TextRequest request) override;
  Result<EmbedResult> Embed(const EmbedRequest& request, const Cancellation& cancelled) override;
  RuntimeStatus Status() const override;
  Result<KvStatus> Kv(bool with_files = true) const override;
  Result<ModelStatus> LoadModel(const std::string& name) override;
  Result<UnloadResult> UnloadModel(const std::string& name, int64_t timeout_ms) override;
  Result<std::pair<ResidencyState, ModelStatus>> SetResidency(const std::string& name,
                                                              ResidencyState target) override;
  Result<CompactResult> Compact(const std::vector<std::string>& reload) override;
  MemoryPressureLevel DispatchPressure(MemoryPressureLevel level,
                                       std::optional<uint64_t> free_bytes) override;
  Result<PrewarmResult> Prewarm(const PrewarmSpec& request) override;
  Result<std::vector<std::string>> CloseConversation(const std::string& conversation_id,
                                                     const std::string& model) override;
  ArbiterEventSubscription OnEvent(ArbiterEventListener listener) override;
  MemoryCharge ChargeMemory(std::string owner, ChargeKind kind, size_t bytes) override {
    return ledger_->Charge(std::move(owner), kind, bytes);
  }
  ReclaimPolicy& reclaim_policy() override { return policy_; }
  // modalities.cc
  Result<TranscribeResult> Transcribe(const TranscribeRequest& request,
                                      const Cancellation& cancelled) override;
  Result<VadResult> DetectSpeech(const VadRequest& request, const Cancellation& cancelled) override;
  arbiter::Status Speak(const SpeechRequest& request,
               const std::function<bool(const SpeechStart&)>& on_start,
               const std::function<bool(std::span<const int16_t>)>& on_pcm,
               const Cancellation& cancelled) override;
  Result<DescribeResult> Describe(const DescribeRequest& request,
                                  const Cancellation& cancelled) override;
  Result<ModelEntry> Model(const std::string& name) const override;
  Result<ProcessLease> AcquireProcess(const std::string& name, Capability capability) override;
  VisionCacheStats VisionCache() const override;
  // introspect.cc
  arbiter::Status SetIdleTtl(const std::string& model, std::optional<int64_t> ttl_ms) override;
  Result<TokenizeResult> Tokenize(const std::string& model, std::string_view text,
                                  bool add_special, bool parse_special) override;
  Result<std::string> Detokenize(const std::string& model,
                                 const std::vector<int32_t>& ids) override;
  Result<TextModelView> InspectTextModel(const std::string& model) override;
  // Places the vision model's text of each image in its message (text.cc's
  // StartText calls it). Errors: kInvalidRequest (no vision model, bad image).
  arbiter::Status DescribeChatImages(const std::string& model, std::vector<ChatImage> images,
                                     std::vector<ChatMessage>* messages,
                                     const Cancellation& cancelled);
  std::vector<ProcessModelStats> ProcessStats() const;

  // ---- shared by runtime.cc and text.cc ----
  // The capability of configured model `name`, or kModelNotFound.
  Result<Capability> FindModel(const std::string& name) const;
  // kWrongCapability unless `name` (configured) serves `want`.
  arbiter::Status CheckCapability(const std::string& name, Capability have, Capability want) const;
  // Runs one backend job through the model's request queue and waits for
  // it (cancellation reaches the queue and the run). Errors: the acquire's,
  // the run's, kQueueFull.
  Result<std::any> RunBackend(Capability capability, const std::string& model,
                              std::shared_ptr<BackendJob> job, const Cancellation& cancelled);
  // Pins the model (loading it); typed errors. Externally managed weights
  // that are not on the device are refused before anything loads.
  // `any_backend`: a model of another engine is pinned too (its handle
  // holds a BackendModel); else such a model is kWrongCapability.
  Result<ArbiterHandle> AcquireModel(const std::string& name, Capability capability,
                                     bool any_backend = false);
  // A handle on `name` when the arbiter reports it loaded; never loads it.
  std::optional<ArbiterHandle> ResidentHandle(const std::string& name);
  ModelStatus ModelStatusOf(const std::string& name) const;
  WeightCacheStatus WeightsStatus() const;
  // The weight cache model `name` computes from (its device's; the host's
  // for a cpu or unknown model).
  WeightCache* CacheOf(const std::string& name) const;
  KvPrecache* PrecacheFor(const std::string& name) const;
  bool stopping() const { return stopping_.load(); }
  // Constrained decoding for a text request (constrained.cc): the
  // constraint its response format, grammar or forced tool call asks for
  // (null when none), over `engine`'s vocabulary (built once per loaded
  // model and kept in vocabularies_). `kind`: the chat template family
  // (tool calls only). Errors: kInvalidArgument with reason kInvalidRequest
  // naming the field (a schema keyword, a grammar line).
  Result<std::unique_ptr<TokenConstraint>> OutputConstraint(const std::string& model,
                                                            const Engine& engine,
                                                            std::optional<ChatTemplateKind> kind,
                                                            const TextRequest& request);
  // True when `request` forces a tool call: tools with tool_choice
  // "required" or a named function (Note [Forced tool calls] in text.cc).
  static bool ForcesToolCall(const TextRequest& request);

 private:
  void KvMaintenanceLoop();
  // Reads the process's memory once and, when no model memory was charged
  // or loading around the read, makes it the ledger's runtime_bytes (Note
  // [Runtime bytes] in runtime.cc). Returns the read (Status() reports it).
  Result<ProcessMemoryInfo> MeasureRuntimeBytes() const;
  void KvEvictionPass();
  void StopMaintenance();

  // Written only by Start (ResolveDeviceLayers places each device model's
  // layers) before any model registers; read-only after.
  Config config_;
  // Each built-in model's layers per device (ResolveDeviceLayers), for Status.
  ModelLayers layers_;
  std::vector<std::pair<std::string, Capability>> names_;  // configuration order
  std::atomic<bool> stopping_{false};

  // Construction order = member order; destruction is Shutdown()'s order
  // (Note [Runtime shutdown]) and then the reverse of this list.
  std::optional<ServePressure> pressure_;
  std::unique_ptr<MemoryLedger> ledger_;
  std::unique_ptr<ServeKv> kv_;
  ReclaimTargets targets_;
  ReclaimPolicy policy_{&targets_};
  std::unique_ptr<ServeWeights> weights_;
  // Chat image parts and /v1/vision/describe results (charged; purged by
  // the reclaim policy).
  std::unique_ptr<VisionEmbeddingCache> vision_cache_;
  // Process-backed models: their supervisor (null without any) and the
  // backends' shared context (the process watcher).
  std::unique_ptr<ProcessSupervisor> supervisor_;
  std::shared_ptr<BackendContext> backends_;
  std::unique_ptr<MemoryArbiter> arbiter_;
  MemoryPressureSubscription pressure_sub_;

  // Note [KV maintenance] in runtime.cc.
  Mutex kv_mu_;
  CondVar kv_wake_{&kv_mu_};
  bool kv_stop_ GUARDED_BY(kv_mu_) = false;
  std::thread kv_thread_;
  std::atomic<uint64_t> kv_files_swept_{0};

  Mutex shutdown_mu_;
  bool shut_down_ GUARDED_BY(shutdown_mu_) = false;

  // Per text model: the grammar vocabulary of its loaded tokenizer (Note
  // [Grammar vocabularies] in constrained.cc).
  struct VocabularyEntry {
    const Tokenizer* tokenizer = nullptr;
    std::shared_ptr<const GrammarVocabulary> vocabulary;
    MemoryCharge charge;  // its bytes, kind scratch, under the model's resident key
  };
  Mutex vocab_mu_;
  std::map<std::string, VocabularyEntry> vocabularies_ GUARDED_BY(vocab_mu_);
  // Drops a model's vocabulary (and its charge) when the model unloads;
  // declared last: unsubscribed before vocabularies_ goes.
  ArbiterEventSubscription vocab_sub_;
};

}  // namespace arbiter::runtime_internal
