// bench/kv_bench.cc — `arbiter bench kv`: see kv_bench.h for the scenarios,
// their ideals and limits, and the method.
//
// Every case that goes through the precache starts from a clean state
// (Fresh(): every slot cleared, a new PromptCache, a new KvPrecache attached
// to the one engine), so no slot, host entry or file can lend a prefix that
// the case did not put there itself; conversation ids are unique per
// repetition and their files are removed after use. The prefix's KV is
// computed once (a 1-token Generate) and saved; cases that only need "the
// prefix is on the conversation's slot" restore it from that snapshot
// instead of recomputing 2000 tokens, then Prewarm (which computes the one
// token every request computes). Every run is checked against what the
// case set up (tokens cached / restored / copied / computed, the tier the
// outcome names): a benchmark that silently measured a cold prefill as a
// restore would be worse than none.
#include "bench/kv_bench.h"

#include <cblas.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "arbiter/engine/engine.h"
#include "arbiter/kv/cache_key.h"
#include "arbiter/kv/kv_file.h"
#include "arbiter/kv/kv_store.h"
#include "arbiter/kv/precache.h"
#include "arbiter/kv/prompt_cache.h"
#include "bench/memory_bandwidth.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModelKey = "bench";
constexpr int kMaxDisplacers = 64;  // prompt_cache case: tries to land on the slot
constexpr int kCtxSlack = 8;        // n_ctx beyond the longest shape

// `n` pseudo-random ids in [0, vocab) from `seed`; the first one is
// seed mod vocab, so sequences from consecutive seeds differ at position 0.
std::vector<int32_t> Ids(int n, uint64_t seed, int vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  if (n > 0) ids[0] = static_cast<int32_t>(seed % static_cast<uint64_t>(vocab));
  return ids;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int max_tokens, int slot = -1) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.slot = slot;
  return r;
}

// kInternal naming the case, what was set up and what happened.
Status Unexpected(std::string_view what, const GenerationResult& g, const KvOutcome* o,
                  std::string_view expected) {
  return InternalError(fmt::format(
      "kv bench: {}: expected {}; got prompt {} cached {} copied {} computed {}{}", what, expected,
      g.prompt_tokens, g.cached_tokens, g.copied_tokens, g.timings.prefill_tokens,
      o != nullptr ? fmt::format(", slot {} source {} restored {} stashed {}{}", o->slot,
                                 KvSourceName(o->source), o->restored_tokens, o->stashed,
                                 o->warning.empty() ? "" : " warning: " + o->warning)
                   : std::string()));
}

// One timed request of the TTFT scenario.
struct TtftSample {
  double ttft_ms = 0;
  double prefill_ms = 0;
  GenerationResult g;
  KvOutcome outcome;
  double prewarm_ms = 0;
  int prewarm_computed = 0;
};

// A PromptCache and a KvPrecache over it; the precache goes first.
struct Tiers {
  std::unique_ptr<PromptCache> prompt_cache;
  std::unique_ptr<KvPrecache> precache;
  void Reset() {
    precache.reset();
    prompt_cache.reset();
  }
};

class KvBench {
 public:
  explicit KvBench(const KvBenchOptions& o) : o_(o) {}
  ~KvBench() {
    tiers_.Reset();
    store_.reset();
    if (!tmp_dir_.empty()) {
      std::error_code ec;
      fs::remove_all(tmp_dir_, ec);
    }
  }

  Status Setup(KvBenchResult* r);
  Status RunTtft(KvBenchResult* r);
  Status RunSaveRestore(KvBenchResult* r);
  Status RunSharedPrefix(KvBenchResult* r);
  Status RunQa(KvBenchResult* r);

 private:
  // Every slot emptied, a new PromptCache of `capacity` bytes spilling to
  // the store, a new KvPrecache attached to the engine.
  Status Fresh(uint64_t capacity);
  Result<GenerationResult> Run(const std::string& conversation, std::vector<int32_t> prompt,
                               int max_tokens, KvOutcome* outcome, double* wall_ms);
  std::vector<int32_t> Turn(int rep) const {
    return Ids(o_.turn_tokens, 20000 + static_cast<uint64_t>(rep), vocab_);
  }

  Result<TtftSample> Ideal(int rep);
  Result<TtftSample> Cold(int rep);
  Result<TtftSample> Prewarmed(int rep);
  Result<TtftSample> FromPromptCache(int rep);
  Result<TtftSample> FromDisk(int rep);
  // The prefix restored into slot 0 and prewarmed for `conversation` (which
  // a fresh precache's registry puts on slot 0).
  Status PrefixOnSlot0(const std::string& conversation);

  const KvBenchOptions o_;
  std::string tmp_dir_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<Engine> engine_;
  std::string hash_;
  int vocab_ = 0;
  std::vector<int32_t> prefix_;
  KvSnapshot prefix_snapshot_;
  Tiers tiers_;
  std::atomic<int> spill_failures_{0};
};

Status KvBench::Setup(KvBenchResult* r) {
  const std::string base = !o_.work_dir.empty()
                               ? o_.work_dir
                               : (getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp");
  std::string tmpl = base + "/arbiter-kv-bench-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return UnavailableError(
        fmt::format("kv bench: cannot make a temp dir under {}: {}", base, std::strerror(errno)));
  }
  tmp_dir_ = tmpl;
  KvStoreOptions so;
  so.dir = tmp_dir_ + "/kv";
  ARBITER_ASSIGN_OR_RETURN(store_, KvStore::Open(so));
  r->kv_dir = so.dir;

  // The longest shape of the scenarios run decides n_ctx (a prompt must fit
  // n_ctx − 1; the fed tokens are prompt + output − 1). The prefix is always
  // computed (Setup).
  const auto runs = [this](const char* scenario) { return o_.only.empty() || o_.only == scenario; };
  int need = o_.prefix_tokens + o_.turn_tokens + 1;
  std::string shape = fmt::format("prefix {} + turn {} + 1", o_.prefix_tokens, o_.turn_tokens);
  for (int p : runs("shared_prefix") ? o_.shared_prefix_tokens : std::vector<int>{}) {
    const int n = p + o_.shared_suffix_max + o_.shared_output_max + 1;
    if (n > need) {
      need = n;
      shape = fmt::format("shared prefix {} + suffix {} + output {} + 1", p, o_.shared_suffix_max,
                          o_.shared_output_max);
    }
  }
  const int qa = o_.qa_context_tokens + o_.qa_rounds * (o_.turn_tokens + o_.qa_answer_tokens) + 1;
  if (runs("qa") && qa > need) {
    need = qa;
    shape = fmt::format("QA context {} + {} rounds × (question {} + answer {}) + 1",
                        o_.qa_context_tokens, o_.qa_rounds, o_.turn_tokens, o_.qa_answer_tokens);
  }
  if (o_.threads > 0) openblas_set_num_threads(o_.threads);
  r->threads = o_.threads > 0 ? o_.threads : openblas_get_num_threads();
  EngineOptions eo;
  eo.n_slots = o_.n_slots;
  eo.n_ctx = need + kCtxSlack;
  eo.n_threads = o_.threads;
  eo.kv_type = o_.kv_type;
  eo.device = o_.device;
  r->device = o_.device;
  ARBITER_ASSIGN_OR_RETURN(engine_, Engine::Load(o_.model_dir, eo));
  if (engine_->n_ctx() < need) {
    return InvalidArgumentError(fmt::format(
        "kv bench: the model's context ({} tokens) is shorter than the longest shape ({} "
        "tokens: {}); use shorter shapes or a model with a longer context",
        engine_->n_ctx(), need, shape));
  }
  // The model hash the server would use (server/kv_service.cc KvModelHash).
  ARBITER_ASSIGN_OR_RETURN(WeightModel wm, Engine::WeightModelFor(o_.model_dir, "kv", eo));
  ModelHashInputs in;
  in.target = fmt::format("{:016x}", wm.digest);
  in.cache_type_k = "f32";
  in.cache_type_v = "f32";
  in.extra = "arbiter-kv-v1";
  hash_ = ModelHash(in);
  vocab_ = engine_->config().vocab_size;

  r->model_hash = hash_;
  r->n_ctx = engine_->n_ctx();

  // Warm-up on every slot (code paths, the BLAS thread pool), then the
  // prefix's KV, computed once.
  for (int s = 0; s < o_.n_slots; ++s) {
    ARBITER_RETURN_IF_ERROR(
        engine_->Generate(Greedy(Ids(16, 1, vocab_), 2, s), nullptr, nullptr).status());
  }
  prefix_ = Ids(o_.prefix_tokens, 10000, vocab_);
  ARBITER_RETURN_IF_ERROR(engine_->ClearSlot(0, nullptr));
  ARBITER_ASSIGN_OR_RETURN(GenerationResult g,
                           engine_->Generate(Greedy(prefix_, 1, 0), nullptr, nullptr));
  if (g.cached_tokens != 0) return Unexpected("prefix", g, nullptr, "cached 0");
  ARBITER_ASSIGN_OR_RETURN(prefix_snapshot_, engine_->SaveSlot(0, nullptr));
  if (prefix_snapshot_.tokens != prefix_) {
    return InternalError(
        fmt::format("kv bench: slot 0 holds {} tokens after the prefix, not the "
                    "{} of the prefix",
                    prefix_snapshot_.n_tokens(), prefix_.size()));
  }
  r->n_layers = static_cast<int>(prefix_snapshot_.n_layers);
  r->kv_dim = static_cast<int>(prefix_snapshot_.kv_dim);
  r->kv_type = std::string(KvTypeName(prefix_snapshot_.kv_type));
  r->kv_bytes_per_token = 2.0 * r->n_layers * static_cast<double>(prefix_snapshot_.row_bytes());
  return OkStatus();
}

Status KvBench::Fresh(uint64_t capacity) {
  tiers_.Reset();  // the precache first, then the prompt cache
  for (int s = 0; s < o_.n_slots; ++s) ARBITER_RETURN_IF_ERROR(engine_->ClearSlot(s, nullptr));
  PromptCacheOptions po;
  po.capacity_bytes = capacity;
  KvStore* store = store_.get();
  std::atomic<int>* failures = &spill_failures_;
  po.spill = [store, failures](const std::string&, const std::string& conversation, TtlClass ttl,
                               KvSnapshot snapshot) {
    if (!store->Save(conversation, ttl, snapshot).ok()) failures->fetch_add(1);
  };
  tiers_.prompt_cache = std::make_unique<PromptCache>(std::move(po));
  KvPrecacheOptions ko;
  ko.model_key = kModelKey;
  ko.model_hash = hash_;
  ko.n_slots = o_.n_slots;
  ko.store = store_.get();
  ko.prompt_cache = tiers_.prompt_cache.get();
  tiers_.precache = std::make_unique<KvPrecache>(std::move(ko));
  tiers_.precache->AttachEngine(engine_.get());
  return OkStatus();
}

Result<GenerationResult> KvBench::Run(const std::string& conversation, std::vector<int32_t> prompt,
                                      int max_tokens, KvOutcome* outcome, double* wall_ms) {
  const double t0 = NowSeconds();
  Result<GenerationResult> g =
      tiers_.precache->Generate(engine_.get(), conversation, TtlClass::kShort,
                                Greedy(std::move(prompt), max_tokens), nullptr, nullptr, outcome);
  if (wall_ms != nullptr) *wall_ms = MsSince(t0);
  return g;
}

// ---- TTFT ---------------------------------------------------------------------

Result<TtftSample> KvBench::Ideal(int rep) {
  tiers_.Reset();
  for (int s = 0; s < o_.n_slots; ++s) ARBITER_RETURN_IF_ERROR(engine_->ClearSlot(s, nullptr));
  ARBITER_RETURN_IF_ERROR(engine_->RestoreSlot(0, prefix_snapshot_, nullptr).status());
  TtftSample t;
  const GenerationRequest req = Greedy(Concat(prefix_, Turn(rep)), 1, 0);
  const double t0 = NowSeconds();
  ARBITER_ASSIGN_OR_RETURN(t.g, engine_->Generate(req, nullptr, nullptr));
  t.ttft_ms = MsSince(t0);
  t.prefill_ms = t.g.timings.prefill_ms;
  if (t.g.cached_tokens != o_.prefix_tokens || t.g.copied_tokens != 0) {
    return Unexpected("ideal", t.g, nullptr, fmt::format("cached {}, copied 0", o_.prefix_tokens));
  }
  return t;
}

Result<TtftSample> KvBench::Cold(int rep) {
  ARBITER_RETURN_IF_ERROR(Fresh(uint64_t{1} << 40));
  TtftSample t;
  ARBITER_ASSIGN_OR_RETURN(
      t.g, Run(fmt::format("cold-{}", rep), Concat(prefix_, Turn(rep)), 1, &t.outcome, &t.ttft_ms));
  t.prefill_ms = t.g.timings.prefill_ms;
  if (t.g.cached_tokens != 0 || t.outcome.source != KvSource::kNone) {
    return Unexpected("cold", t.g, &t.outcome, "cached 0, source none");
  }
  return t;
}

Result<TtftSample> KvBench::Prewarmed(int rep) {
  ARBITER_RETURN_IF_ERROR(Fresh(uint64_t{1} << 40));
  const std::string conversation = fmt::format("prewarm-{}", rep);
  TtftSample t;
  const double t0 = NowSeconds();
  ARBITER_ASSIGN_OR_RETURN(
      GenerationResult w,
      tiers_.precache->Prewarm(engine_.get(), conversation, prefix_, TtlClass::kShort, nullptr));
  t.prewarm_ms = MsSince(t0);
  t.prewarm_computed = w.timings.prefill_tokens;
  if (w.cached_tokens != 0) return Unexpected("prewarm (the Prewarm call)", w, nullptr, "cached 0");
  ARBITER_ASSIGN_OR_RETURN(
      t.g, Run(conversation, Concat(prefix_, Turn(rep)), 1, &t.outcome, &t.ttft_ms));
  t.prefill_ms = t.g.timings.prefill_ms;
  if (t.g.cached_tokens != o_.prefix_tokens || t.g.copied_tokens != 0 ||
      t.outcome.source != KvSource::kSlot || t.outcome.restored_tokens != 0) {
    return Unexpected("prewarm", t.g, &t.outcome,
                      fmt::format("cached {}, copied 0, source slot", o_.prefix_tokens));
  }
  return t;
}

Status KvBench::PrefixOnSlot0(const std::string& conversation) {
  ARBITER_RETURN_IF_ERROR(engine_->RestoreSlot(0, prefix_snapshot_, nullptr).status());
  ARBITER_ASSIGN_OR_RETURN(
      GenerationResult w,
      tiers_.precache->Prewarm(engine_.get(), conversation, prefix_, TtlClass::kShort, nullptr));
  const std::vector<KvSlotView> slots = tiers_.precache->Slots();
  if (w.cached_tokens != o_.prefix_tokens - 1 || slots.empty() ||
      slots[0].conversation_id != conversation) {
    return InternalError(fmt::format(
        "kv bench: prewarm of \"{}\" over the restored prefix: expected slot 0 and {} cached "
        "tokens; got {} cached, slot 0 owned by \"{}\"",
        conversation, o_.prefix_tokens - 1, w.cached_tokens,
        slots.empty() ? "" : slots[0].conversation_id));
  }
  return OkStatus();
}

Result<TtftSample> KvBench::FromPromptCache(int rep) {
  ARBITER_RETURN_IF_ERROR(Fresh(uint64_t{1} << 40));
  const std::string conversation = fmt::format("host-{}", rep);
  ARBITER_RETURN_IF_ERROR(PrefixOnSlot0(conversation));
  // Short conversations until one is given slot 0 (a fresh registry puts
  // the next ones on the emptier slots first, then by hash).
  bool displaced = false;
  for (int k = 0; k < kMaxDisplacers && !displaced; ++k) {
    KvOutcome out;
    ARBITER_RETURN_IF_ERROR(Run(fmt::format("host-{}-d{}", rep, k),
                                Ids(o_.turn_tokens, 30000 + 100 * rep + k, vocab_), 1, &out,
                                nullptr)
                                .status());
    displaced = out.slot == 0;
  }
  if (!displaced || !tiers_.prompt_cache->Contains(kModelKey, conversation)) {
    return InternalError(fmt::format(
        "kv bench: prompt_cache: \"{}\" was not moved to the prompt cache by {} displacers",
        conversation, kMaxDisplacers));
  }
  TtftSample t;
  ARBITER_ASSIGN_OR_RETURN(
      t.g, Run(conversation, Concat(prefix_, Turn(rep)), 1, &t.outcome, &t.ttft_ms));
  t.prefill_ms = t.g.timings.prefill_ms;
  if (t.g.cached_tokens != o_.prefix_tokens || t.g.copied_tokens != 0 ||
      t.outcome.source != KvSource::kPromptCache || t.outcome.restored_tokens != o_.prefix_tokens) {
    return Unexpected(
        "prompt_cache", t.g, &t.outcome,
        fmt::format("cached {0}, copied 0, source prompt_cache, restored {0}", o_.prefix_tokens));
  }
  return t;
}

Result<TtftSample> KvBench::FromDisk(int rep) {
  ARBITER_RETURN_IF_ERROR(Fresh(uint64_t{1} << 40));
  const std::string conversation = fmt::format("disk-{}", rep);
  ARBITER_RETURN_IF_ERROR(PrefixOnSlot0(conversation));
  if (!tiers_.precache->Close(engine_.get(), conversation) ||
      !store_->Contains(hash_, conversation)) {
    return InternalError(fmt::format("kv bench: disk: closing \"{}\" wrote no file", conversation));
  }
  ARBITER_RETURN_IF_ERROR(Fresh(uint64_t{1} << 40));  // as after a restart
  TtftSample t;
  ARBITER_ASSIGN_OR_RETURN(
      t.g, Run(conversation, Concat(prefix_, Turn(rep)), 1, &t.outcome, &t.ttft_ms));
  t.prefill_ms = t.g.timings.prefill_ms;
  store_->Remove(hash_, conversation);
  if (t.g.cached_tokens != o_.prefix_tokens || t.g.copied_tokens != 0 ||
      t.outcome.source != KvSource::kDisk || t.outcome.restored_tokens != o_.prefix_tokens) {
    return Unexpected(
        "disk", t.g, &t.outcome,
        fmt::format("cached {0}, copied 0, source disk, restored {0}", o_.prefix_tokens));
  }
  return t;
}

Status KvBench::RunTtft(KvBenchResult* r) {
  const char* names[] = {"ideal", "cold", "prewarm", "prompt_cache", "disk"};
  constexpr int kCases = 5;
  std::vector<double> ttft[kCases], prefill[kCases], overhead[kCases], prewarm;
  std::vector<TtftSample> last(kCases);
  for (int rep = 0; rep < o_.repetitions; ++rep) {
    for (int c = 0; c < kCases; ++c) {
      Result<TtftSample> t = c == 0   ? Ideal(rep)
                             : c == 1 ? Cold(rep)
                             : c == 2 ? Prewarmed(rep)
                             : c == 3 ? FromPromptCache(rep)
                                      : FromDisk(rep);
      if (!t.ok()) return t.status();
      ttft[c].push_back(t->ttft_ms);
      prefill[c].push_back(t->prefill_ms);
      overhead[c].push_back(t->ttft_ms - t->prefill_ms);
      if (c == 2) prewarm.push_back(t->prewarm_ms);
      last[c] = std::move(*t);
    }
  }
  for (int c = 0; c < kCases; ++c) {
    KvTtftCase k;
    k.name = names[c];
    k.source = c == 0 ? "" : std::string(KvSourceName(last[c].outcome.source));
    k.ttft_ms = Summarize(ttft[c]);
    k.prefill_ms = Summarize(prefill[c]);
    k.overhead_ms = Summarize(overhead[c]);
    k.prompt_tokens = last[c].g.prompt_tokens;
    k.cached_tokens = last[c].g.cached_tokens;
    k.computed_tokens = last[c].g.timings.prefill_tokens;
    k.restored_tokens = last[c].outcome.restored_tokens;
    k.stashed = last[c].outcome.stashed;
    if (c == 2) {
      k.prewarm_ms = Summarize(prewarm);
      k.prewarm_computed_tokens = last[c].prewarm_computed;
    }
    r->ttft.push_back(std::move(k));
  }
  const KvTtftCase& ideal = r->ttft[0];
  for (KvTtftCase& k : r->ttft) {
    k.ratio_best = ideal.ttft_ms.min > 0 ? k.ttft_ms.min / ideal.ttft_ms.min : 0;
    k.ratio_p50 = ideal.ttft_ms.p50 > 0 ? k.ttft_ms.p50 / ideal.ttft_ms.p50 : 0;
  }
  tiers_.Reset();
  return OkStatus();
}

// ---- save and restore ---------------------------------------------------------

// write() of `bytes` bytes from `data` to a new file at `path`, then close
// (no fsync); then the fsync of the file alone. Removes the file.
Status WriteThenFsync(const std::string& path, const std::vector<uint8_t>& data, double* write_ms,
                      double* fsync_ms) {
  const double t0 = NowSeconds();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return InternalError(fmt::format("kv bench: create {}: {}", path, strerror(errno)));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return InternalError(fmt::format("kv bench: write {}: {}", path, strerror(err)));
    }
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  *write_ms = MsSince(t0);
  fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return InternalError(fmt::format("kv bench: open {}: {}", path, strerror(errno)));
  const double t1 = NowSeconds();
  const int rc = ::fsync(fd);
  *fsync_ms = MsSince(t1);
  ::close(fd);
  ::unlink(path.c_str());
  if (rc != 0) return InternalError(fmt::format("kv bench: fsync {}: {}", path, strerror(errno)));
  return OkStatus();
}

Status KvBench::RunSaveRestore(KvBenchResult* r) {
  KvSaveRestoreResult& s = r->save_restore;
  std::vector<double> save_slot, write_file, save_total, rewrite_file, resave_total, save_direct,
      read_file, restore_slot, file_to_slot, file_to_slot_copy, write_nofsync, fsync, memcpy_gb_s;
  std::vector<uint8_t> raw;  // the context write's bytes (file size, arbitrary content)
  for (int rep = 0; rep < o_.repetitions; ++rep) {
    for (int slot = 0; slot < o_.n_slots; ++slot) {
      ARBITER_RETURN_IF_ERROR(engine_->ClearSlot(slot, nullptr));
    }
    ARBITER_RETURN_IF_ERROR(engine_->RestoreSlot(0, prefix_snapshot_, nullptr).status());

    double t0 = NowSeconds();
    ARBITER_ASSIGN_OR_RETURN(KvSnapshot snap, engine_->SaveSlot(0, nullptr));
    save_slot.push_back(MsSince(t0));
    if (snap.tokens != prefix_ || snap.kv != prefix_snapshot_.kv) {
      return InternalError("kv bench: SaveSlot(0) did not return the prefix's KV");
    }
    snap.model_hash = hash_;

    // A conversation saved for the first time, then saved again.
    const std::string id = fmt::format("save-{}", rep);
    const std::string path = store_->PathFor(hash_, id, TtlClass::kShort);
    t0 = NowSeconds();
    ARBITER_ASSIGN_OR_RETURN(uint64_t written, store_->Save(id, TtlClass::kShort, snap));
    write_file.push_back(MsSince(t0));
    save_total.push_back(save_slot.back() + write_file.back());
    t0 = NowSeconds();
    ARBITER_ASSIGN_OR_RETURN(written, store_->Save(id, TtlClass::kShort, snap));
    rewrite_file.push_back(MsSince(t0));
    resave_total.push_back(save_slot.back() + rewrite_file.back());
    std::error_code ec;
    const uint64_t on_disk = fs::file_size(path, ec);
    if (written != KvFileBytes(snap) || on_disk != written) {
      return InternalError(
          fmt::format("kv bench: KvStore::Save wrote {} bytes, the file has {}, "
                      "KvFileBytes is {}",
                      written, ec ? 0 : on_disk, KvFileBytes(snap)));
    }
    s.snapshot_bytes = snap.MemoryBytes();
    s.file_bytes = written;
    // The slot straight to a new file, as KvPrecache persists a slot.
    const std::string direct_id = fmt::format("direct-{}", rep);
    uint64_t direct_written = 0;
    t0 = NowSeconds();
    ARBITER_RETURN_IF_ERROR(engine_->VisitSlot(
        0,
        [&](const KvRowsView& rows) -> Status {
          ARBITER_ASSIGN_OR_RETURN(direct_written,
                                   store_->Save(direct_id, TtlClass::kShort, hash_, rows));
          return OkStatus();
        },
        nullptr));
    save_direct.push_back(MsSince(t0));
    if (direct_written != written) {
      return InternalError(
          fmt::format("kv bench: the slot's rows made a {}-byte file, the snapshot a {}-byte one",
                      direct_written, written));
    }
    store_->Remove(hash_, direct_id);
    s.n_tokens = static_cast<int>(snap.n_tokens());

    {
      t0 = NowSeconds();
      ARBITER_ASSIGN_OR_RETURN(KvSnapshot read, ReadKvFile(path, hash_));
      read_file.push_back(MsSince(t0));
      if (read.tokens != snap.tokens || read.kv != snap.kv) {
        return InternalError("kv bench: ReadKvFile returned other K/V than was saved");
      }
    }

    t0 = NowSeconds();
    ARBITER_ASSIGN_OR_RETURN(int restored, engine_->RestoreSlot(1, snap, nullptr));
    restore_slot.push_back(MsSince(t0));
    if (restored != s.n_tokens) {
      return InternalError(
          fmt::format("kv bench: RestoreSlot restored {} of {} tokens", restored, s.n_tokens));
    }

    // The disk tier's restore, as KvPrecache does it: mapped, one copy.
    ARBITER_RETURN_IF_ERROR(engine_->ClearSlot(1, nullptr));
    t0 = NowSeconds();
    {
      ARBITER_ASSIGN_OR_RETURN(KvMappedLoadResult loaded, store_->LoadMapped(hash_, id));
      ARBITER_ASSIGN_OR_RETURN(restored, engine_->RestoreSlot(1, loaded.file.view(), nullptr));
    }  // unmapped, as at the end of a request's restore
    file_to_slot.push_back(MsSince(t0));
    if (restored != s.n_tokens || engine_->SlotTokens(1) != prefix_) {
      return InternalError(
          fmt::format("kv bench: file → slot restored {} of {} tokens", restored, s.n_tokens));
    }
    // Context: through a KvSnapshot (the copying reader, KvStore::Load).
    ARBITER_RETURN_IF_ERROR(engine_->ClearSlot(1, nullptr));
    t0 = NowSeconds();
    {
      ARBITER_ASSIGN_OR_RETURN(KvLoadResult loaded, store_->Load(hash_, id));
      ARBITER_ASSIGN_OR_RETURN(restored, engine_->RestoreSlot(1, loaded.snapshot, nullptr));
    }  // the snapshot is freed
    file_to_slot_copy.push_back(MsSince(t0));
    if (restored != s.n_tokens || engine_->SlotTokens(1) != prefix_) {
      return InternalError(fmt::format("kv bench: file → snapshot → slot restored {} of {} tokens",
                                       restored, s.n_tokens));
    }

    // Context: the same byte count written without fsync, then its fsync.
    if (raw.size() != written) {
      raw.assign(written, 0);
      std::memcpy(raw.data(), snap.kv.data(),
                  std::min<size_t>(written, snap.kv.size()));
    }
    double w_ms = 0, f_ms = 0;
    ARBITER_RETURN_IF_ERROR(
        WriteThenFsync(tmp_dir_ + "/raw-" + std::to_string(rep), raw, &w_ms, &f_ms));
    write_nofsync.push_back(w_ms);
    fsync.push_back(f_ms);

    memcpy_gb_s.push_back(MeasureMemcpyBandwidth(s.snapshot_bytes, 1) / 1e9);
    store_->Remove(hash_, id);
  }

  s.save_slot_ms = Summarize(save_slot);
  s.write_file_ms = Summarize(write_file);
  s.save_total_ms = Summarize(save_total);
  s.rewrite_file_ms = Summarize(rewrite_file);
  s.resave_total_ms = Summarize(resave_total);
  s.save_direct_ms = Summarize(save_direct);
  s.read_file_ms = Summarize(read_file);
  s.restore_slot_ms = Summarize(restore_slot);
  s.file_to_slot_ms = Summarize(file_to_slot);
  s.file_to_slot_copy_ms = Summarize(file_to_slot_copy);
  s.write_nofsync_ms = Summarize(write_nofsync);
  s.fsync_ms = Summarize(fsync);
  s.memcpy_gb_s = Summarize(memcpy_gb_s);
  s.save_slot_gb_s = GbPerSecond(s.snapshot_bytes, s.save_slot_ms.p50 / 1e3);
  s.write_file_gb_s = GbPerSecond(s.file_bytes, s.write_file_ms.p50 / 1e3);
  s.read_file_gb_s = GbPerSecond(s.file_bytes, s.read_file_ms.p50 / 1e3);
  s.restore_slot_gb_s = GbPerSecond(s.snapshot_bytes, s.restore_slot_ms.p50 / 1e3);
  s.file_to_slot_gb_s = GbPerSecond(s.file_bytes, s.file_to_slot_ms.p50 / 1e3);
  s.restore_slot_vs_memcpy = s.memcpy_gb_s.p50 > 0 ? s.restore_slot_gb_s / s.memcpy_gb_s.p50 : 0;
  s.file_to_slot_vs_memcpy = s.memcpy_gb_s.p50 > 0 ? s.file_to_slot_gb_s / s.memcpy_gb_s.p50 : 0;
  s.ref_save_gb_s = GbPerSecond(s.ref_bytes, s.ref_save_ms / 1e3);
  s.ref_load_gb_s = GbPerSecond(s.ref_bytes, s.ref_load_ms / 1e3);
  s.target_save_total_ms = 2.0 * s.ref_save_ms * static_cast<double>(s.file_bytes) / s.ref_bytes;
  s.file_to_slot_target_met = s.file_to_slot_gb_s >= s.target_file_to_slot_gb_s;
  s.save_target_met = s.save_total_ms.p50 <= s.target_save_total_ms;
  s.resave_target_met = s.resave_total_ms.p50 <= s.target_save_total_ms;
  s.save_direct_target_met = s.save_direct_ms.p50 <= s.target_save_total_ms;
  return OkStatus();
}

// ---- shared prefix ------------------------------------------------------------

Status KvBench::RunSharedPrefix(KvBenchResult* r) {
  for (int length : o_.shared_prefix_tokens) {
    ARBITER_RETURN_IF_ERROR(Fresh(uint64_t{1} << 40));
    std::mt19937_64 rng(1234 + static_cast<uint64_t>(length));
    std::uniform_int_distribution<int> suffix_len(o_.shared_suffix_min, o_.shared_suffix_max);
    std::uniform_int_distribution<int> output_len(o_.shared_output_min, o_.shared_output_max);
    const std::vector<int32_t> prefix = Ids(length, 40000 + static_cast<uint64_t>(length), vocab_);
    KvSharedPrefixCase k;
    k.prefix_tokens = length;
    k.requests = o_.shared_requests;
    std::vector<double> ttft;
    for (int i = 0; i < o_.shared_requests; ++i) {
      const int n_suffix = suffix_len(rng);
      const int n_out = output_len(rng);
      std::vector<int32_t> prompt =
          Concat(prefix, Ids(n_suffix, 50000 + 1000 * static_cast<uint64_t>(length) + i, vocab_));
      KvOutcome out;
      double wall = 0;
      ARBITER_ASSIGN_OR_RETURN(GenerationResult g, Run("", std::move(prompt), n_out, &out, &wall));
      if (i > 0 && g.cached_tokens < length) {
        return Unexpected(fmt::format("shared prefix {} request {}", length, i), g, &out,
                          fmt::format("≥ {} cached", length));
      }
      const double t = wall - g.timings.decode_ms;
      if (i == 0) k.first_ttft_ms = t;
      ttft.push_back(t);
      k.prompt_tokens += static_cast<uint64_t>(g.prompt_tokens);
      k.cached_tokens += static_cast<uint64_t>(g.cached_tokens);
      k.copied_tokens += static_cast<uint64_t>(g.copied_tokens);
      k.computed_tokens += static_cast<uint64_t>(g.timings.prefill_tokens);
    }
    k.ttft_ms = Summarize(ttft);
    k.hit_fraction =
        k.prompt_tokens > 0 ? static_cast<double>(k.cached_tokens) / k.prompt_tokens : 0;
    r->shared_prefix.push_back(k);
  }
  tiers_.Reset();
  return OkStatus();
}

// ---- multi-round QA -----------------------------------------------------------

Status KvBench::RunQa(KvBenchResult* r) {
  const int final_tokens =
      o_.qa_context_tokens + o_.qa_rounds * (o_.turn_tokens + o_.qa_answer_tokens);
  const uint64_t final_bytes =
      static_cast<uint64_t>(final_tokens) * (static_cast<uint64_t>(r->kv_bytes_per_token) + 4);
  struct Case {
    const char* name;
    uint64_t capacity;
  };
  const Case cases[] = {{"host_holds_all", final_bytes * static_cast<uint64_t>(o_.qa_users)},
                        {"host_holds_2", final_bytes * 2}};
  for (const Case& c : cases) {
    ARBITER_RETURN_IF_ERROR(Fresh(c.capacity));
    KvQaCase q;
    q.name = c.name;
    q.prompt_cache_bytes = c.capacity;
    q.total.round = -1;
    std::vector<std::vector<int32_t>> history(static_cast<size_t>(o_.qa_users));
    for (int u = 0; u < o_.qa_users; ++u) {
      history[u] = Ids(o_.qa_context_tokens, 60000 + static_cast<uint64_t>(u), vocab_);
    }
    for (int round = 0; round < o_.qa_rounds; ++round) {
      KvQaRound qr;
      qr.round = round;
      double ttft_sum = 0, prompt_sum = 0;
      for (int u = 0; u < o_.qa_users; ++u) {
        const size_t before = history[u].size();
        std::vector<int32_t> prompt =
            Concat(history[u],
                   Ids(o_.turn_tokens, 70000 + 100 * static_cast<uint64_t>(u) + round, vocab_));
        KvOutcome out;
        double wall = 0;
        ARBITER_ASSIGN_OR_RETURN(GenerationResult g, Run(fmt::format("qa-{}-u{}", c.name, u),
                                                         prompt, o_.qa_answer_tokens, &out, &wall));
        // Nothing a user said before is ever recomputed: its KV is in one of
        // the tiers (the host tier spills to disk, the disk has no budget).
        if (round > 0 && static_cast<size_t>(g.cached_tokens) < before - 1) {
          return Unexpected(fmt::format("qa {} user {} round {}", c.name, u, round), g, &out,
                            fmt::format("≥ {} cached", before - 1));
        }
        history[u] = Concat(std::move(prompt), g.output_ids);
        ttft_sum += wall - g.timings.decode_ms;
        prompt_sum += g.prompt_tokens;
        ++qr.turns;
        qr.computed_tokens += static_cast<uint64_t>(g.timings.prefill_tokens);
        qr.cached_tokens += static_cast<uint64_t>(g.cached_tokens);
        switch (out.source) {
          case KvSource::kSlot:
            ++qr.from_slot;
            break;
          case KvSource::kPromptCache:
            ++qr.from_prompt_cache;
            break;
          case KvSource::kDisk:
            ++qr.from_disk;
            break;
          case KvSource::kNone:
            ++qr.from_none;
            break;
        }
      }
      qr.ttft_mean_ms = ttft_sum / qr.turns;
      qr.prompt_tokens_mean = prompt_sum / qr.turns;
      // The total's means are weighted by turns.
      KvQaRound& t = q.total;
      t.ttft_mean_ms = (t.ttft_mean_ms * t.turns + ttft_sum) / (t.turns + qr.turns);
      t.prompt_tokens_mean = (t.prompt_tokens_mean * t.turns + prompt_sum) / (t.turns + qr.turns);
      t.turns += qr.turns;
      t.computed_tokens += qr.computed_tokens;
      t.cached_tokens += qr.cached_tokens;
      t.from_slot += qr.from_slot;
      t.from_prompt_cache += qr.from_prompt_cache;
      t.from_disk += qr.from_disk;
      t.from_none += qr.from_none;
      q.rounds.push_back(qr);
    }
    q.spilled = tiers_.prompt_cache->counters().spilled;
    q.stashes = tiers_.precache->counters().stashes;
    tiers_.Reset();
    for (int u = 0; u < o_.qa_users; ++u)
      store_->Remove(hash_, fmt::format("qa-{}-u{}", c.name, u));
    r->qa.push_back(std::move(q));
  }
  if (spill_failures_.load() > 0) {
    return InternalError(
        fmt::format("kv bench: {} prompt-cache spills to disk failed", spill_failures_.load()));
  }
  return OkStatus();
}

Status CheckOptions(const KvBenchOptions& o) {
  if (o.model_dir.empty()) return InvalidArgumentError("kv bench: model_dir is required");
  bool ok = o.prefix_tokens >= 1 && o.turn_tokens >= 1 && o.repetitions >= 1 && o.threads >= 0 &&
            o.n_slots >= 2 && o.shared_requests >= 1 && o.shared_suffix_min >= 1 &&
            o.shared_suffix_min <= o.shared_suffix_max && o.shared_output_min >= 1 &&
            o.shared_output_min <= o.shared_output_max && o.qa_users >= 1 && o.qa_rounds >= 1 &&
            o.qa_context_tokens >= 1 && o.qa_answer_tokens >= 1;
  for (int p : o.shared_prefix_tokens) ok = ok && p >= 1;
  if (!o.only.empty() && o.only != "ttft" && o.only != "save_restore" &&
      o.only != "shared_prefix" && o.only != "qa") {
    return InvalidArgumentError(fmt::format(
        "kv bench: unknown scenario \"{}\" (ttft, save_restore, shared_prefix, qa)", o.only));
  }
  if (!ok) {
    return InvalidArgumentError(
        "kv bench: token counts, repetitions and requests must be ≥ 1, n_slots ≥ 2, threads ≥ 0, "
        "and each min ≤ its max");
  }
  return OkStatus();
}

}  // namespace

Result<KvBenchResult> RunKvBench(const KvBenchOptions& options) {
  ARBITER_RETURN_IF_ERROR(CheckOptions(options));
  if (!fs::is_directory(options.model_dir) && !fs::is_regular_file(options.model_dir)) {
    return InvalidArgumentError(fmt::format(
        "kv bench: {} is neither a model directory nor a .gguf file", options.model_dir));
  }
  KvBenchResult r;
  r.model_dir = options.model_dir;
  r.n_slots = options.n_slots;
  r.prefix_tokens = options.prefix_tokens;
  r.turn_tokens = options.turn_tokens;
  r.repetitions = options.repetitions;
  r.loadavg_start = LoadAverage1();
  const double t0 = NowSeconds();
  KvBench bench(options);
  ARBITER_RETURN_IF_ERROR(bench.Setup(&r));
  const std::string& only = options.only;
  if (only.empty() || only == "ttft") ARBITER_RETURN_IF_ERROR(bench.RunTtft(&r));
  if (only.empty() || only == "save_restore") ARBITER_RETURN_IF_ERROR(bench.RunSaveRestore(&r));
  if (only.empty() || only == "shared_prefix") {
    ARBITER_RETURN_IF_ERROR(bench.RunSharedPrefix(&r));
  }
  if (only.empty() || only == "qa") ARBITER_RETURN_IF_ERROR(bench.RunQa(&r));
  r.seconds = NowSeconds() - t0;
  r.loadavg_end = LoadAverage1();
  return r;
}

// ---- report -------------------------------------------------------------------

std::string FormatKvBench(const KvBenchResult& r) {
  std::string o;
  auto line = [&o](const std::string& s) {
    o += s;
    o += '\n';
  };
  const double prefix_mb = r.kv_bytes_per_token * r.prefix_tokens / 1e6;
  line(fmt::format("model           {} (KV model hash {})", r.model_dir, r.model_hash));
  line(
      fmt::format("engine          {} slots, n_ctx {}, {} threads, device {}; KV {} {} layers "
                  "× 2 × {} = {:.0f} B/token",
                  r.n_slots, r.n_ctx, r.threads, r.device, r.kv_type, r.n_layers, r.kv_dim,
                  r.kv_bytes_per_token));
  line(
      fmt::format("shape           prefix {} tokens ({:.2f} MB of K/V), turn {} tokens; {} "
                  "repetitions (best, p50)",
                  r.prefix_tokens, prefix_mb, r.turn_tokens, r.repetitions));
  line(fmt::format("run             {:.1f} s, load average {:.2f} → {:.2f}; KV dir {} (removed)",
                   r.seconds, r.loadavg_start, r.loadavg_end, r.kv_dir));
  if (!r.ttft.empty()) {
    line("");
    line(
        fmt::format("TTFT of one turn: prefix {} + turn {}, 1 token; wall of the Generate call "
                    "(ms)",
                    r.prefix_tokens, r.turn_tokens));
    line(fmt::format("  {:<13} {:<13} {:>8} {:>7} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10}", "case",
                     "tier", "computed", "cached", "restored", "best", "p50", "best/ideal",
                     "p50/ideal", "overhead50"));
    for (const KvTtftCase& k : r.ttft) {
      line(fmt::format(
          "  {:<13} {:<13} {:>8} {:>7} {:>8} {:>8.1f} {:>8.1f} {:>10.2f} {:>10.2f} {:>10.2f}",
          k.name, k.name == "ideal" ? "(engine)" : k.source, k.computed_tokens, k.cached_tokens,
          k.restored_tokens, k.ttft_ms.min, k.ttft_ms.p50, k.ratio_best, k.ratio_p50,
          k.overhead_ms.p50));
    }
    line("  (overhead50: p50 of TTFT − the engine's prefill time: slot, stash, restore, sample)");
    for (const KvTtftCase& k : r.ttft) {
      if (k.name == "prewarm") {
        line(fmt::format(
            "  (the Prewarm call itself: {} tokens computed, best {:.1f} ms, p50 {:.1f} "
            "ms — before the turn, not in its TTFT)",
            k.prewarm_computed_tokens, k.prewarm_ms.min, k.prewarm_ms.p50));
      }
      if (k.name == "prompt_cache" && k.stashed) {
        line("  (prompt_cache: the displacer's KV, turn-sized, is stashed first, inside the TTFT)");
      }
    }
    line("  (disk: page cache warm — the file was written just before)");
  }

  const KvSaveRestoreResult& s = r.save_restore;
  if (s.n_tokens > 0) {
    line("");
    line(fmt::format("Save and restore: {} tokens; snapshot {} B ({:.2f} MB), file {} B",
                     s.n_tokens, s.snapshot_bytes, s.snapshot_bytes / 1e6, s.file_bytes));
    line(fmt::format("  {:<50} {:>9} {:>9} {:>11}", "step", "best ms", "p50 ms", "GB/s (p50)"));
    auto row = [&](const char* name, const SampleSummary& st, double gb_s) {
      line(fmt::format("  {:<50} {:>9.2f} {:>9.2f} {:>11}", name, st.min, st.p50,
                       gb_s > 0 ? fmt::format("{:.2f}", gb_s) : std::string("")));
    };
    row("SaveSlot (slot → snapshot)", s.save_slot_ms, s.save_slot_gb_s);
    row("KvStore::Save, new file (write, fsync, rename)", s.write_file_ms, s.write_file_gb_s);
    row("save total (SaveSlot + KvStore::Save)", s.save_total_ms,
        GbPerSecond(s.file_bytes, s.save_total_ms.p50 / 1e3));
    row("KvStore::Save over the previous file", s.rewrite_file_ms,
        GbPerSecond(s.file_bytes, s.rewrite_file_ms.p50 / 1e3));
    row("re-save total (SaveSlot + Save over)", s.resave_total_ms,
        GbPerSecond(s.file_bytes, s.resave_total_ms.p50 / 1e3));
    row("slot → file (VisitSlot + KvStore::Save, no copy)", s.save_direct_ms,
        GbPerSecond(s.file_bytes, s.save_direct_ms.p50 / 1e3));
    row("ReadKvFile (page cache warm, validated)", s.read_file_ms, s.read_file_gb_s);
    row("RestoreSlot (snapshot → slot)", s.restore_slot_ms, s.restore_slot_gb_s);
    row("file → slot (LoadMapped + RestoreSlot + unmap)", s.file_to_slot_ms, s.file_to_slot_gb_s);
    row("context: file → snapshot → slot (Load + Restore)", s.file_to_slot_copy_ms,
        GbPerSecond(s.file_bytes, s.file_to_slot_copy_ms.p50 / 1e3));
    row("context: write() of the file's bytes, no fsync", s.write_nofsync_ms,
        GbPerSecond(s.file_bytes, s.write_nofsync_ms.p50 / 1e3));
    row("context: fsync of that file", s.fsync_ms, 0);
    line(fmt::format("  context: memcpy, 1 thread, {:.2f} MB: best {:.2f} GB/s, p50 {:.2f} GB/s",
                     s.snapshot_bytes / 1e6, s.memcpy_gb_s.max, s.memcpy_gb_s.p50));
    line(fmt::format("  RestoreSlot = {:.2f} of memcpy; file → slot = {:.2f} of memcpy",
                     s.restore_slot_vs_memcpy, s.file_to_slot_vs_memcpy));
    line(fmt::format(
        "  reference (llama.cpp, this machine class, {:.0f} MB, no fsync): save {:.1f} "
        "ms = {:.2f} GB/s, load {:.1f} ms = {:.2f} GB/s",
        s.ref_bytes / 1e6, s.ref_save_ms, s.ref_save_gb_s, s.ref_load_ms, s.ref_load_gb_s));
    line(fmt::format("  target: file → slot ≥ {:.1f} GB/s: {:.2f} GB/s p50 — {}",
                     s.target_file_to_slot_gb_s, s.file_to_slot_gb_s,
                     s.file_to_slot_target_met ? "met" : "MISSED"));
    line(
        fmt::format("  target: save total with fsync ≤ 2 × {:.1f} ms × {:.2f} MB / {:.0f} MB = "
                    "{:.1f} ms: {:.1f} ms p50 — {}",
                    s.ref_save_ms, s.file_bytes / 1e6, s.ref_bytes / 1e6, s.target_save_total_ms,
                    s.save_total_ms.p50, s.save_target_met ? "met" : "MISSED"));
    line(fmt::format("  same bound, re-save over the previous file: {:.1f} ms p50 — {}",
                     s.resave_total_ms.p50, s.resave_target_met ? "met" : "MISSED"));
    line(
        fmt::format("  same bound, slot → file without a snapshot (what KvPrecache does): "
                    "{:.1f} ms p50 — {}",
                    s.save_direct_ms.p50, s.save_direct_target_met ? "met" : "MISSED"));
    line(
        fmt::format("  raw ms vs llama.cpp (our bytes are {:.2f}× theirs): save {:.1f} vs {:.1f} "
                    "ms, load {:.1f} vs {:.1f} ms",
                    s.file_bytes / s.ref_bytes, s.save_total_ms.p50, s.ref_save_ms,
                    s.file_to_slot_ms.p50, s.ref_load_ms));
  }

  if (!r.shared_prefix.empty()) {
    line("");
    line("Shared prefix (peers.md 1): requests without a conversation id, one at a time");
    line(fmt::format("  {:>6} {:>8} {:>9} {:>9} {:>9} {:>8} {:>22}", "prefix", "requests", "p50 ms",
                     "p99 ms", "first ms", "hit", "computed / prompt tok"));
    for (const KvSharedPrefixCase& k : r.shared_prefix) {
      line(fmt::format("  {:>6} {:>8} {:>9.1f} {:>9.1f} {:>9.1f} {:>8.3f} {:>22}", k.prefix_tokens,
                       k.requests, k.ttft_ms.p50, k.ttft_ms.p99, k.first_ttft_ms, k.hit_fraction,
                       fmt::format("{} / {}", k.computed_tokens, k.prompt_tokens)));
    }
    line(
        "  (TTFT = wall − the engine's decode time; p99 is nearest-rank, so with few requests it "
        "is the cold first one)");
  }

  if (!r.qa.empty()) {
    line("");
    line(fmt::format("Multi-round QA (peers.md 2): users × rounds round-robin on {} slots",
                     r.n_slots));
    for (const KvQaCase& q : r.qa) {
      line(
          fmt::format("  {} (prompt cache {:.1f} MB; {} stashes slot → host, {} spills host → "
                      "disk)",
                      q.name, q.prompt_cache_bytes / 1e6, q.stashes, q.spilled));
      line(fmt::format("    {:>5} {:>5} {:>13} {:>11} {:>9} {:>5} {:>12} {:>5} {:>5}", "round",
                       "turns", "TTFT mean ms", "prompt mean", "computed", "slot", "prompt_cache",
                       "disk", "none"));
      auto qa_row = [&](const KvQaRound& x) {
        line(fmt::format("    {:>5} {:>5} {:>13.1f} {:>11.0f} {:>9} {:>5} {:>12} {:>5} {:>5}",
                         x.round < 0 ? std::string("all") : std::to_string(x.round), x.turns,
                         x.ttft_mean_ms, x.prompt_tokens_mean, x.computed_tokens, x.from_slot,
                         x.from_prompt_cache, x.from_disk, x.from_none));
      };
      for (const KvQaRound& x : q.rounds) qa_row(x);
      qa_row(q.total);
    }
  }
  return o;
}

// ---- JSON ---------------------------------------------------------------------

namespace {

// {samples, best, p50, p99, max, mean}: the keys `arbiter bench kv --json`
// has always had (scripts and docs/BENCHMARKS.md read them); best = min.
nlohmann::json SummaryJson(const SampleSummary& s) {
  return {{"samples", s.samples}, {"best", s.min}, {"p50", s.p50},
          {"p99", s.p99},         {"max", s.max},  {"mean", s.mean}};
}

nlohmann::json QaRoundJson(const KvQaRound& x) {
  return {{"round", x.round},
          {"turns", x.turns},
          {"ttft_mean_ms", x.ttft_mean_ms},
          {"prompt_tokens_mean", x.prompt_tokens_mean},
          {"computed_tokens", x.computed_tokens},
          {"cached_tokens", x.cached_tokens},
          {"from_slot", x.from_slot},
          {"from_prompt_cache", x.from_prompt_cache},
          {"from_disk", x.from_disk},
          {"from_none", x.from_none}};
}

}  // namespace

std::string FormatKvBenchJson(const KvBenchResult& r) {
  nlohmann::json j;
  j["model_dir"] = r.model_dir;
  j["model_hash"] = r.model_hash;
  j["n_slots"] = r.n_slots;
  j["n_ctx"] = r.n_ctx;
  j["threads"] = r.threads;
  j["prefix_tokens"] = r.prefix_tokens;
  j["turn_tokens"] = r.turn_tokens;
  j["repetitions"] = r.repetitions;
  j["n_layers"] = r.n_layers;
  j["kv_dim"] = r.kv_dim;
  j["kv_type"] = r.kv_type;
  j["device"] = r.device;
  j["kv_bytes_per_token"] = r.kv_bytes_per_token;
  j["loadavg_start"] = r.loadavg_start;
  j["loadavg_end"] = r.loadavg_end;
  j["seconds"] = r.seconds;
  j["ttft"] = nlohmann::json::array();
  for (const KvTtftCase& k : r.ttft) {
    nlohmann::json c = {{"name", k.name},
                        {"source", k.source},
                        {"ttft_ms", SummaryJson(k.ttft_ms)},
                        {"prefill_ms", SummaryJson(k.prefill_ms)},
                        {"overhead_ms", SummaryJson(k.overhead_ms)},
                        {"ratio_best", k.ratio_best},
                        {"ratio_p50", k.ratio_p50},
                        {"prompt_tokens", k.prompt_tokens},
                        {"cached_tokens", k.cached_tokens},
                        {"computed_tokens", k.computed_tokens},
                        {"restored_tokens", k.restored_tokens},
                        {"stashed", k.stashed}};
    if (k.name == "prewarm") {
      c["prewarm_ms"] = SummaryJson(k.prewarm_ms);
      c["prewarm_computed_tokens"] = k.prewarm_computed_tokens;
    }
    j["ttft"].push_back(std::move(c));
  }
  const KvSaveRestoreResult& s = r.save_restore;
  j["save_restore"] = {{"n_tokens", s.n_tokens},
                       {"snapshot_bytes", s.snapshot_bytes},
                       {"file_bytes", s.file_bytes},
                       {"save_slot_ms", SummaryJson(s.save_slot_ms)},
                       {"write_file_ms", SummaryJson(s.write_file_ms)},
                       {"save_total_ms", SummaryJson(s.save_total_ms)},
                       {"rewrite_file_ms", SummaryJson(s.rewrite_file_ms)},
                       {"resave_total_ms", SummaryJson(s.resave_total_ms)},
                       {"save_direct_ms", SummaryJson(s.save_direct_ms)},
                       {"read_file_ms", SummaryJson(s.read_file_ms)},
                       {"restore_slot_ms", SummaryJson(s.restore_slot_ms)},
                       {"file_to_slot_ms", SummaryJson(s.file_to_slot_ms)},
                       {"file_to_slot_copy_ms", SummaryJson(s.file_to_slot_copy_ms)},
                       {"write_nofsync_ms", SummaryJson(s.write_nofsync_ms)},
                       {"fsync_ms", SummaryJson(s.fsync_ms)},
                       {"memcpy_gb_s", SummaryJson(s.memcpy_gb_s)},
                       {"save_slot_gb_s", s.save_slot_gb_s},
                       {"write_file_gb_s", s.write_file_gb_s},
                       {"read_file_gb_s", s.read_file_gb_s},
                       {"restore_slot_gb_s", s.restore_slot_gb_s},
                       {"file_to_slot_gb_s", s.file_to_slot_gb_s},
                       {"restore_slot_vs_memcpy", s.restore_slot_vs_memcpy},
                       {"file_to_slot_vs_memcpy", s.file_to_slot_vs_memcpy},
                       {"ref_bytes", s.ref_bytes},
                       {"ref_save_ms", s.ref_save_ms},
                       {"ref_load_ms", s.ref_load_ms},
                       {"ref_save_gb_s", s.ref_save_gb_s},
                       {"ref_load_gb_s", s.ref_load_gb_s},
                       {"target_file_to_slot_gb_s", s.target_file_to_slot_gb_s},
                       {"target_save_total_ms", s.target_save_total_ms},
                       {"file_to_slot_target_met", s.file_to_slot_target_met},
                       {"save_target_met", s.save_target_met},
                       {"resave_target_met", s.resave_target_met},
                       {"save_direct_target_met", s.save_direct_target_met}};
  j["shared_prefix"] = nlohmann::json::array();
  for (const KvSharedPrefixCase& k : r.shared_prefix) {
    j["shared_prefix"].push_back({{"prefix_tokens", k.prefix_tokens},
                                  {"requests", k.requests},
                                  {"ttft_ms", SummaryJson(k.ttft_ms)},
                                  {"first_ttft_ms", k.first_ttft_ms},
                                  {"prompt_tokens", k.prompt_tokens},
                                  {"cached_tokens", k.cached_tokens},
                                  {"computed_tokens", k.computed_tokens},
                                  {"copied_tokens", k.copied_tokens},
                                  {"hit_fraction", k.hit_fraction}});
  }
  j["qa"] = nlohmann::json::array();
  for (const KvQaCase& q : r.qa) {
    nlohmann::json rounds = nlohmann::json::array();
    for (const KvQaRound& x : q.rounds) rounds.push_back(QaRoundJson(x));
    j["qa"].push_back({{"name", q.name},
                       {"prompt_cache_bytes", q.prompt_cache_bytes},
                       {"stashes", q.stashes},
                       {"spilled", q.spilled},
                       {"rounds", std::move(rounds)},
                       {"total", QaRoundJson(q.total)}});
  }
  return j.dump(2) + "\n";
}

}  // namespace arbiter
