// See metrics.h for the series and where each comes from.
#include "server/internal/metrics.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <prometheus/histogram.h>
#include <prometheus/text_serializer.h>

namespace arbiter::server_internal {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

ServerMetrics::ServerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      loads_(BuildCounter()
                 .Name("arbiter_model_loads_total")
                 .Help("Successful model loads")
                 .Register(*registry_)),
      load_failures_(BuildCounter()
                         .Name("arbiter_model_load_failures_total")
                         .Help("Failed model loads")
                         .Register(*registry_)),
      unloads_(BuildCounter()
                   .Name("arbiter_model_unloads_total")
                   .Help("Model unloads by reason")
                   .Register(*registry_)),
      evictions_(BuildCounter()
                     .Name("arbiter_evictions_total")
                     .Help("Evictions by reason (every unload but shutdown)")
                     .Register(*registry_)),
      http_requests_(BuildCounter()
                         .Name("arbiter_http_requests_total")
                         .Help("HTTP requests by route and status code")
                         .Register(*registry_)),
      pressure_level_(BuildGauge()
                          .Name("arbiter_memory_pressure_level")
                          .Help("Memory pressure level: 0 nominal, 1 low, 2 critical")
                          .Register(*registry_)
                          .Add({})),
      budget_bytes_(BuildGauge()
                        .Name("arbiter_memory_budget_bytes")
                        .Help("Memory budget for models in bytes (0 = unlimited)")
                        .Register(*registry_)
                        .Add({})),
      charged_bytes_(BuildGauge()
                         .Name("arbiter_memory_charged_bytes")
                         .Help("Bytes charged to the memory ledger")
                         .Register(*registry_)
                         .Add({})),
      resident_bytes_(BuildGauge()
                          .Name("arbiter_memory_resident_bytes")
                          .Help("Bytes of loaded models")
                          .Register(*registry_)
                          .Add({})),
      runtime_bytes_(BuildGauge()
                         .Name("arbiter_memory_runtime_bytes")
                         .Help("The process's own memory that no model owns, measured while "
                               "nothing is charged (not against the budget)")
                         .Register(*registry_)
                         .Add({})),
      process_resident_bytes_(BuildGauge()
                                  .Name("arbiter_process_resident_bytes")
                                  .Help("RssAnon + RssShmem of the process")
                                  .Register(*registry_)
                                  .Add({})),
      unaccounted_bytes_(BuildGauge()
                             .Name("arbiter_memory_unaccounted_bytes")
                             .Help("process_resident - charged - runtime bytes (signed)")
                             .Register(*registry_)
                             .Add({})),
      model_unloads_(BuildCounter()
                         .Name("arbiter_model_unloads_by_model_total")
                         .Help("Model unloads by model, capability and reason")
                         .Register(*registry_)),
      runs_(prometheus::BuildHistogram()
                .Name("arbiter_capability_run_seconds")
                .Help("Queued runs (speech, transcription, vision, VAD) by model: latency")
                .Register(*registry_)),
      queue_depth_(BuildGauge()
                       .Name("arbiter_model_queue_depth")
                       .Help("Requests waiting in the model's queue (not running)")
                       .Register(*registry_)),
      queue_rejections_(BuildCounter()
                            .Name("arbiter_model_queue_rejections_total")
                            .Help("Requests refused because the model's queue was full")
                            .Register(*registry_)),
      process_starts_(BuildCounter()
                          .Name("arbiter_process_model_starts_total")
                          .Help("Starts of a process-backed model's process")
                          .Register(*registry_)),
      process_crashes_(BuildCounter()
                           .Name("arbiter_process_model_crashes_total")
                           .Help("Exits of a process-backed model that were not asked for")
                           .Register(*registry_)),
      process_over_budget_(BuildCounter()
                               .Name("arbiter_process_model_over_budget_stops_total")
                               .Help("Processes stopped because the budget could not hold them")
                               .Register(*registry_)),
      process_rss_(BuildGauge()
                       .Name("arbiter_process_model_rss_bytes")
                       .Help("RSS of a process-backed model's process group (last reading)")
                       .Register(*registry_)),
      vision_cache_lookups_(BuildCounter()
                                .Name("arbiter_vision_cache_lookups_total")
                                .Help("VisionEmbeddingCache lookups by result (hit, miss)")
                                .Register(*registry_)),
      vision_cache_entries_(BuildGauge()
                                .Name("arbiter_vision_cache_entries")
                                .Help("Entries in the VisionEmbeddingCache")
                                .Register(*registry_)
                                .Add({})),
      vision_cache_bytes_(BuildGauge()
                              .Name("arbiter_vision_cache_bytes")
                              .Help("Bytes charged by the VisionEmbeddingCache")
                              .Register(*registry_)
                              .Add({})),
      model_resident_(BuildGauge()
                          .Name("arbiter_model_resident")
                          .Help("1 when the model is loaded, else 0")
                          .Register(*registry_)),
      model_bytes_(BuildGauge()
                       .Name("arbiter_model_bytes")
                       .Help("Model size in bytes (measured once loaded, else estimated)")
                       .Register(*registry_)),
      charged_by_kind_(BuildGauge()
                           .Name("arbiter_memory_charged_by_kind_bytes")
                           .Help("Bytes charged to the memory ledger, by kind")
                           .Register(*registry_)),
      domains_(*registry_),
      weight_loads_(BuildCounter()
                        .Name("arbiter_weight_cache_loads_total")
                        .Help("Weight loads into the device arena")
                        .Register(*registry_)),
      weight_evicts_(BuildCounter()
                         .Name("arbiter_weight_cache_evicts_total")
                         .Help("Device weight copies evicted")
                         .Register(*registry_)),
      weight_load_seconds_(BuildCounter()
                               .Name("arbiter_weight_cache_load_seconds_total")
                               .Help("Seconds spent loading weights into the device arena")
                               .Register(*registry_)),
      weight_compactions_(BuildCounter()
                              .Name("arbiter_weight_cache_compactions_total")
                              .Help("Device arena compactions")
                              .Register(*registry_)),
      model_weights_resident_(BuildGauge()
                                  .Name("arbiter_model_weights_resident")
                                  .Help("1 when the model's weights are in the device arena")
                                  .Register(*registry_)),
      model_weights_pinned_(BuildGauge()
                                .Name("arbiter_model_weights_pinned")
                                .Help("Residency: 0 unpinned, 1 pinned_system, 2 pinned_device")
                                .Register(*registry_)),
      model_weight_bytes_(BuildGauge()
                              .Name("arbiter_model_weight_bytes")
                              .Help("Bytes of the model's compute-ready weights")
                              .Register(*registry_)),
      kv_prompt_tokens_(BuildCounter()
                            .Name("arbiter_kv_prompt_tokens_total")
                            .Help("Prompt tokens of text requests, computed or cached (reused KV)")
                            .Register(*registry_)),
      kv_copied_tokens_(BuildCounter()
                            .Name("arbiter_kv_copied_tokens_total")
                            .Help("Cached prompt tokens whose KV was copied from another slot")
                            .Register(*registry_)),
      kv_tier_hits_(BuildCounter()
                        .Name("arbiter_kv_tier_hits_total")
                        .Help("Requests that reused KV, by the tier it came from")
                        .Register(*registry_)),
      kv_restores_(BuildCounter()
                       .Name("arbiter_kv_restores_total")
                       .Help("Restores of saved KV into a slot (host or disk tier), by result")
                       .Register(*registry_)),
      kv_stashes_(BuildCounter()
                      .Name("arbiter_kv_stashes_total")
                      .Help("Conversations' KV moved from a slot to the host prompt cache")
                      .Register(*registry_)),
      kv_persisted_(BuildCounter()
                        .Name("arbiter_kv_persisted_total")
                        .Help("KV files written by the precache (close, idle, unload, shutdown)")
                        .Register(*registry_)),
      kv_prewarms_(BuildCounter()
                       .Name("arbiter_kv_prewarms_total")
                       .Help("Prewarms (admin, system prompt, keep-alive), by result")
                       .Register(*registry_)),
      kv_keepalive_(BuildCounter()
                        .Name("arbiter_kv_keepalive_rewarms_total")
                        .Help("Keep-alive re-warms of idle prewarmed conversations")
                        .Register(*registry_)),
      kv_files_swept_(BuildCounter()
                          .Name("arbiter_kv_files_swept_total")
                          .Help("KV files deleted: past their TTL class or over the disk budget")
                          .Register(*registry_)),
      kv_write_errors_(BuildCounter()
                           .Name("arbiter_kv_write_errors_total")
                           .Help("KV saves that failed to write (e.g. a full disk); the "
                                 "conversation's previous file is kept")
                           .Register(*registry_)),
      kv_prompt_cache_bytes_(BuildGauge()
                                 .Name("arbiter_kv_prompt_cache_bytes")
                                 .Help("Bytes of KV held in the host prompt cache")
                                 .Register(*registry_)
                                 .Add({})),
      kv_prompt_cache_entries_(BuildGauge()
                                   .Name("arbiter_kv_prompt_cache_entries")
                                   .Help("Conversations held in the host prompt cache")
                                   .Register(*registry_)
                                   .Add({})),
      kv_disk_bytes_(BuildGauge()
                         .Name("arbiter_kv_disk_bytes")
                         .Help("Bytes of KV files in the disk tier")
                         .Register(*registry_)
                         .Add({})),
      ttft_(prometheus::BuildHistogram()
                .Name("arbiter_time_to_first_token_seconds")
                .Help("Text requests: admission to the first generated token")
                .Register(*registry_)),
      tpot_(prometheus::BuildHistogram()
                .Name("arbiter_time_per_output_token_seconds")
                .Help("Text requests: (e2e - TTFT) / (generated tokens - 1)")
                .Register(*registry_)),
      e2e_(prometheus::BuildHistogram()
               .Name("arbiter_e2e_request_latency_seconds")
               .Help("Text requests: admission to the last token")
               .Register(*registry_)),
      prompt_tokens_(BuildCounter()
                         .Name("arbiter_prompt_tokens_total")
                         .Help("Prompt tokens of finished text requests")
                         .Register(*registry_)),
      generation_tokens_(BuildCounter()
                             .Name("arbiter_generation_tokens_total")
                             .Help("Generated tokens of finished text requests")
                             .Register(*registry_)),
      running_(BuildGauge()
                   .Name("arbiter_num_requests_running")
                   .Help("Text requests generating (first token out)")
                   .Register(*registry_)),
      waiting_(BuildGauge()
                   .Name("arbiter_num_requests_waiting")
                   .Help("Text requests admitted without a token yet (KV slot wait, prefill)")
                   .Register(*registry_)),
      kv_usage_(BuildGauge()
                    .Name("arbiter_kv_cache_usage_perc")
                    .Help("Tokens held by the model's KV slots / (slots x ctx), 0..1")
                    .Register(*registry_)) {
  // Plain gauges of the weight runtime: one family each.
  const std::pair<const char*, const char*> kWeightGauges[] = {
      {"arbiter_weight_cache_resident_bytes", "Device bytes of on-demand (not device-pinned) weights"},
      {"arbiter_weight_cache_max_bytes", "The on-demand weight budget in bytes"},
      {"arbiter_weight_cache_pinned_bytes", "Device bytes of device-pinned weights"},
      {"arbiter_weight_cache_max_scratch_bytes", "Scratch reserved in the arena (largest model's)"},
      {"arbiter_weight_pool_bytes", "Arena bytes for weights, pinned included"},
      {"arbiter_host_floor_bytes", "Bytes of host weight floors held"},
      {"arbiter_device_memory_in_use_bytes", "Device arena bytes allocated"},
      {"arbiter_device_memory_limit_bytes", "Device arena size in bytes"},
      {"arbiter_device_memory_free_bytes", "Device arena bytes free"},
      {"arbiter_device_memory_peak_bytes", "Largest device arena allocation total seen"},
      {"arbiter_device_memory_largest_free_block_bytes", "Largest free block of the arena"},
  };
  for (const auto& [name, help] : kWeightGauges) {
    weight_gauge_by_name_[name] =
        &BuildGauge().Name(name).Help(help).Register(*registry_).Add({});
  }
}

void ServerMetrics::OnEvent(const ArbiterEvent& e) {
  switch (e.type) {
    case ArbiterEventType::kModelLoad:
      loads_
          .Add({{"model", e.model_key}, {"capability", std::string(CapabilityName(e.capability))}})
          .Increment();
      break;
    case ArbiterEventType::kModelUnload:
      unloads_.Add({{"reason", std::string(UnloadReasonName(e.reason))}}).Increment();
      model_unloads_
          .Add({{"model", e.model_key},
                {"capability", std::string(CapabilityName(e.capability))},
                {"reason", std::string(UnloadReasonName(e.reason))}})
          .Increment();
      break;
    case ArbiterEventType::kCapabilityRun:
      runs_
          .Add({{"model", e.model_key}, {"capability", std::string(CapabilityName(e.capability))}},
               prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                                                       30, 60})
          .Observe(e.run_ms / 1000.0);
      break;
    case ArbiterEventType::kEviction:
      evictions_.Add({{"reason", std::string(UnloadReasonName(e.reason))}}).Increment();
      break;
    default:
      break;
  }
}

void ServerMetrics::OnHttpRequest(std::string_view route, int status) {
  http_requests_.Add({{"route", std::string(route)}, {"code", std::to_string(status)}})
      .Increment();
}

void ServerMetrics::Advance(prometheus::Family<prometheus::Counter>& family,
                            const prometheus::Labels& labels, uint64_t now) {
  // Cumulative values → counter increments, remembered per series.
  std::string key = family.GetName();
  for (const auto& [k, v] : labels) key += "|" + k + "=" + v;
  uint64_t& seen = kv_seen_[key];
  prometheus::Counter& c = family.Add(labels);
  if (now > seen) c.Increment(static_cast<double>(now - seen));
  seen = now;
}

std::string ServerMetrics::Scrape(const ArbiterStats& s, const MemoryLedgerSnapshot& ledger,
                                  const WeightCacheStatus* w, const KvMetricsSample* kv,
                                  const ProcessMemorySample* process,
                                  const ModalityMetricsSample* m) {
  {
    MutexLock l(&mu_);
    auto advance = [this](prometheus::Family<prometheus::Counter>& family,
                          const prometheus::Labels& labels, uint64_t now) {
      mu_.AssertHeld();
      Advance(family, labels, now);
    };
    if (m != nullptr) {
      for (const ProcessModelStats& p : m->processes) {
        advance(process_starts_, {{"model", p.name}}, p.starts);
        advance(process_crashes_, {{"model", p.name}}, p.crashes);
        advance(process_over_budget_, {{"model", p.name}}, p.over_budget_stops);
        process_rss_.Add({{"model", p.name}}).Set(static_cast<double>(p.rss_bytes));
      }
      advance(vision_cache_lookups_, {{"result", "hit"}}, m->vision_cache.hits);
      advance(vision_cache_lookups_, {{"result", "miss"}}, m->vision_cache.misses);
      vision_cache_entries_.Set(static_cast<double>(m->vision_cache.entries));
      vision_cache_bytes_.Set(static_cast<double>(m->vision_cache.bytes));
    }
    for (const ModelStats& ms : s.models) {
      const prometheus::Labels labels{{"model", ms.name},
                                      {"capability", std::string(CapabilityName(ms.capability))}};
      queue_depth_.Add(labels).Set(static_cast<double>(ms.queued));
      advance(queue_rejections_, labels, ms.queue_rejections);
    }
    if (kv != nullptr) {
      for (const auto& [model, usage] : kv->kv_usage) {
        kv_usage_.Add({{"model", model}}).Set(usage);
        if (vllm_kv_usage_ != nullptr) vllm_kv_usage_->Add({{"model_name", model}}).Set(usage);
      }
      for (const auto& [model, c] : kv->models) {
        advance(kv_prompt_tokens_, {{"model", model}, {"kind", "computed"}},
                c.prompt_tokens - c.cached_tokens);
        advance(kv_prompt_tokens_, {{"model", model}, {"kind", "cached"}}, c.cached_tokens);
        advance(kv_copied_tokens_, {{"model", model}}, c.copied_tokens);
        advance(kv_tier_hits_, {{"model", model}, {"tier", "slot"}}, c.slot_hits);
        advance(kv_tier_hits_, {{"model", model}, {"tier", "prompt_cache"}}, c.prompt_cache_hits);
        advance(kv_tier_hits_, {{"model", model}, {"tier", "disk"}}, c.disk_hits);
        advance(kv_restores_, {{"model", model}, {"result", "ok"}},
                c.prompt_cache_hits + c.disk_hits);
        advance(kv_restores_, {{"model", model}, {"result", "failed"}}, c.restore_failures);
        advance(kv_stashes_, {{"model", model}}, c.stashes);
        advance(kv_persisted_, {{"model", model}}, c.persisted);
        advance(kv_prewarms_, {{"model", model}, {"result", "ok"}}, c.prewarms);
        advance(kv_prewarms_, {{"model", model}, {"result", "failed"}}, c.prewarm_failures);
        advance(kv_keepalive_, {{"model", model}}, c.keepalive_rewarms);
      }
      advance(kv_files_swept_, {}, kv->files_swept);
      advance(kv_write_errors_, {}, kv->write_errors);
      kv_prompt_cache_bytes_.Set(static_cast<double>(kv->prompt_cache_bytes));
      kv_prompt_cache_entries_.Set(static_cast<double>(kv->prompt_cache_entries));
      kv_disk_bytes_.Set(static_cast<double>(kv->disk_bytes));
    }
    for (size_t k = 0; k < kChargeKindCount; ++k) {
      charged_by_kind_.Add({{"kind", std::string(ChargeKindName(static_cast<ChargeKind>(k)))}})
          .Set(static_cast<double>(ledger.by_kind[k]));
    }
    domains_.Update(ledger);
    if (w != nullptr) {
      auto set = [this](const char* name, uint64_t v) {
        mu_.AssertHeld();
        weight_gauge_by_name_.at(name)->Set(static_cast<double>(v));
      };
      set("arbiter_weight_cache_resident_bytes", w->resident_bytes);
      set("arbiter_weight_cache_max_bytes", w->max_bytes);
      set("arbiter_weight_cache_pinned_bytes", w->pinned_bytes);
      set("arbiter_weight_cache_max_scratch_bytes", w->max_scratch_bytes);
      set("arbiter_weight_pool_bytes", w->weight_pool_bytes);
      set("arbiter_host_floor_bytes", w->host_bytes);
      set("arbiter_device_memory_in_use_bytes", w->pool.in_use_bytes);
      set("arbiter_device_memory_limit_bytes", w->pool.limit_bytes);
      set("arbiter_device_memory_free_bytes", w->pool.free_bytes);
      set("arbiter_device_memory_peak_bytes", w->pool.peak_in_use_bytes);
      set("arbiter_device_memory_largest_free_block_bytes", w->pool.largest_free_block_bytes);
      // Cumulative snapshot values → counter increments.
      auto advance = [](prometheus::Counter& c, auto now, auto* seen) {
        if (now > *seen) c.Increment(static_cast<double>(now - *seen));
        *seen = now;
      };
      advance(weight_loads_.Add({}), w->loads, &weight_loads_seen_);
      advance(weight_evicts_.Add({}), w->evicts, &weight_evicts_seen_);
      advance(weight_compactions_.Add({}), w->compactions, &weight_compactions_seen_);
      advance(weight_load_seconds_.Add({}), w->load_seconds, &weight_load_seconds_seen_);
      for (const WeightModelStatus& m : w->models) {
        const prometheus::Labels labels{{"model", m.key}};
        model_weights_resident_.Add(labels).Set(m.device_resident ? 1 : 0);
        model_weights_pinned_.Add(labels).Set(static_cast<double>(static_cast<int>(m.residency)));
        model_weight_bytes_.Add(labels).Set(static_cast<double>(m.weight_bytes));
      }
    }
    pressure_level_.Set(static_cast<double>(static_cast<int>(s.pressure)));
    budget_bytes_.Set(static_cast<double>(s.budget_bytes));
    charged_bytes_.Set(static_cast<double>(s.charged_bytes));
    resident_bytes_.Set(static_cast<double>(s.resident_bytes));
    runtime_bytes_.Set(static_cast<double>(ledger.runtime_bytes));
    if (process != nullptr) {
      process_resident_bytes_.Set(static_cast<double>(process->resident_bytes));
      unaccounted_bytes_.Set(static_cast<double>(process->unaccounted_bytes));
    }
    for (const ModelStats& m : s.models) {
      const prometheus::Labels labels{{"model", m.name},
                                      {"capability", std::string(CapabilityName(m.capability))}};
      loads_.Add(labels);  // present (0) before the first load
      model_resident_.Add(labels).Set(m.state == ModelState::kLoaded ? 1 : 0);
      model_bytes_.Add(labels).Set(static_cast<double>(m.bytes));
      uint64_t& seen = failures_seen_[m.resident_key];
      prometheus::Counter& failures = load_failures_.Add(labels);
      if (m.load_failures > seen) {
        failures.Increment(static_cast<double>(m.load_failures - seen));
        seen = m.load_failures;
      }
    }
  }
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

// ---- text generation -------------------------------------------------------

namespace {

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds. vLLM's buckets, so dashboards built for it read ours.
const prometheus::Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
    0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
const prometheus::Histogram::BucketBoundaries kTpotBuckets = {
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0};
const prometheus::Histogram::BucketBoundaries kE2eBuckets = {
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0};

}  // namespace

void ServerMetrics::EnableVllmCompat() {
  if (vllm_running_ != nullptr) return;
  vllm_running_ = &BuildGauge()
                       .Name("vllm:num_requests_running")
                       .Help("Requests generating (arbiter: first token out)")
                       .Register(*registry_);
  vllm_waiting_ = &BuildGauge()
                       .Name("vllm:num_requests_waiting")
                       .Help("Requests waiting (arbiter: admitted, no token yet)")
                       .Register(*registry_);
  vllm_kv_usage_ = &BuildGauge()
                        .Name("vllm:kv_cache_usage_perc")
                        .Help("KV cache usage, 0..1 (tokens held / slots x ctx)")
                        .Register(*registry_);
}

void ServerMetrics::AddRunning(const std::string& model, double delta) {
  running_.Add({{"model", model}}).Increment(delta);
  if (vllm_running_ != nullptr) vllm_running_->Add({{"model_name", model}}).Increment(delta);
}

void ServerMetrics::AddWaiting(const std::string& model, double delta) {
  waiting_.Add({{"model", model}}).Increment(delta);
  if (vllm_waiting_ != nullptr) vllm_waiting_->Add({{"model_name", model}}).Increment(delta);
}

TextRun ServerMetrics::StartTextRun(std::string model) {
  TextRun run;
  run.metrics_ = this;
  run.model_ = std::move(model);
  run.start_ns_ = SteadyNs();
  AddWaiting(run.model_, 1);
  return run;
}

TextRun::TextRun(TextRun&& o) noexcept
    : metrics_(std::exchange(o.metrics_, nullptr)),
      model_(std::move(o.model_)),
      start_ns_(o.start_ns_),
      first_ns_(o.first_ns_),
      finished_(o.finished_) {}

TextRun& TextRun::operator=(TextRun&& o) noexcept {
  if (this != &o) {
    Leave();
    metrics_ = std::exchange(o.metrics_, nullptr);
    model_ = std::move(o.model_);
    start_ns_ = o.start_ns_;
    first_ns_ = o.first_ns_;
    finished_ = o.finished_;
  }
  return *this;
}

TextRun::~TextRun() { Leave(); }

void TextRun::Leave() {
  if (metrics_ == nullptr) return;
  if (first_ns_ == 0) {
    metrics_->AddWaiting(model_, -1);
  } else {
    metrics_->AddRunning(model_, -1);
  }
  metrics_ = nullptr;
}

void TextRun::FirstToken() {
  if (metrics_ == nullptr || first_ns_ != 0) return;
  first_ns_ = std::max<int64_t>(SteadyNs(), start_ns_ + 1);
  metrics_->ttft_.Add({{"model", model_}}, kTtftBuckets)
      .Observe(static_cast<double>(first_ns_ - start_ns_) / 1e9);
  metrics_->AddWaiting(model_, -1);
  metrics_->AddRunning(model_, 1);
}

void TextRun::Finished(int prompt_tokens, int generated_tokens) {
  if (metrics_ == nullptr || finished_) return;
  finished_ = true;
  const int64_t now = SteadyNs();
  const prometheus::Labels labels{{"model", model_}};
  metrics_->e2e_.Add(labels, kE2eBuckets).Observe(static_cast<double>(now - start_ns_) / 1e9);
  if (generated_tokens > 1 && first_ns_ != 0) {
    metrics_->tpot_.Add(labels, kTpotBuckets)
        .Observe(static_cast<double>(now - first_ns_) / 1e9 / (generated_tokens - 1));
  }
  metrics_->prompt_tokens_.Add(labels).Increment(std::max(0, prompt_tokens));
  metrics_->generation_tokens_.Add(labels).Increment(std::max(0, generated_tokens));
  // No longer running from here, before the answer is sent: a client that
  // reads /metrics right after its answer must not still see itself.
  Leave();
}

}  // namespace arbiter::server_internal
