// The KV precache of one text model (arbiter/kv/precache.h).
//
// Slots: the engine chooses and waits (Engine::ReserveSlot; Note [Slot
// choice] and Note [Slot waits] in src/engine/engine.cc). A request
// reserves its slot — pinned to its conversation's, or, anonymous, the one
// the engine picks by longest prefix — and holds that SlotReservation
// through every step: the stash of the previous owner (SaveSlot), the
// restore of its conversation (RestoreSlot) and the generation (Generate),
// none of which waits again. Ownership is KV policy and stays here: slots_
// says which conversation's KV each slot holds and with which TTL class;
// the engine gets only the bit its tie-break needs
// (SlotReservation::set_owned: prefer a slot nobody owns, nothing to stash).
//
// Locking: mu_ guards the owner table, the per-conversation state and the
// counters. Ownership of a slot changes only while a reservation of it is
// held. Engine calls and file IO never run under mu_, except Slots(), which
// calls Engine::Slots (a short lock of the engine's own): the lock order is
// KvPrecache::mu_ → the engine's mutex, and the engine never calls back.
#include "arbiter/kv/precache.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <spdlog/spdlog.h>

#include "arbiter/base/log_safe.h"

namespace arbiter {
namespace {

size_t CommonPrefix(const int32_t* a, size_t a_size, const std::vector<int32_t>& b) {
  const size_t n = std::min(a_size, b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}
size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return CommonPrefix(a.data(), a.size(), b);
}

// A reservation of `slot` that waits as long as it takes (the precache's
// own maintenance: persisting, detaching). Errors: kInvalidArgument for a
// slot the engine does not have.
Result<SlotReservation> HoldSlot(Engine* engine, int slot) {
  return engine->ReserveSlot(SlotRequest{.slot = slot}, kNoDeadline, nullptr);
}

}  // namespace

std::string_view KvSourceName(KvSource source) {
  switch (source) {
    case KvSource::kNone: return "none";
    case KvSource::kSlot: return "slot";
    case KvSource::kPromptCache: return "prompt_cache";
    case KvSource::kDisk: return "disk";
  }
  return "none";
}

KvPrecache::KvPrecache(KvPrecacheOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      registry_(clock_),
      n_slots_(std::max(1, options_.n_slots)) {
  MutexLock l(&mu_);
  slots_.resize(static_cast<size_t>(n_slots_));
}

KvPrecache::~KvPrecache() = default;

void KvPrecache::AttachLocked(Engine* engine) {
  if (engine_ == engine) return;
  // A new engine instance: its slots are empty, whatever the old table said
  // (the old engine persisted its owned slots in DetachEngine).
  engine_ = engine;
  for (SlotEntry& s : slots_) {
    s.owner.clear();
    s.owner_ttl = TtlClass::kShort;
  }
}

void KvPrecache::AttachEngine(Engine* engine) {
  MutexLock l(&mu_);
  AttachLocked(engine);
}

void KvPrecache::DetachEngine(Engine* engine) {
  {
    MutexLock l(&mu_);
    if (engine_ != engine || engine == nullptr) return;
  }
  // Hold every slot: running requests finish first. Reserved in index
  // order, one at a time; no request holds one slot while waiting for
  // another, so this cannot deadlock.
  const int n = std::min(n_slots_, engine->n_slots());
  std::vector<SlotReservation> held;
  for (int i = 0; i < n; ++i) {
    Result<SlotReservation> r = HoldSlot(engine, i);
    if (r.ok()) held.push_back(std::move(*r));
  }
  std::vector<std::pair<const SlotReservation*, std::pair<std::string, TtlClass>>> owned;
  {
    MutexLock l(&mu_);
    for (const SlotReservation& r : held) {
      const SlotEntry& s = slots_[r.slot()];
      if (!s.owner.empty()) owned.push_back({&r, {s.owner, s.owner_ttl}});
    }
  }
  for (const auto& [r, who] : owned) PersistSlot(engine, *r, who.first, who.second);
  {
    MutexLock l(&mu_);
    for (SlotEntry& s : slots_) s.owner.clear();
    engine_ = nullptr;
  }
  // `held` is released here, before the caller destroys the engine.
}

bool KvPrecache::PersistSnapshot(const std::string& conversation, TtlClass ttl,
                                 const KvSnapshot& snapshot) {
  if (options_.store == nullptr || snapshot.n_tokens() == 0) return false;
  Result<uint64_t> written = options_.store->Save(conversation, ttl, snapshot);
  if (!written.ok()) {
    spdlog::warn("kv: model \"{}\": could not save conversation \"{}\": {}",
                 LogSafe(options_.model_key), LogSafe(conversation),
                 LogSafe(written.status().message(), kLogSafeMessageBytes));
    return false;
  }
  MutexLock l(&mu_);
  ++counters_.persisted;
  return true;
}

bool KvPrecache::PersistSlot(Engine* engine, const SlotReservation& slot,
                             const std::string& conversation, TtlClass ttl) {
  if (options_.store == nullptr) return false;
  // Written from the slot's rows in place: no snapshot copy.
  bool empty = false;
  Status st = engine->VisitSlot(slot, [&](const KvRowsView& rows) -> Status {
    empty = rows.n_tokens == 0;
    if (empty) return OkStatus();
    return options_.store->Save(conversation, ttl, options_.model_hash, rows).status();
  });
  if (!st.ok()) {
    spdlog::warn("kv: model \"{}\": could not save conversation \"{}\" from slot {}: {}",
                 LogSafe(options_.model_key), LogSafe(conversation), slot.slot(),
                 LogSafe(st.message(), kLogSafeMessageBytes));
    return false;
  }
  if (empty) return false;
  MutexLock l(&mu_);
  ++counters_.persisted;
  return true;
}

void KvPrecache::PrepareSlot(Engine* engine, SlotReservation& slot,
                             const std::string& conversation, const std::vector<int32_t>& prompt,
                             KvOutcome* outcome) {
  std::string owner;
  TtlClass owner_ttl = TtlClass::kShort;
  {
    MutexLock l(&mu_);
    owner = slots_[slot.slot()].owner;
    owner_ttl = slots_[slot.slot()].owner_ttl;
  }
  const std::vector<int32_t>& held = slot.tokens();
  const size_t slot_lcp = CommonPrefix(held, prompt);
  outcome->source = slot_lcp > 0 ? KvSource::kSlot : KvSource::kNone;

  // 1. Another conversation's KV leaves the slot for the host tier (or disk).
  if (!owner.empty() && owner != conversation && !held.empty()) {
    Result<KvSnapshot> snap = engine->SaveSlot(slot);
    if (snap.ok()) {
      snap->model_hash = options_.model_hash;
      if (options_.prompt_cache != nullptr) {
        // What does not fit is handed to the spill callback (disk).
        options_.prompt_cache->Put(options_.model_key, owner, owner_ttl, std::move(*snap));
      } else {
        PersistSnapshot(owner, owner_ttl, *snap);
      }
      outcome->stashed = true;
      MutexLock l(&mu_);
      ++counters_.stashes;
    } else {
      spdlog::warn("kv: model \"{}\": could not move conversation \"{}\" out of slot {}: {}",
                   LogSafe(options_.model_key), LogSafe(owner), slot.slot(),
                   LogSafe(snap.status().message(), kLogSafeMessageBytes));
    }
    slot.set_owned(false);
    MutexLock l(&mu_);
    slots_[slot.slot()].owner.clear();
  }
  if (conversation.empty() || owner == conversation) return;

  // 2. The conversation's own state, only when it is warmer than the slot's
  //    (docs/kv-precache.md "Defects of the reference, fixed": restore only
  //    when colder): the host tier first; disk only when it has no RAM
  //    state.
  //    A file is mapped and restored in place (one copy: file → slot).
  std::optional<KvSnapshot> snap;
  std::optional<MappedKvFile> file;
  KvSource from = KvSource::kNone;
  if (options_.prompt_cache != nullptr) {
    snap = options_.prompt_cache->Take(options_.model_key, conversation);
    if (snap) from = KvSource::kPromptCache;
  }
  if (!snap && options_.store != nullptr) {
    Result<KvMappedLoadResult> loaded =
        options_.store->LoadMapped(options_.model_hash, conversation, engine->kv_type());
    if (loaded.ok()) {
      file = std::move(loaded->file);
      from = KvSource::kDisk;
    } else if (loaded.status().code() != StatusCode::kNotFound) {
      outcome->warning = fmt::format(
          "saved KV of conversation \"{}\" was not usable, the prompt is prefilled cold: {}",
          conversation, loaded.status().message());
      spdlog::warn("kv: model \"{}\": {}", LogSafe(options_.model_key),
                   LogSafe(outcome->warning, kLogSafeMessageBytes));
      MutexLock l(&mu_);
      ++counters_.restore_failures;
    }
  }
  if (!snap && !file) return;
  const KvSnapshotView view = snap ? snap->View() : file->view();
  if (CommonPrefix(view.tokens, view.n_tokens, prompt) <= slot_lcp) return;
  Result<int> restored = engine->RestoreSlot(slot, view);
  if (!restored.ok()) {
    outcome->warning = fmt::format("saved KV of conversation \"{}\" could not be restored ({}); "
                                   "the prompt is prefilled cold",
                                   conversation, restored.status().message());
    spdlog::warn("kv: model \"{}\": {}", LogSafe(options_.model_key),
                 LogSafe(outcome->warning, kLogSafeMessageBytes));
    MutexLock l(&mu_);
    ++counters_.restore_failures;
    return;
  }
  outcome->source = from;
  outcome->restored_tokens = *restored;
  MutexLock l(&mu_);
  if (from == KvSource::kPromptCache) ++counters_.prompt_cache_hits;
  if (from == KvSource::kDisk) ++counters_.disk_hits;
}

void KvPrecache::Touch(const std::string& conversation, std::optional<TtlClass> ttl, bool use) {
  MutexLock l(&mu_);
  ConversationState& c = conversations_[conversation];
  c.touched_ms = clock_->NowMs();
  if (use) c.used_ms = c.touched_ms;
  if (ttl) c.ttl = *ttl;
}

Result<GenerationResult> KvPrecache::Generate(Engine* engine, std::string_view conversation_id,
                                              TtlClass ttl, GenerationRequest request,
                                              const TextCallback& on_text,
                                              const Cancellation& cancelled, KvOutcome* outcome,
                                              std::chrono::steady_clock::time_point deadline) {
  return Run(engine, conversation_id, ttl, std::move(request), on_text, cancelled, outcome,
             /*use=*/true, deadline);
}

Result<GenerationResult> KvPrecache::Run(Engine* engine, std::string_view conversation_id,
                                         TtlClass ttl, GenerationRequest request,
                                         const TextCallback& on_text,
                                         const Cancellation& cancelled, KvOutcome* outcome,
                                         bool use, std::chrono::steady_clock::time_point deadline) {
  KvOutcome local;
  KvOutcome* out = outcome != nullptr ? outcome : &local;
  *out = KvOutcome{};
  const std::string conversation(conversation_id);
  int pinned = -1;
  if (!conversation.empty()) {
    ARBITER_ASSIGN_OR_RETURN(
        ConversationHandle h,
        registry_.Open(options_.model_key, conversation, n_slots_,
                       options_.conversation_ttl_ms));
    pinned = h.slot_id;
    Touch(conversation, ttl, use);
  }
  {
    MutexLock l(&mu_);
    AttachLocked(engine);
  }
  if (pinned >= engine->n_slots()) {
    return FailedPreconditionError("kv: model \"" + options_.model_key + "\": conversation slot " +
                                   std::to_string(pinned) + " but the engine has " +
                                   std::to_string(engine->n_slots()) +
                                   " slots; the precache's n_slots must equal [[models]] parallel");
  }
  // The engine chooses the slot (pinned: the conversation's) and waits for
  // it (Note [Slot choice], Note [Slot waits] in src/engine/engine.cc).
  Result<SlotReservation> reserved = engine->ReserveSlot(
      SlotRequest{.slot = pinned, .prompt = request.prompt_ids}, deadline, cancelled);
  if (!reserved.ok()) {
    if (reserved.status().code() != StatusCode::kCancelled) return reserved.status();
    GenerationResult r;
    r.prompt_tokens = static_cast<int>(request.prompt_ids.size());
    r.finish_reason = FinishReason::kCancelled;
    return r;
  }
  SlotReservation& slot = *reserved;
  out->slot = slot.slot();
  PrepareSlot(engine, slot, conversation, request.prompt_ids, out);
  request.slot = -1;  // runs within the reservation
  Result<GenerationResult> result = engine->Generate(slot, request, on_text, cancelled);
  {
    // The conversation (none: an anonymous prefix) owns the slot from now on.
    MutexLock l(&mu_);
    slots_[slot.slot()].owner = conversation;
    slots_[slot.slot()].owner_ttl = ttl;
  }
  slot.set_owned(!conversation.empty());
  slot.Release();
  if (result.ok()) {
    if (result->cached_tokens == 0) out->source = KvSource::kNone;
    MutexLock l(&mu_);
    ++counters_.requests;
    counters_.prompt_tokens += static_cast<uint64_t>(result->prompt_tokens);
    counters_.cached_tokens += static_cast<uint64_t>(result->cached_tokens);
    counters_.copied_tokens += static_cast<uint64_t>(result->copied_tokens);
    if (out->source == KvSource::kSlot) ++counters_.slot_hits;
  }
  return result;
}

Result<GenerationResult> KvPrecache::Prewarm(Engine* engine, std::string_view conversation_id,
                                             std::vector<int32_t> prefix_ids, TtlClass ttl,
                                             const Cancellation& cancelled) {
  return PrewarmImpl(engine, conversation_id, std::move(prefix_ids), ttl, cancelled, /*use=*/true);
}

Result<GenerationResult> KvPrecache::PrewarmImpl(Engine* engine, std::string_view conversation_id,
                                                 std::vector<int32_t> prefix_ids, TtlClass ttl,
                                                 const Cancellation& cancelled, bool use) {
  if (conversation_id.empty()) return InvalidArgumentError("prewarm: the conversation id is empty");
  if (prefix_ids.empty()) return InvalidArgumentError("prewarm: the prefix is empty");
  GenerationRequest req;
  req.prompt_ids = prefix_ids;
  req.max_tokens = 1;
  req.sampling.temperature = 0.0f;
  req.ignore_eos = true;
  Result<GenerationResult> r =
      Run(engine, conversation_id, ttl, std::move(req), nullptr, cancelled, nullptr, use,
          kNoDeadline);
  MutexLock l(&mu_);
  if (!r.ok() || r->finish_reason == FinishReason::kCancelled) {
    ++counters_.prewarm_failures;
    return r;
  }
  ++counters_.prewarms;
  ConversationState& c = conversations_[std::string(conversation_id)];
  c.prewarm_prefix = std::move(prefix_ids);
  c.touched_ms = clock_->NowMs();
  if (use) c.used_ms = c.touched_ms;
  return r;
}

int KvPrecache::KeepAlive(Engine* engine) {
  const int64_t stale_ms = static_cast<int64_t>(kKeepAliveStaleFraction *
                                                static_cast<double>(TtlMs(TtlClass::kShort,
                                                                          options_.ttl)));
  struct Due {
    std::string conversation;
    std::vector<int32_t> prefix;
    TtlClass ttl;
  };
  std::vector<Due> due;
  {
    MutexLock l(&mu_);
    const int64_t now = clock_->NowMs();
    for (const auto& [id, c] : conversations_) {
      // A conversation nobody used for conversation_ttl is left to close.
      if (!c.prewarm_prefix.empty() && now - c.touched_ms >= stale_ms &&
          (id == kSystemPrefixConversation || now - c.used_ms <= options_.conversation_ttl_ms)) {
        due.push_back({id, c.prewarm_prefix, c.ttl});
      }
    }
  }
  int rewarmed = 0;
  for (Due& d : due) {
    std::optional<ConversationHandle> h = registry_.Get(options_.model_key, d.conversation);
    bool slot_is_ours = false;
    if (h && engine != nullptr) {
      // Busy is the engine's (a snapshot: the re-warm waits if it changed).
      const std::vector<SlotInfo> info = engine->Slots();
      const bool busy =
          h->slot_id < static_cast<int>(info.size()) && info[h->slot_id].busy;
      MutexLock l(&mu_);
      const SlotEntry& s = slots_[h->slot_id];
      slot_is_ours = !busy && (s.owner.empty() || s.owner == d.conversation);
    }
    if (slot_is_ours) {
      Result<GenerationResult> r =
          PrewarmImpl(engine, d.conversation, d.prefix, d.ttl, nullptr, /*use=*/false);
      if (r.ok()) {
        ++rewarmed;
        MutexLock l(&mu_);
        ++counters_.keepalive_rewarms;
        continue;
      }
      spdlog::warn("kv: model \"{}\": keep-alive of conversation \"{}\" failed: {}",
                   LogSafe(options_.model_key), LogSafe(d.conversation),
                   LogSafe(r.status().message(), kLogSafeMessageBytes));
    }
    // Parked elsewhere (host tier, disk) or the slot is taken: refresh the
    // TTLs of what is saved instead of pulling it back.
    if (options_.prompt_cache != nullptr) {
      if (std::optional<KvSnapshot> snap =
              options_.prompt_cache->Take(options_.model_key, d.conversation)) {
        options_.prompt_cache->Put(options_.model_key, d.conversation, d.ttl, std::move(*snap));
      }
    }
    if (options_.store != nullptr) options_.store->Touch(options_.model_hash, d.conversation);
    Touch(d.conversation, std::nullopt, /*use=*/false);
  }
  return rewarmed;
}

bool KvPrecache::PersistAndForget(Engine* engine, const std::string& conversation,
                                  std::optional<TtlClass> ttl) {
  TtlClass cls = TtlClass::kShort;
  int owned_slot = -1;
  {
    MutexLock l(&mu_);
    auto it = conversations_.find(conversation);
    if (it != conversations_.end()) cls = it->second.ttl;
    if (ttl) cls = *ttl;
    if (engine != nullptr && engine_ == engine) {
      for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].owner == conversation) owned_slot = static_cast<int>(i);
      }
    }
  }
  bool had_state = false;
  Result<SlotReservation> slot =
      owned_slot >= 0 ? HoldSlot(engine, owned_slot) : Result<SlotReservation>(SlotReservation());
  if (slot.ok() && slot->held()) {
    bool still_ours = false;
    {
      MutexLock l(&mu_);
      still_ours = slots_[owned_slot].owner == conversation;
    }
    if (still_ours) {
      had_state = true;
      PersistSlot(engine, *slot, conversation, cls);
      // The slot keeps its tokens (an anonymous cached prefix from now on).
      slot->set_owned(false);
      MutexLock l(&mu_);
      slots_[owned_slot].owner.clear();
    }
    slot->Release();
  }
  if (options_.prompt_cache != nullptr) {
    if (std::optional<KvSnapshot> snap =
            options_.prompt_cache->Take(options_.model_key, conversation)) {
      had_state = true;
      PersistSnapshot(conversation, cls, *snap);
    }
  }
  MutexLock l(&mu_);
  conversations_.erase(conversation);
  return had_state;
}

bool KvPrecache::Close(Engine* engine, std::string_view conversation_id) {
  const std::string conversation(conversation_id);
  const bool was_open = registry_.Close(options_.model_key, conversation);
  const bool had_state = PersistAndForget(engine, conversation, std::nullopt);
  return was_open || had_state;
}

std::vector<std::string> KvPrecache::EvictIdle(Engine* engine) {
  std::vector<std::string> ids;
  for (const ConversationHandle& h : registry_.EvictIdle()) ids.push_back(h.conversation_id);
  // Keep-alive re-warms touch the registry too; idleness counts real use
  // (requests, explicit prewarms) only. The system prefix stays.
  {
    MutexLock l(&mu_);
    const int64_t now = clock_->NowMs();
    for (const auto& [id, c] : conversations_) {
      if (id != kSystemPrefixConversation && now - c.used_ms > options_.conversation_ttl_ms &&
          std::find(ids.begin(), ids.end(), id) == ids.end()) {
        ids.push_back(id);
      }
    }
  }
  for (const std::string& id : ids) {
    registry_.Close(options_.model_key, id);
    PersistAndForget(engine, id, TtlClass::kLong);
  }
  return ids;
}

void KvPrecache::Shutdown(Engine* engine) {
  DetachEngine(engine);
  if (options_.prompt_cache != nullptr) options_.prompt_cache->SpillModel(options_.model_key);
}

std::vector<KvSlotView> KvPrecache::Slots() const {
  MutexLock l(&mu_);
  std::vector<SlotInfo> info;
  if (engine_ != nullptr) info = engine_->Slots();
  std::vector<KvSlotView> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    KvSlotView v;
    v.index = static_cast<int>(i);
    v.conversation_id = slots_[i].owner;
    v.busy = i < info.size() && info[i].busy;
    v.n_tokens = i < info.size() ? info[i].n_tokens : 0;
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<KvPrewarmView> KvPrecache::Prewarmed() const {
  MutexLock l(&mu_);
  std::vector<KvPrewarmView> out;
  const int64_t now = clock_->NowMs();
  for (const auto& [id, c] : conversations_) {
    if (c.prewarm_prefix.empty()) continue;
    out.push_back({id, static_cast<int>(c.prewarm_prefix.size()), now - c.touched_ms});
  }
  return out;
}

KvPrecacheCounters KvPrecache::counters() const {
  MutexLock l(&mu_);
  return counters_;
}

}  // namespace arbiter
