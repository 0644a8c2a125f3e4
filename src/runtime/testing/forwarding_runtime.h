// Test support: a Runtime that forwards every operation to a real one, for
// test doubles that replace one or two operations with a faulty collaborator
// (STYLE.md rule 22: a stuck backend call, a failing run).
//
// Thread safety: as the wrapped runtime's. `real` must outlive the wrapper.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arbiter/runtime/runtime.h"

namespace arbiter::testing {

class ForwardingRuntime : public Runtime {
 public:
  explicit ForwardingRuntime(Runtime* real) : real_(real) {}

  void Shutdown() override { real_->Shutdown(); }
  const Config& config() const override { return real_->config(); }
  std::vector<std::pair<std::string, Capability>> ModelNames() const override {
    return real_->ModelNames();
  }
  Result<std::unique_ptr<TextGeneration>> StartText(TextRequest request) override {
    return real_->StartText(std::move(request));
  }
  Result<EmbedResult> Embed(const EmbedRequest& r, const Cancellation& c) override {
    return real_->Embed(r, c);
  }
  RuntimeStatus Status() const override { return real_->Status(); }
  Result<KvStatus> Kv(bool with_files) const override { return real_->Kv(with_files); }
  Result<ModelStatus> LoadModel(const std::string& n) override { return real_->LoadModel(n); }
  Result<UnloadResult> UnloadModel(const std::string& n, int64_t t) override {
    return real_->UnloadModel(n, t);
  }
  Result<std::pair<ResidencyState, ModelStatus>> SetResidency(const std::string& n,
                                                              ResidencyState t) override {
    return real_->SetResidency(n, t);
  }
  Result<CompactResult> Compact(const std::vector<std::string>& r) override {
    return real_->Compact(r);
  }
  MemoryPressureLevel DispatchPressure(MemoryPressureLevel l, std::optional<uint64_t> f) override {
    return real_->DispatchPressure(l, f);
  }
  Result<PrewarmResult> Prewarm(const PrewarmSpec& r) override { return real_->Prewarm(r); }
  Result<std::vector<std::string>> CloseConversation(const std::string& id,
                                                     const std::string& m) override {
    return real_->CloseConversation(id, m);
  }
  Result<TranscribeResult> Transcribe(const TranscribeRequest& r, const Cancellation& c) override {
    return real_->Transcribe(r, c);
  }
  Result<VadResult> DetectSpeech(const VadRequest& r, const Cancellation& c) override {
    return real_->DetectSpeech(r, c);
  }
  ::arbiter::Status Speak(const SpeechRequest& r,
                          const std::function<bool(const SpeechStart&)>& on_start,
                          const std::function<bool(std::span<const int16_t>)>& on_pcm,
                          const Cancellation& c) override {
    return real_->Speak(r, on_start, on_pcm, c);
  }
  Result<DescribeResult> Describe(const DescribeRequest& r, const Cancellation& c) override {
    return real_->Describe(r, c);
  }
  Result<ModelEntry> Model(const std::string& n) const override { return real_->Model(n); }
  Result<ProcessLease> AcquireProcess(const std::string& n, Capability c) override {
    return real_->AcquireProcess(n, c);
  }
  VisionCacheStats VisionCache() const override { return real_->VisionCache(); }
  ArbiterEventSubscription OnEvent(ArbiterEventListener l) override {
    return real_->OnEvent(std::move(l));
  }
  MemoryCharge ChargeMemory(std::string owner, ChargeKind kind, size_t bytes) override {
    return real_->ChargeMemory(std::move(owner), kind, bytes);
  }
  ReclaimPolicy& reclaim_policy() override { return real_->reclaim_policy(); }

 private:
  Runtime* real_;
};

}  // namespace arbiter::testing
