// arbiter/engine/engine.h — the built-in CPU engine for Llama-family
// decoders: one loaded model with `n_slots` KV slots.
//
// Architectures: LlamaForCausalLM, Qwen2ForCausalLM (q/k/v bias),
// Qwen3ForCausalLM (per-head q/k RMSNorm); weights F32/F16/BF16 converted to
// f32 into the buffers of a WeightCache (the engine owns no weight memory). Forward pass: RMSNorm, RoPE (theta from config; HF
// "rotate_half" layout), grouped-query attention, SwiGLU MLP, tied or separate
// lm_head. Prefill runs the prompt in batches through cblas_sgemm; decode
// uses cblas_sgemv (OpenBLAS).
//
// KV cache: per slot [n_layers, 2, n_ctx, n_kv_heads × head_dim] f32. The
// engine is the one place that chooses a slot and waits for one (Note [Slot
// choice] and Note [Slot waits] in src/engine/engine.cc): ReserveSlot holds
// a slot for its caller — the one it names ("pinned"), or the free slot
// whose cached tokens share the longest common prefix with its prompt —
// and Generate / SaveSlot / VisitSlot / RestoreSlot / ClearSlot then run
// within that SlotReservation without waiting again. The calls that take a
// slot index or GenerationRequest::slot reserve one themselves for their
// duration. Before prefill, a longer prefix held by another free slot is
// copied in instead of recomputed, so a common system prefix is computed
// once per engine.
//
// Thread safety: thread-safe. Every method may be called from many threads;
// up to n_slots reservations are held at once, the rest block until a slot
// (their pinned one, if any) frees, their deadline passes, or they are
// cancelled (a CancelToken wakes them at once; a CancelFn is polled).
//
// Example: compute a system prefix once, keep it, start a conversation from it.
//   GenerationRequest req;  req.prompt_ids = system_ids;  req.slot = 0;  req.max_tokens = 1;
//   engine->Generate(req, nullptr, nullptr);                // slot 0 holds the prefix
//   Result<KvSnapshot> kept = engine->SaveSlot(0, nullptr);  // e.g. into a prompt cache
//   req.prompt_ids.insert(req.prompt_ids.end(), user_ids.begin(), user_ids.end());
//   req.slot = 1;  req.max_tokens = 256;
//   engine->Generate(req, on_text, cancelled);  // copies the prefix from slot 0:
//                                               // copied_tokens = system_ids.size()
//
// Example: several steps on one slot without letting it go (what KvPrecache
// does: stash the previous owner, restore a conversation, generate).
//   Result<SlotReservation> r = engine->ReserveSlot({.slot = 1}, deadline, token);
//   if (!r.ok()) return r.status();                      // kCancelled, kDeadlineExceeded
//   Result<KvSnapshot> old = engine->SaveSlot(*r);       // no second wait
//   engine->RestoreSlot(*r, conversation.View());
//   engine->Generate(*r, req, on_text, token);
//   r->set_owned(true);                                  // released when r goes
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/base/cancel.h"
#include "arbiter/base/status.h"
#include "arbiter/engine/chat_template.h"
#include "arbiter/engine/kv_snapshot.h"
#include "arbiter/engine/model_files.h"
#include "arbiter/engine/tokenizer.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/weights/weight_cache.h"

namespace arbiter {

struct EngineOptions {
  int n_ctx = 2048;   // tokens per slot (clamped to max_position_embeddings)
  int n_slots = 1;    // concurrent sequences ("parallel")
  int prefill_batch = 512;  // tokens per sgemm batch
  // Threads for decode's matrix-vector products; 0 → openblas_get_num_threads()
  // at Load. Prefill's sgemm always uses OpenBLAS's (process-wide) thread count.
  int n_threads = 0;
  // Where the weights live (docs/architecture.md "Weight tiers": the engine
  // never owns weight memory). Null: Load makes a private WeightCache over a
  // cpu arena of exactly the model's compute layout (no ledger) and loads the
  // weights into it. Otherwise `weight_key` must be registered in it
  // (WeightModelFor); Load acquires the weights once, so they are
  // device-resident when Load returns, and every request holds a WeightLease
  // for its duration (the cache may evict the copy between requests; the
  // next request reloads it, from the host floor when the model has one).
  WeightCache* weight_cache = nullptr;
  std::string weight_key;
  // The type every slot's K/V rows are held in (kv_snapshot.h: f32, f16,
  // bf16, q8_0; `[[models]] kv_type`; Note [KV cache types] in
  // engine/internal/forward.cc). Snapshots and KV files carry it; one of
  // another type is not restored. q8_0 requires head_dim % 32 == 0.
  GgmlType kv_type = kDefaultKvType;
  // The compute device the forward pass runs on and the slots' KV caches
  // and scratch are allocated from (Note [The compute seam] in
  // src/engine/internal/compute_backend.cc). "cpu" is the only one today;
  // another name fails Load / Footprint / WeightModelFor with
  // kInvalidArgument naming it.
  std::string device = "cpu";
  // Partial offload (Note [Partial offload] in
  // src/engine/internal/split_compute.cc): on a Vulkan device, how many of
  // the model's last layers run there, with the final norm and the output
  // projection; the others run on the CPU, their KV and scratch in host
  // memory. −1 (or ≥ n_layers): every layer on the device; 0: none (the
  // model runs on the CPU, device() "cpu"). Ignored on "cpu". A split needs
  // kv_type f16. With weight_cache set, a split's device part is
  // `weight_key` in weight_cache (WeightModelFor) and its host part
  // `host_weight_key` in `host_weight_cache` (HostWeightModelFor, a cpu
  // arena); in private mode Load makes both.
  int device_layers = -1;
  WeightCache* host_weight_cache = nullptr;
  std::string host_weight_key;
};

// How the next token is drawn (engine/sampler.h has the pipeline's order).
struct SamplingParams {
  float temperature = 1.0f;  // 0 → greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 → off
  float min_p = 0.0f;        // [0, 1]: drop tokens below min_p × the top probability; 0 → off
  // OpenAI's penalties over the tokens generated so far, [-2, 2]:
  // logit −= presence · [count > 0] + frequency · count.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // CTRL / Hugging Face repetition penalty over prompt and output tokens,
  // > 0 (1 → off): a seen token's logit is divided by it when positive,
  // multiplied when negative.
  float repetition_penalty = 1.0f;
  // Added to the logit of each token id, [-100, 100] (OpenAI's logit_bias;
  // -100 effectively bans a token).
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool has_seed = false;
  uint64_t seed = 0;         // used when has_seed; else random
};

// Constrained decoding's hook into Generate (arbiter/engine/grammar.h
// implements it for GBNF grammars and JSON schemas). For every token it
// samples, Generate calls FillAllowed, samples among the allowed tokens
// (the others' logits set to −inf before penalties' effects are drawn),
// then Accept. End-of-sequence tokens are allowed iff CanEnd(); after an
// Accept that leaves MustEnd() true the generation stops (finish kStop).
// Thread safety: thread-compatible; one generation uses one instance.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets allowed[t] = 1 for every token id t in [0, allowed.size()) that
  // keeps the output a prefix of a sentence the constraint accepts, else 0
  // (special tokens are 0; Generate adds end-of-sequence itself). When
  // `tokens_left` (this token included) is no more than the tokens the
  // shortest completion needs, only tokens on a shortest completion path
  // are allowed, so the output is complete when the budget ends.
  virtual void FillAllowed(int tokens_left, std::span<uint8_t> allowed) = 0;
  // Advances past `token`. kInvalidArgument when FillAllowed would not
  // have allowed it (nothing changes then).
  virtual Status Accept(int32_t token) = 0;
  // The output so far is a complete sentence (end-of-sequence may follow).
  virtual bool CanEnd() const = 0;
  // Nothing may follow the output so far.
  virtual bool MustEnd() const = 0;
};

// One generated token's log-probability and its most probable
// alternatives (OpenAI's logprobs): log-softmax of the logits after logit
// bias, penalties and the constraint's mask, before temperature, top-k,
// top-p and min-p.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // [top_logprobs], most probable first
};

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int max_tokens = 256;               // ≥ 1; also bounded by n_ctx
  std::vector<std::string> stop;      // stop strings (not included in text)
  bool ignore_eos = false;
  // -1: the engine picks the slot (Note [Slot choice]: longest common
  // prefix with the prompt). 0..n_slots-1: exactly that slot ("pinned");
  // waits for it (Note [Slot waits]). Out of range → kInvalidArgument.
  // Generate within a SlotReservation: -1 or the reservation's slot.
  int slot = -1;
  // Constrained decoding (see TokenConstraint); null = unconstrained. Not
  // owned; must outlive the call.
  TokenConstraint* constraint = nullptr;
  // -1: no logprobs. 0..20: each generated token's TokenLogprob (in
  // GenerationResult::logprobs and through on_token) with that many
  // alternatives.
  int top_logprobs = -1;
  // Called on the generating thread for every generated token, before its
  // text reaches the TextCallback (text may be held back for stop strings
  // and incomplete UTF-8). `lp` is null unless top_logprobs ≥ 0.
  std::function<void(int32_t token, const TokenLogprob* lp)> on_token;
};

enum class FinishReason { kStop, kLength, kCancelled };
std::string_view FinishReasonName(FinishReason r);  // "stop" | "length" | "cancelled"

struct GenerationTimings {
  double prefill_ms = 0;
  double decode_ms = 0;
  int prefill_tokens = 0;  // prompt tokens computed
  int decode_tokens = 0;
};

struct GenerationResult {
  std::vector<int32_t> output_ids;
  std::string text;                 // complete UTF-8; stop string removed
  FinishReason finish_reason = FinishReason::kStop;
  int prompt_tokens = 0;
  int cached_tokens = 0;            // prompt tokens whose K/V were not computed (own + copied)
  GenerationTimings timings;
  int slot = -1;                    // the slot that ran it (-1 when cancelled while waiting)
  // Prompt tokens whose K/V were copied from another slot (included in
  // cached_tokens): positions [cached_tokens − copied_tokens, cached_tokens).
  int copied_tokens = 0;
  // [output_ids] when the request's top_logprobs ≥ 0, else empty.
  std::vector<TokenLogprob> logprobs;
};

// One slot as seen by Engine::Slots(), taken under the engine's lock.
struct SlotInfo {
  int index = 0;
  // Held by a SlotReservation (ReserveSlot, or a call that reserves for
  // itself: Generate, Embed, ComputeLogits, SaveSlot, VisitSlot, RestoreSlot,
  // ClearSlot). A free slot may at the same moment be read as another slot's
  // copy source; it is not busy then (its content does not change), but a
  // call pinned to it waits for the copy (a memcpy) to end.
  bool busy = false;
  // Tokens whose K/V the slot holds; 0 while busy (its content is in flux).
  int n_tokens = 0;
  // When the slot was last filled by Generate, Embed, ComputeLogits or
  // RestoreSlot: a counter, not a time (larger is more recent), set when
  // the reservation that filled it is released; 0 for a slot never used or
  // emptied (ClearSlot, or a call that failed before computing on an empty
  // slot). SaveSlot and VisitSlot leave it unchanged.
  uint64_t last_used = 0;
  // The last holder marked the content as someone's (SlotReservation::
  // set_owned; KvPrecache: a conversation's KV). On a prefix tie an
  // unpinned reservation takes an unowned slot first (Note [Slot choice]).
  bool owned = false;
};

// Receives each new piece of text (complete UTF-8 sequences only; text that
// might begin a stop string is held back until resolved). Return false to
// stop generation (finish reason kCancelled).
using TextCallback = std::function<bool(std::string_view delta)>;
// No deadline: wait until a slot frees or the call is cancelled.
inline constexpr std::chrono::steady_clock::time_point kNoDeadline =
    std::chrono::steady_clock::time_point::max();

// What ReserveSlot asks for.
struct SlotRequest {
  // 0..n_slots-1: exactly that slot ("pinned"); -1: the engine picks.
  int slot = -1;
  // The tokens the holder will run, [n_tokens] (may be empty): an unpinned
  // request takes the free slot sharing the longest common prefix with
  // them. Read only during the call.
  std::span<const int32_t> prompt;
};

class Engine;

// Exclusive use of one slot of one engine (STYLE rule 7: a move-only RAII
// handle). While held, nobody else computes in, saves, restores or chooses
// the slot, and the holder's calls that take the reservation run without
// waiting. The destructor (or Release()) frees it: the slot's cached tokens
// become tokens(), its owned flag owned(), and waiters are woken.
// REQUIRES: released before its engine is destroyed.
// Thread safety: thread-compatible (one owner; the engine calls that take
// it must not run concurrently on the same reservation).
class SlotReservation {
 public:
  SlotReservation() = default;  // holds nothing
  SlotReservation(SlotReservation&& other) noexcept;
  SlotReservation& operator=(SlotReservation&& other) noexcept;
  SlotReservation(const SlotReservation&) = delete;
  SlotReservation& operator=(const SlotReservation&) = delete;
  ~SlotReservation() { Release(); }

  bool held() const { return engine_ != nullptr; }
  // The slot index; -1 when nothing is held.
  int slot() const { return slot_; }
  // The tokens whose K/V the slot holds now, positions [0, n); kept up to
  // date by the calls run within the reservation.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Whether the content is someone's (see SlotInfo::owned); starts as the
  // slot's flag at reservation and is published on release.
  bool owned() const { return owned_; }
  void set_owned(bool owned) { owned_ = owned; }
  // Frees the slot now; no-op when nothing is held.
  void Release();

 private:
  friend class Engine;
  Engine* engine_ = nullptr;
  int slot_ = -1;
  bool owned_ = false;
  bool touched_ = false;  // filled by a call (updates last_used on release)
  std::vector<int32_t> tokens_;
};

// What a model costs in memory under some EngineOptions, in bytes
// (Engine::Footprint; a loaded engine reports the same numbers as kv_bytes()
// − scratch_bytes(), scratch_bytes() and weight_bytes()).
struct EngineFootprint {
  // every slot's KV cache: n_slots × n_layers × 2 × n_ctx rows of kv_type
  size_t kv_bytes = 0;
  size_t scratch_bytes = 0;  // every slot's activation scratch
  size_t weight_bytes = 0;   // the f32 compute layout (held by the WeightCache, not the engine)
  // A split model (EngineOptions::device_layers): the CPU layers' KV and
  // scratch, in host memory; kv_bytes and scratch_bytes are then the device
  // part's only.
  size_t host_kv_bytes = 0;
  size_t host_scratch_bytes = 0;
  // What the engine itself holds on its device: kv_bytes + scratch_bytes.
  size_t engine_bytes() const { return kv_bytes + scratch_bytes; }
};

class Engine {
 public:
  virtual ~Engine() = default;

  // --- Loading. A load opens and plans the model's files once
  // (OpenModelFiles, arbiter/engine/model_files.h) and passes the ModelFiles
  // to Footprint, WeightModelFor and Load; the path-based overloads open
  // them themselves (a parse per call).

  // Builds an engine over `files` (no file is read again: the tokenizer and
  // the compute plan come from `files`; the weights come through the
  // WeightCache's fill, which opens the safetensors files and checks they
  // did not change since `files` was opened — Note [One parse per load] in
  // src/engine/engine.cc). The engine keeps `files` alive.
  // Errors: kInvalidArgument for options it refuses (n_ctx < 2, n_slots <
  // 1, prefill_batch < 1, n_threads < 0). With options.weight_cache set:
  // kFailedPrecondition when options.weight_key is not registered in it
  // (Load never registers it), or is registered with another model's layout;
  // the cache's Acquire errors as is (NotResidentError in externally-managed
  // mode when the model is not device-resident, kResourceExhausted, a fill
  // error prefixed "weights of '<key>': "). In private mode a conversion
  // error comes prefixed "weights of 'engine': "; kResourceExhausted when
  // the KV caches cannot be allocated. REQUIRES: files non-null.
  static Result<std::unique_ptr<Engine>> Load(std::shared_ptr<const ModelFiles> files,
                                              const EngineOptions& options);
  // OpenModelFiles(model_dir), then Load(files, options). Errors: those of
  // OpenModelFiles, then of Load.
  static Result<std::unique_ptr<Engine>> Load(const std::string& model_dir,
                                              const EngineOptions& options);

  // Everything Load checks except the weight conversion: config.json and
  // tokenizer.json parse, the safetensors headers are valid, and every
  // tensor the architecture needs is present with the expected shape. Reads
  // only headers (cheap for any model size). = OpenModelFiles(model_dir)
  // .status().
  static Status Validate(const std::string& model_dir);

  // The weight cache registration of `files` under `key`: the compute
  // layout the forward pass reads (f32 buffers in order: embed_tokens, per
  // layer attn_norm, wqkv [q;k;v rows], bqkv (attention_bias), q_norm and
  // k_norm (qk_norm), wo, ffn_norm, w_gate_up [gate;up rows], w_down, then
  // the final norm and lm_head unless tied), its digest
  // files.WeightsDigestFor(key) (key, layout, a token of every safetensors
  // file), a fill that converts the safetensors tensors into those buffers
  // (opening the files when called; kFailedPrecondition when a file's token
  // no longer matches the one in the digest), `residency`, and
  // scratch_bytes = one slot's activation scratch for `options` (n_ctx,
  // prefill_batch). Reads nothing.
  // Errors: kInvalidArgument for options Load would refuse.
  static Result<WeightModel> WeightModelFor(const ModelFiles& files, const std::string& key,
                                            const EngineOptions& options,
                                            ResidencyState residency = ResidencyState::kUnpinned);
  // The same from a directory: reads config.json and the safetensors
  // headers (not tokenizer.json). Errors: as OpenModelFiles, minus the
  // tokenizer's; kInvalidArgument for options Load would refuse.
  static Result<WeightModel> WeightModelFor(const std::string& model_dir, const std::string& key,
                                            const EngineOptions& options,
                                            ResidencyState residency = ResidencyState::kUnpinned);
  // A split model (options.device_layers in (0, n_layers) on a Vulkan
  // device): WeightModelFor registers only the device part's buffers (the
  // last device_layers layers, the final norm, the output projection) and
  // this the host part's (the embedding and the other layers), each with
  // the same digest rule and a fill of its own buffers; scratch_bytes is
  // the host part's. Errors: as WeightModelFor; kInvalidArgument when
  // `options` is not a split.
  // Partial offload: the most of the model's last layers that can run on
  // options.device within `budget_bytes` of its memory — the device part's
  // weights (those layers, the final norm and the output projection, each
  // buffer padded to the device's alignment) plus options.n_slots slots'
  // device part (the device layers' KV and scratch; the CPU layers' are
  // host memory, host_kv_bytes / host_scratch_bytes). n_layers when the whole model fits; 0 when
  // not even one layer with the output projection does (the model should
  // run on the CPU). options.device_layers is ignored. Reads nothing.
  // Errors: kInvalidArgument for options Load would refuse.
  static Result<int> DeviceLayersFor(const ModelFiles& files, const EngineOptions& options,
                                     uint64_t budget_bytes);
  static Result<WeightModel> HostWeightModelFor(const ModelFiles& files, const std::string& key,
                                                const EngineOptions& options,
                                                ResidencyState residency = ResidencyState::kUnpinned);

  // What Load(files, options) will hold (engine bytes) and register (weight
  // bytes), without allocating anything; n_ctx is clamped as Load clamps it.
  // Errors: kInvalidArgument for options Load would refuse.
  static Result<EngineFootprint> Footprint(const ModelFiles& files, const EngineOptions& options);

  virtual const ModelConfig& config() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  // kFailedPrecondition when the tokenizer has no known chat format.
  virtual Result<ChatTemplateKind> chat_template() const = 0;
  virtual int n_ctx() const = 0;
  virtual int n_slots() const = 0;
  // The compute layout's bytes (f32 weights); they live in the WeightCache,
  // not in the engine.
  virtual size_t weight_bytes() const = 0;
  // Bytes the engine itself holds: all slots' KV caches plus their scratch.
  virtual size_t kv_bytes() const = 0;
  // EngineOptions::kv_type as loaded.
  virtual GgmlType kv_type() const = 0;
  // The scratch part of kv_bytes(): every slot's activation buffers.
  virtual size_t scratch_bytes() const = 0;
  // Partial offload: a split model's bytes in host memory (the `host`
  // domain), both included in kv_bytes(): its CPU layers' KV caches, and
  // their scratch (also in scratch_bytes()); 0 otherwise.
  virtual size_t host_kv_bytes() const = 0;
  virtual size_t host_scratch_bytes() const = 0;
  // EngineOptions::device as loaded ("cpu").
  virtual std::string_view device() const = 0;
  // The memory domain kv_bytes() and scratch_bytes() live in, the one
  // their ledger charges belong to: "host" (RAM) for the CPU device.
  virtual std::string_view memory_domain() const = 0;
  // Partial offload: how many of the last layers run on device() (the
  // others on the CPU); config's n_layers when all of them do.
  virtual int device_layers() const = 0;

  // --- Slots. Indices are [0, n_slots()). The slot methods below never take
  // a WeightLease: they touch only the slot's KV buffers and work while the
  // weights are not resident (externally-managed cache, evicted copy).

  // A snapshot of every slot, [n_slots] in index order. Never blocks on a
  // busy slot (holds the engine's lock only to copy the slot table).
  virtual std::vector<SlotInfo> Slots() const = 0;

  // The token ids whose K/V free slot `slot` holds, [n_tokens]; empty when
  // the slot is busy (its content is in flux; a holder reads
  // SlotReservation::tokens()), empty, or out of range.
  virtual std::vector<int32_t> SlotTokens(int slot) const = 0;

  // Reserves a slot: `request.slot` when pinned, else the one Note [Slot
  // choice] (src/engine/engine.cc) picks for `request.prompt` — the longest
  // common prefix among free slots; ties: an unowned slot, then the least
  // recently used; never a free slot a pinned caller is waiting for, nor one
  // being read as a copy source. When nothing fits it blocks on a condition
  // variable until a slot frees, `deadline` (std::chrono::steady_clock, real
  // time) passes, or `cancel` fires — a CancelToken wakes it at once; a
  // predicate-only Cancellation is polled every Cancellation::kCancelPollMs
  // (Note [Slot waits]). Cancellation and the deadline are looked at only
  // when the call has to wait: a free slot is taken even if both have
  // passed. A pinned waiter keeps its slot from unpinned callers until it
  // gets it or gives up.
  // Errors: kInvalidArgument for request.slot outside [-1, n_slots);
  // kCancelled; kDeadlineExceeded. On error nothing is held.
  virtual Result<SlotReservation> ReserveSlot(const SlotRequest& request,
                                              std::chrono::steady_clock::time_point deadline,
                                              const Cancellation& cancel) = 0;

  // The calls below that take a SlotReservation run on its slot without
  // waiting. Each returns kFailedPrecondition when `slot` is not held or
  // belongs to another engine (nothing is touched then).

  // Copies the slot's cached prefix out: tokens [n] and, for every layer, K
  // and V rows [0, n) in KvSnapshot's layout ([n_layers, 2, n] rows of
  // kv_type(), kv_type set); model_hash is left empty. n may be 0 (an
  // empty snapshot with n_layers, kv_dim and kv_type set). The slot keeps
  // its content. Errors: kResourceExhausted when the snapshot
  // (n · n_layers · 2 · KvRowBytes(kv_type, kv_dim) bytes) cannot be
  // allocated.
  virtual Result<KvSnapshot> SaveSlot(const SlotReservation& slot) = 0;
  // Reserves `slot` (pinned, no deadline), then SaveSlot. Errors: also
  // kInvalidArgument for a slot out of range; kCancelled when `cancelled`
  // fired while waiting.
  virtual Result<KvSnapshot> SaveSlot(int slot, const Cancellation& cancelled) = 0;

  // Calls `visit` with the slot's cached prefix viewed in place (tokens and,
  // per layer, K and V rows [0, n) in the slot's KV cache — no copy);
  // returns what `visit` returns. How a slot is saved to a file without a
  // snapshot (kv_file.h WriteKvFile of a KvRowsView). The slot keeps its
  // content. `visit` runs on the calling thread and must not call into this
  // engine.
  virtual Status VisitSlot(const SlotReservation& slot,
                           const std::function<Status(const KvRowsView&)>& visit) = 0;
  // Reserves `slot` like SaveSlot(int, …), then VisitSlot. Errors as it.
  virtual Status VisitSlot(int slot, const std::function<Status(const KvRowsView&)>& visit,
                           const Cancellation& cancelled) = 0;

  // Replaces the slot's content with `snapshot` (K/V rows [0, n) of every
  // layer and the tokens; model_hash is not checked); returns the number of
  // tokens restored, n = snapshot.n_tokens. A later Generate whose prompt
  // extends those tokens reuses them (cached_tokens up to n, at most
  // prompt − 1), whether pinned to this slot or not. The snapshot must come
  // from this model (same weights): the engine can only check its shape.
  // Validates before touching anything: n_layers, kv_dim and kv_type equal
  // to the engine's, kv_bytes == n_layers · 2 · n · row bytes, n ≤ n_ctx − 1, every
  // token id in [0, vocab_size); a violation is kInvalidArgument naming the
  // field and both values, and the slot keeps its old content. REQUIRES:
  // `snapshot`'s memory stays valid until the call returns (e.g. a mapped
  // KV file: a restore from disk copies each byte once).
  virtual Result<int> RestoreSlot(SlotReservation& slot, const KvSnapshotView& snapshot) = 0;
  // Validates, then reserves `slot` (pinned, no deadline) and restores.
  // Errors: as above; kInvalidArgument for a slot out of range; kCancelled
  // as SaveSlot. `snapshot` is only read, and may be freed when the call
  // returns.
  virtual Result<int> RestoreSlot(int slot, const KvSnapshot& snapshot,
                                  const Cancellation& cancelled) = 0;
  virtual Result<int> RestoreSlot(int slot, const KvSnapshotView& view,
                                  const Cancellation& cancelled) = 0;

  // Empties the slot's cached tokens (the K/V bytes are not zeroed, only
  // forgotten) and marks it as never used, so an unpinned request with no
  // prefix match takes it first.
  virtual Status ClearSlot(SlotReservation& slot) = 0;
  // Reserves `slot` like SaveSlot(int, …), then ClearSlot. Errors as it.
  virtual Status ClearSlot(int slot, const Cancellation& cancelled) = 0;

  // --- Compute. Generate, Embed and ComputeLogits hold a slot (their
  // reservation, or one they reserve themselves), then take a WeightLease
  // on the model's weights for the whole call. A weight-acquire error is
  // returned as is: NotResidentError (kFailedPrecondition; externally-managed
  // cache, model not device-resident), kResourceExhausted (the cache cannot
  // make room while other models' weights are leased), or a reload error
  // (the file changed or broke since Load), prefixed "weights of '<key>': ".
  // Nothing is computed and the slot's cached prefix is kept.
  //
  // Runs one generation on the reserved slot. kInvalidArgument for an empty
  // prompt or a prompt that does not fit n_ctx (message gives both
  // numbers), a token id outside [0, vocab_size), max_tokens < 1, or bad
  // sampling params; kFailedPrecondition for a model without an lm_head;
  // kInvalidArgument for request.slot other than -1 and slot.slot().
  // Reuses the longest common prefix of the slot's cached tokens; then, if
  // another free slot holds a longer prefix of the prompt, copies the K/V
  // rows of the difference from it (copied_tokens; Note [Prefix copy between
  // slots]) instead of computing them. cached_tokens counts both; at least
  // one prompt token is always computed (cached_tokens ≤ prompt − 1). The
  // copy needs no weights and happens before the WeightLease is taken, so
  // after a weight error the slot holds the copied prefix. Cancellation
  // (`cancel` fired, checked before every sampled token, or TextCallback
  // false) is not an error: the result has finish_reason kCancelled.
  // `on_text` and `cancel`'s predicate may be empty and are called on the
  // calling thread.
  virtual Result<GenerationResult> Generate(SlotReservation& slot,
                                            const GenerationRequest& request,
                                            const TextCallback& on_text,
                                            const Cancellation& cancel) = 0;
  // Validates `request`, reserves request.slot (pinned) or the slot Note
  // [Slot choice] picks for its prompt (no deadline), then Generate on it.
  // Errors: as above, and kInvalidArgument for request.slot outside [-1,
  // n_slots). Cancelled while waiting for the slot: finish_reason
  // kCancelled, no output, result.slot -1.
  virtual Result<GenerationResult> Generate(const GenerationRequest& request,
                                            const TextCallback& on_text,
                                            const Cancellation& cancelled) = 0;

  // Mean of the final (normed) hidden states over `ids`, L2-normalized.
  // Returns [hidden_size]. Reserves a slot like Generate.
  // kInvalidArgument for empty ids, ids longer than n_ctx or out of vocab;
  // kCancelled when `cancelled` fired while waiting for a slot.
  virtual Result<std::vector<float>> Embed(const std::vector<int32_t>& ids,
                                           const Cancellation& cancelled) = 0;

  // For tests and the numerical reference: logits for every position of
  // `ids` from an empty KV state. Returns [n_tokens, vocab_size] row-major.
  // Reserves a slot (waits as long as it takes). kInvalidArgument as for
  // Embed; kFailedPrecondition for a model without an lm_head.
  virtual Result<std::vector<float>> ComputeLogits(const std::vector<int32_t>& ids) = 0;

 protected:
  // For implementations: a reservation of `slot` by this engine holding
  // `tokens` (the slot's cached tokens) and `owned` (its flag).
  SlotReservation MakeReservation(int slot, std::vector<int32_t> tokens, bool owned);
  // True when `r` is held and was made by this engine.
  bool Holds(const SlotReservation& r) const { return r.engine_ == this; }
  // The holder's view of the slot's cached tokens (see tokens()).
  static std::vector<int32_t>& HeldTokens(SlotReservation& r) { return r.tokens_; }
  // Records that a call filled the slot (its last_used advances on release).
  static void MarkFilled(SlotReservation& r) { r.touched_ = true; }

 private:
  friend class SlotReservation;
  // Frees `slot`, publishing the holder's `tokens`, `owned` flag and whether
  // it was `filled`. Called once per reservation, by its Release().
  virtual void ReleaseReserved(int slot, std::vector<int32_t> tokens, bool owned,
                               bool filled) = 0;
};

}  // namespace arbiter
