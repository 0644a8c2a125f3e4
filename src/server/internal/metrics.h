// server/internal/metrics.h — the Prometheus registry behind GET /metrics
// (prometheus-cpp core; text exposition format 0.0.4).
//
// Counters driven by arbiter events (ServerMetrics::OnEvent, subscribed with
// MemoryArbiter::OnEvent):
//   arbiter_model_loads_total{model,capability}
//   arbiter_model_unloads_total{reason}      swap|pressure|shutdown|fit|idle|manual
//   arbiter_evictions_total{reason}          pressure|swap|fit|idle|manual
// Counters from the Stats() snapshot at scrape time (advanced by the delta
// since the previous scrape, so they never go down):
//   arbiter_model_load_failures_total{model,capability}
// Gauges from the snapshot at scrape time:
//   arbiter_memory_pressure_level            0 nominal, 1 low, 2 critical
//   arbiter_memory_budget_bytes, arbiter_memory_charged_bytes,
//   arbiter_memory_resident_bytes
//   arbiter_model_resident{model,capability} 1 loaded, else 0
//   arbiter_model_bytes{model,capability}    measured (or estimated) size
//   arbiter_memory_charged_by_kind_bytes{kind}  ledger bytes per ChargeKind
//   (the memory series above are the host's; every domain's, the host
//   included, are in domain_metrics.h: arbiter_memory_domain_*{domain})
// Weight runtime (WeightCacheStatus at scrape time; the reference weight
// runtime's metrics under the arbiter_ prefix, docs/http-api.md
// "GET /metrics"):
//   arbiter_weight_cache_resident_bytes, arbiter_weight_cache_max_bytes,
//   arbiter_weight_cache_pinned_bytes, arbiter_weight_cache_max_scratch_bytes,
//   arbiter_weight_pool_bytes, arbiter_host_floor_bytes       gauges
//   arbiter_weight_cache_loads_total, arbiter_weight_cache_evicts_total,
//   arbiter_weight_cache_load_seconds_total,
//   arbiter_weight_cache_compactions_total                     counters
//   arbiter_model_weights_resident{model}   1 device-resident, else 0
//   arbiter_model_weights_pinned{model}     0 unpinned, 1 pinned_system,
//                                           2 pinned_device
//   arbiter_model_weight_bytes{model}       the model's compute layout
//   arbiter_device_memory_in_use_bytes, _limit_bytes, _free_bytes,
//   _peak_bytes, _largest_free_block_bytes   the device arena's pool
// KV precache (KvCountersStatus and the tiers at scrape time; counters
// advanced by the delta since the previous scrape):
//   arbiter_kv_prompt_tokens_total{model,kind}   kind computed|cached
//   arbiter_kv_copied_tokens_total{model}        cached tokens copied from another slot
//   arbiter_kv_tier_hits_total{model,tier}       tier slot|prompt_cache|disk
//   arbiter_kv_restores_total{model,result}      result ok|failed (host or disk tier)
//   arbiter_kv_stashes_total{model}              slot → host tier moves
//   arbiter_kv_persisted_total{model}            KV files written
//   arbiter_kv_prewarms_total{model,result}      result ok|failed
//   arbiter_kv_keepalive_rewarms_total{model}
//   arbiter_kv_files_swept_total                 expired or over the disk budget
//   arbiter_kv_write_errors_total                KV saves that failed to write
//   arbiter_kv_prompt_cache_bytes, arbiter_kv_prompt_cache_entries,
//   arbiter_kv_disk_bytes                        gauges
// Other modalities (issue 14 point 6):
//   arbiter_model_unloads_by_model_total{model,capability,reason}
//   arbiter_capability_run_seconds{model,capability}   histogram of queued runs
//   arbiter_model_queue_depth{model,capability}        gauge
//   arbiter_model_queue_rejections_total{model,capability}
//   arbiter_process_model_starts_total{model}, _crashes_total{model},
//   _over_budget_stops_total{model}, arbiter_process_model_rss_bytes{model}
//   arbiter_vision_cache_lookups_total{result}         hit|miss
//   arbiter_vision_cache_entries, arbiter_vision_cache_bytes
// Text generation (TextRun, driven by the chat/completion runners: OpenAI,
// Ollama):
//   arbiter_time_to_first_token_seconds{model}      histogram
//   arbiter_time_per_output_token_seconds{model}    histogram: (e2e − TTFT) / (tokens − 1)
//   arbiter_e2e_request_latency_seconds{model}      histogram: admitted → finished
//   arbiter_prompt_tokens_total{model}, arbiter_generation_tokens_total{model}
//   arbiter_num_requests_running{model}  gauge: generating (first token out)
//   arbiter_num_requests_waiting{model}  gauge: admitted, no token yet (the
//                                        wait for a KV slot and the prefill)
//   arbiter_kv_cache_usage_perc{model}   gauge, 0..1: Σ tokens held by the
//                                        model's slots / (slots × ctx)
// With [server] metrics_compat = ["vllm"] (EnableVllmCompat), the same
// three gauges under vLLM's names with a model_name label — the model-server
// protocol routers read (Gateway API Inference Extension, llm-d):
//   vllm:num_requests_running{model_name}, vllm:num_requests_waiting{model_name},
//   vllm:kv_cache_usage_perc{model_name}
// HTTP:
//   arbiter_http_requests_total{route,code}  route is the route pattern
//                                            ("/admin/models/{name}/load"),
//                                            "other" for unknown paths
//
// Thread safety: thread-safe (prometheus-cpp families and metrics are; the
// scrape-time bookkeeping has its own lock).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/arbiter/vision_embedding_cache.h"
#include "arbiter/runtime/backend_models.h"
#include "arbiter/base/mutex.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/runtime/snapshots.h"
#include "server/internal/domain_metrics.h"

namespace arbiter::server_internal {

// The KV precache's state at scrape time.
struct KvMetricsSample {
  std::vector<std::pair<std::string, KvCountersStatus>> models;  // by model name
  uint64_t files_swept = 0;
  uint64_t write_errors = 0;
  uint64_t prompt_cache_bytes = 0;
  uint64_t prompt_cache_entries = 0;
  uint64_t disk_bytes = 0;
  // Per text model: Σ tokens held by its slots / (slots × ctx), 0..1.
  std::vector<std::pair<std::string, double>> kv_usage;
};

// The process's measured memory, next to the ledger (docs/memory.md "The
// ledger is the truth").
struct ProcessMemorySample {
  uint64_t resident_bytes = 0;    // RssAnon + RssShmem
  int64_t unaccounted_bytes = 0;  // resident − charged − runtime, signed
};

// Process-backed models and the vision cache at scrape time.
struct ModalityMetricsSample {
  std::vector<ProcessModelStats> processes;
  VisionCacheStats vision_cache;
};

class ServerMetrics;

// One text generation's metrics, from admission to the end (RAII: the
// running/waiting gauges are left when it is destroyed, whatever happened).
// Usage, in a runner:
//   TextRun run = ctx.metrics->StartTextRun(model);   // after StartText succeeded
//   ... on the first generated token: run.FirstToken();
//   ... after Run(): run.Finished(prompt_tokens, generated_tokens);
// Thread-compatible (one runner); move-only.
class TextRun {
 public:
  TextRun() = default;
  TextRun(TextRun&& o) noexcept;
  TextRun& operator=(TextRun&& o) noexcept;
  TextRun(const TextRun&) = delete;
  TextRun& operator=(const TextRun&) = delete;
  ~TextRun();
  // Records the TTFT and moves the request from waiting to running. Once;
  // later calls do nothing.
  void FirstToken();
  // Records the end-to-end latency, the time per output token (when more
  // than one token) and the token counters, and leaves the running (or
  // waiting) gauge. Once.
  void Finished(int prompt_tokens, int generated_tokens);

 private:
  friend class ServerMetrics;
  void Leave();
  ServerMetrics* metrics_ = nullptr;
  std::string model_;
  int64_t start_ns_ = 0;   // steady clock
  int64_t first_ns_ = 0;   // 0 = no token yet
  bool finished_ = false;
};

class ServerMetrics {
 public:
  ServerMetrics();

  // A text request was admitted (counted as waiting until FirstToken()).
  TextRun StartTextRun(std::string model);
  // Registers the vllm:* gauges ([server] metrics_compat = ["vllm"]). Call
  // before serving.
  void EnableVllmCompat();

  // Fast: a label lookup and an atomic add. Safe from any thread.
  void OnEvent(const ArbiterEvent& event);
  void OnHttpRequest(std::string_view route, int status);
  // Refreshes the snapshot-driven series from `stats` and returns the text
  // exposition of every series.
  // `weights` may be null (no weight series then).
  // `kv` may be null (no KV series then).
  // `process` may be null (no process series then): the measured side of
  // the ledger (RuntimeStatus::process_resident_bytes, unaccounted_bytes).
  std::string Scrape(const ArbiterStats& stats, const MemoryLedgerSnapshot& ledger,
                     const WeightCacheStatus* weights, const KvMetricsSample* kv = nullptr,
                     const ProcessMemorySample* process = nullptr,
                     const ModalityMetricsSample* modalities = nullptr) EXCLUDES(mu_);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& loads_;
  prometheus::Family<prometheus::Counter>& load_failures_;
  prometheus::Family<prometheus::Counter>& unloads_;
  prometheus::Family<prometheus::Counter>& evictions_;
  prometheus::Family<prometheus::Counter>& http_requests_;
  prometheus::Gauge& pressure_level_;
  prometheus::Gauge& budget_bytes_;
  prometheus::Gauge& charged_bytes_;
  prometheus::Gauge& resident_bytes_;
  prometheus::Gauge& runtime_bytes_;
  prometheus::Gauge& process_resident_bytes_;
  prometheus::Gauge& unaccounted_bytes_;
  prometheus::Family<prometheus::Counter>& model_unloads_;
  prometheus::Family<prometheus::Histogram>& runs_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Counter>& queue_rejections_;
  prometheus::Family<prometheus::Counter>& process_starts_;
  prometheus::Family<prometheus::Counter>& process_crashes_;
  prometheus::Family<prometheus::Counter>& process_over_budget_;
  prometheus::Family<prometheus::Gauge>& process_rss_;
  prometheus::Family<prometheus::Counter>& vision_cache_lookups_;
  prometheus::Gauge& vision_cache_entries_;
  prometheus::Gauge& vision_cache_bytes_;
  prometheus::Family<prometheus::Gauge>& model_resident_;
  prometheus::Family<prometheus::Gauge>& model_bytes_;
  prometheus::Family<prometheus::Gauge>& charged_by_kind_;
  DomainMetrics domains_ GUARDED_BY(mu_);
  // Weight runtime.
  prometheus::Family<prometheus::Counter>& weight_loads_;
  prometheus::Family<prometheus::Counter>& weight_evicts_;
  prometheus::Family<prometheus::Counter>& weight_load_seconds_;
  prometheus::Family<prometheus::Counter>& weight_compactions_;
  prometheus::Family<prometheus::Gauge>& model_weights_resident_;
  prometheus::Family<prometheus::Gauge>& model_weights_pinned_;
  prometheus::Family<prometheus::Gauge>& model_weight_bytes_;

  // KV precache.
  prometheus::Family<prometheus::Counter>& kv_prompt_tokens_;
  prometheus::Family<prometheus::Counter>& kv_copied_tokens_;
  prometheus::Family<prometheus::Counter>& kv_tier_hits_;
  prometheus::Family<prometheus::Counter>& kv_restores_;
  prometheus::Family<prometheus::Counter>& kv_stashes_;
  prometheus::Family<prometheus::Counter>& kv_persisted_;
  prometheus::Family<prometheus::Counter>& kv_prewarms_;
  prometheus::Family<prometheus::Counter>& kv_keepalive_;
  prometheus::Family<prometheus::Counter>& kv_files_swept_;
  prometheus::Family<prometheus::Counter>& kv_write_errors_;
  prometheus::Gauge& kv_prompt_cache_bytes_;
  prometheus::Gauge& kv_prompt_cache_entries_;
  prometheus::Gauge& kv_disk_bytes_;

  // Text generation (TextRun).
  friend class TextRun;
  prometheus::Family<prometheus::Histogram>& ttft_;
  prometheus::Family<prometheus::Histogram>& tpot_;
  prometheus::Family<prometheus::Histogram>& e2e_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_;
  prometheus::Family<prometheus::Counter>& generation_tokens_;
  prometheus::Family<prometheus::Gauge>& running_;
  prometheus::Family<prometheus::Gauge>& waiting_;
  prometheus::Family<prometheus::Gauge>& kv_usage_;
  // Null until EnableVllmCompat(); set before serving, read after.
  prometheus::Family<prometheus::Gauge>* vllm_running_ = nullptr;
  prometheus::Family<prometheus::Gauge>* vllm_waiting_ = nullptr;
  prometheus::Family<prometheus::Gauge>* vllm_kv_usage_ = nullptr;
  // +1 / −1 on the running or waiting gauges of `model` (and vLLM's twins).
  void AddRunning(const std::string& model, double delta);
  void AddWaiting(const std::string& model, double delta);

  // Advances a counter to the cumulative value `now` (by the delta since the
  // last scrape of that series).
  void Advance(prometheus::Family<prometheus::Counter>& family, const prometheus::Labels& labels,
               uint64_t now) REQUIRES(mu_);

  Mutex mu_;  // serializes scrapes
  // KV counter values already added, by series (family name + labels).
  std::map<std::string, uint64_t> kv_seen_ GUARDED_BY(mu_);
  std::map<std::string, uint64_t> failures_seen_ GUARDED_BY(mu_);  // resident key → count
  // Weight counters already added (the snapshot is cumulative).
  uint64_t weight_loads_seen_ GUARDED_BY(mu_) = 0;
  uint64_t weight_evicts_seen_ GUARDED_BY(mu_) = 0;
  uint64_t weight_compactions_seen_ GUARDED_BY(mu_) = 0;
  double weight_load_seconds_seen_ GUARDED_BY(mu_) = 0;
  std::map<std::string, prometheus::Gauge*> weight_gauge_by_name_ GUARDED_BY(mu_);
};

}  // namespace arbiter::server_internal
