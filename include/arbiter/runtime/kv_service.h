// arbiter/runtime/kv_service.h — the KV precache of `arbiter serve`: the disk
// tier (KvStore under [kv] dir), the host tier (one PromptCache for every
// model, charged to the ledger) and one KvPrecache per text model
// (docs/config.md "[kv]", docs/http-api.md "KV precache").
//
// Lifetime: ServeKv must outlive the MemoryArbiter whose engines it serves
// (their deleters detach from it, persisting owned slots) — construct it
// first, destroy it last. Its destructor spills the prompt cache to disk.
//
// Thread safety: the members are thread-safe; the map is fixed after
// MakeServeKv.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "arbiter/base/status.h"
#include "arbiter/engine/model_files.h"
#include "arbiter/kv/kv_store.h"
#include "arbiter/kv/precache.h"
#include "arbiter/kv/prompt_cache.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/runtime/config.h"

namespace arbiter {

struct ServeKv {
  KvSettings settings;
  std::string dir;                        // resolved [kv] dir
  std::unique_ptr<KvStore> store;
  std::unique_ptr<PromptCache> prompt_cache;  // null when [kv] prompt_cache = 0
  // By model name; text models whose files could be read at startup.
  std::map<std::string, std::unique_ptr<KvPrecache>, std::less<>> precaches;

  // The model's precache, or null.
  KvPrecache* Find(std::string_view model) const;
  ~ServeKv();
};

// The model hash of a text model (docs/kv-precache.md "Keys and names"; no
// slot count in it: "Defects of the reference, fixed"): SHA-256 over
// the digest of its compute layout and files (WeightsDigest, without the
// model's name, so two names for the same files share their KV), the K/V
// types ("f32") and the KV format version; not the slot count or the
// context size.
// Errors: those of Engine::WeightModelFor (the model's files).
Result<std::string> KvModelHash(const ModelEntry& entry);
// The same from files already opened for a load (no file is read again).
// Never fails.
Result<std::string> KvModelHash(const ModelFiles& files);

// Builds the KV precache for `config`: the directory ([kv] dir, else
// <state dir>/kv, created 0700), the store, the prompt cache (charged to
// `ledger`, spilling to the store) and a precache for every text model
// whose hash can be computed (a broken model gets none and is logged).
// Errors: the directory cannot be created or opened (kInvalidArgument /
// the file-system error, naming [kv].dir).
// `opened` (may be null) gives the text models' files already opened
// (OpenConfiguredModels in runtime/models.h), so their hash reads nothing.
Result<std::unique_ptr<ServeKv>> MakeServeKv(
    const Config& config, MemoryLedger* ledger,
    const std::map<std::string, Result<std::shared_ptr<const ModelFiles>>>* opened = nullptr);


}  // namespace arbiter
