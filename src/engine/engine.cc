// engine/engine.cc — Engine::Load and the generation loop.
//
// Generation (one call, one leased slot; see internal/engine_impl.h):
//   1. validate the request; lease the pinned slot (request.slot ≥ 0) or the
//      free slot with the longest common prefix; in the same pass under the
//      lock, find another free slot holding a longer prefix of the prompt
//      and copy the K/V rows of the difference from it (Note [Prefix copy
//      between slots]); then take the WeightLease;
//   2. prefill prompt[cached, n) in prefill_batch chunks → logits of the last
//      prompt token (cached = own prefix + copied rows ≤ n − 1);
//   3. loop: poll `cancelled`; sample; EOS (unless ignore_eos) → stop; append
//      the token's bytes (special tokens render as nothing) to a TextStream,
//      which holds back partial UTF-8 and possible stop-string prefixes;
//      a stop string → stop; send the released delta (callback false →
//      cancelled); max_tokens reached → length; context full → length;
//      otherwise decode the token (one sgemv step) for the next logits.
//   4. flush the TextStream (unless stopped by a stop string or cancelled).
// The sampled token that ends generation (EOS, or the last one) is never fed
// back, so the slot's cached tokens are exactly the prompt plus the fed
// outputs.
//
// Weights (reference/seed-runtime-weights.md §3): the engine computes from a
// WeightCache's buffers. Load plans the compute layout (model_weights.h),
// makes a private cache over a cpu arena of exactly that layout unless the
// caller passed one, and acquires the weights once so they are resident (and
// a broken tensor fails Load). Every call then holds a WeightLease for its
// duration (engine_impl.h), except SaveSlot / RestoreSlot / ClearSlot, which
// touch only a slot's KV buffers and work while the weights are not resident.
#include "arbiter/engine/engine.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <new>

#include "arbiter/base/clock.h"
#include "arbiter/base/hash.h"
#include "arbiter/engine/sampler.h"
#include "arbiter/formats/safetensors.h"
#include "arbiter/weights/weight_files.h"
#include "engine/internal/engine_impl.h"
#include "engine/internal/model_weights.h"
#include "engine/internal/text_stream.h"

namespace arbiter {

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "stop";
}

namespace engine_internal {
namespace {

constexpr int kSlotWaitPollMs = 50;  // how often a waiting caller polls its CancelFn

// End-of-turn / end-of-text specials that end generation when the tokenizer
// has them, in addition to config.json's eos_token_id.
constexpr const char* kEndTokens[] = {"<|im_end|>", "<|eot_id|>", "<|endoftext|>",
                                      "<|end_of_text|>", "<|eom_id|>"};

double MsSince(int64_t start_ns) {
  return static_cast<double>(Clock::Real()->NowNs() - start_ns) / 1e6;
}

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

Status CheckWeightLease(const WeightLease& lease, const ComputeLayout& layout,
                        const std::string& key) {
  if (lease.size() != layout.buffers.size()) {
    return FailedPreconditionError(
        "weights '" + key + "' have " + std::to_string(lease.size()) +
        " tensors but the model's compute layout has " + std::to_string(layout.buffers.size()) +
        "; register the key with Engine::WeightModelFor of this model");
  }
  for (size_t i = 0; i < lease.size(); ++i) {
    if (lease.tensor(i) == nullptr) {
      return FailedPreconditionError(
          "weights '" + key + "' are in a device arena the CPU engine cannot read (tensor " +
          layout.buffers[i].name + " has no host address); give the engine a cpu arena");
    }
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------
// SlotLease

SlotLease::SlotLease(EngineImpl* engine, int index, std::vector<int32_t> cached_prefix)
    : engine_(engine), index_(index), fed_(std::move(cached_prefix)) {}

SlotLease::SlotLease(SlotLease&& o) noexcept
    : engine_(std::exchange(o.engine_, nullptr)), index_(o.index_), fed_(std::move(o.fed_)) {}

SlotLease::~SlotLease() {
  if (engine_ != nullptr) engine_->ReleaseSlot(index_, std::move(fed_));
}

SlotState& SlotLease::state() { return *engine_->slot_states_[index_]; }

// ---------------------------------------------------------------------------
// EngineImpl

EngineImpl::EngineImpl(std::unique_ptr<Tokenizer> tokenizer,
                       std::shared_ptr<const ComputeLayout> layout,
                       std::unique_ptr<Decoder> decoder, WeightSource weights,
                       const EngineOptions& options, int n_ctx)
    : weights_(std::move(weights)), tokenizer_(std::move(tokenizer)), layout_(std::move(layout)),
      decoder_(std::move(decoder)), options_(options), n_ctx_(n_ctx) {
  const ModelDims& d = decoder_->dims();
  const int batch = std::min(options.prefill_batch, n_ctx);
  for (int i = 0; i < options.n_slots; ++i) {
    auto st = std::make_unique<SlotState>();
    st->kv = KvCache(d.n_layers, n_ctx, d.kv_dim);
    st->scratch = ForwardScratch(d, batch, n_ctx);
    slot_states_.push_back(std::move(st));
  }
  MutexLock l(&mu_);
  slots_.resize(options.n_slots);

  for (int id : layout_->config.eos_token_ids) {
    if (id >= 0) eos_ids_.push_back(id);
  }
  for (const char* t : kEndTokens) {
    const int32_t id = tokenizer_->TokenId(t);
    if (id >= 0 && tokenizer_->IsSpecial(id)) eos_ids_.push_back(id);
  }
  std::sort(eos_ids_.begin(), eos_ids_.end());
  eos_ids_.erase(std::unique(eos_ids_.begin(), eos_ids_.end()), eos_ids_.end());
}

EngineImpl::~EngineImpl() = default;

Result<EngineImpl::LeasedWeights> EngineImpl::AcquireWeights() const {
  ARBITER_ASSIGN_OR_RETURN(WeightLease lease, weights_.cache->Acquire(weights_.key));
  ARBITER_RETURN_IF_ERROR(CheckWeightLease(lease, *layout_, weights_.key));
  LeasedWeights out;
  out.w = BindModelWeights(*layout_, lease.tensors());
  out.lease = std::move(lease);
  return out;
}

Result<ChatTemplateKind> EngineImpl::chat_template() const {
  return DetectChatTemplate(*tokenizer_);
}

size_t EngineImpl::kv_bytes() const {
  size_t total = 0;
  for (const auto& s : slot_states_) total += s->kv.bytes() + s->scratch.bytes();
  return total;
}

size_t EngineImpl::scratch_bytes() const {
  size_t total = 0;
  for (const auto& s : slot_states_) total += s->scratch.bytes();
  return total;
}

bool EngineImpl::IsEos(int32_t id) const {
  return std::binary_search(eos_ids_.begin(), eos_ids_.end(), id);
}

Status EngineImpl::CheckIds(const std::vector<int32_t>& ids, int limit, const char* what) const {
  if (ids.empty()) return InvalidArgumentError(std::string(what) + " is empty");
  if (ids.size() > static_cast<size_t>(limit)) {
    return InvalidArgumentError(std::string(what) + " has " + std::to_string(ids.size()) +
                                " tokens; this model's context holds at most " +
                                std::to_string(limit) + " (n_ctx " + std::to_string(n_ctx_) +
                                "); shorten it or raise n_ctx");
  }
  const int vocab = decoder_->dims().vocab;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return InvalidArgumentError(std::string(what) + ": token id " + std::to_string(ids[i]) +
                                  " at position " + std::to_string(i) + " is outside [0, " +
                                  std::to_string(vocab) + ")");
    }
  }
  return OkStatus();
}

std::optional<SlotLease> EngineImpl::AcquireSlot(const SlotWant& want,
                                                 const CancelFn& cancelled) {
  const std::vector<int32_t>* prompt = want.prompt;
  // Longest prefix a copy may bring: at least one prompt token is computed.
  const size_t copy_cap = want.copy != nullptr ? prompt->size() - 1 : 0;
  bool reserved = false;  // counted in slots_[want.pinned].pinned_waiters
  while (true) {
    {
      MutexLock l(&mu_);
      int chosen = -1;
      size_t best_lcp = 0;
      int src = -1;
      size_t src_lcp = 0;
      for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
        const SlotMeta& m = slots_[i];
        if (m.busy) continue;
        const bool pinned_here = want.pinned == i;
        if (want.pinned >= 0 && !pinned_here && want.copy == nullptr) continue;
        const size_t lcp = prompt != nullptr ? CommonPrefix(m.tokens, *prompt) : 0;
        const bool leasable =
            m.readers == 0 && (want.pinned >= 0 ? pinned_here : m.pinned_waiters == 0);
        if (leasable && (chosen < 0 || lcp > best_lcp ||
                         (lcp == best_lcp && m.last_used < slots_[chosen].last_used))) {
          chosen = i;
          best_lcp = lcp;
        }
        if (want.copy != nullptr && std::min(lcp, copy_cap) > src_lcp) {
          src = i;
          src_lcp = std::min(lcp, copy_cap);
        }
      }
      if (chosen >= 0) {
        SlotMeta& m = slots_[chosen];
        if (reserved) --m.pinned_waiters;
        m.busy = true;
        if (want.touch) m.last_used = ++use_counter_;
        if (prompt != nullptr) m.tokens.resize(best_lcp);  // the rest will be overwritten
        std::vector<int32_t> prefix = std::move(m.tokens);
        m.tokens.clear();
        // src_lcp is the longest capped prefix among all non-busy slots; copy
        // when it beats the chosen slot's own (a tie gains nothing).
        if (src >= 0 && src != chosen && src_lcp > std::min(best_lcp, copy_cap)) {
          ++slots_[src].readers;
          *want.copy = CopySource{src, src_lcp};
        }
        return SlotLease(this, chosen, std::move(prefix));
      }
      if (want.pinned >= 0 && !reserved) {
        ++slots_[want.pinned].pinned_waiters;
        reserved = true;
      }
      slot_freed_.WaitUntil(std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(kSlotWaitPollMs));
    }
    // The caller's CancelFn runs outside the lock (it may be slow, or call
    // back into the engine).
    if (cancelled && cancelled()) {
      if (reserved) {
        MutexLock l(&mu_);
        --slots_[want.pinned].pinned_waiters;
        slot_freed_.SignalAll();  // unpinned waiters may take it now
      }
      return std::nullopt;
    }
  }
}

void EngineImpl::ReleaseSlot(int index, std::vector<int32_t> fed) {
  MutexLock l(&mu_);
  SlotMeta& m = slots_[index];
  m.tokens = std::move(fed);
  m.busy = false;
  if (m.tokens.empty()) m.last_used = 0;
  slot_freed_.SignalAll();
}

void EngineImpl::EndCopy(int index) {
  MutexLock l(&mu_);
  if (--slots_[index].readers == 0) slot_freed_.SignalAll();
}

Status EngineImpl::CheckSlot(int slot, const char* what) const {
  if (slot < 0 || slot >= n_slots()) {
    return InvalidArgumentError(std::string(what) + ": slot " + std::to_string(slot) +
                                " is outside [0, " + std::to_string(n_slots()) +
                                "); this engine has " + std::to_string(n_slots()) + " slots");
  }
  return OkStatus();
}

Status EngineImpl::CheckSnapshot(const KvSnapshotView& snapshot, int slot) const {
  const ModelDims& d = decoder_->dims();
  const std::string what = "RestoreSlot(" + std::to_string(slot) + "): snapshot ";
  if (snapshot.n_layers != static_cast<uint32_t>(d.n_layers)) {
    return InvalidArgumentError(what + "n_layers " + std::to_string(snapshot.n_layers) +
                                " differs from the model's n_layers " +
                                std::to_string(d.n_layers) + "; it comes from another model");
  }
  if (snapshot.kv_dim != static_cast<uint32_t>(d.kv_dim)) {
    return InvalidArgumentError(what + "kv_dim " + std::to_string(snapshot.kv_dim) +
                                " differs from the model's kv_dim " + std::to_string(d.kv_dim) +
                                "; it comes from another model");
  }
  const size_t n = snapshot.n_tokens;
  const size_t want_floats = size_t{2} * d.n_layers * d.kv_dim * n;
  if (snapshot.kv_floats != want_floats) {
    return InvalidArgumentError(what + "kv has " + std::to_string(snapshot.kv_floats) +
                                " floats; n_layers · 2 · n_tokens · kv_dim = " +
                                std::to_string(want_floats) + " (n_tokens " +
                                std::to_string(n) + ")");
  }
  if (n > static_cast<size_t>(n_ctx_ - 1)) {
    return InvalidArgumentError(what + "n_tokens " + std::to_string(n) +
                                " exceeds this engine's n_ctx − 1 = " + std::to_string(n_ctx_ - 1) +
                                "; load the engine with a larger n_ctx");
  }
  const int vocab = d.vocab;
  for (size_t i = 0; i < n; ++i) {
    if (snapshot.tokens[i] < 0 || snapshot.tokens[i] >= vocab) {
      return InvalidArgumentError(what + "tokens[" + std::to_string(i) + "] " +
                                  std::to_string(snapshot.tokens[i]) + " is outside [0, " +
                                  std::to_string(vocab) + ") (vocab_size " +
                                  std::to_string(vocab) + ")");
    }
  }
  return OkStatus();
}

std::vector<SlotInfo> EngineImpl::Slots() const {
  std::vector<SlotInfo> out(slot_states_.size());  // allocated outside the lock
  MutexLock l(&mu_);
  for (size_t i = 0; i < out.size(); ++i) {
    const SlotMeta& m = slots_[i];
    out[i].index = static_cast<int>(i);
    out[i].busy = m.busy;
    out[i].n_tokens = static_cast<int>(m.tokens.size());  // empty while busy
    out[i].last_used = m.last_used;
  }
  return out;
}

std::vector<int32_t> EngineImpl::SlotTokens(int slot) const {
  if (slot < 0 || slot >= n_slots()) return {};
  MutexLock l(&mu_);
  return slots_[slot].tokens;  // empty while busy (the lease holds them)
}

Result<KvSnapshot> EngineImpl::SaveSlot(int slot, const CancelFn& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckSlot(slot, "SaveSlot"));
  std::optional<SlotLease> lease = AcquireSlot({.pinned = slot, .touch = false}, cancelled);
  if (!lease) {
    return CancelledError("SaveSlot(" + std::to_string(slot) +
                          "): cancelled while waiting for the slot");
  }
  const ModelDims& d = decoder_->dims();
  const std::vector<int32_t>& tokens = lease->fed();
  KvSnapshot snapshot;
  snapshot.n_layers = static_cast<uint32_t>(d.n_layers);
  snapshot.kv_dim = static_cast<uint32_t>(d.kv_dim);
  try {
    snapshot.tokens = tokens;
    // Not zeroed (KvBufferAllocator): ReadRows overwrites every value.
    snapshot.kv.resize(size_t{2} * d.n_layers * d.kv_dim * tokens.size());
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("SaveSlot(" + std::to_string(slot) + "): no memory for " +
                                  std::to_string(tokens.size()) + " tokens of K/V (" +
                                  std::to_string(size_t{2} * d.n_layers * d.kv_dim *
                                                 tokens.size() * sizeof(float)) +
                                  " bytes)");
  }
  lease->state().kv.ReadRows(static_cast<int>(tokens.size()), snapshot.kv.data());
  return snapshot;
}

Status EngineImpl::VisitSlot(int slot, const std::function<Status(const KvRowsView&)>& visit,
                             const CancelFn& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckSlot(slot, "VisitSlot"));
  std::optional<SlotLease> lease = AcquireSlot({.pinned = slot, .touch = false}, cancelled);
  if (!lease) {
    return CancelledError("VisitSlot(" + std::to_string(slot) +
                          "): cancelled while waiting for the slot");
  }
  const ModelDims& d = decoder_->dims();
  const std::vector<int32_t>& tokens = lease->fed();
  const KvCache& kv = lease->state().kv;
  KvRowsView rows;
  rows.n_layers = static_cast<uint32_t>(d.n_layers);
  rows.kv_dim = static_cast<uint32_t>(d.kv_dim);
  rows.tokens = tokens.data();
  rows.n_tokens = tokens.size();
  for (int l = 0; l < d.n_layers; ++l) {
    rows.k.push_back(kv.k(l));
    rows.v.push_back(kv.v(l));
  }
  return visit(rows);
}

Result<int> EngineImpl::RestoreSlot(int slot, const KvSnapshot& snapshot,
                                    const CancelFn& cancelled) {
  return RestoreSlot(slot, snapshot.View(), cancelled);
}

Result<int> EngineImpl::RestoreSlot(int slot, const KvSnapshotView& snapshot,
                                    const CancelFn& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckSlot(slot, "RestoreSlot"));
  ARBITER_RETURN_IF_ERROR(CheckSnapshot(snapshot, slot));
  std::vector<int32_t> tokens;
  try {
    // Before the lease: on failure the slot is untouched.
    tokens.assign(snapshot.tokens, snapshot.tokens + snapshot.n_tokens);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("RestoreSlot(" + std::to_string(slot) + "): no memory for " +
                                  std::to_string(snapshot.n_tokens) + " token ids");
  }
  std::optional<SlotLease> lease = AcquireSlot({.pinned = slot, .touch = true}, cancelled);
  if (!lease) {
    return CancelledError("RestoreSlot(" + std::to_string(slot) +
                          "): cancelled while waiting for the slot");
  }
  const int n = static_cast<int>(tokens.size());
  lease->state().kv.WriteRows(n, snapshot.kv);
  lease->fed() = std::move(tokens);
  return n;
}

Status EngineImpl::ClearSlot(int slot, const CancelFn& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckSlot(slot, "ClearSlot"));
  std::optional<SlotLease> lease = AcquireSlot({.pinned = slot, .touch = false}, cancelled);
  if (!lease) {
    return CancelledError("ClearSlot(" + std::to_string(slot) +
                          "): cancelled while waiting for the slot");
  }
  lease->fed().clear();  // released empty: counts as never used
  return OkStatus();
}

Result<GenerationResult> EngineImpl::Generate(const GenerationRequest& request,
                                              const TextCallback& on_text,
                                              const CancelFn& cancelled) {
  const std::vector<int32_t>& prompt = request.prompt_ids;
  ARBITER_RETURN_IF_ERROR(CheckIds(prompt, n_ctx_ - 1, "prompt"));
  if (request.max_tokens < 1) {
    return InvalidArgumentError("max_tokens " + std::to_string(request.max_tokens) +
                                " must be ≥ 1");
  }
  ARBITER_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
  if (!layout_->has_lm_head) {
    return FailedPreconditionError("model " + config().architecture_name +
                                   " has no lm_head; it can only embed");
  }
  if (request.slot < -1 || request.slot >= n_slots()) {
    return InvalidArgumentError("request slot " + std::to_string(request.slot) +
                                " is outside [-1, " + std::to_string(n_slots()) +
                                "): -1 for any free slot, else one of this engine's " +
                                std::to_string(n_slots()) + " slots");
  }

  GenerationResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  CopySource copy;
  std::optional<SlotLease> lease =
      AcquireSlot({.prompt = &prompt, .pinned = request.slot, .copy = &copy}, cancelled);
  if (!lease) {
    result.finish_reason = FinishReason::kCancelled;
    return result;
  }
  result.slot = lease->index();
  SlotState& st = lease->state();
  std::vector<int32_t>& fed = lease->fed();  // a prefix of the prompt
  size_t cached = std::min(fed.size(), prompt.size() - 1);
  if (copy.index >= 0) {
    // Note [Prefix copy between slots]: rows [cached, copy.n_tokens) from the
    // source, which no lease can take until EndCopy. copy.n_tokens > cached,
    // so fed (the own prefix) is exactly prompt[0, cached).
    st.kv.CopyRowsFrom(slot_states_[copy.index]->kv, static_cast<int>(cached),
                       static_cast<int>(copy.n_tokens));
    EndCopy(copy.index);
    fed.resize(cached);
    fed.insert(fed.end(), prompt.begin() + cached, prompt.begin() + copy.n_tokens);
    result.copied_tokens = static_cast<int>(copy.n_tokens - cached);
    cached = copy.n_tokens;
  }
  ARBITER_ASSIGN_OR_RETURN(LeasedWeights weights, AcquireWeights());
  const ModelWeights& w = weights.w;
  const int vocab = decoder_->dims().vocab;

  // Prefill the uncached suffix (at least one token).
  fed.resize(cached);
  result.cached_tokens = static_cast<int>(cached);
  std::vector<float> logits(vocab);
  int64_t t0 = Clock::Real()->NowNs();
  const int n_new = static_cast<int>(prompt.size() - cached);
  decoder_->Forward(w, st.kv, st.scratch, prompt.data() + cached, n_new,
                    static_cast<int>(cached), ForwardOutputs{.last_logits = logits.data()});
  fed.insert(fed.end(), prompt.begin() + cached, prompt.end());
  result.timings.prefill_ms = MsSince(t0);
  result.timings.prefill_tokens = n_new;

  Sampler sampler(request.sampling);
  TextStream stream(request.stop);
  t0 = Clock::Real()->NowNs();
  bool flush = true;
  while (true) {
    if (cancelled && cancelled()) {
      result.finish_reason = FinishReason::kCancelled;
      flush = false;
      break;
    }
    const int32_t next = sampler.Sample(logits.data(), vocab);
    if (!request.ignore_eos && IsEos(next)) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    result.output_ids.push_back(next);
    const std::string delta =
        tokenizer_->IsSpecial(next) ? std::string() : stream.Append(tokenizer_->TokenBytes(next));
    if (!delta.empty() && on_text && !on_text(delta)) {
      result.finish_reason = FinishReason::kCancelled;
      flush = false;
      break;
    }
    if (stream.stopped()) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    if (static_cast<int>(result.output_ids.size()) >= request.max_tokens ||
        static_cast<int>(fed.size()) >= n_ctx_) {
      result.finish_reason = FinishReason::kLength;
      break;
    }
    decoder_->Forward(w, st.kv, st.scratch, &next, 1, static_cast<int>(fed.size()),
                      ForwardOutputs{.last_logits = logits.data()});
    fed.push_back(next);
    ++result.timings.decode_tokens;
  }
  result.timings.decode_ms = MsSince(t0);
  if (flush) {
    const std::string tail = stream.Finish();
    if (!tail.empty() && on_text) on_text(tail);  // generation is over either way
  }
  result.text = stream.text();
  return result;
}

Result<std::vector<float>> EngineImpl::Embed(const std::vector<int32_t>& ids,
                                             const CancelFn& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckIds(ids, n_ctx_, "input"));
  std::optional<SlotLease> lease = AcquireSlot({.prompt = &ids}, cancelled);
  if (!lease) return CancelledError("embedding cancelled while waiting for a free slot");
  ARBITER_ASSIGN_OR_RETURN(LeasedWeights weights, AcquireWeights());
  SlotState& st = lease->state();
  const int hidden = decoder_->dims().hidden;
  std::vector<double> sum(hidden, 0.0);
  lease->fed().clear();
  decoder_->Forward(weights.w, st.kv, st.scratch, ids.data(), static_cast<int>(ids.size()), 0,
                    ForwardOutputs{.hidden_sum = sum.data()});
  lease->fed() = ids;
  double norm = 0;
  for (double v : sum) norm += v * v;  // the mean's 1/n cancels in the L2 normalization
  norm = std::sqrt(norm);
  std::vector<float> out(hidden);
  for (int i = 0; i < hidden; ++i) out[i] = norm > 0 ? static_cast<float>(sum[i] / norm) : 0.0f;
  return out;
}

Result<std::vector<float>> EngineImpl::ComputeLogits(const std::vector<int32_t>& ids) {
  ARBITER_RETURN_IF_ERROR(CheckIds(ids, n_ctx_, "input"));
  if (!layout_->has_lm_head) {
    return FailedPreconditionError("model " + config().architecture_name + " has no lm_head");
  }
  std::optional<SlotLease> lease = AcquireSlot({.prompt = &ids}, nullptr);
  ARBITER_ASSIGN_OR_RETURN(LeasedWeights weights, AcquireWeights());
  SlotState& st = lease->state();
  std::vector<float> out;
  try {
    out.resize(ids.size() * static_cast<size_t>(decoder_->dims().vocab));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("ComputeLogits: no memory for " + std::to_string(ids.size()) +
                                  " × " + std::to_string(decoder_->dims().vocab) + " logits");
  }
  lease->fed().clear();
  decoder_->Forward(weights.w, st.kv, st.scratch, ids.data(), static_cast<int>(ids.size()), 0,
                    ForwardOutputs{.all_logits = out.data()});
  lease->fed() = ids;
  return out;
}

Result<std::vector<float>> EngineImpl::IncrementalLogits(const std::vector<int32_t>& ids,
                                                         int n_prefill) {
  ARBITER_RETURN_IF_ERROR(CheckIds(ids, n_ctx_, "input"));
  if (n_prefill < 1 || static_cast<size_t>(n_prefill) > ids.size()) {
    return InvalidArgumentError("n_prefill " + std::to_string(n_prefill) + " outside [1, " +
                                std::to_string(ids.size()) + "]");
  }
  if (!layout_->has_lm_head) {
    return FailedPreconditionError("model " + config().architecture_name + " has no lm_head");
  }
  std::optional<SlotLease> lease = AcquireSlot({.prompt = &ids}, nullptr);
  ARBITER_ASSIGN_OR_RETURN(LeasedWeights weights, AcquireWeights());
  SlotState& st = lease->state();
  std::vector<float> logits(decoder_->dims().vocab);
  lease->fed().clear();
  decoder_->Forward(weights.w, st.kv, st.scratch, ids.data(), n_prefill, 0,
                    ForwardOutputs{.last_logits = logits.data()});
  for (size_t i = n_prefill; i < ids.size(); ++i) {
    decoder_->Forward(weights.w, st.kv, st.scratch, &ids[i], 1, static_cast<int>(i),
                      ForwardOutputs{.last_logits = logits.data()});
  }
  lease->fed() = ids;
  return logits;
}

}  // namespace engine_internal

// ---------------------------------------------------------------------------
// Engine::Load and WeightModelFor

namespace {

// Name of the model in an engine's private weight cache.
constexpr const char* kPrivateWeightKey = "engine";

Status CheckOptions(const EngineOptions& options) {
  if (options.n_ctx < 2 || options.n_slots < 1 || options.prefill_batch < 1 ||
      options.n_threads < 0) {
    return InvalidArgumentError("engine options: need n_ctx ≥ 2 (got " +
                                std::to_string(options.n_ctx) + "), n_slots ≥ 1 (got " +
                                std::to_string(options.n_slots) + "), prefill_batch ≥ 1 (got " +
                                std::to_string(options.prefill_batch) + "), n_threads ≥ 0 (got " +
                                std::to_string(options.n_threads) + ")");
  }
  return OkStatus();
}

std::string DirPrefix(const std::string& model_dir) {
  return model_dir.empty() || model_dir.back() == '/' ? model_dir : model_dir + "/";
}

// Tokens per slot: options.n_ctx clamped to the model's context.
int ClampedContext(const EngineOptions& options, const ModelConfig& config) {
  return std::max(2, std::min(options.n_ctx, config.max_position_embeddings));
}

// XXH3-64 over the WeightsFileToken of every file (8 bytes each, little
// endian, in st.files() order); never 0.
uint64_t FilesToken(const SafetensorsModel& st) {
  std::string bytes;
  for (const std::string& f : st.files()) {
    const uint64_t t = WeightsFileToken(f);
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((t >> (8 * i)) & 0xff));
  }
  const uint64_t h = Xxh3_64(bytes.data(), bytes.size());
  return h == 0 ? 1 : h;
}

// The registration of `layout` (planned from `st`, the files of `model_dir`).
WeightModel MakeWeightModel(const std::string& model_dir, const std::string& key,
                            std::shared_ptr<const engine_internal::ComputeLayout> layout,
                            const SafetensorsModel& st, ResidencyState residency,
                            uint64_t scratch_bytes) {
  WeightModel m;
  m.key = key;
  m.specs = layout->buffers;
  m.digest = WeightsDigest(key, m.specs, FilesToken(st));
  m.fill = [model_dir, layout](const std::vector<void*>& arrays) -> Status {
    try {
      ARBITER_ASSIGN_OR_RETURN(SafetensorsModel files, SafetensorsModel::Open(model_dir));
      return engine_internal::FillComputeLayout(*layout, files, model_dir, arrays);
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError(model_dir + ": out of memory converting weights to f32");
    }
  };
  m.residency = residency;
  m.scratch_bytes = scratch_bytes;
  return m;
}

// A private cache holding exactly `layout`: a cpu arena of the laid-out
// buffers (each at a 64-byte boundary, as the cache places them) plus one
// alignment unit, no ledger, the whole arena for weights.
Result<engine_internal::WeightSource> MakePrivateWeights(
    const std::string& model_dir, std::shared_ptr<const engine_internal::ComputeLayout> layout,
    const SafetensorsModel& st) {
  constexpr uint64_t kAlign = 64;
  uint64_t arena = kAlign;
  for (size_t i = 0; i < layout->buffers.size(); ++i) {
    arena += (layout->buffer_floats(i) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  }
  engine_internal::WeightSource src;
  ARBITER_ASSIGN_OR_RETURN(src.owned_device, CpuDeviceBackend::Create(arena));
  WeightCacheOptions cache_options;
  cache_options.device = src.owned_device.get();
  cache_options.ledger = nullptr;
  cache_options.fraction = 1.0;
  cache_options.wiggle = 0.0;
  ARBITER_ASSIGN_OR_RETURN(src.owned_cache, WeightCache::Create(std::move(cache_options)));
  src.cache = src.owned_cache.get();
  src.key = kPrivateWeightKey;
  // scratch_bytes 0: this arena holds weights only (the engine's scratch is
  // its own memory), so no room is reserved for it in the budget.
  ARBITER_RETURN_IF_ERROR(src.cache->Register(
      MakeWeightModel(model_dir, src.key, std::move(layout), st, ResidencyState::kUnpinned, 0)));
  return src;
}

}  // namespace

Status Engine::Validate(const std::string& model_dir) {
  const std::string dir = DirPrefix(model_dir);
  ARBITER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir + "config.json"));
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                           Tokenizer::Load(dir + "tokenizer.json"));
  ARBITER_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::Open(model_dir));
  return engine_internal::ValidateModelWeights(config, st, model_dir);
}

Result<WeightModel> Engine::WeightModelFor(const std::string& model_dir, const std::string& key,
                                           const EngineOptions& options,
                                           ResidencyState residency) {
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  ARBITER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(DirPrefix(model_dir) + "config.json"));
  try {
    ARBITER_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::Open(model_dir));
    ARBITER_ASSIGN_OR_RETURN(engine_internal::ComputeLayout layout,
                             engine_internal::PlanComputeLayout(config, st, model_dir));
    const int n_ctx = ClampedContext(options, config);
    const uint64_t scratch = engine_internal::ForwardScratch::BytesFor(
        layout.dims, std::min(options.prefill_batch, n_ctx), n_ctx);
    return MakeWeightModel(
        model_dir, key,
        std::make_shared<const engine_internal::ComputeLayout>(std::move(layout)), st, residency,
        scratch);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(model_dir + ": out of memory reading the weight headers");
  }
}

Result<std::unique_ptr<Engine>> Engine::Load(const std::string& model_dir,
                                             const EngineOptions& options) {
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  if (options.weight_cache != nullptr && !options.weight_cache->Contains(options.weight_key)) {
    return FailedPreconditionError(
        "engine options: weight_key '" + options.weight_key +
        "' is not registered in the weight cache; register Engine::WeightModelFor(\"" +
        model_dir + "\", \"" + options.weight_key + "\", ...) first");
  }
  const std::string dir = DirPrefix(model_dir);
  ARBITER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir + "config.json"));
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                           Tokenizer::Load(dir + "tokenizer.json"));
  try {
    std::shared_ptr<const engine_internal::ComputeLayout> layout;
    engine_internal::WeightSource weights;
    {
      ARBITER_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::Open(model_dir));
      ARBITER_ASSIGN_OR_RETURN(engine_internal::ComputeLayout planned,
                               engine_internal::PlanComputeLayout(config, st, model_dir));
      layout = std::make_shared<const engine_internal::ComputeLayout>(std::move(planned));
      if (options.weight_cache == nullptr) {
        ARBITER_ASSIGN_OR_RETURN(weights, MakePrivateWeights(model_dir, layout, st));
      } else {
        weights.cache = options.weight_cache;
        weights.key = options.weight_key;
      }
    }
    {
      // Resident now; a conversion error surfaces here. Released at once:
      // requests take their own leases.
      ARBITER_ASSIGN_OR_RETURN(WeightLease lease, weights.cache->Acquire(weights.key));
      ARBITER_RETURN_IF_ERROR(engine_internal::CheckWeightLease(lease, *layout, weights.key));
    }
    if (options.weight_cache != nullptr) {
      // The key must name this model's layout, not another model's.
      for (const WeightModelStats& m : weights.cache->Stats().models) {
        if (m.key == weights.key && m.weight_bytes != layout->bytes()) {
          return FailedPreconditionError(
              "weights '" + weights.key + "' are " + std::to_string(m.weight_bytes) +
              " bytes but the compute layout of " + model_dir + " is " +
              std::to_string(layout->bytes()) +
              "; register the key with Engine::WeightModelFor of this model");
        }
      }
    }
    const int n_ctx = ClampedContext(options, config);
    const int n_threads = options.n_threads > 0 ? options.n_threads : openblas_get_num_threads();
    auto decoder = std::make_unique<engine_internal::Decoder>(layout->config, layout->has_lm_head,
                                                              n_ctx, n_threads);
    return std::unique_ptr<Engine>(std::make_unique<engine_internal::EngineImpl>(
        std::move(tokenizer), std::move(layout), std::move(decoder), std::move(weights), options,
        n_ctx));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(model_dir + ": out of memory allocating weights or KV cache (n_ctx " +
                                  std::to_string(options.n_ctx) + ", n_slots " +
                                  std::to_string(options.n_slots) + ")");
  }
}

}  // namespace arbiter
