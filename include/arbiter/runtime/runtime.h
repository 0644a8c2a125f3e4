// arbiter/runtime/runtime.h — the running system: one owner for everything
// `arbiter serve` (and `arbiter generate`) runs, and the typed operations the
// HTTP server and the CLI call (docs/architecture.md, the layer table: runtime).
//
// Runtime::Create(config) builds, in this order: the pressure sources, the
// MemoryLedger (the one byte budget), the KV tiers (disk store, host prompt
// cache, one KvPrecache per text model), the ReclaimPolicy (Note [Reclaim
// order] in reclaim_policy.cc), the device arena, host-floor store and
// WeightCache, the MemoryArbiter with every configured model registered,
// then starts the pressure subscription and the KV maintenance thread.
// Nothing holds a pointer to something built after it except through the
// ReclaimTargets the policy reads at call time, which are complete before
// any model can load.
//
// Shutdown() tears it down in the reverse order, documented in Note
// [Runtime shutdown] in runtime.cc: stop the pressure subscription and the
// KV maintenance thread, shut the arbiter down (every engine is freed; its
// slots' conversations are saved to the KV directory), spill the prompt
// cache to disk, then free the weight cache, the store and the arena.
//
// Operations return typed results; errors carry a Status with a typed
// reason (Note [Typed error reasons] in base/status.h): kModelNotFound,
// kWrongCapability, kMemoryPressure, kBudgetExceeded, kNotResident,
// kLoadFailed, kContextLengthExceeded, ... — the edge maps them to HTTP.
//
// Thread safety: thread-safe; every operation may be called from many
// threads until Shutdown(). TextGeneration is thread-compatible (one owner).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/arbiter/vision_embedding_cache.h"
#include "arbiter/base/status.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/memory/memory_pool.h"
#include "arbiter/runtime/backend_models.h"
#include "arbiter/runtime/config.h"
#include "arbiter/runtime/modalities.h"
#include "arbiter/runtime/reclaim_policy.h"
#include "arbiter/runtime/snapshots.h"
#include "arbiter/runtime/vocabulary.h"

namespace arbiter {

// ---- requests and results (native structs; the edge parses into them) ----

enum class OutputConstraintKind { kNone, kJsonObject, kJsonSchema, kGrammar };

// OpenAI's tool_choice: "auto" (the model decides), "none" (no call; tools
// still described), "required" (at least one call), or one named function.
struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction: its name
};

// One chat or completion request.
struct TextRequest {
  std::string model;
  bool chat = true;                    // true: `messages`; false: `prompt`
  std::vector<ChatMessage> messages;   // chat: rendered with the model's template
  std::string prompt;                  // completion text (prompt_is_ids false)
  std::vector<int32_t> prompt_ids;     // completion token ids (prompt_is_ids true)
  bool prompt_is_ids = false;
  bool echo = false;                   // completion: prepend the prompt to the text
  // Tokens to generate, ≥ 1. Empty: chat → what the context leaves;
  // completion → 16 (OpenAI's default).
  std::optional<int> max_tokens;
  SamplingParams sampling;
  std::vector<std::string> stop;       // not applied to a forced tool call (tool_choice)
  bool ignore_eos = false;             // keep generating past end-of-sequence
  std::string conversation_id;         // "" = none (the longest-prefix slot)
  std::string cache_ttl;               // "" | "short" | "long" | "extended"
  // Chat image parts: each is read by the model's `vision` model first and
  // its text placed in the message as a delimited block (kInvalidRequest
  // when the model has no vision model).
  std::vector<ChatImage> images;
  // Constrained decoding (arbiter/engine/grammar.h): the output must be a
  // JSON object, match a JSON schema (`constraint_text` = the schema as
  // JSON text), or match a GBNF grammar (`constraint_text` = its text).
  OutputConstraintKind constraint = OutputConstraintKind::kNone;
  std::string constraint_text;
  // -1: no logprobs; 0..20 alternatives per token (GenerationResult::logprobs).
  int top_logprobs = -1;
  // Chat only: functions rendered into the prompt in the template family's
  // tool format and parsed back out of the output (TextResult::tool_calls).
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice;
  // Called for every generated token before its text (GenerationRequest::on_token).
  std::function<void(int32_t token, const TokenLogprob* lp)> on_token;
};

struct TextResult {
  GenerationResult generation;
  KvOutcome kv;                        // slot, source, restored tokens (slot -1: no precache)
  // With tools: the calls parsed out of the output, and the output without
  // them (else content = generation.text, no calls). A forced call
  // (tool_choice "required" or a named function) gives exactly one call, or
  // none and empty content when the budget ran out before the call was
  // complete (finish reason kLength).
  std::vector<ToolCall> tool_calls;
  std::string content;
};

// An admitted text generation: the model is pinned (its handle held), the
// prompt rendered, tokenized and checked against the context. Run() once;
// the model is released when Run returns (or when this is destroyed).
class TextGeneration {
 public:
  virtual ~TextGeneration() = default;
  virtual const std::string& model() const = 0;
  // Prompt tokens, [n] (for usage before the run).
  virtual int prompt_tokens() const = 0;
  // The prompt as the engine sees it: [prompt_tokens()] token ids.
  virtual const std::vector<int32_t>& prompt_ids() const = 0;
  // Completion with echo: the prompt text to prepend; else "".
  virtual const std::string& echo_text() const = 0;
  // A token's bytes in the model's vocabulary (logprobs' `token` and
  // `bytes`). REQUIRES: called before Run returns (e.g. from on_token or
  // the TextCallback): the model may be unloaded afterwards.
  virtual std::string TokenBytes(int32_t id) const = 0;
  // Generates; `on_text` receives each piece of text (return false to stop;
  // with tools, text that may be a tool call is held back: Note [Tool-call
  // hold-back] in text.cc).
  // `cancelled` is checked between tokens; while the run waits for a KV
  // slot its token wakes the wait at once (a predicate-only Cancellation is
  // polled: base/cancel.h). Cancellation is not an error
  // (finish_reason kCancelled). Errors: the engine's (kNotResident when
  // externally managed weights were demoted since the acquire,
  // kBudgetExceeded when reloading them cannot get room, kInvalidArgument);
  // kInternal with reason kToolCallUnparsed when a forced call's output does
  // not parse (a bug: the grammar should not allow it).
  virtual Result<TextResult> Run(const TextCallback& on_text, const Cancellation& cancelled) = 0;
};

struct EmbedRequest {
  std::string model;
  std::vector<std::string> inputs;     // ≥ 1
  std::optional<int> dimensions;       // must equal the model's hidden size when set
};
struct EmbedResult {
  std::vector<std::vector<float>> vectors;  // [inputs, hidden_size], L2-normalized
  int prompt_tokens = 0;
};

struct PrewarmSpec {
  std::string model;
  std::string conversation_id;         // non-empty
  std::vector<ChatMessage> messages;   // the stable prefix, or
  std::string prompt;                  // plain text when `messages` is empty
  std::string cache_ttl;
};
struct PrewarmResult {
  GenerationResult generation;         // slot, prompt_tokens, cached_tokens, timings
};

// ---- snapshots (stats are structs first; the edge serializes them) --------

// One configured model: the arbiter's view and, with a weight cache, its
// weights; ready is false for a failed model or, in externally-managed
// mode, weights not on the device.
struct ModelStatus {
  ModelStats arbiter;
  std::optional<WeightModelStatus> weights;
  bool ready = true;
  std::optional<std::string> engine;       // ModelEngineName of its [[models]] engine
  std::optional<std::string> device;       // its [[models]] device ("cpu", "vulkan", "vulkan:N")
  // A built-in model's layers per compute device ("vulkan:0" → 12, "cpu" →
  // 4: partial offload, ResolveDeviceLayers); empty for other engines.
  std::map<std::string, int> layers;
  // Everything the model costs now: the arbiter's bytes (its entry's
  // charges, or the estimate when not loaded) plus its weights' ledger
  // charges (device weights and host floors, owner "weights::<name>").
  uint64_t total_bytes = 0;
  // Process-backed models: starts, crashes (with the last exit status and
  // output tail), over-budget stops, last RSS reading.
  std::optional<ProcessModelStats> process;
};

struct RuntimeStatus {
  ArbiterStats arbiter;
  MemoryLedgerSnapshot ledger;
  std::optional<WeightCacheStatus> weights;  // its `pool` is the device arena
  std::vector<ModelStatus> models;          // configuration order
  std::string pressure_source;              // "cgroup" | "psi" | "meminfo" | "none"
  std::optional<NextVictim> next_victim;    // the reclaim policy's next model
  // The same per memory domain, by name ("host" included): a device's
  // victims are the idle models charged there.
  std::map<std::string, std::optional<NextVictim>> domain_next_victims;
  // The measured side of the ledger (docs/memory.md "The ledger is the
  // truth"): RssAnon + RssShmem of the process at the time of the status,
  // and that minus ledger.charged_bytes minus ledger.runtime_bytes, signed
  // (positive: memory the ledger does not know of), outside_bytes added to
  // the measured side. 0 and 0 when
  // /proc/self/status cannot be read.
  uint64_t process_resident_bytes = 0;
  int64_t unaccounted_bytes = 0;
  // Charged bytes that live outside RssAnon + RssShmem, counted on the
  // measured side: backends' file-backed pages and process models'
  // children (BackendContext::OutsideBytes).
  uint64_t outside_bytes = 0;
  // Process-backed models (starts, crashes, RSS) and the vision cache.
  std::vector<ProcessModelStats> processes;
  VisionCacheStats vision_cache;
};

struct KvModelStatus {
  std::string name;
  std::string model_hash;
  std::vector<KvSlotView> slots;
  std::vector<ConversationHandle> conversations;
  std::vector<KvPrewarmView> prewarmed;
  int high_water = 0;
  int recommended_parallel = 0;
  KvCountersStatus counters;
};

struct KvPromptCacheStatus {
  uint64_t bytes = 0;
  uint64_t capacity_bytes = 0;
  std::vector<PromptCacheEntryInfo> entries;
  PromptCache::Counters counters;
};

inline constexpr size_t kKvStatusMaxFiles = 1000;
struct KvStatus {
  std::string dir;
  uint64_t disk_bytes = 0;
  KvSettings settings;
  std::optional<KvPromptCacheStatus> prompt_cache;  // empty: [kv] prompt_cache = 0
  std::vector<KvModelStatus> models;
  std::vector<KvFileInfo> files;       // newest first, at most kKvStatusMaxFiles
  size_t files_total = 0;
  uint64_t files_swept = 0;            // by the maintenance thread since start
  uint64_t write_errors = 0;           // KV saves that failed to write (KvStore::write_errors)
};

// Runtime::Tokenize: the ids and each token's raw bytes (a piece may be a
// partial UTF-8 sequence).
struct TokenizeResult {
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;     // [ids]
};

// Runtime::InspectTextModel: a text model's engine shape and slots.
struct TextModelView {
  std::string name;
  std::string path;                    // [[models]] path
  bool loaded = false;
  int n_ctx = 0;                       // tokens per slot: the engine's when loaded, else [[models]] ctx
  int n_slots = 0;                     // [[models]] parallel
  std::string chat_template;           // ChatTemplateName, "" when none or not loaded
  int vocab_size = 0;                  // 0 when not loaded
  std::vector<KvSlotView> slots;       // [n_slots] (n_tokens 0 while busy)
};

struct UnloadResult {
  bool unloaded = false;               // false: it was not resident
  ModelStatus model;
};

// ---- the runtime -----------------------------------------------------------

class Runtime {
 public:
  // Builds and starts everything `config` describes (see the file comment).
  // A broken model is not an error: it is registered, marked failed (its
  // error in Status()) and the others serve. Errors: the config's resources
  // cannot be created ([kv] dir, [memory] arena or shared store, an
  // explicitly chosen pressure source), naming the key.
  static Result<std::unique_ptr<Runtime>> Create(const Config& config);

  virtual ~Runtime() = default;

  // Note [Runtime shutdown]. Idempotent; operations after it fail with
  // kShuttingDown. Blocks until loads in flight and held handles are done
  // (bounded by the arbiter's shutdown timeout).
  virtual void Shutdown() = 0;

  virtual const Config& config() const = 0;

  // Names and capabilities of the configured models, configuration order.
  virtual std::vector<std::pair<std::string, Capability>> ModelNames() const = 0;

  // Admits a text generation (see TextGeneration). Errors: kModelNotFound,
  // kWrongCapability, the acquire's (kMemoryPressure, kBudgetExceeded,
  // kLoadFailed, kNotResident, kAcquireTimeout, kShuttingDown),
  // kNoChatTemplate, kEmptyPrompt, kContextLengthExceeded, kInvalidTokenId,
  // kInvalidRequest (a bad cache_ttl or conversation id).
  virtual Result<std::unique_ptr<TextGeneration>> StartText(TextRequest request) = 0;

  // Embeds every input. Errors: as StartText's acquire, kInvalidRequest
  // (dimensions), kContextLengthExceeded, kCancelled (`cancelled` as Run's).
  virtual Result<EmbedResult> Embed(const EmbedRequest& request,
                                    const Cancellation& cancelled) = 0;

  virtual RuntimeStatus Status() const = 0;
  // The KV tiers; without `with_files` the file list stays empty (the
  // directory is scanned once, for disk_bytes). Errors: kNoKvPrecache when
  // [kv] gave none (never with Create's runtime).
  virtual Result<KvStatus> Kv(bool with_files = true) const = 0;

  // ---- admin operations (docs/http-api.md "Admin") ----
  // Loads (acquire + release: resident, unpinned). Errors: as StartText's acquire.
  virtual Result<ModelStatus> LoadModel(const std::string& name) = 0;
  // Unloads, waiting up to `timeout_ms` for holders. Errors: kModelNotFound,
  // kModelHeld, kLoadInProgress.
  virtual Result<UnloadResult> UnloadModel(const std::string& name, int64_t timeout_ms) = 0;
  // Sets the weights' residency floor; returns the previous one and the
  // model. Errors: kModelNotFound, kModelBroken, kPinDoesNotFit, others.
  virtual Result<std::pair<ResidencyState, ModelStatus>> SetResidency(const std::string& name,
                                                                      ResidencyState target) = 0;
  // WeightCache::Compact. Errors: kModelNotFound for a name in `reload`.
  virtual Result<CompactResult> Compact(const std::vector<std::string>& reload) = 0;
  // A pressure level for testing and for control planes (the bridge source;
  // the reclaim policy reacts on this thread). Returns the level in force.
  virtual MemoryPressureLevel DispatchPressure(MemoryPressureLevel level,
                                               std::optional<uint64_t> free_bytes) = 0;
  // Prefills a conversation's stable prefix. Errors: kModelNotFound,
  // kWrongCapability, kNoKvPrecache, the acquire's, kNoChatTemplate, the
  // prompt checks, kCancelled (shutting down).
  virtual Result<PrewarmResult> Prewarm(const PrewarmSpec& request) = 0;
  // Persists and closes a conversation in `model` ("" = every text model).
  // Returns the models that had it. Errors: kModelNotFound (unknown
  // `model`), kConversationNotFound.
  virtual Result<std::vector<std::string>> CloseConversation(const std::string& conversation_id,
                                                             const std::string& model) = 0;

  // ---- other modalities (issue 14; arbiter/runtime/modalities.h) ----
  // Each runs through the model's request queue (one run at a time per
  // model, bounded by [[models]] queue: kQueueFull when full). Errors: as
  // StartText's acquire, kInvalidRequest for bad input (naming the field:
  // not audio, too long, a corrupt or oversized image, an unknown voice,
  // empty input, a speech input over [server] max_speech_chars), kCancelled.
  virtual Result<TranscribeResult> Transcribe(const TranscribeRequest& request,
                                              const Cancellation& cancelled) = 0;
  virtual Result<VadResult> DetectSpeech(const VadRequest& request,
                                         const Cancellation& cancelled) = 0;
  // Synthesizes; `on_start` is called once before the first audio (return
  // false to stop), then `on_pcm` with [n] int16 mono samples at that rate
  // as they are produced (return false to stop). Both run on the calling
  // thread. An error before on_start means nothing was produced.
  virtual arbiter::Status Speak(const SpeechRequest& request,
                       const std::function<bool(const SpeechStart&)>& on_start,
                       const std::function<bool(std::span<const int16_t>)>& on_pcm,
                       const Cancellation& cancelled) = 0;
  // Reads an image, through the VisionEmbeddingCache (keyed by the model
  // family and the normalized image).
  virtual Result<DescribeResult> Describe(const DescribeRequest& request,
                                          const Cancellation& cancelled) = 0;
  // The configured entry of `name` (engine, vision model, ...).
  virtual Result<ModelEntry> Model(const std::string& name) const = 0;
  // Pins a process-backed model (starting its process if needed) for one
  // proxied request. Errors: kModelNotFound, kWrongCapability (not a
  // process model or another capability), the acquire's.
  virtual Result<ProcessLease> AcquireProcess(const std::string& name, Capability capability) = 0;
  // The VisionEmbeddingCache's counters.
  virtual VisionCacheStats VisionCache() const = 0;

  // ---- Ollama's keep_alive and the llama.cpp server's introspection
  // (runtime/introspect.cc). Defaults: kUnimplemented (test doubles). ----
  // Replaces `model`'s idle TTL from now on (Ollama's keep_alive): empty =
  // never unloaded for idleness, 0 = unloaded by the arbiter's next idle
  // sweep (within [memory] idle check period, 1 s) once no request holds it.
  // Errors: kModelNotFound, kInvalidRequest for a negative TTL.
  virtual arbiter::Status SetIdleTtl(const std::string& model, std::optional<int64_t> ttl_ms) {
    (void)model, (void)ttl_ms;
    return UnimplementedError("SetIdleTtl is not implemented by this runtime");
  }
  // Tokenizes `text` with text model `model`'s tokenizer (loading it).
  // `add_special`: prepend the model's BOS token when it has one;
  // `parse_special`: special tokens written in the text map to their ids.
  // Errors: kModelNotFound, kWrongCapability, the acquire's.
  virtual Result<TokenizeResult> Tokenize(const std::string& model, std::string_view text,
                                          bool add_special, bool parse_special) {
    (void)model, (void)text, (void)add_special, (void)parse_special;
    return UnimplementedError("Tokenize is not implemented by this runtime");
  }
  // The text of `ids` (special tokens rendered). Errors: as Tokenize's,
  // kInvalidTokenId for an id outside the vocabulary.
  virtual Result<std::string> Detokenize(const std::string& model,
                                         const std::vector<int32_t>& ids) {
    (void)model, (void)ids;
    return UnimplementedError("Detokenize is not implemented by this runtime");
  }
  // `model`'s shape and slots. Never loads it; when it is loaded, the
  // engine is pinned for the read (which counts as a use for its idle TTL).
  // Errors: kModelNotFound, kWrongCapability.
  virtual Result<TextModelView> InspectTextModel(const std::string& model) {
    (void)model;
    return UnimplementedError("InspectTextModel is not implemented by this runtime");
  }

  // Arbiter events (loads, unloads, evictions, pressure, runs).
  virtual ArbiterEventSubscription OnEvent(ArbiterEventListener listener) = 0;
  // Charges `bytes` that a layer above the runtime holds for as long as it
  // runs (the server's history rings: GET /admin/history) to the one
  // ledger under `owner`, never refused (an overshoot is an over-commit,
  // as MemoryLedger::Charge). The token uncharges on destruction and may be
  // resized (MemoryCharge::ForceResize); it must not outlive the runtime.
  // Thread-safe. Default: an empty token (test doubles have no ledger).
  virtual MemoryCharge ChargeMemory(std::string owner, ChargeKind kind, size_t bytes) {
    (void)owner, (void)kind, (void)bytes;
    return MemoryCharge();
  }
  // The policy itself (tests observe its stages).
  virtual ReclaimPolicy& reclaim_policy() = 0;
};

}  // namespace arbiter
