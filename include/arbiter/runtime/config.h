// arbiter/runtime/config.h — the TOML configuration of `arbiter serve`.
//
// Sources, lowest precedence first: built-in defaults < the TOML file <
// environment (ARBITER_HOST, ARBITER_PORT, ARBITER_API_KEY, ARBITER_BUDGET,
// ARBITER_HEADROOM, ARBITER_PRESSURE_SOURCE) < command-line flags. Every
// setting and its default is in docs/config.md.
//
//   [server]  host, port, api_key, max_body_bytes, threads, read_timeout_s,
//             request_timeout_s, write_timeout_s, keep_alive_max, keep_alive_timeout_s,
//             acquire_timeout_s, preload, metrics_public, max_connections, queue_max,
//             max_embedding_inputs, max_embedding_tokens, max_audio_bytes,
//             max_audio_seconds, max_image_bytes, max_image_pixels
//   [memory]  budget (SIZE: bytes, "512MiB", "2GB", "75%" of MemTotal),
//             headroom (SIZE; budget = MemTotal − headroom when budget is unset),
//             the weight runtime: device_arena (SIZE; default = 2 × budget),
//             weight_cache_fraction, wiggle_fraction, shared_host_weights,
//             shared_host_weights_mode ("0600"), mode ("self_managed" |
//             "externally_managed"), compaction_interval,
//             same_role ("coexist" | "swap")
//   [pressure] source ("auto" | "meminfo" | "psi" | "cgroup" | "none"),
//             interval_ms, low_fraction, critical_fraction, psi_window_ms,
//             psi_low_stall_ms, psi_critical_stall_ms, psi_quiet_ms
//   [kv]      the KV precache: dir, ttl_short, ttl_long, ttl_extended,
//             conversation_ttl, eviction_interval, keepalive_interval
//             (durations), prompt_cache, disk_budget (SIZE; 0 = off /
//             unlimited)
//   [devices."vulkan:N"] one compute device's memory domain, applied when
//             the device is opened: budget (SIZE; "%" of the device heap),
//             headroom (SIZE; budget = heap − headroom, clamped by the
//             driver's heapBudget, when budget is unset). Unknown keys here
//             are errors.
//   [[models]] name, path, capability ("text" | "embedding" |
//             "vision-describe" | "image-gen" | "transcribe" | "speak" | "vad"),
//             engine ("builtin" | "pocketsphinx" | "flite" | "espeak-ng" |
//             "tesseract" | "process"; default from the capability), language
//             (tesseract), queue (requests waiting per model), vision (text
//             models: the vision-describe model run on image parts), command,
//             health, ready_timeout_s, estimated_size (process models), role (a
//             ResidentRoleName), idle_ttl (duration: "30s", "5m", "1h", or
//             integer seconds), parallel, ctx, residency ("unpinned" |
//             "pinned_system" | "pinned_device"), system_prompt (prefilled
//             at load), same_role ("coexist" | "swap"; default [memory]'s),
//             compute_dtype ("auto": matrices computed in their stored type |
//             "f32": converted to f32 at load), kv_type ("f16" default |
//             "bf16" | "q8_0" | "f32": the KV cache's element type),
//             chat_template ("chatml" | "llama3" | "llama2" | "mistral" |
//             "gemma" | "phi3")
//
// Unknown keys and sections are not errors: they are collected in
// Config::warnings for the caller to log. Bad values are kInvalidArgument
// naming the key, e.g. "[[models]][1].ctx must be a positive integer"
// (model indexes are 0-based); a TOML syntax error names the file, line and
// column. Relative model paths are resolved against the config file's
// directory.
//
// Thread safety: pure functions over values (the env lookup is injected).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/status.h"
#include "arbiter/engine/chat_template.h"
#include "arbiter/engine/kv_snapshot.h"  // KV types
#include "arbiter/kv/cache_key.h"  // kKeepAliveStaleFraction
#include "arbiter/memory/memory_ledger.h"  // kDefaultDeviceHeadroom
#include "arbiter/weights/weight_cache.h"

namespace arbiter {

// Headroom left to the OS and other processes by the default budget
// (bytes): budget = MemTotal − 1536 MiB.
inline constexpr uint64_t kDefaultHeadroomBytes = 1536ull << 20;

struct ServerSettings {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0 = any free port (logged)
  std::string api_key;                   // empty = no auth
  size_t max_body_bytes = 8u << 20;      // request bodies above → 413
  int threads = 0;                       // HTTP worker threads; 0 = 8 + Σ parallel
  int max_connections = 1024;            // open connections beyond → immediate 503 and close
  int queue_max = 256;                   // requests waiting for a worker beyond → 503
  int read_timeout_s = 30;               // per read of request bytes
  int request_timeout_s = 60;            // to send one whole request (headers + body) → 408
  int write_timeout_s = 30;
  int keep_alive_max = 100;              // requests per connection
  int keep_alive_timeout_s = 5;          // idle seconds before closing
  int acquire_timeout_s = 300;           // wait for a model load before 503
  bool preload = false;                  // load every model at startup
  // false (secure default): /metrics requires the API key when one is set.
  // true: /metrics is open (for scrapers without credentials).
  bool metrics_public = false;
  // POST /v1/embeddings limits (beyond → 400, before the model computes
  // anything): inputs per request (OpenAI's own cap) and the tokens of all
  // inputs together, so one request cannot hold an embedding model for long.
  int max_embedding_inputs = 2048;
  int64_t max_embedding_tokens = 300000;
  // Audio uploads (POST /v1/audio/transcriptions, /v1/audio/vad): their own
  // body limit instead of max_body_bytes, and the longest audio decoded.
  size_t max_audio_bytes = 64u << 20;
  double max_audio_seconds = 600;
  // Images (chat image parts, /v1/vision/describe): decoded bytes per image
  // and pixels, checked from the header before decoding.
  size_t max_image_bytes = 32u << 20;
  uint64_t max_image_pixels = 50'000'000;
  // POST /v1/audio/speech: the longest `input`, in Unicode code points
  // (OpenAI's limit); longer → 400 naming the key.
  int max_speech_chars = 4096;
  // SIGINT/SIGTERM: the longest wait for running requests and the runtime
  // to stop; then the work still running is logged and abandoned, and the
  // process exits (status 1).
  int shutdown_timeout_s = 10;
  // Browser origins allowed to call the API (CORS): exact origins such as
  // "http://localhost:5173", or "*" for any. Empty (default): no CORS
  // headers, preflights are not answered.
  std::vector<std::string> cors_origins;
  // Host header names served besides loopback's (Note [Host check] in
  // server/internal/access.h): host names or IP addresses without a port
  // ("[::1]" form for IPv6), any port, case-insensitive; "*" for any Host.
  // Empty (default): bound to loopback, only localhost, 127.0.0.0/8 and
  // [::1] are served; bound to another address, any Host is.
  std::vector<std::string> allowed_hosts;
  // Extra metric names GET /metrics exports for other ecosystems' readers:
  // "vllm" (vllm:num_requests_running, vllm:num_requests_waiting,
  // vllm:kv_cache_usage_perc). Empty (default): none.
  std::vector<std::string> metrics_compat;
};

// `[pressure] source`.
enum class PressureSourceKind { kAuto, kMeminfo, kPsi, kCgroup, kNone };
// "auto" | "meminfo" | "psi" | "cgroup" | "none".
std::string_view PressureSourceKindName(PressureSourceKind kind);

// `[pressure]`: which OS signal feeds the arbiter (always combined with the
// POST /admin/pressure bridge) and the thresholds the sources take.
struct PressureSettings {
  PressureSourceKind source = PressureSourceKind::kAuto;
  int64_t interval_ms = 5000;            // meminfo / cgroup poll period (≥ 500)
  double low_fraction = 0.15;            // free fraction ≤ this → low (meminfo / cgroup)
  double critical_fraction = 0.05;       // free fraction ≤ this → critical; < low_fraction
  int64_t psi_window_ms = 2000;          // PSI trigger window, 500..10000 (2 s multiples
                                         // without CAP_SYS_RESOURCE)
  int64_t psi_low_stall_ms = 300;        // "some" stall within the window → low
  int64_t psi_critical_stall_ms = 200;   // "full" stall within the window → critical
  int64_t psi_quiet_ms = 10000;          // no trigger this long → the level decays
};

// The weight runtime's `[memory]` keys (docs/config.md "[memory]").
struct WeightSettings {
  // The device arena (a cpu arena in RAM here), bytes; 0 = twice the budget
  // (address space only: the ledger's budget binds first).
  std::string device_arena_text;         // as written ("" = default)
  uint64_t device_arena_bytes = 0;
  double weight_cache_fraction = kDefaultWeightFraction;  // (0, 1]
  double wiggle_fraction = kDefaultWeightWiggle;          // [0, 1)
  // Host floors in POSIX shared memory, one copy per node for every arbiter
  // process serving the same model files.
  bool shared_host_weights = false;
  uint32_t shared_host_weights_mode = 0600;  // permission bits of the regions
  // Region name prefix: /dev/shm/<prefix>-<model>-<digest>. Processes that
  // should share floors use the same prefix; regions under it whose model is
  // not configured here are swept at startup when no process holds them.
  std::string shared_host_weights_prefix = "arbiter";
  ResidencyMode mode = ResidencyMode::kSelfManaged;
  // Compact after every N-th weight load; 0 = never. TOML key
  // [memory].compaction_interval.
  uint64_t compaction_every_loads = 0;
};

// `[kv]`: the KV precache (docs/kv-precache.md; docs/config.md "[kv]").
// Durations in ms.
struct KvSettings {
  // Directory of the disk tier; "" = <state dir>/kv (resolved by the CLI).
  std::string dir;
  // TTL class windows (docs/kv-precache.md "Keys and names"): how long a KV
  // file of each class lives after its last write or touch, and how long a
  // prompt-cache entry stays in RAM.
  int64_t ttl_short_ms = 300000;
  int64_t ttl_long_ms = 3600000;
  int64_t ttl_extended_ms = 86400000;
  // A conversation idle this long is persisted (.long) and closed (the
  // registry's default TTL, docs/kv-precache.md "Slots and conversations").
  int64_t conversation_ttl_ms = 3600000;
  // How often expired files, idle conversations and the disk budget are
  // swept (reference: 300 000; ≥ 1000 here).
  int64_t eviction_interval_ms = 300000;
  // How often the keep-alive looks for prewarmed conversations untouched for
  // ≥ 0.8 × ttl_short. Must be < 0.2 × ttl_short, so a re-warm always lands
  // before the short TTL runs out (docs/kv-precache.md "Defects of the
  // reference, fixed": keep-alive before the short TTL); default 30 s.
  int64_t keepalive_interval_ms = 30000;
  // Host-RAM prompt cache (the host tier), charged to the ledger; 0 = off.
  std::string prompt_cache_text;         // as written ("" = default)
  uint64_t prompt_cache_bytes = 512ull << 20;
  // Bytes of KV files on disk; oldest evicted first. 0 = unlimited.
  std::string disk_budget_text;          // as written ("" = default)
  uint64_t disk_budget_bytes = 4ull << 30;
};

// `[memory] same_role` (and `[[models]] same_role`): what loading a model
// does to the other resident models of its role (docs/config.md).
//   kCoexist  they stay, budget permitting (the default: a deliberate
//             departure from the seed, whose arbiter holds one model per
//             role — several configured chat models should not evict each
//             other on every alternate request while memory is free);
//   kSwap     the seed's contract: the idle models of the role are unloaded
//             first (reason "swap"); a held one is waited for (drained).
enum class SameRolePolicy { kCoexist, kSwap };
// "coexist" | "swap".
std::string_view SameRolePolicyName(SameRolePolicy policy);
// Errors: kInvalidArgument naming the accepted values.
Result<SameRolePolicy> ParseSameRolePolicy(std::string_view text);

// `[[models]] engine`: what implements a model (docs/config.md "Engines").
enum class ModelEngine { kBuiltin, kPocketSphinx, kFlite, kEspeakNg, kTesseract, kProcess };
// "builtin" | "pocketsphinx" | "flite" | "espeak-ng" | "tesseract" | "process".
std::string_view ModelEngineName(ModelEngine engine);
// The engine a capability gets without `engine` (and without `command`):
// text, embedding → builtin; transcribe, vad → pocketsphinx; speak → flite;
// vision-describe → tesseract; image-gen → process.
ModelEngine DefaultEngineFor(Capability capability);

// An external model server (`engine = "process"`, issue 14 point 3).
struct ProcessCommand {
  std::vector<std::string> argv;         // "{port}" in any element = the chosen port
  std::string health = "/health";        // GET path polled until 200
  int64_t ready_timeout_ms = 60000;
  uint64_t estimated_bytes = 256ull << 20;  // the charge before the first measurement
  std::string estimated_size_text;       // as written ("" = default)
};

struct ModelEntry {
  std::string name;                      // the "model" of requests
  // builtin: the model directory or .gguf file (required); pocketsphinx:
  // the acoustic/language model directory; tesseract: the tessdata
  // directory; espeak-ng: its data directory; "" = the engine's default.
  // Absolute after load.
  std::string path;
  Capability capability = Capability::kText;
  ModelEngine engine = ModelEngine::kBuiltin;
  std::string language = "eng";          // tesseract: the language data's name
  // Requests waiting for this model beyond the one running → 503 with
  // Retry-After (non-text capabilities; MemoryArbiter queue_max).
  int queue = 16;
  // Text models: the vision-describe model run on image parts ("" = images
  // refused with 400).
  std::string vision;
  ProcessCommand process;                // engine = process
  int parallel = 1;                      // KV slots = concurrent requests
  int ctx = 2048;                        // tokens per slot
  // Resident role; empty = DefaultRoleFor(capability).
  std::optional<ResidentRole> role;
  // Unload the model once idle (no request using it) this long; empty = never.
  std::optional<int64_t> idle_ttl_ms;
  // Weight residency floor (WeightCache): unpinned, pinned_system (a host
  // floor is kept), pinned_device (always in the device arena).
  ResidencyState residency = ResidencyState::kUnpinned;
  // Text models: the stable prefix (a system message) prefilled at load on
  // the synthetic conversation "__system_prefix__"; "" = none.
  std::string system_prompt;
  // Overrides [memory] same_role for this model; empty = the [memory] one.
  std::optional<SameRolePolicy> same_role;
  // compute_dtype = "f32": weight matrices converted to f32 at load instead
  // of computed in their stored type (ModelFilesOptions::compute_f32).
  bool compute_f32 = false;
  // kv_type: the element type of the model's KV cache, its prompt-cache
  // snapshots and its KV files (EngineOptions::kv_type).
  GgmlType kv_type = kDefaultKvType;
  // device: where the built-in engine computes and keeps the weights, KV and
  // scratch — "cpu" (the host domain), "vulkan" (the first GPU, else the
  // first Vulkan device) or "vulkan:N" (its own memory domain, `[devices]`).
  std::string device = "cpu";
  // device_layers (on a Vulkan device): how many of the model's last layers
  // run there, with the output layer; the others run on the CPU (partial
  // offload, EngineOptions::device_layers). −1 (unset): arbiter decides at
  // startup — every layer when the model fits the device's budget, else the
  // most that fit (ResolveDeviceLayers), the CPU when none does.
  int device_layers = -1;
  // chat_template = "<family>": render chats in that family instead of the
  // one the model's template or tokens give (ModelFilesOptions::chat_template).
  std::optional<ChatTemplateKind> chat_template;
};

// [devices."NAME"]: the memory domain of one compute device (Note [Memory
// domains] in arbiter/memory/memory_ledger.h). Sizes stay text until the
// device is opened: a percentage is of the device's heap, which only the
// driver knows (ResolveDeviceBudget()).
struct DeviceSettings {
  std::string name;                        // "vulkan:N"
  std::optional<std::string> budget_text;  // as written; unset = heap − headroom
  std::string headroom_text{kDefaultDeviceHeadroom};
};

struct Config {
  ServerSettings server;
  std::string budget_text;               // as written ("" = default)
  uint64_t budget_bytes = 0;             // resolved [memory] budget
  std::string headroom_text;             // as written ("" = default 1536MiB)
  uint64_t headroom_bytes = kDefaultHeadroomBytes;  // [memory] headroom
  SameRolePolicy same_role = SameRolePolicy::kCoexist;  // [memory] same_role
  PressureSettings pressure;
  WeightSettings weights;
  KvSettings kv;
  std::vector<ModelEntry> models;
  std::vector<DeviceSettings> devices;   // [devices."NAME"], sorted by name
  std::string state_dir;                 // resolved by the CLI
  std::vector<std::string> warnings;     // unknown keys etc., for logging
};

// MemTotal − kDefaultHeadroomBytes; half of MemTotal when that would leave
// less than a quarter of it.
uint64_t DefaultBudgetBytes(uint64_t mem_total_bytes);

// Parses a duration: integer seconds (≥ 0) or a string "<n><unit>" with unit
// ms, s, m or h ("30s", "5m", "1h", "250ms"). Returns milliseconds.
// Errors: kInvalidArgument naming `key`.
Result<int64_t> ParseDurationMs(std::string_view text, std::string_view key);

// A default config (no models), budget = DefaultBudgetBytes(mem_total_bytes).
Config DefaultConfig(uint64_t mem_total_bytes);

// Parses TOML `text` over the defaults. `file` names it in errors and its
// directory anchors relative model paths. `mem_total_bytes` is 100% for "75%".
Result<Config> ParseConfigToml(std::string_view text, const std::string& file,
                               uint64_t mem_total_bytes);
// Reads `path` and parses it. kNotFound when missing.
Result<Config> LoadConfigFile(const std::string& path, uint64_t mem_total_bytes);

// getenv-like lookup: returns nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

// Applies ARBITER_HOST, ARBITER_PORT, ARBITER_API_KEY, ARBITER_BUDGET,
// ARBITER_HEADROOM (re-derives the budget when no budget was set) and
// ARBITER_PRESSURE_SOURCE. Errors name the variable (`ARBITER_PORT must be an
// integer in 0..65535`).
Status ApplyEnvOverrides(const EnvLookup& env, uint64_t mem_total_bytes, Config* config);

// Whether `name` names a compute device's memory domain: "vulkan:N" with N
// a decimal index (0..999, no sign or leading zero), as the Vulkan loader
// enumerates physical devices.
// Errors: kInvalidArgument quoting the name (at most 64 bytes of it) and the
// expected form.
Status ValidateDeviceName(std::string_view name);

// Checks cross-field rules: unique model names, port range, etc.
Status ValidateConfig(const Config& config);

// $XDG_STATE_HOME/arbiter, else $HOME/.local/state/arbiter.
// kFailedPrecondition when neither variable is set.
Result<std::string> DefaultStateDir(const EnvLookup& env);

}  // namespace arbiter
