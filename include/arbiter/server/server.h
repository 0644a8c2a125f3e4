// arbiter/server/server.h — the HTTP server: OpenAI-compatible API plus
// health and admin status, over arbiter's event-driven HTTP/1.1 transport
// (src/server/internal/http/http_server.h; docs/http-api.md).
//
// Routes:
//   GET  /health                  open (no auth): {"status":"ok"}
//   GET  /v1/models               OpenAI list; each model also carries
//                                 "capability", "status" (ready | loading |
//                                 loaded | failed) and "error" when failed
//   POST /v1/chat/completions     non-streaming and SSE streaming
//   POST /v1/completions          non-streaming and SSE streaming
//   POST /v1/embeddings
//   GET  /admin/status            the MemoryArbiter's stats snapshot (budget,
//                                 charged bytes by kind, pressure, per-model
//                                 role, state, ref_count, bytes, and the
//                                 weights' residency, device_resident,
//                                 host_resident, weight_bytes), the
//                                 "weight_cache" snapshot and the device
//                                 "pool" stats
//   POST /admin/pressure          {"level","free_mb"} → the pressure bridge
//   POST /admin/models/{name}/load    acquire + release: loaded, unpinned
//   POST /admin/models/{name}/unload  ?timeout_ms= (default 10000); 409 while
//                                 held by requests
//   POST /admin/models/{name}/residency {"target": "unpinned" |
//                                 "pinned_system" | "pinned_device"}: the
//                                 weights' residency floor (WeightCache::
//                                 SetResidency, either mode); 404 unknown
//                                 model, 400 bad target, 409 a pin that cannot
//                                 fit (with the reason)
//   POST /admin/compact           {"reload": [names]} (body optional): frees
//                                 every idle on-demand device copy, reloads
//                                 the listed models → {"reloaded",
//                                 "resident_bytes_after", "freed_bytes",
//                                 "skipped_leased"}
//   GET  /admin/events            SSE: `event: <type>\ndata: <json>` per
//                                 arbiter event; a bounded queue per client
//                                 (oldest dropped, reported as `event:
//                                 dropped`); ends when the server stops;
//                                 at most threads/2 streams (503 beyond)
//   POST /admin/prewarm           {"model","conversation_id","messages"|"prompt",
//                                 "cache_ttl"}: prefills a conversation's stable
//                                 prefix on its slot → {"slot","prefix_tokens",
//                                 "cached_tokens","computed_tokens","prefill_ms"}
//   POST /admin/conversations/{id}/close  [?model=] persists the
//                                 conversation's KV, closes it; 404 unknown
//   GET  /admin/kv                slots (conversation, tokens), prompt-cache
//                                 entries, KV files (class, size, age), counters
//   GET  /metrics                 Prometheus text (API key required when one
//                                 is set, unless [server] metrics_public)
//
// Limits and policy (docs/http-api.md "Limits, timeouts, cancellation", STYLE.md rule
// 11): binds loopback by default; bodies over max_body_bytes → 413; read and
// write timeouts, and request_timeout_s for a whole request (408, slowloris
// guard); JSON nesting ≤ 128; keep-alive caps; at most max_connections open
// connections (beyond: an immediate 503); one event loop owns every socket, so
// idle or half-sent connections cost no thread, and /health, /metrics,
// /admin/status and /v1/models are answered on it even while every worker is
// busy; a fixed worker pool (threads; default 8 + Σ parallel) runs the rest,
// with at most queue_max requests waiting (503 beyond). With an API key configured, /v1/*, /admin/* and /metrics require
// `Authorization: Bearer KEY` (401 otherwise). Errors are OpenAI-shaped
// {"error":{"message","type","code"}}: 400 bad input, 401, 404 unknown model
// or route, 408, 409 (unload of a held model), 413, 503 + Retry-After when
// the budget refuses (code "budget_exceeded"), critical memory pressure
// refuses a non-text model (code "memory_pressure") or the arbiter is busy,
// 503 + Retry-After (code "not_resident") in externally-managed mode for a
// model whose weights are not device-resident (the reference's message),
// 503 (no Retry-After, code "model_load_failed") when the model failed to
// load, 500 only for bugs.
//
// Cancellation: a client that disconnects stops its generation at the next
// token, streaming or not (the transport keeps reading the connection while
// the handler runs and sees the hang-up). Stop() also cancels every
// generation.
//
// Thread safety: Start/Run/Stop may be called from different threads; Stop()
// is idempotent and safe to call before, during or after Run(). Not
// async-signal-safe: call Stop() from a normal thread (e.g. one that
// sigwait()s), not from a signal handler.
// Lifetime: the Runtime must outlive the Server.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/runtime/config.h"
#include "arbiter/runtime/runtime.h"

namespace arbiter {

class Server {
 public:
  // Serves `runtime`'s models and admin operations (HTTP only: every
  // operation is the Runtime's). `settings.threads == 0` picks 8 + Σ
  // parallel of the configured models. `runtime` must outlive the Server.
  Server(ServerSettings settings, Runtime* runtime);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds settings.host:settings.port (port 0: any free port).
  // Errors: kUnavailable naming the address when it cannot be bound.
  Status Bind();
  // The bound port. REQUIRES: Bind() succeeded.
  int port() const;
  // Serves until Stop(). REQUIRES: Bind() succeeded. Errors: kInternal when
  // the listener fails.
  Status Run();
  // Stops accepting, cancels running generations, ends every events stream,
  // lets handlers finish. Waits for them without a bound: a handler stuck in
  // a backend call keeps it waiting (ShutdownDeadline bounds the whole
  // shutdown).
  void Stop();

  // The requests whose handlers are running now, oldest first, one line
  // each: `POST /v1/audio/speech from 127.0.0.1:41234, running for 12.3 s`
  // (the path's control characters escaped, at most 256 bytes of it).
  // Thread-safe; never blocks on a handler.
  std::vector<std::string> DescribeRunning() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbiter
