// arbiter/runtime/vocabulary.h — the value types the runtime's operations
// speak, for the layers above it (the HTTP server, the CLI).
//
// The runtime takes and returns a few types that the layers below it define,
// because they are the ones that consume them:
//   messages and tools   ChatMessage, ToolCall, ToolDefinition,
//                        ChatTemplateKind (engine/chat_template.h)
//   sampling and output  SamplingParams, FinishReason, TokenLogprob,
//                        GenerationResult, TextCallback (engine/engine.h)
//   KV precache          KvOutcome, KvSource + KvSourceName, KvSlotView,
//                        KvPrewarmView (kv/precache.h), TtlClass +
//                        TtlClassName (kv/cache_key.h), ConversationHandle
//                        (kv/conversation_registry.h), PromptCacheEntryInfo
//                        (kv/prompt_cache.h), KvFileInfo (kv/kv_store.h)
//   weight residency     ResidencyState + ResidencyStateName +
//                        ParseResidencyState, ResidencyMode +
//                        ResidencyModeName, WeightLoadSource +
//                        WeightLoadSourceName, CompactResult
//                        (weights/weight_cache.h)
// Code above the runtime gets them from this header (runtime.h includes it)
// and never includes an engine, kv or weights header itself: this list is
// the whole of what it uses of those layers. The stats of the weight cache
// and of the precaches are not here: the runtime reports them in snapshot
// structs of its own (runtime/snapshots.h). The server's structure test
// (src/server/CMakeLists.txt, server_layering) fails when a server source
// includes one of those layers' headers.
//
// Thread safety: value types and pure functions.
#pragma once

#include "arbiter/engine/chat_template.h"
#include "arbiter/engine/engine.h"
#include "arbiter/kv/cache_key.h"
#include "arbiter/kv/conversation_registry.h"
#include "arbiter/kv/kv_store.h"
#include "arbiter/kv/precache.h"
#include "arbiter/kv/prompt_cache.h"
#include "arbiter/weights/weight_cache.h"
