// engine/engine.cc — Engine::Load, the slot scheduler and the generation loop.
//
// Generation (one call on one reserved slot; see internal/engine_impl.h):
//   1. validate the request; hold the slot (the caller's SlotReservation, or
//      one reserved now: the pinned slot, or the one Note [Slot choice]
//      picks); cut the slot's tokens to their common prefix with the
//      prompt; find another free slot holding a longer prefix and copy the
//      K/V rows of the difference from it (Note [Prefix copy between
//      slots]); then take the WeightLease;
//   2. prefill prompt[cached, n) in prefill_batch chunks → logits of the last
//      prompt token (cached = own prefix + copied rows ≤ n − 1);
//   3. loop: check the cancellation; sample; EOS (unless ignore_eos) → stop;
//      append the token's bytes (special tokens render as nothing) to a
//      TextStream, which holds back partial UTF-8 and possible stop-string
//      prefixes; a stop string → stop; send the released delta (callback
//      false → cancelled); max_tokens reached → length; context full →
//      length; otherwise decode the token (one step) for the next logits.
//   4. flush the TextStream (unless stopped by a stop string or cancelled).
// The sampled token that ends generation (EOS, or the last one) is never fed
// back, so the slot's cached tokens are exactly the prompt plus the fed
// outputs.
// Prefill, decode and every K/V move go through the model's DecoderCompute
// (Note [The compute seam] in internal/compute_backend.cc); everything here
// — slots, sampling, constraints, text — is device-independent.
//
// Note [Slot choice]. The engine is the only place that decides which slot
// a call runs on (KvPrecache asks it through ReserveSlot; STYLE rule 15).
// PickSlotLocked, under mu_, over the slots that are not busy and not being
// read as a copy source:
//   - pinned (slot ≥ 0): exactly that slot;
//   - unpinned: skip slots a pinned caller waits for (it reserved them: the
//     prefix it came for must not be overwritten, and unpinned traffic must
//     not starve it); take the longest common prefix between the slot's
//     tokens and the request's prompt; ties: a slot nobody owns
//     (SlotReservation::set_owned: KvPrecache marks a conversation's slot,
//     so taking an unowned one first saves a stash of that conversation's
//     KV), then the least recently filled (last_used; 0 = never or emptied),
//     then the lowest index.
// The owned flag lives in the engine rather than coming with each request:
// the choice is re-made on every wake-up of a waiting caller, and only the
// engine's table is current then (a flag passed in would be as old as the
// call). Which conversation owns a slot, and its TTL class, stay KV policy
// in KvPrecache; the engine keeps only the bit the choice needs.
//
// Note [Slot waits]. When PickSlotLocked finds nothing, the caller waits on
// slot_freed_ (signalled by every release, every end of a copy and every
// pinned waiter that gives up) until a slot fits, its deadline passes
// (kDeadlineExceeded; std::chrono::steady_clock, real time: a simulated
// Clock must not stall a wait) or it is cancelled (kCancelled). A
// CancelToken wakes it through a callback registered for the wait (taking
// mu_ then signalling, so the wake-up cannot fall between the waiter's check
// and its sleep); nothing is polled. A Cancellation that carries a CancelFn
// predicate cannot wake anybody, so such a caller also wakes every
// Cancellation::kCancelPollMs to call it (outside mu_: it may call back into
// the engine). The callback is registered outside mu_ (it may run at once)
// and unregistered outside mu_ (unregistering waits for a running callback,
// which takes mu_). A pinned caller that has to wait counts itself in its
// slot's pinned_waiters until it gets the slot or gives up.
#include "arbiter/engine/engine.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>

#include "arbiter/base/clock.h"
#include "arbiter/engine/sampler.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/safetensors.h"
#include "arbiter/weights/weight_files.h"
#include "engine/internal/compute_backend.h"
#include "engine/internal/engine_impl.h"
#include "engine/internal/model_files_internal.h"
#include "engine/internal/model_weights.h"
#include "engine/internal/text_stream.h"
#include "engine/internal/vulkan_compute.h"

namespace arbiter {

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "stop";
}

// ---------------------------------------------------------------------------
// SlotReservation and Engine's helpers for implementations

SlotReservation::SlotReservation(SlotReservation&& other) noexcept
    : engine_(std::exchange(other.engine_, nullptr)),
      slot_(std::exchange(other.slot_, -1)),
      owned_(other.owned_),
      touched_(other.touched_),
      tokens_(std::move(other.tokens_)) {}

SlotReservation& SlotReservation::operator=(SlotReservation&& other) noexcept {
  if (this != &other) {
    Release();
    engine_ = std::exchange(other.engine_, nullptr);
    slot_ = std::exchange(other.slot_, -1);
    owned_ = other.owned_;
    touched_ = other.touched_;
    tokens_ = std::move(other.tokens_);
  }
  return *this;
}

void SlotReservation::Release() {
  if (engine_ == nullptr) return;
  Engine* engine = std::exchange(engine_, nullptr);
  const int slot = std::exchange(slot_, -1);
  engine->ReleaseReserved(slot, std::move(tokens_), owned_, touched_);
  tokens_.clear();
  touched_ = false;
}

SlotReservation Engine::MakeReservation(int slot, std::vector<int32_t> tokens, bool owned) {
  SlotReservation r;
  r.engine_ = this;
  r.slot_ = slot;
  r.owned_ = owned;
  r.tokens_ = std::move(tokens);
  return r;
}

namespace engine_internal {
namespace {

// End-of-turn / end-of-text specials that end generation when the tokenizer
// has them, in addition to config.json's eos_token_id.
constexpr const char* kEndTokens[] = {"<|im_end|>", "<|eot_id|>", "<|endoftext|>",
                                      "<|end_of_text|>", "<|eom_id|>"};

double MsSince(int64_t start_ns) {
  return static_cast<double>(Clock::Real()->NowNs() - start_ns) / 1e6;
}

size_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// Note [Logit adjustments per step]
// Before each token is drawn, Generate changes the logits in one order:
// logit bias, repetition penalty (prompt and output tokens), presence and
// frequency penalties (output tokens; ApplyLogitAdjustments in sampler.cc),
// then the TokenConstraint's mask (disallowed tokens → −inf), with
// end-of-sequence allowed iff the constraint's output is complete. Logprobs
// are read from the logits after all of this, so a masked token has
// logprob −inf and the reported distribution is the one sampled from (at
// temperature 1). The sampler then applies temperature, top-k, top-p, min-p.
class StepAdjuster {
 public:
  StepAdjuster(const GenerationRequest& r, std::span<const int32_t> prompt, int vocab,
               const std::vector<int32_t>& eos_ids)
      : params_(r.sampling), constraint_(r.constraint), ignore_eos_(r.ignore_eos),
        vocab_(vocab), eos_ids_(eos_ids) {
    if (params_.repetition_penalty != 1.0f) {
      seen_.assign(vocab, 0);
      for (int32_t id : prompt) seen_[id] = 1;
    }
    if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
      counts_.assign(vocab, 0);
    }
    if (constraint_ != nullptr) allowed_.resize(vocab);
  }

  // Adjusts logits [vocab] for the next token. False when the constraint
  // allows no token and the output cannot end here.
  bool Apply(float* logits, int tokens_left) {
    ApplyLogitAdjustments(params_, seen_, counts_, logits, vocab_);
    if (constraint_ == nullptr) return true;
    std::fill(allowed_.begin(), allowed_.end(), uint8_t{0});
    constraint_->FillAllowed(std::max(tokens_left, 1), allowed_);
    const bool can_end = constraint_->CanEnd() && !ignore_eos_;
    eos_logits_.clear();
    for (int32_t id : eos_ids_) eos_logits_.push_back(logits[id]);
    bool any = false;
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < vocab_; ++i) {
      if (allowed_[i]) {
        any = true;
      } else {
        logits[i] = kMasked;
      }
    }
    for (size_t k = 0; k < eos_ids_.size(); ++k) {
      logits[eos_ids_[k]] = can_end ? eos_logits_[k] : kMasked;
    }
    return any || (can_end && !eos_ids_.empty());
  }

  Status Accept(int32_t token) {
    if (!seen_.empty()) seen_[token] = 1;
    if (!counts_.empty()) ++counts_[token];
    return constraint_ == nullptr ? OkStatus() : constraint_->Accept(token);
  }

  bool MustEnd() const { return constraint_ != nullptr && constraint_->MustEnd(); }

 private:
  const SamplingParams& params_;
  TokenConstraint* constraint_;
  bool ignore_eos_;
  int vocab_;
  const std::vector<int32_t>& eos_ids_;
  std::vector<uint8_t> seen_;      // [vocab] or empty
  std::vector<int32_t> counts_;    // [vocab] or empty
  std::vector<uint8_t> allowed_;   // [vocab] or empty
  std::vector<float> eos_logits_;  // [eos_ids]
};

}  // namespace

// ---------------------------------------------------------------------------
// EngineImpl

EngineImpl::EngineImpl(std::shared_ptr<const ModelFiles> files,
                       std::unique_ptr<DecoderCompute> compute,
                       std::vector<std::unique_ptr<ComputeSlot>> slots, WeightSource weights,
                       const EngineOptions& options, int n_ctx)
    : weights_(std::move(weights)),
      files_(std::move(files)),
      tokenizer_(ModelFilesAccess::tokenizer(*files_)),
      layout_(ModelFilesAccess::layout(*files_)),
      compute_(std::move(compute)),
      options_(options),
      n_ctx_(n_ctx),
      slot_states_(std::move(slots)) {
  MutexLock l(&mu_);
  slots_.resize(options.n_slots);

  for (int id : layout_->config.eos_token_ids) {
    if (id >= 0) eos_ids_.push_back(id);
  }
  for (const char* t : kEndTokens) {
    const int32_t id = tokenizer_->TokenId(t);
    if (id >= 0 && tokenizer_->IsSpecial(id)) eos_ids_.push_back(id);
  }
  // The chat format's end of turn ends a generation too.
  if (Result<ChatTemplateKind> kind = files_->chat_template(); kind.ok()) {
    const int32_t id = tokenizer_->TokenId(ChatEndOfTurnToken(*kind));
    if (id >= 0) eos_ids_.push_back(id);
  }
  std::sort(eos_ids_.begin(), eos_ids_.end());
  eos_ids_.erase(std::unique(eos_ids_.begin(), eos_ids_.end()), eos_ids_.end());
}

EngineImpl::~EngineImpl() = default;

Result<EngineImpl::LeasedWeights> EngineImpl::AcquireWeights() const {
  LeasedWeights out;
  ARBITER_ASSIGN_OR_RETURN(out.lease, weights_.cache->Acquire(weights_.key));
  if (compute_->split()) {
    ARBITER_ASSIGN_OR_RETURN(out.host_lease, weights_.host_cache->Acquire(weights_.host_key));
    ARBITER_ASSIGN_OR_RETURN(out.w,
                             compute_->BindWeights(out.lease, out.host_lease, weights_.key));
    return out;
  }
  ARBITER_ASSIGN_OR_RETURN(out.w, compute_->BindWeights(out.lease, weights_.key));
  return out;
}

Result<ChatTemplateKind> EngineImpl::chat_template() const {
  return files_->chat_template();
}

size_t EngineImpl::kv_bytes() const {
  size_t total = 0;
  for (const auto& s : slot_states_) total += s->footprint().bytes();
  return total;
}

size_t EngineImpl::scratch_bytes() const {
  size_t total = 0;
  for (const auto& s : slot_states_) total += s->footprint().scratch_bytes;
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
  const int vocab = compute_->dims().vocab;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return InvalidArgumentError(std::string(what) + ": token id " + std::to_string(ids[i]) +
                                  " at position " + std::to_string(i) + " is outside [0, " +
                                  std::to_string(vocab) + ")");
    }
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------
// The slot scheduler (Note [Slot choice], Note [Slot waits])

int EngineImpl::PickSlotLocked(int pinned, std::span<const int32_t> prompt) const {
  int chosen = -1;
  size_t best_lcp = 0;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    const SlotMeta& m = slots_[i];
    if (m.busy || m.readers > 0) continue;
    if (pinned >= 0) {
      if (i == pinned) return i;
      continue;
    }
    if (m.pinned_waiters > 0) continue;
    const size_t lcp = CommonPrefix(m.tokens, prompt);
    bool better = chosen < 0 || lcp > best_lcp;
    if (!better && lcp == best_lcp) {
      const SlotMeta& c = slots_[chosen];
      better = (!m.owned && c.owned) || (m.owned == c.owned && m.last_used < c.last_used);
    }
    if (better) {
      chosen = i;
      best_lcp = lcp;
    }
  }
  return chosen;
}

Result<SlotReservation> EngineImpl::Reserve(int pinned, std::span<const int32_t> prompt,
                                            std::chrono::steady_clock::time_point deadline,
                                            const Cancellation& cancel, const std::string& what) {
  enum class GiveUp { kNo, kCancelled, kDeadline };
  // Registered before the first sleep; wakes this waiter when the token
  // fires. Declared before every lock so it is unregistered outside mu_.
  CancelRegistration wake;
  bool armed = !cancel.token().can_be_cancelled();  // nothing to register
  bool reserved = false;  // counted in slots_[pinned].pinned_waiters
  while (true) {
    GiveUp give_up = GiveUp::kNo;
    {
      MutexLock l(&mu_);
      const int chosen = PickSlotLocked(pinned, prompt);
      if (chosen >= 0) {
        SlotMeta& m = slots_[chosen];
        if (reserved) --m.pinned_waiters;
        m.busy = true;
        std::vector<int32_t> tokens = std::move(m.tokens);
        m.tokens.clear();
        return MakeReservation(chosen, std::move(tokens), m.owned);
      }
      if (pinned >= 0 && !reserved) {
        ++slots_[pinned].pinned_waiters;
        reserved = true;
      }
      const auto now = std::chrono::steady_clock::now();
      if (cancel.token().cancelled()) {
        give_up = GiveUp::kCancelled;
      } else if (now >= deadline) {
        give_up = GiveUp::kDeadline;
      } else if (armed) {
        ++wait_stats_.sleeps;
        ++wait_stats_.waiting;
        if (cancel.polls()) {
          const auto step = now + std::chrono::milliseconds(Cancellation::kCancelPollMs);
          slot_freed_.WaitUntil(std::min(deadline, step));
        } else if (deadline == kNoDeadline) {
          slot_freed_.Wait();
        } else {
          slot_freed_.WaitUntil(deadline);
        }
        --wait_stats_.waiting;
        ++wait_stats_.wakeups;
      }
    }
    if (give_up == GiveUp::kNo && !armed) {
      // First time it has to wait: register the wake-up outside mu_ (the
      // callback runs at once when the token has already fired) and look
      // again before sleeping.
      wake = cancel.token().OnCancel([this] {
        MutexLock l(&mu_);
        slot_freed_.SignalAll();
      });
      armed = true;
      continue;
    }
    // A predicate is called outside the lock (it may be slow, or call back
    // into the engine).
    if (give_up == GiveUp::kNo && cancel.polls() && cancel.cancelled()) {
      give_up = GiveUp::kCancelled;
    }
    if (give_up == GiveUp::kNo) continue;
    if (reserved) {
      MutexLock l(&mu_);
      --slots_[pinned].pinned_waiters;
      slot_freed_.SignalAll();  // unpinned waiters may take it now
    }
    const std::string which = pinned >= 0 ? "slot " + std::to_string(pinned) : "a free slot";
    if (give_up == GiveUp::kCancelled) {
      return CancelledError(what + ": cancelled while waiting for " + which);
    }
    return DeadlineExceededError(what + ": the deadline passed while waiting for " + which +
                                 " (all " + std::to_string(n_slots()) +
                                 " slots busy); retry later or raise parallel");
  }
}

Result<SlotReservation> EngineImpl::ReserveSlot(const SlotRequest& request,
                                                std::chrono::steady_clock::time_point deadline,
                                                const Cancellation& cancel) {
  if (request.slot < -1 || request.slot >= n_slots()) {
    return InvalidArgumentError("ReserveSlot: slot " + std::to_string(request.slot) +
                                " is outside [-1, " + std::to_string(n_slots()) +
                                "): -1 for any free slot, else one of this engine's " +
                                std::to_string(n_slots()) + " slots");
  }
  return Reserve(request.slot, request.prompt, deadline, cancel, "ReserveSlot");
}

void EngineImpl::ReleaseReserved(int slot, std::vector<int32_t> tokens, bool owned, bool filled) {
  MutexLock l(&mu_);
  SlotMeta& m = slots_[slot];
  m.tokens = std::move(tokens);
  m.busy = false;
  m.owned = owned;
  if (m.tokens.empty()) {
    m.last_used = 0;
  } else if (filled) {
    m.last_used = ++use_counter_;
  }
  slot_freed_.SignalAll();
}

EngineImpl::CopySource EngineImpl::BeginCopy(int self, const std::vector<int32_t>& prompt,
                                             size_t own) {
  // Longest prefix a copy may bring: at least one prompt token is computed.
  const size_t cap = prompt.size() - 1;
  CopySource best;
  MutexLock l(&mu_);
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    const SlotMeta& m = slots_[i];
    if (i == self || m.busy) continue;
    const size_t lcp = std::min(CommonPrefix(m.tokens, prompt), cap);
    if (lcp > best.n_tokens) best = CopySource{i, lcp};
  }
  // A tie with the own prefix gains nothing.
  if (best.index < 0 || best.n_tokens <= own) return CopySource{};
  ++slots_[best.index].readers;
  return best;
}

void EngineImpl::EndCopy(int index) {
  MutexLock l(&mu_);
  if (--slots_[index].readers == 0) slot_freed_.SignalAll();
}

SlotWaitStats EngineImpl::slot_wait_stats() const {
  MutexLock l(&mu_);
  return wait_stats_;
}

Status EngineImpl::CheckSlot(int slot, const char* what) const {
  if (slot < 0 || slot >= n_slots()) {
    return InvalidArgumentError(std::string(what) + ": slot " + std::to_string(slot) +
                                " is outside [0, " + std::to_string(n_slots()) +
                                "); this engine has " + std::to_string(n_slots()) + " slots");
  }
  return OkStatus();
}

Status EngineImpl::CheckHeld(const SlotReservation& r, const char* what) const {
  if (!Holds(r)) {
    return FailedPreconditionError(
        std::string(what) + ": the slot reservation is " +
        (r.held() ? "another engine's" : "empty (released or moved from)") +
        "; reserve a slot of this engine with ReserveSlot first");
  }
  return OkStatus();
}

Status EngineImpl::CheckSnapshot(const KvSnapshotView& snapshot, int slot) const {
  const ModelDims& d = compute_->dims();
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
  if (snapshot.kv_type != options_.kv_type) {
    return InvalidArgumentError(what + "kv_type " + std::string(KvTypeName(snapshot.kv_type)) +
                                " differs from this engine's kv_type " +
                                std::string(KvTypeName(options_.kv_type)) +
                                "; K/V of another type are recomputed, not restored");
  }
  const size_t n = snapshot.n_tokens;
  const size_t want_bytes = size_t{2} * d.n_layers * n * KvRowBytes(options_.kv_type, d.kv_dim);
  if (snapshot.kv_bytes != want_bytes) {
    return InvalidArgumentError(what + "kv has " + std::to_string(snapshot.kv_bytes) +
                                " bytes; n_layers · 2 · n_tokens rows of " +
                                std::string(KvTypeName(options_.kv_type)) + " = " +
                                std::to_string(want_bytes) + " (n_tokens " +
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
    out[i].owned = m.owned;
  }
  return out;
}

std::vector<int32_t> EngineImpl::SlotTokens(int slot) const {
  if (slot < 0 || slot >= n_slots()) return {};
  MutexLock l(&mu_);
  return slots_[slot].tokens;  // empty while busy (the reservation holds them)
}

// ---------------------------------------------------------------------------
// Slot contents

Result<KvSnapshot> EngineImpl::SaveSlot(const SlotReservation& r) {
  ARBITER_RETURN_IF_ERROR(CheckHeld(r, "SaveSlot"));
  const ModelDims& d = compute_->dims();
  const std::vector<int32_t>& tokens = r.tokens();
  KvSnapshot snapshot;
  snapshot.n_layers = static_cast<uint32_t>(d.n_layers);
  snapshot.kv_dim = static_cast<uint32_t>(d.kv_dim);
  snapshot.kv_type = options_.kv_type;
  try {
    snapshot.tokens = tokens;
    // Not zeroed (KvBufferAllocator): ReadRows overwrites every byte.
    snapshot.kv.resize(snapshot.ExpectedKvBytes());
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("SaveSlot(" + std::to_string(r.slot()) + "): no memory for " +
                                  std::to_string(tokens.size()) + " tokens of K/V (" +
                                  std::to_string(snapshot.ExpectedKvBytes()) + " bytes)");
  }
  compute_->ReadKv(state(r), static_cast<int>(tokens.size()), snapshot.kv.data());
  return snapshot;
}

Result<KvSnapshot> EngineImpl::SaveSlot(int slot, const Cancellation& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckSlot(slot, "SaveSlot"));
  ARBITER_ASSIGN_OR_RETURN(
      SlotReservation r,
      Reserve(slot, {}, kNoDeadline, cancelled, "SaveSlot(" + std::to_string(slot) + ")"));
  return SaveSlot(r);
}

Status EngineImpl::VisitSlot(const SlotReservation& r,
                             const std::function<Status(const KvRowsView&)>& visit) {
  ARBITER_RETURN_IF_ERROR(CheckHeld(r, "VisitSlot"));
  const ModelDims& d = compute_->dims();
  const std::vector<int32_t>& tokens = r.tokens();
  KvRowsView rows;
  rows.n_layers = static_cast<uint32_t>(d.n_layers);
  rows.kv_dim = static_cast<uint32_t>(d.kv_dim);
  rows.kv_type = compute_->kv_type();
  rows.tokens = tokens.data();
  rows.n_tokens = tokens.size();
  return compute_->VisitKv(state(r), std::move(rows), visit);
}

Status EngineImpl::VisitSlot(int slot, const std::function<Status(const KvRowsView&)>& visit,
                             const Cancellation& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckSlot(slot, "VisitSlot"));
  ARBITER_ASSIGN_OR_RETURN(
      SlotReservation r,
      Reserve(slot, {}, kNoDeadline, cancelled, "VisitSlot(" + std::to_string(slot) + ")"));
  return VisitSlot(r, visit);
}

Result<int> EngineImpl::RestoreSlot(SlotReservation& r, const KvSnapshotView& snapshot) {
  ARBITER_RETURN_IF_ERROR(CheckHeld(r, "RestoreSlot"));
  ARBITER_RETURN_IF_ERROR(CheckSnapshot(snapshot, r.slot()));
  std::vector<int32_t> tokens;
  try {
    // Before writing: on failure the slot is untouched.
    tokens.assign(snapshot.tokens, snapshot.tokens + snapshot.n_tokens);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("RestoreSlot(" + std::to_string(r.slot()) +
                                  "): no memory for " + std::to_string(snapshot.n_tokens) +
                                  " token ids");
  }
  const int n = static_cast<int>(tokens.size());
  compute_->WriteKv(state(r), n, snapshot.kv);
  HeldTokens(r) = std::move(tokens);
  MarkFilled(r);
  return n;
}

Result<int> EngineImpl::RestoreSlot(int slot, const KvSnapshot& snapshot,
                                    const Cancellation& cancelled) {
  return RestoreSlot(slot, snapshot.View(), cancelled);
}

Result<int> EngineImpl::RestoreSlot(int slot, const KvSnapshotView& snapshot,
                                    const Cancellation& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckSlot(slot, "RestoreSlot"));
  // Validated before waiting: a bad snapshot never costs a wait.
  ARBITER_RETURN_IF_ERROR(CheckSnapshot(snapshot, slot));
  ARBITER_ASSIGN_OR_RETURN(
      SlotReservation r,
      Reserve(slot, {}, kNoDeadline, cancelled, "RestoreSlot(" + std::to_string(slot) + ")"));
  return RestoreSlot(r, snapshot);
}

Status EngineImpl::ClearSlot(SlotReservation& r) {
  ARBITER_RETURN_IF_ERROR(CheckHeld(r, "ClearSlot"));
  HeldTokens(r).clear();  // released empty: counts as never used
  return OkStatus();
}

Status EngineImpl::ClearSlot(int slot, const Cancellation& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckSlot(slot, "ClearSlot"));
  ARBITER_ASSIGN_OR_RETURN(
      SlotReservation r,
      Reserve(slot, {}, kNoDeadline, cancelled, "ClearSlot(" + std::to_string(slot) + ")"));
  return ClearSlot(r);
}

// ---------------------------------------------------------------------------
// Compute

Status EngineImpl::CheckRequest(const GenerationRequest& request) const {
  ARBITER_RETURN_IF_ERROR(CheckIds(request.prompt_ids, n_ctx_ - 1, "prompt"));
  if (request.max_tokens < 1) {
    return InvalidArgumentError("max_tokens " + std::to_string(request.max_tokens) +
                                " must be ≥ 1");
  }
  ARBITER_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
  const int vocab = tokenizer_->vocab_size();
  for (const auto& [id, bias] : request.sampling.logit_bias) {
    if (id < 0 || id >= vocab) {
      return InvalidArgumentError("logit_bias: token id " + std::to_string(id) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  if (request.top_logprobs > 20) {
    return InvalidArgumentError("top_logprobs " + std::to_string(request.top_logprobs) +
                                " must be in [0, 20]");
  }
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
  return OkStatus();
}

Result<GenerationResult> EngineImpl::Generate(const GenerationRequest& request,
                                              const TextCallback& on_text,
                                              const Cancellation& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckRequest(request));
  Result<SlotReservation> r =
      Reserve(request.slot, request.prompt_ids, kNoDeadline, cancelled, "Generate");
  if (!r.ok()) {
    if (r.status().code() != StatusCode::kCancelled) return r.status();
    GenerationResult result;
    result.prompt_tokens = static_cast<int>(request.prompt_ids.size());
    result.finish_reason = FinishReason::kCancelled;
    return result;
  }
  return Generate(*r, request, on_text, cancelled);
}

Result<GenerationResult> EngineImpl::Generate(SlotReservation& r,
                                              const GenerationRequest& request,
                                              const TextCallback& on_text,
                                              const Cancellation& cancel) {
  ARBITER_RETURN_IF_ERROR(CheckHeld(r, "Generate"));
  ARBITER_RETURN_IF_ERROR(CheckRequest(request));
  if (request.slot >= 0 && request.slot != r.slot()) {
    return InvalidArgumentError("request slot " + std::to_string(request.slot) +
                                " differs from the reserved slot " + std::to_string(r.slot()) +
                                "; leave it -1 when generating within a reservation");
  }
  const std::vector<int32_t>& prompt = request.prompt_ids;
  GenerationResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  result.slot = r.slot();
  ComputeSlot& st = state(r);
  std::vector<int32_t>& fed = HeldTokens(r);
  fed.resize(CommonPrefix(fed, prompt));  // the rest will be overwritten
  MarkFilled(r);
  size_t cached = std::min(fed.size(), prompt.size() - 1);
  const CopySource copy = BeginCopy(r.slot(), prompt, cached);
  if (copy.index >= 0) {
    // Note [Prefix copy between slots]: rows [cached, copy.n_tokens) from the
    // source, which no reservation can take until EndCopy. copy.n_tokens > cached,
    // so fed (the own prefix) is exactly prompt[0, cached).
    compute_->CopyKv(*slot_states_[copy.index], st, static_cast<int>(cached),
                     static_cast<int>(copy.n_tokens));
    EndCopy(copy.index);
    fed.resize(cached);
    fed.insert(fed.end(), prompt.begin() + cached, prompt.begin() + copy.n_tokens);
    result.copied_tokens = static_cast<int>(copy.n_tokens - cached);
    cached = copy.n_tokens;
  }
  ARBITER_ASSIGN_OR_RETURN(LeasedWeights weights, AcquireWeights());
  const ComputeWeights& w = *weights.w;
  const int vocab = compute_->dims().vocab;

  // Prefill the uncached suffix (at least one token).
  fed.resize(cached);
  result.cached_tokens = static_cast<int>(cached);
  std::vector<float> logits(vocab);
  int64_t t0 = Clock::Real()->NowNs();
  const int n_new = static_cast<int>(prompt.size() - cached);
  ARBITER_RETURN_IF_ERROR(compute_->Prefill(w, st, prompt.data() + cached, n_new,
                                            static_cast<int>(cached),
                                            ForwardOutputs{.last_logits = logits.data()}));
  fed.insert(fed.end(), prompt.begin() + cached, prompt.end());
  result.timings.prefill_ms = MsSince(t0);
  result.timings.prefill_tokens = n_new;

  Sampler sampler(request.sampling);
  TextStream stream(request.stop);
  StepAdjuster adjust(request, prompt, vocab, eos_ids_);
  t0 = Clock::Real()->NowNs();
  bool flush = true;
  while (true) {
    if (cancel.cancelled()) {
      result.finish_reason = FinishReason::kCancelled;
      flush = false;
      break;
    }
    const int tokens_left = std::min(request.max_tokens - static_cast<int>(result.output_ids.size()),
                                     n_ctx_ - static_cast<int>(fed.size()));
    if (!adjust.Apply(logits.data(), tokens_left)) {
      // The constraint allows nothing here and the output is incomplete: a
      // grammar that needs a character this vocabulary cannot spell.
      return FailedPreconditionError(
          "constrained decoding: the grammar allows no token of this model's vocabulary after " +
          std::to_string(result.output_ids.size()) + " generated tokens");
    }
    const int32_t next = sampler.Sample(logits.data(), vocab);
    TokenLogprob lp;
    if (request.top_logprobs >= 0) lp = LogprobOf(logits.data(), vocab, next, request.top_logprobs);
    if (!request.ignore_eos && IsEos(next)) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    ARBITER_RETURN_IF_ERROR(adjust.Accept(next));
    if (request.on_token) request.on_token(next, request.top_logprobs >= 0 ? &lp : nullptr);
    if (request.top_logprobs >= 0) result.logprobs.push_back(std::move(lp));
    result.output_ids.push_back(next);
    const std::string delta =
        tokenizer_->IsSpecial(next) ? std::string() : stream.Append(tokenizer_->TokenBytes(next));
    if (!delta.empty() && on_text && !on_text(delta)) {
      result.finish_reason = FinishReason::kCancelled;
      flush = false;
      break;
    }
    if (stream.stopped() || adjust.MustEnd()) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    if (static_cast<int>(result.output_ids.size()) >= request.max_tokens ||
        static_cast<int>(fed.size()) >= n_ctx_) {
      result.finish_reason = FinishReason::kLength;
      break;
    }
    ARBITER_RETURN_IF_ERROR(
        compute_->Decode(w, st, next, static_cast<int>(fed.size()), logits.data()));
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
                                             const Cancellation& cancelled) {
  ARBITER_RETURN_IF_ERROR(CheckIds(ids, n_ctx_, "input"));
  ARBITER_ASSIGN_OR_RETURN(SlotReservation r,
                           Reserve(-1, ids, kNoDeadline, cancelled, "Embed"));
  MarkFilled(r);
  ARBITER_ASSIGN_OR_RETURN(LeasedWeights weights, AcquireWeights());
  const int hidden = compute_->dims().hidden;
  std::vector<double> sum(hidden, 0.0);
  HeldTokens(r).clear();
  ARBITER_RETURN_IF_ERROR(compute_->Prefill(*weights.w, state(r), ids.data(),
                                            static_cast<int>(ids.size()), 0,
                                            ForwardOutputs{.hidden_sum = sum.data()}));
  HeldTokens(r) = ids;
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
  ARBITER_ASSIGN_OR_RETURN(SlotReservation r,
                           Reserve(-1, ids, kNoDeadline, nullptr, "ComputeLogits"));
  MarkFilled(r);
  ARBITER_ASSIGN_OR_RETURN(LeasedWeights weights, AcquireWeights());
  std::vector<float> out;
  try {
    out.resize(ids.size() * static_cast<size_t>(compute_->dims().vocab));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("ComputeLogits: no memory for " + std::to_string(ids.size()) +
                                  " × " + std::to_string(compute_->dims().vocab) + " logits");
  }
  HeldTokens(r).clear();
  ARBITER_RETURN_IF_ERROR(compute_->Prefill(*weights.w, state(r), ids.data(),
                                            static_cast<int>(ids.size()), 0,
                                            ForwardOutputs{.all_logits = out.data()}));
  HeldTokens(r) = ids;
  return out;
}

Result<std::vector<float>> EngineImpl::IncrementalLogits(const std::vector<int32_t>& ids,
                                                         int n_prefill) {
  ARBITER_RETURN_IF_ERROR(CheckIds(ids, n_ctx_, "input"));
  if (n_prefill < 1 || static_cast<size_t>(n_prefill) > ids.size()) {
    return InvalidArgumentError("IncrementalLogits: n_prefill " + std::to_string(n_prefill) +
                                " outside [1, " + std::to_string(ids.size()) + "]");
  }
  if (!layout_->has_lm_head) {
    return FailedPreconditionError("model " + config().architecture_name + " has no lm_head");
  }
  ARBITER_ASSIGN_OR_RETURN(SlotReservation r,
                           Reserve(-1, ids, kNoDeadline, nullptr, "IncrementalLogits"));
  MarkFilled(r);
  ARBITER_ASSIGN_OR_RETURN(LeasedWeights weights, AcquireWeights());
  ComputeSlot& st = state(r);
  std::vector<float> logits(compute_->dims().vocab);
  HeldTokens(r).clear();
  ARBITER_RETURN_IF_ERROR(compute_->Prefill(*weights.w, st, ids.data(), n_prefill, 0,
                                            ForwardOutputs{.last_logits = logits.data()}));
  for (size_t i = n_prefill; i < ids.size(); ++i) {
    ARBITER_RETURN_IF_ERROR(
        compute_->Decode(*weights.w, st, ids[i], static_cast<int>(i), logits.data()));
  }
  HeldTokens(r) = ids;
  return logits;
}

}  // namespace engine_internal

// ---------------------------------------------------------------------------
// Engine::Load, WeightModelFor, Footprint
//
// Note [One parse per load]. A model's files are opened and planned once per
// load: OpenModelFiles parses config.json and tokenizer.json, reads the
// safetensors headers, plans the compute layout and takes a token of every
// weight file (size and mtime). Footprint, WeightModelFor and Load all work
// from that one ModelFiles and read nothing themselves. The only later read
// is of weight bytes, by the registration's fill, whenever the WeightCache
// loads them (the first Acquire, a reload after eviction, a host floor):
// the fill opens the safetensors files, and before converting anything
// checks that their token still equals the one the ModelFiles took — the
// token that went into the registration's digest. A file replaced or
// rewritten since (between the footprint estimate and the load, or any time
// later) therefore fails the fill with kFailedPrecondition naming the
// directory, instead of loading bytes the digest (which names a shared
// host floor) does not describe; reopening the model (a new ModelFiles, a
// new registration) picks the new files up. The fill also re-checks every
// tensor's presence and shape (FillComputeLayout), which catches a change
// the token misses (one keeping size and mtime).

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
  if (options.device_layers < -1) {
    return InvalidArgumentError("engine options: device_layers " +
                                std::to_string(options.device_layers) +
                                " (use −1 for every layer, or a count ≥ 0)");
  }
  if (!IsKvType(options.kv_type)) {
    return InvalidArgumentError("engine options: kv_type " +
                                std::string(GgmlTypeName(options.kv_type)) +
                                " is not a KV cache type; use f16 (default), bf16, q8_0 or f32");
  }
  return engine_internal::CheckComputeDevice(options.device).WithPrefix("engine options");
}

// kInvalidArgument when the model's heads cannot be held in options.kv_type
// (q8_0 blocks of 32 must not straddle two heads).
Status CheckKvType(const EngineOptions& options, const engine_internal::ModelDims& d,
                   const std::string& model_dir) {
  if (KvRowBytes(options.kv_type, d.head_dim) == 0) {
    return InvalidArgumentError(
        model_dir + ": kv_type " + std::string(KvTypeName(options.kv_type)) +
        " stores blocks of " +
        std::to_string(GgmlTypeTraitsOf(options.kv_type)->block_elems) +
        " values, which head_dim " + std::to_string(d.head_dim) +
        " is not a multiple of; use kv_type = \"f16\" for this model");
  }
  return OkStatus();
}

// kFailedPrecondition when options.weight_cache does not hold weight_key.
Status CheckRegistered(const EngineOptions& options, const std::string& model_dir) {
  if (options.weight_cache != nullptr && !options.weight_cache->Contains(options.weight_key)) {
    return FailedPreconditionError(
        "engine options: weight_key '" + options.weight_key +
        "' is not registered in the weight cache; register Engine::WeightModelFor(\"" +
        model_dir + "\", \"" + options.weight_key + "\", ...) first");
  }
  return OkStatus();
}

// Tokens per slot: options.n_ctx clamped to the model's context.
int ClampedContext(const EngineOptions& options, const ModelConfig& config) {
  return std::max(2, std::min(options.n_ctx, config.max_position_embeddings));
}

// The registration of `files`' layout (Note [One parse per load]), or of
// its buffers `part` only (a split model's part, ascending indices; empty:
// every buffer).
WeightModel MakeWeightModel(const ModelFiles& files, const std::string& key,
                            ResidencyState residency, uint64_t scratch_bytes,
                            std::vector<size_t> part = {}) {
  std::shared_ptr<const engine_internal::ComputeLayout> layout =
      engine_internal::ModelFilesAccess::layout(files);
  WeightModel m;
  m.key = key;
  if (part.empty()) {
    m.specs = layout->buffers;
  } else {
    for (size_t i : part) m.specs.push_back(layout->buffers[i]);
  }
  m.digest = files.WeightsDigestFor(key);
  m.fill = [dir = files.dir(), token = files.files_token(), layout,
            part = std::move(part)](const std::vector<void*>& given) -> Status {
    // A part's arrays go to their buffers; the others stay null (skipped).
    std::vector<void*> arrays = given;
    if (!part.empty()) {
      arrays.assign(layout->buffers.size(), nullptr);
      for (size_t i = 0; i < part.size() && i < given.size(); ++i) arrays[part[i]] = given[i];
    }
    const Status changed = FailedPreconditionError(
        dir + ": the weight files changed since the model was opened (their size or mtime "
              "differs from the token in the weights digest); reload the model to plan "
              "and register the new files");
    try {
      if (layout->source == engine_internal::ComputeSource::kGguf) {
        if (engine_internal::FilesToken({dir}) != token) return changed;
        ARBITER_ASSIGN_OR_RETURN(GgufFile gguf, OpenGguf(dir));
        return engine_internal::FillComputeLayoutGguf(*layout, gguf, dir, arrays);
      }
      ARBITER_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::Open(dir));
      if (engine_internal::FilesToken(st.files()) != token) return changed;
      return engine_internal::FillComputeLayout(*layout, st, dir, arrays);
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError(dir + ": out of memory reading the weights");
    }
  };
  m.residency = residency;
  m.scratch_bytes = scratch_bytes;
  return m;
}

// A private cache holding exactly `files`' layout: a cpu arena of the
// laid-out buffers (each at a 64-byte boundary, as the cache places them)
// plus one alignment unit, no ledger, the whole arena for weights.
// `part`: only those buffers (a split model's part; empty: all).
Result<engine_internal::WeightSource> MakePrivateWeights(const ModelFiles& files,
                                                         std::string_view device,
                                                         const std::vector<size_t>& part = {}) {
  const engine_internal::ComputeLayout& layout = *engine_internal::ModelFilesAccess::layout(files);
  constexpr uint64_t kAlign = 64;
  uint64_t arena = kAlign;
  for (size_t i = 0; i < layout.buffers.size(); ++i) {
    if (!part.empty() && !std::binary_search(part.begin(), part.end(), i)) continue;
    arena += (layout.buffer_bytes(i) + kAlign - 1) / kAlign * kAlign;
  }
  engine_internal::WeightSource src;
  if (engine_internal::IsVulkanComputeDevice(device)) {
    // The device's arena: the block may start on its own alignment.
    ARBITER_ASSIGN_OR_RETURN(src.owned_device,
                             engine_internal::MakeVulkanWeightArena(device, arena + 4096));
  } else {
    ARBITER_ASSIGN_OR_RETURN(src.owned_device, CpuDeviceBackend::Create(arena));
  }
  WeightCacheOptions cache_options;
  cache_options.device = src.owned_device.get();
  cache_options.ledger = nullptr;
  cache_options.fraction = 1.0;
  cache_options.wiggle = 0.0;
  if (engine_internal::IsVulkanComputeDevice(device)) cache_options.pool_region_bytes = 1;
  ARBITER_ASSIGN_OR_RETURN(src.owned_cache, WeightCache::Create(std::move(cache_options)));
  src.cache = src.owned_cache.get();
  src.key = kPrivateWeightKey;
  // scratch_bytes 0: this arena holds weights only (the engine's scratch is
  // its own memory), so no room is reserved for it in the budget.
  ARBITER_RETURN_IF_ERROR(src.cache->Register(
      MakeWeightModel(files, src.key, ResidencyState::kUnpinned, 0, part)));
  return src;
}

// What the compute device is made for under `options` (n_ctx clamped;
// threads resolved as Load resolves them).
engine_internal::ComputeSpec ComputeSpecFor(const ModelFiles& files,
                                            const EngineOptions& options) {
  engine_internal::ComputeSpec spec;
  spec.device = options.device;
  spec.layout = engine_internal::ModelFilesAccess::layout(files);
  spec.n_ctx = ClampedContext(options, spec.layout->config);
  spec.batch = std::min(options.prefill_batch, spec.n_ctx);
  spec.n_threads = options.n_threads > 0 ? options.n_threads : openblas_get_num_threads();
  spec.kv_type = options.kv_type;
  spec.device_layers = options.device_layers;
  return spec;
}

// The split of `files` under `options` (Note [Partial offload] in
// split_compute.cc): the first device layer, 0 when not split.
int FirstDeviceLayer(const ModelFiles& files, const EngineOptions& options) {
  return engine_internal::FirstDeviceLayer(ComputeSpecFor(files, options));
}

// One slot's memory under `options`, as the device will allocate it.
// Errors: an unknown device (CheckComputeDevice).
Result<engine_internal::SlotFootprint> SlotFootprint(const ModelFiles& files,
                                                     const EngineOptions& options) {
  return engine_internal::SlotFootprintFor(ComputeSpecFor(files, options));
}

}  // namespace

Status Engine::Validate(const std::string& model_dir) {
  return OpenModelFiles(model_dir).status();
}

Result<WeightModel> Engine::WeightModelFor(const ModelFiles& files, const std::string& key,
                                           const EngineOptions& options,
                                           ResidencyState residency) {
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  ARBITER_ASSIGN_OR_RETURN(engine_internal::SlotFootprint slot, SlotFootprint(files, options));
  if (const int first = FirstDeviceLayer(files, options); first > 0) {
    return MakeWeightModel(
        files, key, residency, slot.scratch_bytes - slot.host_scratch_bytes,
        engine_internal::SplitBuffersOf(*engine_internal::ModelFilesAccess::layout(files), first)
            .device);
  }
  return MakeWeightModel(files, key, residency, slot.scratch_bytes);
}

Result<int> Engine::DeviceLayersFor(const ModelFiles& files, const EngineOptions& options,
                                    uint64_t budget_bytes) {
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  const engine_internal::ComputeLayout& layout = *engine_internal::ModelFilesAccess::layout(files);
  // Device arenas place each buffer on at least this boundary.
  constexpr uint64_t kPad = 256;
  const int n_layers = layout.dims.n_layers;
  const auto n_slots = static_cast<uint64_t>(options.n_slots);
  for (int n = n_layers; n >= 1; --n) {
    EngineOptions o = options;
    o.device_layers = n;
    ARBITER_ASSIGN_OR_RETURN(engine_internal::SlotFootprint slot, SlotFootprint(files, o));
    uint64_t bytes = n_slots * (slot.bytes() - slot.host_kv_bytes - slot.host_scratch_bytes);
    if (n == n_layers) {
      for (size_t i = 0; i < layout.buffers.size(); ++i) bytes += layout.buffer_bytes(i) + kPad;
    } else {
      for (size_t i : engine_internal::SplitBuffersOf(layout, n_layers - n).device) {
        bytes += layout.buffer_bytes(i) + kPad;
      }
    }
    if (bytes <= budget_bytes) return n;
  }
  return 0;
}

Result<WeightModel> Engine::HostWeightModelFor(const ModelFiles& files, const std::string& key,
                                               const EngineOptions& options,
                                               ResidencyState residency) {
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  ARBITER_ASSIGN_OR_RETURN(engine_internal::SlotFootprint slot, SlotFootprint(files, options));
  const int first = FirstDeviceLayer(files, options);
  if (first == 0) {
    return InvalidArgumentError("HostWeightModelFor: the model is not split (device \"" +
                                options.device + "\", device_layers " +
                                std::to_string(options.device_layers) + ")");
  }
  return MakeWeightModel(
      files, key, residency, slot.host_scratch_bytes,
      engine_internal::SplitBuffersOf(*engine_internal::ModelFilesAccess::layout(files), first)
          .host);
}

Result<WeightModel> Engine::WeightModelFor(const std::string& model_dir, const std::string& key,
                                           const EngineOptions& options,
                                           ResidencyState residency) {
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  ARBITER_ASSIGN_OR_RETURN(
      std::shared_ptr<const ModelFiles> files,
      engine_internal::ModelFilesAccess::Open(model_dir, /*with_tokenizer=*/false));
  return WeightModelFor(*files, key, options, residency);
}

Result<EngineFootprint> Engine::Footprint(const ModelFiles& files, const EngineOptions& options) {
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  const engine_internal::ComputeLayout& layout = *engine_internal::ModelFilesAccess::layout(files);
  ARBITER_RETURN_IF_ERROR(CheckKvType(options, layout.dims, files.dir()));
  ARBITER_ASSIGN_OR_RETURN(engine_internal::SlotFootprint slot, SlotFootprint(files, options));
  const size_t n_slots = static_cast<size_t>(options.n_slots);
  EngineFootprint f;
  // Per slot: n_layers × 2 × n_ctx rows of kv_type, and the activations.
  f.kv_bytes = n_slots * (slot.kv_bytes - slot.host_kv_bytes);
  f.scratch_bytes = n_slots * (slot.scratch_bytes - slot.host_scratch_bytes);
  f.host_kv_bytes = n_slots * slot.host_kv_bytes;
  f.host_scratch_bytes = n_slots * slot.host_scratch_bytes;
  f.weight_bytes = layout.bytes();
  return f;
}

Result<std::unique_ptr<Engine>> Engine::Load(const std::string& model_dir,
                                             const EngineOptions& options) {
  // The cheap checks first, before any file is read.
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  ARBITER_RETURN_IF_ERROR(CheckRegistered(options, model_dir));
  ARBITER_ASSIGN_OR_RETURN(std::shared_ptr<const ModelFiles> files, OpenModelFiles(model_dir));
  return Load(std::move(files), options);
}

Result<std::unique_ptr<Engine>> Engine::Load(std::shared_ptr<const ModelFiles> files,
                                             const EngineOptions& options) {
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  const std::string& model_dir = files->dir();
  ARBITER_RETURN_IF_ERROR(CheckRegistered(options, model_dir));
  if (engine_internal::ModelFilesAccess::tokenizer(*files) == nullptr) {
    return FailedPreconditionError(model_dir +
                                   ": opened without its tokenizer; use OpenModelFiles");
  }
  ARBITER_RETURN_IF_ERROR(
      CheckKvType(options, engine_internal::ModelFilesAccess::layout(*files)->dims, model_dir));
  try {
    const std::shared_ptr<const engine_internal::ComputeLayout>& layout =
        engine_internal::ModelFilesAccess::layout(*files);
    engine_internal::WeightSource weights;
    const engine_internal::ComputeSpec spec = ComputeSpecFor(*files, options);
    const int first = engine_internal::FirstDeviceLayer(spec);
    const bool all_cpu = engine_internal::IsVulkanComputeDevice(options.device) &&
                         options.device_layers == 0;
    if (first > 0 && options.weight_cache != nullptr && options.host_weight_cache == nullptr) {
      return InvalidArgumentError("engine options: a split model (device_layers " +
                                  std::to_string(options.device_layers) +
                                  ") needs host_weight_cache with its host part "
                                  "(HostWeightModelFor)");
    }
    if (options.weight_cache == nullptr && first > 0) {
      const engine_internal::SplitBuffers parts = engine_internal::SplitBuffersOf(*layout, first);
      ARBITER_ASSIGN_OR_RETURN(weights, MakePrivateWeights(*files, options.device, parts.device));
      ARBITER_ASSIGN_OR_RETURN(engine_internal::WeightSource host,
                               MakePrivateWeights(*files, "cpu", parts.host));
      weights.owned_host_device = std::move(host.owned_device);
      weights.owned_host_cache = std::move(host.owned_cache);
      weights.host_cache = weights.owned_host_cache.get();
      weights.host_key = host.key;  // the private key, in its own cache
    } else if (options.weight_cache == nullptr) {
      ARBITER_ASSIGN_OR_RETURN(weights,
                               MakePrivateWeights(*files, all_cpu ? "cpu" : options.device));
    } else {
      weights.cache = options.weight_cache;
      weights.key = options.weight_key;
      if (first > 0) {
        weights.host_cache = options.host_weight_cache;
        weights.host_key = options.host_weight_key;
      }
    }
    ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<engine_internal::DecoderCompute> compute,
                             engine_internal::MakeDecoderCompute(spec));
    {
      // Resident now; a conversion error surfaces here, and weights the
      // device cannot read. Released at once: requests take their own leases.
      ARBITER_ASSIGN_OR_RETURN(WeightLease lease, weights.cache->Acquire(weights.key));
      if (first > 0) {
        ARBITER_ASSIGN_OR_RETURN(WeightLease host, weights.host_cache->Acquire(weights.host_key));
        ARBITER_RETURN_IF_ERROR(compute->BindWeights(lease, host, weights.key).status());
      } else {
        ARBITER_RETURN_IF_ERROR(compute->BindWeights(lease, weights.key).status());
      }
    }
    if (options.weight_cache != nullptr && first == 0) {
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
    // Every slot's KV cache and scratch, from the model's device.
    std::vector<std::unique_ptr<engine_internal::ComputeSlot>> slots;
    for (int i = 0; i < options.n_slots; ++i) {
      Result<std::unique_ptr<engine_internal::ComputeSlot>> slot = compute->CreateSlot();
      if (!slot.ok()) {
        return slot.status().WithPrefix(model_dir + " (n_ctx " + std::to_string(options.n_ctx) +
                                        ", n_slots " + std::to_string(options.n_slots) + ")");
      }
      slots.push_back(std::move(slot).value());
    }
    return std::unique_ptr<Engine>(std::make_unique<engine_internal::EngineImpl>(
        std::move(files), std::move(compute), std::move(slots), std::move(weights), options,
        spec.n_ctx));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(model_dir + ": out of memory allocating weights or KV cache (n_ctx " +
                                  std::to_string(options.n_ctx) + ", n_slots " +
                                  std::to_string(options.n_slots) + ")");
  }
}

}  // namespace arbiter
