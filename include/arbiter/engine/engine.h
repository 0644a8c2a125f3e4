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
// KV cache: per slot [n_layers, 2, n_ctx, n_kv_heads × head_dim] f32. A
// request either takes the free slot that already holds the longest prefix
// of its prompt, or names one ("pinned"; GenerationRequest::slot). Before
// prefill, a longer prefix held by another free slot is copied in instead of
// recomputed, so a common system prefix is computed once per engine. A slot's
// cached prefix can be saved into a KvSnapshot, restored from one, or
// cleared (SaveSlot / RestoreSlot / ClearSlot).
//
// Thread safety: thread-safe. Every method may be called from many threads;
// up to n_slots calls that take a slot run at once, the rest block until a
// slot (their pinned one, if any) frees, or their `cancelled` returns true.
//
// Example: compute a system prefix once, keep it, start a conversation from it.
//   GenerationRequest req;  req.prompt_ids = system_ids;  req.slot = 0;  req.max_tokens = 1;
//   engine->Generate(req, nullptr, nullptr);                // slot 0 holds the prefix
//   Result<KvSnapshot> kept = engine->SaveSlot(0, nullptr);  // e.g. into a prompt cache
//   req.prompt_ids.insert(req.prompt_ids.end(), user_ids.begin(), user_ids.end());
//   req.slot = 1;  req.max_tokens = 256;
//   engine->Generate(req, on_text, cancelled);  // copies the prefix from slot 0:
//                                               // copied_tokens = system_ids.size()
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/chat_template.h"
#include "arbiter/engine/kv_snapshot.h"
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
  // Where the weights live (reference/seed-runtime-weights.md §3; the engine
  // never owns weight memory). Null: Load makes a private WeightCache over a
  // cpu arena of exactly the model's compute layout (no ledger) and loads the
  // weights into it. Otherwise `weight_key` must be registered in it
  // (WeightModelFor); Load acquires the weights once, so they are
  // device-resident when Load returns, and every request holds a WeightLease
  // for its duration (the cache may evict the copy between requests; the
  // next request reloads it, from the host floor when the model has one).
  WeightCache* weight_cache = nullptr;
  std::string weight_key;
};

struct SamplingParams {
  float temperature = 1.0f;  // 0 → greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 → off
  bool has_seed = false;
  uint64_t seed = 0;         // used when has_seed; else random
};

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int max_tokens = 256;               // ≥ 1; also bounded by n_ctx
  std::vector<std::string> stop;      // stop strings (not included in text)
  bool ignore_eos = false;
  // -1: the free slot whose cached tokens share the longest common prefix
  // with the prompt (ties: least recently used; a free slot a pinned call is
  // waiting for is left to it). 0..n_slots-1: exactly that slot ("pinned");
  // waits for it, polling `cancelled`. Out of range → kInvalidArgument.
  int slot = -1;
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
};

// One slot as seen by Engine::Slots(), taken under the engine's lock.
struct SlotInfo {
  int index = 0;
  // Held by a call (Generate, Embed, ComputeLogits, SaveSlot, RestoreSlot,
  // ClearSlot). A free slot may at the same moment be read as another slot's
  // copy source; it is not busy then (its content does not change), but a
  // call pinned to it waits for the copy (a memcpy) to end.
  bool busy = false;
  // Tokens whose K/V the slot holds; 0 while busy (its content is in flux).
  int n_tokens = 0;
  // When the slot was last filled by Generate, Embed, ComputeLogits or
  // RestoreSlot: a counter, not a time (larger is more recent); 0 for a slot
  // never used or emptied (ClearSlot, or a call that failed before computing
  // on an empty slot). SaveSlot leaves it unchanged.
  uint64_t last_used = 0;
};

// Receives each new piece of text (complete UTF-8 sequences only; text that
// might begin a stop string is held back until resolved). Return false to
// stop generation (finish reason kCancelled).
using TextCallback = std::function<bool(std::string_view delta)>;
// Polled between tokens and while waiting for a slot (every 50 ms; never under
// the engine's lock, so it may call back into the engine); true → cancel.
using CancelFn = std::function<bool()>;

class Engine {
 public:
  virtual ~Engine() = default;

  // Loads config.json, tokenizer.json and the safetensors weights of
  // `model_dir`. Errors name the file and the field or tensor (kDataLoss,
  // kNotFound, kUnimplemented). With options.weight_cache set:
  // kFailedPrecondition when options.weight_key is not registered in it
  // (Load never registers it), or is registered with another model's layout;
  // the cache's Acquire errors as is (NotResidentError in externally-managed
  // mode when the model is not device-resident, kResourceExhausted, a fill
  // error prefixed "weights of '<key>': "). In private mode a conversion
  // error comes prefixed "weights of 'engine': ".
  // Everything Load checks except the weight conversion: config.json and
  // tokenizer.json parse, the safetensors headers are valid, and every
  // tensor the architecture needs is present with the expected shape. Reads
  // only headers (cheap for any model size). Errors as Load.
  static Status Validate(const std::string& model_dir);

  static Result<std::unique_ptr<Engine>> Load(const std::string& model_dir,
                                              const EngineOptions& options);

  // The weight cache registration of `model_dir` under `key`: the compute
  // layout the forward pass reads (f32 buffers in order: embed_tokens, per
  // layer attn_norm, wqkv [q;k;v rows], bqkv (attention_bias), q_norm and
  // k_norm (qk_norm), wo, ffn_norm, w_gate_up [gate;up rows], w_down, then
  // the final norm and lm_head unless tied), its WeightsDigest (key, layout,
  // a token of every safetensors file), a fill that converts the
  // safetensors tensors into those buffers (opening the files when called),
  // `residency`, and scratch_bytes = one slot's activation scratch for
  // `options` (n_ctx, prefill_batch). Reads config.json and the safetensors
  // headers only (not tokenizer.json).
  // Errors: as Validate, minus the tokenizer's; kInvalidArgument for
  // options Load would refuse.
  static Result<WeightModel> WeightModelFor(const std::string& model_dir, const std::string& key,
                                            const EngineOptions& options,
                                            ResidencyState residency = ResidencyState::kUnpinned);

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
  // The scratch part of kv_bytes(): every slot's activation buffers.
  virtual size_t scratch_bytes() const = 0;

  // Slot indices are [0, n_slots()). The slot methods below never take a
  // WeightLease: they touch only the slot's KV buffers and work while the
  // weights are not resident (externally-managed cache, evicted copy).

  // A snapshot of every slot, [n_slots] in index order. Never blocks on a
  // busy slot (holds the engine's lock only to copy the slot table).
  virtual std::vector<SlotInfo> Slots() const = 0;

  // The token ids whose K/V free slot `slot` holds, [n_tokens]; empty when
  // the slot is busy (its content is in flux), empty, or out of range.
  virtual std::vector<int32_t> SlotTokens(int slot) const = 0;

  // Copies the slot's cached prefix out: tokens [n] and, for every layer, K
  // and V rows [0, n) in KvSnapshot's layout ([n_layers, 2, n, kv_dim] f32);
  // model_hash is left empty. n may be 0 (an empty snapshot with n_layers
  // and kv_dim set). The slot keeps its content. Waits for the slot like a
  // pinned Generate. Errors: kInvalidArgument for a slot out of range;
  // kCancelled when `cancelled` fired while waiting; kResourceExhausted when
  // the snapshot (n · n_layers · 2 · kv_dim · 4 bytes) cannot be allocated.
  virtual Result<KvSnapshot> SaveSlot(int slot, const CancelFn& cancelled) = 0;

  // Calls `visit` with the slot's cached prefix viewed in place (tokens and,
  // per layer, K and V rows [0, n) in the slot's KV cache — no copy), while
  // holding the slot; returns what `visit` returns. How a slot is saved to a
  // file without a snapshot (kv_file.h WriteKvFile of a KvRowsView). Waits
  // for the slot like SaveSlot; the slot keeps its content. Errors:
  // kInvalidArgument for a slot out of range; kCancelled as SaveSlot.
  // `visit` runs on the calling thread and must not call into this engine.
  virtual Status VisitSlot(int slot, const std::function<Status(const KvRowsView&)>& visit,
                           const CancelFn& cancelled) = 0;

  // Replaces the slot's content with `snapshot` (K/V rows [0, n) of every
  // layer and the tokens; model_hash is not checked); returns the number of
  // tokens restored, n = snapshot.n_tokens(). A later Generate whose prompt
  // extends those tokens reuses them (cached_tokens up to n, at most
  // prompt − 1), whether pinned to this slot or not. The snapshot must come
  // from this model (same weights): the engine can only check its shape.
  // Validates before waiting or touching anything: n_layers and kv_dim equal
  // to the model's, kv.size() == n_layers · 2 · n · kv_dim, n ≤ n_ctx − 1,
  // every token id in [0, vocab_size); a violation is kInvalidArgument naming
  // the field and both values, and the slot keeps its old content. Also
  // kInvalidArgument for a slot out of range; kCancelled as SaveSlot.
  // `snapshot` is only read, and may be freed when the call returns.
  virtual Result<int> RestoreSlot(int slot, const KvSnapshot& snapshot,
                                  const CancelFn& cancelled) = 0;
  // The same from arrays read in place (e.g. a mapped KV file, so a restore
  // from disk copies each byte once): the same checks (kv_floats for
  // kv.size()), errors and effects. REQUIRES: `view`'s memory stays valid
  // until the call returns.
  virtual Result<int> RestoreSlot(int slot, const KvSnapshotView& view,
                                  const CancelFn& cancelled) = 0;

  // Empties the slot's cached tokens (the K/V bytes are not zeroed, only
  // forgotten) and marks it as never used, so an unpinned request with no
  // prefix match takes it first. Waits for the slot like a pinned Generate.
  // Errors: kInvalidArgument for a slot out of range; kCancelled as SaveSlot.
  virtual Status ClearSlot(int slot, const CancelFn& cancelled) = 0;

  // Generate, Embed and ComputeLogits first take a slot, then a WeightLease
  // on the model's weights for the whole call. A weight-acquire error is
  // returned as is: NotResidentError (kFailedPrecondition; externally-managed
  // cache, model not device-resident), kResourceExhausted (the cache cannot
  // make room while other models' weights are leased), or a reload error
  // (the file changed or broke since Load), prefixed "weights of '<key>': ".
  // Nothing is computed and the slot's cached prefix is kept.
  //
  // Runs one generation. kInvalidArgument for an empty prompt or a prompt
  // that does not fit n_ctx (message gives both numbers), a token id outside
  // [0, vocab_size), max_tokens < 1, or bad sampling params; kFailedPrecondition
  // for a model without an lm_head; kInvalidArgument for request.slot outside
  // [-1, n_slots). Reuses the longest common prefix of the slot's cached
  // tokens; then, if another free slot holds a longer prefix of the prompt,
  // copies the K/V rows of the difference from it (copied_tokens) instead of
  // computing them. cached_tokens counts both; at least one prompt token is
  // always computed (cached_tokens ≤ prompt − 1). The copy needs no weights
  // and happens before the WeightLease is taken, so after a weight error the
  // slot holds the copied prefix. Cancellation (CancelFn true, or TextCallback
  // false) is not an error: the result has finish_reason kCancelled, with no
  // output when it happened while waiting for a slot. `on_text` and
  // `cancelled` may be empty and are called on the calling thread.
  virtual Result<GenerationResult> Generate(const GenerationRequest& request,
                                            const TextCallback& on_text,
                                            const CancelFn& cancelled) = 0;

  // Mean of the final (normed) hidden states over `ids`, L2-normalized.
  // Returns [hidden_size]. Uses (and blocks for) a slot like Generate.
  // kInvalidArgument for empty ids, ids longer than n_ctx or out of vocab;
  // kCancelled when `cancelled` fired while waiting for a slot.
  virtual Result<std::vector<float>> Embed(const std::vector<int32_t>& ids,
                                           const CancelFn& cancelled) = 0;

  // For tests and the numerical reference: logits for every position of
  // `ids` from an empty KV state. Returns [n_tokens, vocab_size] row-major.
  // Uses (and blocks for) a slot. kInvalidArgument as for Embed;
  // kFailedPrecondition for a model without an lm_head.
  virtual Result<std::vector<float>> ComputeLogits(const std::vector<int32_t>& ids) = 0;
};

}  // namespace arbiter
