// The HTTP server (cpp-httplib): routes, auth, limits, SSE streaming.
//
// Request path (ARCHITECTURE.md "One chat request, end to end"):
//   0. the request (headers and body) must arrive within request_timeout_s,
//      else 408 and the connection is closed (Note [Slow clients] in
//      server/internal/deadline_stream.h);
//   1. pre-routing: API key check for /v1/* and /admin/* (401);
//   2. the body (≤ max_body_bytes, else httplib answers 413 and the error
//      handler writes the JSON body) is parsed into a native request struct
//      (openai.h) — 400 naming the field on any problem;
//   3. the model is resolved against the registered models (404) and its
//      capability checked (400);
//   4. MemoryArbiter::Acquire pins it, loading it if needed (503 on budget
//      refusal, busy timeout or load failure);
//   5. the prompt is built (chat template) and tokenized and checked against
//      the context *before* any byte is sent, so a streaming response never
//      starts with a request error;
//   6. the engine generates; streaming sends SSE chunks from httplib's
//      chunked content provider on the same worker thread;
//   7. the handle is released as soon as generation ends.
//
// Note [Cancellation]
// Every generation gets a CancelFn, polled by the engine between tokens and
// while waiting for a slot. It returns true when the server is stopping, or
// the client is gone: for SSE, when a write fails or sink.is_writable()
// (select + MSG_PEEK liveness check in httplib 0.11.4) says so; for
// non-streaming requests, when the ConnectionProbe sees a hang-up on the
// request's socket.
#include "arbiter/server/server.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/base/size.h"
#include "arbiter/engine/engine.h"
#include "arbiter/kv/precache.h"
#include "arbiter/server/kv_service.h"
#include "arbiter/server/openai.h"
#include "server/internal/connection_probe.h"
#include "server/internal/deadline_stream.h"
#include "server/internal/event_stream.h"
#include "server/internal/metrics.h"

namespace arbiter {
namespace {

using json = nlohmann::json;
using server_internal::ConnectionProbe;
using server_internal::DeadlineStream;
using server_internal::EventQueue;
using server_internal::ServerMetrics;
using server_internal::WaitReadable;

constexpr const char* kJson = "application/json";
constexpr const char* kInvalidRequest = "invalid_request_error";
constexpr const char* kServerError = "server_error";
constexpr int kRetryAfterSeconds = 5;
// GET /admin/events: events buffered per connection before the oldest are
// dropped (and counted), and how often an idle stream checks that its client
// is still there (real ms) and sends a keep-alive comment (s).
constexpr size_t kEventQueueCapacity = 1024;
constexpr int kEventPollMs = 250;
constexpr int kEventKeepAliveS = 15;
// POST /admin/models/{name}/unload: default and largest ?timeout_ms=.
constexpr int64_t kDefaultUnloadTimeoutMs = 10000;
constexpr int64_t kMaxUnloadTimeoutMs = 3600000;

// The route pattern of `path` for the arbiter_http_requests_total label
// (bounded cardinality: model names never become label values here).
std::string RouteLabel(const std::string& path) {
  static const std::set<std::string, std::less<>> kFixed = {
      "/health",        "/v1/models",     "/v1/chat/completions", "/v1/completions",
      "/v1/embeddings", "/admin/status",  "/admin/pressure",      "/admin/events",
      "/admin/compact", "/admin/prewarm", "/admin/kv",    "/metrics"};
  if (kFixed.count(path) != 0) return path;
  if (path.rfind("/admin/conversations/", 0) == 0 && path.size() > 27 &&
      path.compare(path.size() - 6, 6, "/close") == 0) {
    return "/admin/conversations/{id}/close";
  }
  constexpr std::string_view kModels = "/admin/models/";
  if (path.rfind(kModels, 0) == 0) {
    for (std::string_view action : {"/load", "/unload", "/residency"}) {
      if (path.size() > kModels.size() + action.size() &&
          path.compare(path.size() - action.size(), action.size(), action) == 0) {
        return fmt::format("/admin/models/{{name}}{}", action);
      }
    }
  }
  return "other";
}
// Default completion length for /v1/completions (OpenAI's default).
constexpr int kDefaultCompletionTokens = 16;

void SendError(httplib::Response& res, int status, std::string_view message,
               std::string_view type, std::string_view code, int retry_after_s = 0) {
  res.status = status;
  if (retry_after_s > 0) res.set_header("Retry-After", std::to_string(retry_after_s));
  res.set_content(ErrorJson(message, type, code), kJson);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

int64_t UnixNow() { return static_cast<int64_t>(std::time(nullptr)); }

// The stream the calling worker thread is reading a request from (set by
// HttpServer while httplib processes the request), for the error handler.
thread_local const DeadlineStream* tls_request_stream = nullptr;

// True when the calling worker's current request ran out of
// request_timeout_s while being read (Note [Slow clients]).
bool RequestReadTimedOut() {
  return tls_request_stream != nullptr && tls_request_stream->deadline_expired();
}

// Two changes to httplib::Server, hence the subclass:
// - httplib 0.11 listens with a backlog of 5: a burst of more simultaneous
//   connects gets SYNs dropped and waits for the 1 s retransmission. Linux
//   lets listen() be called again on a listening socket to raise the backlog;
//   the socket is a protected member.
// - Each connection is served by our keep-alive loop (httplib's, with the
//   same limits) over a DeadlineStream, which bounds the time to send a whole
//   request: Note [Slow clients] in server/internal/deadline_stream.h.
class HttpServer : public httplib::Server {
 public:
  void RaiseListenBacklog() {
    const socket_t sock = svr_sock_;
    if (sock != INVALID_SOCKET) ::listen(sock, SOMAXCONN);
  }
  void set_request_timeout(std::chrono::milliseconds timeout) { request_timeout_ = timeout; }

 private:
  // Overrides httplib's (private virtual) connection loop; called on a worker
  // thread for every accepted socket, which it closes.
  bool process_and_close_socket(socket_t sock) override {
    using std::chrono::milliseconds;
    using std::chrono::seconds;
    const auto stopping = [this] { return svr_sock_ == INVALID_SOCKET; };
    const milliseconds read_timeout =
        seconds(read_timeout_sec_) + milliseconds(read_timeout_usec_ / 1000);
    const milliseconds write_timeout =
        seconds(write_timeout_sec_) + milliseconds(write_timeout_usec_ / 1000);
    bool ret = false;
    for (size_t left = keep_alive_max_count_; left > 0; --left) {
      if (!WaitReadable(sock, seconds(keep_alive_timeout_sec_), stopping)) break;
      DeadlineStream stream(sock, read_timeout, write_timeout,
                            std::chrono::steady_clock::now() + request_timeout_);
      bool connection_closed = false;
      tls_request_stream = &stream;
      ret = process_request(stream, /*close_connection=*/left == 1, connection_closed, nullptr);
      tls_request_stream = nullptr;
      if (!ret || connection_closed || stream.deadline_expired()) break;
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ret;
  }

  std::chrono::milliseconds request_timeout_{std::chrono::seconds(60)};
};

}  // namespace

struct Server::Impl {
  ServerSettings settings;
  MemoryArbiter* arbiter;
  BridgePressureSource* bridge;  // may be null (no POST /admin/pressure)
  std::string pressure_source;   // the OS source's name, for /admin/status
  WeightCache* weights;          // may be null
  ServeKv* kv;                   // may be null: no KV precache
  int threads;
  HttpServer http;
  std::map<std::string, Capability, std::less<>> models;  // immutable after construction
  int64_t started_at = UnixNow();
  std::atomic<bool> stopping{false};
  int port = -1;
  // Shared with the event listener, which may run after the subscription is
  // gone (Note [Event stream lifetime] in internal/event_stream.h).
  std::shared_ptr<ServerMetrics> metrics = std::make_shared<ServerMetrics>();
  ArbiterEventSubscription metrics_sub;
  // Critical pressure → demote idle device weights to their floors.
  ArbiterEventSubscription demote_sub;
  // Low or critical pressure → the prompt cache spills to disk.
  ArbiterEventSubscription spill_sub;
  // The KV maintenance thread (Note [KV maintenance]).
  Mutex kv_mu;
  CondVar kv_wake{&kv_mu};
  bool kv_stop GUARDED_BY(kv_mu) = false;
  std::thread kv_thread;
  std::atomic<uint64_t> kv_files_swept{0};
  // Open GET /admin/events streams; Stop() closes them.
  Mutex streams_mu;
  std::set<std::shared_ptr<EventQueue>> streams GUARDED_BY(streams_mu);

  Impl(ServerSettings s, MemoryArbiter* a, int total_parallel, BridgePressureSource* b,
       std::string source, WeightCache* w, ServeKv* k)
      : settings(std::move(s)), arbiter(a), bridge(b), pressure_source(std::move(source)),
        weights(w), kv(k) {
    threads = settings.threads > 0 ? settings.threads : 8 + std::max(1, total_parallel);
    for (const ModelStats& m : arbiter->Stats().models) models.emplace(m.name, m.capability);
    std::shared_ptr<ServerMetrics> m = metrics;
    metrics_sub = arbiter->OnEvent([m](const ArbiterEvent& e) { m->OnEvent(e); });
    if (weights != nullptr) {
      WeightCache* cache = weights;
      demote_sub = arbiter->OnEvent([cache](const ArbiterEvent& e) {
        if (e.type != ArbiterEventType::kMemoryPressure ||
            e.level != MemoryPressureLevel::kCritical) {
          return;
        }
        const uint64_t freed = cache->EvictIdle(std::numeric_limits<uint64_t>::max());
        if (freed > 0) {
          spdlog::warn("critical memory pressure: demoted {} of idle device weights to their "
                       "floors",
                       FormatSize(freed));
        }
      });
    }
    if (kv != nullptr && kv->prompt_cache != nullptr) {
      PromptCache* pc = kv->prompt_cache.get();
      spill_sub = arbiter->OnEvent([pc](const ArbiterEvent& e) {
        if (e.type != ArbiterEventType::kMemoryPressure ||
            e.level == MemoryPressureLevel::kNominal) {
          return;
        }
        const uint64_t spilled = pc->Spill(std::numeric_limits<uint64_t>::max());
        if (spilled > 0) {
          spdlog::warn("memory pressure: spilled {} of prompt cache to disk", FormatSize(spilled));
        }
      });
    }
    Configure();
    Routes();
    if (kv != nullptr) kv_thread = std::thread([this] { KvMaintenanceLoop(); });
  }

  ~Impl() { StopKvThread(); }

  void StopKvThread() {
    {
      MutexLock l(&kv_mu);
      kv_stop = true;
      kv_wake.SignalAll();
    }
    if (kv_thread.joinable()) kv_thread.join();
  }

  // Note [KV maintenance]
  // One thread per server, when it has a KV precache. Every [kv]
  // eviction_interval: the disk tier's sweep (expired files, disk budget),
  // the prompt cache's expired entries, and each text model's idle
  // conversations (persisted .long, closed). Every [kv] keepalive_interval:
  // each loaded text model's keep-alive. A model that is not loaded is never
  // loaded for this: its engine is taken only while the arbiter reports it
  // resident (a handle keeps it so during the pass).
  void KvMaintenanceLoop() {
    const int64_t evict_every = kv->settings.eviction_interval_ms;
    const int64_t keepalive_every = kv->settings.keepalive_interval_ms;
    auto next_evict = std::chrono::steady_clock::now() + std::chrono::milliseconds(evict_every);
    auto next_keepalive =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(keepalive_every);
    while (true) {
      {
        MutexLock l(&kv_mu);
        const auto until = std::min(next_evict, next_keepalive);
        while (!kv_stop && std::chrono::steady_clock::now() < until) kv_wake.WaitUntil(until);
        if (kv_stop) return;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_evict) {
        next_evict = now + std::chrono::milliseconds(evict_every);
        KvEvictionPass();
      }
      if (now >= next_keepalive) {
        next_keepalive = now + std::chrono::milliseconds(keepalive_every);
        for (const auto& [name, pc] : kv->precaches) {
          std::optional<ArbiterHandle> h = ResidentHandle(name);
          const int n = pc->KeepAlive(h ? h->backend<Engine>() : nullptr);
          if (n > 0) spdlog::info("kv: model \"{}\": keep-alive re-warmed {} conversation(s)", name, n);
        }
      }
    }
  }

  void KvEvictionPass() {
    const KvSweepResult swept = kv->store->Sweep();
    kv_files_swept.fetch_add(static_cast<uint64_t>(swept.expired + swept.over_budget));
    if (swept.expired + swept.over_budget > 0) {
      spdlog::info("kv: swept {} expired and {} over-budget file(s) ({})", swept.expired,
                   swept.over_budget, FormatSize(swept.bytes_freed));
    }
    if (kv->prompt_cache != nullptr) kv->prompt_cache->PurgeExpired();
    for (const auto& [name, pc] : kv->precaches) {
      std::optional<ArbiterHandle> h = ResidentHandle(name);
      const std::vector<std::string> ids = pc->EvictIdle(h ? h->backend<Engine>() : nullptr);
      if (!ids.empty()) {
        spdlog::info("kv: model \"{}\": closed {} idle conversation(s), KV saved", name, ids.size());
      }
    }
  }

  // A handle on `name` when the arbiter reports it loaded; never loads it.
  std::optional<ArbiterHandle> ResidentHandle(const std::string& name) {
    for (const ModelStats& m : arbiter->Stats().models) {
      if (m.name != name || m.state != ModelState::kLoaded) continue;
      auto it = models.find(name);
      if (it == models.end()) return std::nullopt;
      auto h = arbiter->Acquire(it->second, name, Deadline(std::chrono::seconds(1)));
      if (h.ok() && h->backend<Engine>() != nullptr) return std::move(h).value();
    }
    return std::nullopt;
  }

  size_t OpenStreams() {
    MutexLock l(&streams_mu);
    return streams.size();
  }

  // Ends every events stream (their workers notice within kEventPollMs).
  void CloseStreams() {
    std::set<std::shared_ptr<EventQueue>> open;
    {
      MutexLock l(&streams_mu);
      open = streams;
    }
    for (const auto& q : open) q->Close();
  }

  void Configure() {
    const int n = threads;
    http.new_task_queue = [n] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    http.set_payload_max_length(settings.max_body_bytes);
    http.set_read_timeout(settings.read_timeout_s, 0);
    http.set_request_timeout(std::chrono::seconds(settings.request_timeout_s));
    http.set_write_timeout(settings.write_timeout_s, 0);
    http.set_keep_alive_max_count(static_cast<size_t>(settings.keep_alive_max));
    http.set_keep_alive_timeout(settings.keep_alive_timeout_s);
    http.set_tcp_nodelay(true);

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (settings.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
      const bool protected_path =
          req.path.rfind("/v1/", 0) == 0 || req.path.rfind("/admin/", 0) == 0 ||
          (req.path == "/metrics" && !settings.metrics_public);
      if (!protected_path) return httplib::Server::HandlerResponse::Unhandled;
      const std::string auth = req.get_header_value("Authorization");
      constexpr std::string_view kBearer = "Bearer ";
      if (auth.size() > kBearer.size() && auth.compare(0, kBearer.size(), kBearer) == 0 &&
          ConstantTimeEquals(std::string_view(auth).substr(kBearer.size()), settings.api_key)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      res.set_header("WWW-Authenticate", "Bearer");
      // The body (if any) was not read; do not reuse the connection.
      res.set_header("Connection", "close");
      SendError(res, 401,
                auth.empty() ? "missing API key: send \"Authorization: Bearer <key>\""
                             : "invalid API key",
                kInvalidRequest, "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    });

    // Fills a JSON body for statuses httplib produced itself (404 no route,
    // 413 payload too large, 400 unparsable request line ...).
    httplib::Server::HandlerWithResponse on_error = [this](const httplib::Request& req,
                                                           httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      if (RequestReadTimedOut()) {
        // httplib reports a failed read as 400; the cause was the deadline.
        res.set_header("Connection", "close");
        SendError(res, 408,
                  fmt::format("the request was not received within {} s ([server] "
                              "request_timeout_s); the connection is closed",
                              settings.request_timeout_s),
                  kInvalidRequest, "request_timeout");
        return httplib::Server::HandlerResponse::Handled;
      }
      switch (res.status) {
        case 404:
          SendError(res, 404, fmt::format("no route for {} {}", req.method, req.path),
                    kInvalidRequest, "not_found");
          break;
        case 413:
          SendError(res, 413,
                    fmt::format("request body is larger than the limit of {} bytes "
                                "([server] max_body_bytes)",
                                settings.max_body_bytes),
                    kInvalidRequest, "request_too_large");
          break;
        default:
          SendError(res, res.status,
                    res.status == 400 ? std::string("malformed HTTP request")
                                      : fmt::format("HTTP error {}", res.status),
                    res.status >= 500 ? kServerError : kInvalidRequest, "");
      }
      return httplib::Server::HandlerResponse::Handled;
    };
    http.set_error_handler(std::move(on_error));

    http.set_exception_handler(
        [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown exception";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          spdlog::error("bug: {} {} threw: {}", req.method, req.path, what);
          SendError(res, 500, fmt::format("internal error: {}", what), kServerError,
                    "internal_error");
        });

    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics->OnHttpRequest(RouteLabel(req.path), res.status);
      spdlog::info("{} {} {} ({}:{})", req.method, req.path, res.status, req.remote_addr,
                   req.remote_port);
    });
  }

  void Routes() {
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", kJson);
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      HandleModels(res);
    });
    http.Get("/admin/status", [this](const httplib::Request&, httplib::Response& res) {
      HandleStatus(res);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      HandleChat(req, res);
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      HandleCompletion(req, res);
    });
    http.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
      HandleEmbeddings(req, res);
    });
    http.Post("/admin/pressure", [this](const httplib::Request& req, httplib::Response& res) {
      HandlePressure(req, res);
    });
    http.Post(R"(/admin/models/([^/]+)/load)",
              [this](const httplib::Request& req, httplib::Response& res) {
                HandleLoad(req.matches[1], res);
              });
    http.Post(R"(/admin/models/([^/]+)/unload)",
              [this](const httplib::Request& req, httplib::Response& res) {
                HandleUnload(req, req.matches[1], res);
              });
    http.Post(R"(/admin/models/([^/]+)/residency)",
              [this](const httplib::Request& req, httplib::Response& res) {
                HandleResidency(req, req.matches[1], res);
              });
    http.Post("/admin/compact", [this](const httplib::Request& req, httplib::Response& res) {
      HandleCompact(req, res);
    });
    http.Get("/admin/events", [this](const httplib::Request&, httplib::Response& res) {
      HandleEvents(res);
    });
    http.Post("/admin/prewarm", [this](const httplib::Request& req, httplib::Response& res) {
      HandlePrewarm(req, res);
    });
    http.Post(R"(/admin/conversations/(.+)/close)",
              [this](const httplib::Request& req, httplib::Response& res) {
                HandleCloseConversation(req, req.matches[1], res);
              });
    http.Get("/admin/kv", [this](const httplib::Request&, httplib::Response& res) {
      if (kv == nullptr) {
        return SendError(res, 503, "this server has no KV precache", kServerError, "unavailable");
      }
      json j = json::parse(KvStatusJson(*kv));
      j["files_swept"] = kv_files_swept.load();
      res.set_content(j.dump(), kJson);
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::optional<WeightCacheStats> w;
      if (weights != nullptr) w = weights->Stats();
      std::optional<server_internal::KvMetricsSample> k;
      if (kv != nullptr) {
        k.emplace();
        for (const auto& [name, pc] : kv->precaches) k->models.emplace_back(name, pc->counters());
        k->files_swept = kv_files_swept.load();
        if (kv->prompt_cache != nullptr) {
          k->prompt_cache_bytes = kv->prompt_cache->bytes();
          k->prompt_cache_entries = kv->prompt_cache->size();
        }
        k->disk_bytes = kv->store->DiskBytes();
      }
      res.set_content(metrics->Scrape(arbiter->Stats(), arbiter->ledger()->Snapshot(),
                                      w ? &*w : nullptr, k ? &*k : nullptr),
                      "text/plain; version=0.0.4");
    });
  }

  // ---- model resolution and acquisition -----------------------------------

  // 404 / 400 unless `name` is a registered model of capability `want`.
  bool CheckModel(const std::string& name, Capability want, httplib::Response& res) {
    auto it = models.find(name);
    if (it == models.end()) {
      SendError(res, 404, fmt::format("model \"{}\" not found", name), kInvalidRequest,
                "model_not_found");
      return false;
    }
    if (it->second != want) {
      SendError(res, 400,
                fmt::format("model \"{}\" is a {} model; {}", name, CapabilityName(it->second),
                            it->second == Capability::kEmbedding
                                ? "use /v1/embeddings"
                                : "use /v1/chat/completions or /v1/completions"),
                kInvalidRequest, "wrong_model_capability");
      return false;
    }
    return true;
  }

  // Pins the model; on failure writes the error response and returns nullopt.
  std::optional<ArbiterHandle> Acquire(const std::string& name, Capability cap,
                                       httplib::Response& res) {
    // Externally managed: the control plane decides residency; a model whose
    // weights are not on the device is refused before anything loads.
    if (weights != nullptr && weights->mode() == ResidencyMode::kExternallyManaged &&
        weights->DeviceResident(name) == false) {
      SendError(res, 503, NotResidentError(name).message(), kServerError, "not_resident",
                kRetryAfterSeconds);
      return std::nullopt;
    }
    auto h = arbiter->Acquire(cap, name, Deadline(std::chrono::seconds(settings.acquire_timeout_s)));
    if (h.ok()) {
      if (h->backend<Engine>() == nullptr) {
        SendError(res, 500, fmt::format("model \"{}\" has no engine backend", name), kServerError,
                  "internal_error");
        return std::nullopt;
      }
      return std::move(h).value();
    }
    const Status& st = h.status();
    // Load errors carry the arbiter's documented prefix; everything else is
    // the arbiter refusing or timing out (CheckModel already ruled out
    // unknown names and wrong capabilities).
    const bool load_failed =
        st.message().rfind(fmt::format("model \"{}\" failed to load", name), 0) == 0;
    if (IsNotResident(st)) {  // a load in externally-managed mode (keeps the code)
      SendError(res, 503, NotResidentError(name).message(), kServerError, "not_resident",
                kRetryAfterSeconds);
    } else if (load_failed && st.code() == StatusCode::kResourceExhausted) {
      // The weights could not get room in the budget: transient.
      SendError(res, 503, st.message(), kServerError, "budget_exceeded", kRetryAfterSeconds);
    } else if (load_failed) {
      // 503 without Retry-After: retrying will not help until the files are fixed.
      SendError(res, 503, st.message(), kServerError, "model_load_failed");
    } else if (st.code() == StatusCode::kResourceExhausted) {
      SendError(res, 503, st.message(), kServerError, "budget_exceeded", kRetryAfterSeconds);
    } else if (st.code() == StatusCode::kDeadlineExceeded) {
      SendError(res, 503, st.message(), kServerError, "model_loading", kRetryAfterSeconds);
    } else if (st.code() == StatusCode::kUnavailable) {
      // Critical memory pressure refuses non-text capabilities until the
      // level drops; shutting down refuses everything.
      const bool pressure = st.message().find("memory pressure") != std::string::npos;
      SendError(res, 503, st.message(), kServerError,
                pressure ? "memory_pressure" : "unavailable", kRetryAfterSeconds);
    } else {
      spdlog::error("bug: unexpected acquire error for model \"{}\": {}", name, st.ToString());
      SendError(res, 500, st.message(), kServerError, "internal_error");
    }
    return std::nullopt;
  }

  // 400 unless `ids` is a non-empty, in-vocabulary prompt leaving room for at
  // least one generated token.
  bool CheckPrompt(const Engine& engine, const std::string& model,
                   const std::vector<int32_t>& ids, httplib::Response& res) {
    if (ids.empty()) {
      SendError(res, 400, "the prompt is empty", kInvalidRequest, "empty_prompt");
      return false;
    }
    if (static_cast<int>(ids.size()) > engine.n_ctx() - 1) {
      SendError(res, 400,
                fmt::format("the prompt is {} tokens; model \"{}\" has a context of {} tokens "
                            "(shorten the prompt or raise [[models]] ctx)",
                            ids.size(), model, engine.n_ctx()),
                kInvalidRequest, "context_length_exceeded");
      return false;
    }
    const int vocab = engine.tokenizer().vocab_size();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab) {
        SendError(res, 400,
                  fmt::format("\"prompt[{}]\" is token id {}, outside the model's vocabulary "
                              "[0, {})",
                              i, ids[i], vocab),
                  kInvalidRequest, "invalid_token_id");
        return false;
      }
    }
    return true;
  }

  // ---- generation ------------------------------------------------------------

  struct GenJob {
    ArbiterHandle handle;
    Engine* engine = nullptr;
    GenerationRequest request;
    bool chat = true;
    std::string id;
    std::string model;
    int64_t created = 0;
    bool include_usage = false;
    std::string echo;  // completions: prompt text prepended to the output
    // The KV precache (null: the engine picks the slot by longest prefix).
    KvPrecache* precache = nullptr;
    std::string conversation;  // request conversation_id ("" = none)
    TtlClass ttl = TtlClass::kShort;
  };

  // Runs the job's generation, through the model's KV precache when it has
  // one.
  static Result<GenerationResult> Run(GenJob& job, const TextCallback& on_text,
                                      const CancelFn& cancel, KvOutcome* outcome) {
    if (job.precache == nullptr) return job.engine->Generate(job.request, on_text, cancel);
    return job.precache->Generate(job.engine, job.conversation, job.ttl, job.request, on_text,
                                  cancel, outcome);
  }

  // The job's KV fields from the request's cache fields.
  void SetCacheFields(GenJob& job, const CacheFields& c) {
    job.precache = kv != nullptr ? kv->Find(job.model) : nullptr;
    job.conversation = c.conversation_id;
    if (!c.cache_ttl.empty()) {
      Result<TtlClass> t = ParseTtlClass(c.cache_ttl);
      if (t.ok()) job.ttl = *t;
    }
  }

  static void SendGenerationError(httplib::Response& res, const Status& st) {
    if (IsNotResident(st)) {
      // Externally managed: the weights were demoted since the acquire.
      SendError(res, 503, st.message(), kServerError, "not_resident", kRetryAfterSeconds);
    } else if (st.code() == StatusCode::kResourceExhausted) {
      // The weights had to be reloaded and the budget refused them.
      SendError(res, 503, st.message(), kServerError, "budget_exceeded", kRetryAfterSeconds);
    } else if (st.code() == StatusCode::kInvalidArgument) {
      SendError(res, 400, st.message(), kInvalidRequest, "");
    } else if (st.code() == StatusCode::kFailedPrecondition) {
      SendError(res, 400, st.message(), kInvalidRequest, "");
    } else {
      spdlog::error("generation failed: {}", st.ToString());
      SendError(res, 500, st.message(), kServerError, "internal_error");
    }
  }

  void RunNonStreaming(const httplib::Request& req, httplib::Response& res, GenJob& job) {
    const ConnectionProbe probe =
        ConnectionProbe::Find(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
    CancelFn cancel = [this, &probe] { return stopping.load() || probe.PeerGone(); };
    TextCallback ignore = [](std::string_view) { return true; };
    KvOutcome kv_outcome;
    Result<GenerationResult> result = Run(job, ignore, cancel, &kv_outcome);
    job.handle.Release();
    if (kv_outcome.slot >= 0) {
      res.set_header("X-Arbiter-Kv-Slot", std::to_string(kv_outcome.slot));
      res.set_header("X-Arbiter-Kv-Source", std::string(KvSourceName(kv_outcome.source)));
      if (kv_outcome.restored_tokens > 0) {
        res.set_header("X-Arbiter-Kv-Restored", std::to_string(kv_outcome.restored_tokens));
      }
    }
    if (!result.ok()) return SendGenerationError(res, result.status());
    if (result->finish_reason == FinishReason::kCancelled) {
      spdlog::info("{} {}: client went away; generation stopped after {} tokens", req.method,
                   req.path, result->output_ids.size());
      SendError(res, 503, "generation cancelled", kServerError, "cancelled");
      return;
    }
    Usage usage{result->prompt_tokens, static_cast<int>(result->output_ids.size()),
                result->cached_tokens};
    if (job.chat) {
      res.set_content(ChatCompletionJson(job.id, job.created, job.model, result->text,
                                         result->finish_reason, usage),
                      kJson);
    } else {
      res.set_content(CompletionJson(job.id, job.created, job.model, job.echo + result->text,
                                     result->finish_reason, usage),
                      kJson);
    }
  }

  void RunStreaming(httplib::Response& res, std::shared_ptr<GenJob> job) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream", [this, job](size_t /*offset*/, httplib::DataSink& sink) {
          bool client_ok = true;
          auto send = [&](const std::string& payload) {
            if (!client_ok) return false;
            const std::string frame = SseData(payload);
            if (!sink.write(frame.data(), frame.size())) client_ok = false;
            return client_ok;
          };
          const std::string assistant = "assistant";
          const std::string empty;
          if (job->chat) {
            send(ChatChunkJson(job->id, job->created, job->model, &assistant, &empty, nullptr,
                               job->include_usage));
          } else if (!job->echo.empty()) {
            send(CompletionChunkJson(job->id, job->created, job->model, job->echo, nullptr,
                                     job->include_usage));
          }
          TextCallback on_text = [&](std::string_view delta) {
            const std::string text(delta);
            return send(job->chat ? ChatChunkJson(job->id, job->created, job->model, nullptr,
                                                  &text, nullptr, job->include_usage)
                                  : CompletionChunkJson(job->id, job->created, job->model, text,
                                                        nullptr, job->include_usage));
          };
          CancelFn cancel = [&] {
            return !client_ok || stopping.load() || !sink.is_writable();
          };
          Result<GenerationResult> result = Run(*job, on_text, cancel, nullptr);
          job->handle.Release();
          if (!client_ok) {
            spdlog::info("stream {}: client went away; generation stopped", job->id);
            return false;  // closes the connection
          }
          if (!result.ok()) {
            // Headers are gone; report in-band, then end the stream.
            const Status& st = result.status();
            spdlog::error("stream {}: generation failed: {}", job->id, st.ToString());
            send(ErrorJson(st.message(), kServerError, "generation_failed"));
          } else if (result->finish_reason == FinishReason::kCancelled) {
            // The liveness check failed (client gone) or the server is stopping.
            spdlog::info("stream {}: cancelled after {} tokens ({})", job->id,
                         result->output_ids.size(),
                         stopping.load() ? "server stopping" : "client went away");
            return false;
          } else {
            const FinishReason fr = result->finish_reason;
            send(job->chat ? ChatChunkJson(job->id, job->created, job->model, nullptr, nullptr,
                                           &fr, job->include_usage)
                           : CompletionChunkJson(job->id, job->created, job->model, "", &fr,
                                                 job->include_usage));
            if (job->include_usage) {
              Usage usage{result->prompt_tokens, static_cast<int>(result->output_ids.size()),
                          result->cached_tokens};
              send(UsageChunkJson(job->id, job->created, job->model,
                                  job->chat ? "chat.completion.chunk" : "text_completion", usage));
            }
          }
          const std::string done = "data: [DONE]\n\n";
          if (!client_ok || !sink.write(done.data(), done.size())) return false;
          sink.done();
          return true;
        });
  }

  void HandleChat(const httplib::Request& req, httplib::Response& res) {
    Result<ChatRequest> parsed = ParseChatRequest(req.body);
    if (!parsed.ok()) {
      return SendError(res, 400, parsed.status().message(), kInvalidRequest, "invalid_request");
    }
    ChatRequest& r = *parsed;
    if (!CheckModel(r.model, Capability::kText, res)) return;
    std::optional<ArbiterHandle> handle = Acquire(r.model, Capability::kText, res);
    if (!handle) return;
    Engine* engine = handle->backend<Engine>();
    Result<ChatTemplateKind> kind = engine->chat_template();
    if (!kind.ok()) {
      return SendError(res, 400,
                       fmt::format("model \"{}\" has no chat template ({}); use /v1/completions",
                                   r.model, kind.status().message()),
                       kInvalidRequest, "no_chat_template");
    }
    auto job = std::make_shared<GenJob>();
    // Message text never becomes control tokens (no template injection).
    job->request.prompt_ids = EncodeChat(engine->tokenizer(), *kind, r.messages, true);
    if (!CheckPrompt(*engine, r.model, job->request.prompt_ids, res)) return;
    const int room = engine->n_ctx() - static_cast<int>(job->request.prompt_ids.size());
    job->request.max_tokens = std::min(r.max_tokens.value_or(room), std::max(room, 1));
    job->request.sampling = r.sampling.ToSamplingParams();
    job->request.stop = r.stop;
    job->handle = std::move(*handle);
    job->engine = engine;
    job->chat = true;
    job->id = NewCompletionId("chatcmpl");
    job->model = r.model;
    job->created = UnixNow();
    job->include_usage = r.include_usage;
    SetCacheFields(*job, r.cache);
    if (r.stream) return RunStreaming(res, std::move(job));
    RunNonStreaming(req, res, *job);
  }

  void HandleCompletion(const httplib::Request& req, httplib::Response& res) {
    Result<CompletionRequest> parsed = ParseCompletionRequest(req.body);
    if (!parsed.ok()) {
      return SendError(res, 400, parsed.status().message(), kInvalidRequest, "invalid_request");
    }
    CompletionRequest& r = *parsed;
    if (!CheckModel(r.model, Capability::kText, res)) return;
    std::optional<ArbiterHandle> handle = Acquire(r.model, Capability::kText, res);
    if (!handle) return;
    Engine* engine = handle->backend<Engine>();
    auto job = std::make_shared<GenJob>();
    job->request.prompt_ids =
        r.prompt_is_ids ? r.prompt_ids : engine->tokenizer().Encode(r.prompt, true);
    if (!CheckPrompt(*engine, r.model, job->request.prompt_ids, res)) return;
    // The engine stops at the context end (finish_reason "length").
    job->request.max_tokens = r.max_tokens.value_or(kDefaultCompletionTokens);
    job->request.sampling = r.sampling.ToSamplingParams();
    job->request.stop = r.stop;
    if (r.echo) {
      job->echo = r.prompt_is_ids ? engine->tokenizer().Decode(r.prompt_ids) : r.prompt;
    }
    job->handle = std::move(*handle);
    job->engine = engine;
    job->chat = false;
    job->id = NewCompletionId("cmpl");
    job->model = r.model;
    job->created = UnixNow();
    job->include_usage = r.include_usage;
    SetCacheFields(*job, r.cache);
    if (r.stream) return RunStreaming(res, std::move(job));
    RunNonStreaming(req, res, *job);
  }

  void HandleEmbeddings(const httplib::Request& req, httplib::Response& res) {
    Result<EmbeddingRequest> parsed = ParseEmbeddingRequest(req.body);
    if (!parsed.ok()) {
      return SendError(res, 400, parsed.status().message(), kInvalidRequest, "invalid_request");
    }
    EmbeddingRequest& r = *parsed;
    if (!CheckModel(r.model, Capability::kEmbedding, res)) return;
    std::optional<ArbiterHandle> handle = Acquire(r.model, Capability::kEmbedding, res);
    if (!handle) return;
    Engine* engine = handle->backend<Engine>();
    if (r.dimensions && *r.dimensions != engine->config().hidden_size) {
      return SendError(res, 400,
                       fmt::format("\"dimensions\" must be {} for model \"{}\" (got {})",
                                   engine->config().hidden_size, r.model, *r.dimensions),
                       kInvalidRequest, "invalid_request");
    }
    std::vector<std::vector<int32_t>> ids(r.input.size());
    int prompt_tokens = 0;
    for (size_t i = 0; i < r.input.size(); ++i) {
      ids[i] = engine->tokenizer().Encode(r.input[i], false);
      if (ids[i].empty() || static_cast<int>(ids[i].size()) > engine->n_ctx()) {
        return SendError(res, 400,
                         fmt::format("\"input[{}]\" is {} tokens; model \"{}\" accepts 1 to {}", i,
                                     ids[i].size(), r.model, engine->n_ctx()),
                         kInvalidRequest, "context_length_exceeded");
      }
      prompt_tokens += static_cast<int>(ids[i].size());
    }
    const ConnectionProbe probe =
        ConnectionProbe::Find(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
    CancelFn cancel = [this, &probe] { return stopping.load() || probe.PeerGone(); };
    std::vector<std::vector<float>> vectors;
    for (const auto& one : ids) {
      Result<std::vector<float>> v = engine->Embed(one, cancel);
      if (!v.ok()) {
        handle->Release();
        if (v.status().code() == StatusCode::kCancelled) {
          SendError(res, 503, "embedding cancelled", kServerError, "cancelled");
          return;
        }
        return SendGenerationError(res, v.status());
      }
      vectors.push_back(std::move(v).value());
    }
    handle->Release();
    res.set_content(EmbeddingsJson(r.model, vectors, r.base64, prompt_tokens), kJson);
  }

  // ---- listing and status ----------------------------------------------------

  void HandleModels(httplib::Response& res) {
    ArbiterStats stats = arbiter->Stats();
    json data = json::array();
    for (const ModelStats& m : stats.models) {
      json item = {{"id", m.name},
                   {"object", "model"},
                   {"created", started_at},
                   {"owned_by", "arbiter"},
                   {"capability", CapabilityName(m.capability)},
                   {"status", ModelStateName(m.state)}};
      if (m.state == ModelState::kFailed) item["error"] = m.last_error;
      data.push_back(std::move(item));
    }
    res.set_content(json{{"object", "list"}, {"data", std::move(data)}}.dump(), kJson);
  }

  static json WeightModelJson(const WeightModelStats& w) {
    return json{{"residency", ResidencyStateName(w.residency)},
                {"device_resident", w.device_resident},
                {"host_resident", w.host_resident},
                {"weight_bytes", w.weight_bytes},
                {"device_bytes", w.device_bytes},
                {"host_bytes", w.host_bytes},
                {"weight_leases", w.leases},
                {"weight_loads", w.loads},
                {"weight_evicts", w.evicts},
                {"weight_last_load_source", WeightLoadSourceName(w.last_load_source)},
                {"weight_last_load_seconds", w.last_load_seconds},
                {"floor_region", w.floor_region.empty() ? json(nullptr) : json(w.floor_region)}};
  }

  // The model's arbiter fields plus, with a weight cache, its weight fields
  // (and "ready": false in externally-managed mode unless device-resident).
  json FullModelJson(const ModelStats& m, const WeightCacheStats* w) {
    json item = ModelJson(m);
    bool ready = m.state != ModelState::kFailed;
    if (w != nullptr) {
      for (const WeightModelStats& wm : w->models) {
        if (wm.key != m.name) continue;
        item.update(WeightModelJson(wm));
        if (w->mode == ResidencyMode::kExternallyManaged && !wm.device_resident) ready = false;
      }
    }
    item["ready"] = ready;
    return item;
  }

  static json WeightCacheJson(const WeightCacheStats& w) {
    return json{{"mode", ResidencyModeName(w.mode)},
                {"max_bytes", w.max_bytes},
                {"resident_bytes", w.resident_bytes},
                {"pinned_bytes", w.pinned_bytes},
                {"host_bytes", w.host_bytes},
                {"max_scratch_bytes", w.max_scratch_bytes},
                {"weight_pool_bytes", w.budget.weight_pool},
                {"scratch_ceiling_bytes", w.budget.scratch_ceiling},
                {"pinned_over_commit", w.budget.pinned_over_commit},
                {"loads", w.loads},
                {"evicts", w.evicts},
                {"compactions", w.compactions},
                {"oversize_loads", w.oversize_loads},
                {"load_seconds", w.load_seconds}};
  }

  static json PoolJson(const MemoryPoolStats& p) {
    return json{{"in_use_bytes", p.in_use_bytes},
                {"limit_bytes", p.limit_bytes},
                {"free_bytes", p.free_bytes},
                {"peak_in_use_bytes", p.peak_in_use_bytes},
                {"largest_free_block_bytes", p.largest_free_block_bytes},
                {"fragmentation", p.fragmentation},
                {"live_blocks", p.live_blocks},
                {"free_blocks", p.free_blocks},
                {"num_allocs", p.num_allocs},
                {"num_frees", p.num_frees}};
  }

  static json ModelJson(const ModelStats& m) {
    json item = {{"name", m.name},
                 {"capability", CapabilityName(m.capability)},
                 {"role", ResidentRoleName(m.role)},
                 {"state", ModelStateName(m.state)},
                 {"status", ModelStateName(m.state)},
                 {"resident", m.state == ModelState::kLoaded},
                 {"bytes", m.bytes},
                 {"bytes_measured", m.bytes_measured},
                 {"ref_count", m.refcount},
                 {"refcount", m.refcount},
                 {"loads", m.loads},
                 {"load_failures", m.load_failures},
                 {"evictions", m.evictions},
                 {"last_load_ms", m.last_load_ms}};
    item["error"] = m.last_error.empty() ? json(nullptr) : json(m.last_error);
    return item;
  }

  void HandleStatus(httplib::Response& res) {
    ArbiterStats s = arbiter->Stats();
    std::optional<WeightCacheStats> w;
    if (weights != nullptr) w = weights->Stats();
    json models = json::array();
    for (const ModelStats& m : s.models) models.push_back(FullModelJson(m, w ? &*w : nullptr));
    const MemoryLedgerSnapshot ledger = arbiter->ledger()->Snapshot();
    json by_kind = json::object();
    for (size_t k = 0; k < kChargeKindCount; ++k) {
      by_kind[std::string(ChargeKindName(static_cast<ChargeKind>(k)))] = ledger.by_kind[k];
    }
    json j = {{"budget_bytes", s.budget_bytes},     {"charged_bytes", s.charged_bytes},
              {"resident_bytes", s.resident_bytes}, {"loading_bytes", s.loading_bytes},
              {"resident_models", s.resident_models},
              {"pressure", MemoryPressureLevelName(s.pressure)},
              {"pressure_source", pressure_source},
              {"event_streams", OpenStreams()},
              {"loads", s.loads},                   {"load_failures", s.load_failures},
              {"evictions", s.evictions},           {"models", std::move(models)},
              {"charged_by_kind", std::move(by_kind)},
              {"over_budget_bytes", ledger.over_budget_bytes},
              {"over_commits", ledger.over_commits}};
    if (w) {
      j["weight_cache"] = WeightCacheJson(*w);
      j["pool"] = PoolJson(w->pool);
    }
    res.set_content(j.dump(), kJson);
  }

  // ---- admin control -------------------------------------------------------

  std::optional<ModelStats> FindModelStats(const std::string& name) {
    for (ModelStats& m : arbiter->Stats().models) {
      if (m.name == name) return std::move(m);
    }
    return std::nullopt;
  }

  json ModelStatusJson(const std::string& name) {
    std::optional<ModelStats> m = FindModelStats(name);
    if (!m) return json::object();
    std::optional<WeightCacheStats> w;
    if (weights != nullptr) w = weights->Stats();
    return FullModelJson(*m, w ? &*w : nullptr);
  }

  // POST /admin/models/{name}/residency {"target": ...}.
  void HandleResidency(const httplib::Request& req, const std::string& name,
                       httplib::Response& res) {
    if (models.find(name) == models.end()) {
      return SendError(res, 404, fmt::format("model \"{}\" not found", name), kInvalidRequest,
                       "model_not_found");
    }
    if (weights == nullptr || !weights->Contains(name)) {
      return SendError(res, 409,
                       fmt::format("model \"{}\" has no weights registered (it failed its "
                                   "startup check; see /v1/models)",
                                   name),
                       kInvalidRequest, "model_broken");
    }
    json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    const char* usage =
        "request body must be a JSON object {\"target\": \"unpinned\" | \"pinned_system\" | "
        "\"pinned_device\"}";
    if (!body.is_object()) return SendError(res, 400, usage, kInvalidRequest, "invalid_request");
    auto t = body.find("target");
    if (t == body.end() || !t->is_string()) {
      return SendError(res, 400, usage, kInvalidRequest, "invalid_request");
    }
    Result<ResidencyState> target = ParseResidencyState(t->get<std::string>());
    if (!target.ok()) {
      return SendError(res, 400, fmt::format("\"target\": {}", target.status().message()),
                       kInvalidRequest, "invalid_request");
    }
    Result<ResidencyState> prev = weights->SetResidency(name, *target);
    if (!prev.ok()) {
      const Status& st = prev.status();
      if (st.code() == StatusCode::kResourceExhausted) {
        return SendError(res, 409, st.message(), kInvalidRequest, "pin_does_not_fit");
      }
      spdlog::error("residency of model \"{}\" → {}: {}", name, ResidencyStateName(*target),
                    st.message());
      return SendError(res, 503, st.message(), kServerError, "residency_failed",
                       kRetryAfterSeconds);
    }
    json j = ModelStatusJson(name);
    j["previous_residency"] = ResidencyStateName(*prev);
    res.set_content(j.dump(), kJson);
  }

  // POST /admin/compact {"reload": [...]}.
  void HandleCompact(const httplib::Request& req, httplib::Response& res) {
    if (weights == nullptr) {
      return SendError(res, 503, "this server has no weight cache", kServerError, "unavailable");
    }
    std::vector<std::string> reload;
    if (!req.body.empty()) {
      json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
      const char* usage = "request body must be a JSON object {\"reload\": [model names]}";
      if (!body.is_object()) return SendError(res, 400, usage, kInvalidRequest, "invalid_request");
      if (auto r = body.find("reload"); r != body.end() && !r->is_null()) {
        if (!r->is_array()) return SendError(res, 400, usage, kInvalidRequest, "invalid_request");
        for (size_t i = 0; i < r->size(); ++i) {
          if (!(*r)[i].is_string()) {
            return SendError(res, 400, fmt::format("\"reload[{}]\" must be a model name", i),
                             kInvalidRequest, "invalid_request");
          }
          const std::string name = (*r)[i].get<std::string>();
          if (!weights->Contains(name)) {
            return SendError(res, 404, fmt::format("model \"{}\" not found", name),
                             kInvalidRequest, "model_not_found");
          }
          reload.push_back(name);
        }
      }
    }
    Result<CompactResult> r = weights->Compact(reload);
    if (!r.ok()) {
      const Status& st = r.status();
      return SendError(res, 503, st.message(), kServerError,
                       st.code() == StatusCode::kResourceExhausted ? "budget_exceeded"
                                                                   : "compact_failed",
                       kRetryAfterSeconds);
    }
    json j = {{"reloaded", r->reloaded},
              {"resident_bytes_after", r->resident_bytes_after},
              {"freed_bytes", r->freed_bytes},
              {"skipped_leased", r->skipped_leased}};
    res.set_content(j.dump(), kJson);
  }

  void HandlePressure(const httplib::Request& req, httplib::Response& res) {
    if (bridge == nullptr) {
      return SendError(res, 503, "this server has no pressure bridge", kServerError,
                       "unavailable");
    }
    json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object()) {
      return SendError(res, 400,
                       "request body must be a JSON object {\"level\": \"nominal\" | \"low\" | "
                       "\"critical\", \"free_mb\": N}",
                       kInvalidRequest, "invalid_request");
    }
    auto level_it = body.find("level");
    if (level_it == body.end() || !level_it->is_string()) {
      return SendError(res, 400,
                       "\"level\" is required and must be \"nominal\", \"low\" or \"critical\"",
                       kInvalidRequest, "invalid_request");
    }
    Result<MemoryPressureLevel> level = ParseMemoryPressureLevel(level_it->get<std::string>());
    if (!level.ok()) {
      return SendError(res, 400,
                       fmt::format("\"level\" must be \"nominal\", \"low\" or \"critical\" "
                                   "(got \"{}\")",
                                   level_it->get<std::string>()),
                       kInvalidRequest, "invalid_request");
    }
    std::optional<uint64_t> free_bytes;
    if (auto f = body.find("free_mb"); f != body.end() && !f->is_null()) {
      constexpr double kMaxMb = 1e12;  // ~1 EB: anything above is a typo
      if (!f->is_number() || f->get<double>() < 0 || f->get<double>() > kMaxMb) {
        return SendError(res, 400, "\"free_mb\" must be a number ≥ 0 (MiB of free memory)",
                         kInvalidRequest, "invalid_request");
      }
      free_bytes = static_cast<uint64_t>(f->get<double>() * 1048576.0);
    }
    spdlog::info("pressure bridge: {}{}", MemoryPressureLevelName(*level),
                 free_bytes ? fmt::format(" ({} MiB free)", *free_bytes >> 20) : "");
    // Synchronous: the composite and the arbiter react on this thread.
    bridge->Dispatch(*level, free_bytes);
    json j = {{"level", MemoryPressureLevelName(*level)},
              {"pressure", MemoryPressureLevelName(arbiter->CurrentPressureLevel())}};
    if (free_bytes) j["free_mb"] = *free_bytes >> 20;
    res.set_content(j.dump(), kJson);
  }

  void HandleLoad(const std::string& name, httplib::Response& res) {
    auto it = models.find(name);
    if (it == models.end()) {
      return SendError(res, 404, fmt::format("model \"{}\" not found", name), kInvalidRequest,
                       "model_not_found");
    }
    std::optional<ArbiterHandle> handle = Acquire(name, it->second, res);
    if (!handle) return;
    handle->Release();  // loaded, unpinned: evictable like any idle model
    res.set_content(ModelStatusJson(name).dump(), kJson);
  }

  void HandleUnload(const httplib::Request& req, const std::string& name,
                    httplib::Response& res) {
    auto it = models.find(name);
    if (it == models.end()) {
      return SendError(res, 404, fmt::format("model \"{}\" not found", name), kInvalidRequest,
                       "model_not_found");
    }
    int64_t timeout_ms = kDefaultUnloadTimeoutMs;
    if (req.has_param("timeout_ms")) {
      const std::string v = req.get_param_value("timeout_ms");
      char* end = nullptr;
      errno = 0;
      const long long parsed = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0 || parsed < 0 || parsed > kMaxUnloadTimeoutMs) {
        return SendError(res, 400,
                         fmt::format("\"timeout_ms\" must be an integer in 0..{} (got \"{}\")",
                                     kMaxUnloadTimeoutMs, v),
                         kInvalidRequest, "invalid_request");
      }
      timeout_ms = parsed;
    }
    Result<bool> r =
        arbiter->Unload(it->second, name, Deadline(std::chrono::milliseconds(timeout_ms)));
    if (!r.ok()) {
      const Status& st = r.status();
      if (st.code() == StatusCode::kDeadlineExceeded) {
        const bool held = st.message().find("is held by") != std::string::npos;
        return SendError(res, 409, st.message(), kInvalidRequest,
                         held ? "model_in_use" : "model_loading");
      }
      if (st.code() == StatusCode::kNotFound) {
        return SendError(res, 404, st.message(), kInvalidRequest, "model_not_found");
      }
      spdlog::error("bug: unexpected unload error for model \"{}\": {}", name, st.ToString());
      return SendError(res, 500, st.message(), kServerError, "internal_error");
    }
    json j = ModelStatusJson(name);
    j["unloaded"] = *r;  // false: it was not resident
    res.set_content(j.dump(), kJson);
  }

  // POST /admin/prewarm {"model", "conversation_id", "messages" | "prompt",
  // "cache_ttl"}: prefills the conversation's stable prefix on its slot
  // (reference §2.3). Best-effort for the caller: a failure is reported
  // (4xx/503 with the reason) and never retried here.
  void HandlePrewarm(const httplib::Request& req, httplib::Response& res) {
    if (kv == nullptr) {
      return SendError(res, 503, "this server has no KV precache", kServerError, "unavailable");
    }
    Result<PrewarmRequest> parsed = ParsePrewarmRequest(req.body);
    if (!parsed.ok()) {
      return SendError(res, 400, parsed.status().message(), kInvalidRequest, "invalid_request");
    }
    PrewarmRequest& r = *parsed;
    if (!CheckModel(r.model, Capability::kText, res)) return;
    KvPrecache* precache = kv->Find(r.model);
    if (precache == nullptr) {
      return SendError(res, 503,
                       fmt::format("model \"{}\" has no KV precache (its files could not be read "
                                   "at startup)",
                                   r.model),
                       kServerError, "unavailable");
    }
    std::optional<ArbiterHandle> handle = Acquire(r.model, Capability::kText, res);
    if (!handle) return;
    Engine* engine = handle->backend<Engine>();
    std::vector<int32_t> ids;
    if (!r.messages.empty()) {
      Result<ChatTemplateKind> kind = engine->chat_template();
      if (!kind.ok()) {
        return SendError(res, 400,
                         fmt::format("model \"{}\" has no chat template ({}); prewarm a "
                                     "\"prompt\" instead",
                                     r.model, kind.status().message()),
                         kInvalidRequest, "no_chat_template");
      }
      // The stable prefix: the messages as a request would render them,
      // without the generation prompt the real turn adds after them.
      ids = EncodeChat(engine->tokenizer(), *kind, r.messages, /*add_generation_prompt=*/false);
    } else {
      ids = engine->tokenizer().Encode(r.prompt, true);
    }
    if (!CheckPrompt(*engine, r.model, ids, res)) return;
    TtlClass ttl = TtlClass::kShort;
    if (Result<TtlClass> t = ParseTtlClass(r.cache.cache_ttl); t.ok()) ttl = *t;
    const CancelFn cancel = [this] { return stopping.load(); };
    Result<GenerationResult> g =
        precache->Prewarm(engine, r.cache.conversation_id, std::move(ids), ttl, cancel);
    handle->Release();
    if (!g.ok()) return SendGenerationError(res, g.status());
    if (g->finish_reason == FinishReason::kCancelled) {
      return SendError(res, 503, "prewarm cancelled: the server is stopping", kServerError,
                       "cancelled");
    }
    json j = {{"model", r.model},
              {"conversation_id", r.cache.conversation_id},
              {"slot", g->slot},
              {"prefix_tokens", g->prompt_tokens},
              {"cached_tokens", g->cached_tokens},
              {"computed_tokens", g->timings.prefill_tokens},
              {"prefill_ms", g->timings.prefill_ms}};
    res.set_content(j.dump(), kJson);
  }

  // POST /admin/conversations/{id}/close[?model=NAME]: persists the
  // conversation's KV (its class) and closes it, in NAME or in every text
  // model. 404 when no model knew it.
  void HandleCloseConversation(const httplib::Request& req, const std::string& id,
                               httplib::Response& res) {
    if (kv == nullptr) {
      return SendError(res, 503, "this server has no KV precache", kServerError, "unavailable");
    }
    const std::string only = req.has_param("model") ? req.get_param_value("model") : "";
    if (!only.empty() && kv->Find(only) == nullptr) {
      return SendError(res, 404, fmt::format("model \"{}\" not found or has no KV precache", only),
                       kInvalidRequest, "model_not_found");
    }
    json closed = json::array();
    for (const auto& [name, pc] : kv->precaches) {
      if (!only.empty() && name != only) continue;
      std::optional<ArbiterHandle> h = ResidentHandle(name);
      if (pc->Close(h ? h->backend<Engine>() : nullptr, id)) closed.push_back(name);
    }
    if (closed.empty()) {
      return SendError(res, 404, fmt::format("conversation \"{}\" is not open", id),
                       kInvalidRequest, "conversation_not_found");
    }
    res.set_content(json{{"conversation_id", id}, {"closed", true}, {"models", closed}}.dump(),
                    kJson);
  }

  // GET /admin/events: Note [Event stream lifetime] in internal/event_stream.h.
  void HandleEvents(httplib::Response& res) {
    auto queue = std::make_shared<EventQueue>(kEventQueueCapacity);
    // Each stream holds a worker thread: keep half of them for requests.
    const size_t max_streams = static_cast<size_t>(std::max(1, threads / 2));
    {
      MutexLock l(&streams_mu);
      if (streams.size() >= max_streams) {
        return SendError(res, 503,
                         fmt::format("too many open /admin/events streams ({}; each holds one of "
                                     "the {} worker threads); close one or raise [server] threads",
                                     streams.size(), threads),
                         kServerError, "too_many_streams", kRetryAfterSeconds);
      }
      streams.insert(queue);
    }
    if (stopping.load()) queue->Close();  // raced with Stop(): end at once
    auto sub = std::make_shared<ArbiterEventSubscription>(
        arbiter->OnEvent([queue](const ArbiterEvent& e) { queue->Push(e); }));
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    struct State {
      bool greeted = false;
      std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
    };
    auto state = std::make_shared<State>();
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, queue, state](size_t /*offset*/, httplib::DataSink& sink) {
          const auto now = std::chrono::steady_clock::now();
          auto write = [&](const std::string& s) {
            state->last_write = now;
            return sink.write(s.data(), s.size());
          };
          if (!state->greeted) {
            // Lets a client know the subscription is live before it acts.
            state->greeted = true;
            return write(": subscribed to arbiter events\n\n");
          }
          std::vector<ArbiterEvent> events;
          uint64_t dropped = 0;
          const bool open =
              queue->Wait(now + std::chrono::milliseconds(kEventPollMs), &events, &dropped);
          if (dropped > 0) {
            spdlog::warn("events stream: client lags; dropped {} event(s)", dropped);
            if (!write(fmt::format("event: dropped\ndata: {{\"dropped\":{}}}\n\n", dropped)))
              return false;
          }
          for (const ArbiterEvent& e : events) {
            if (!write(server_internal::ArbiterEventFrame(e))) return false;
          }
          if (!open || stopping.load()) {
            sink.done();  // server stopping: end the response cleanly
            return true;
          }
          if (events.empty()) {
            if (!sink.is_writable()) return false;  // client gone
            if (now - state->last_write >= std::chrono::seconds(kEventKeepAliveS)) {
              return write(": keep-alive\n\n");
            }
          }
          return true;
        },
        [this, queue, sub](bool /*success*/) {
          // On the worker thread, never inside the listener.
          sub->Reset();
          queue->Close();
          MutexLock l(&streams_mu);
          streams.erase(queue);
        });
  }
};

Server::Server(ServerSettings settings, MemoryArbiter* arbiter, int total_parallel,
               BridgePressureSource* pressure_bridge, std::string pressure_source,
               WeightCache* weights, ServeKv* kv)
    : impl_(std::make_unique<Impl>(std::move(settings), arbiter, total_parallel, pressure_bridge,
                                   std::move(pressure_source), weights, kv)) {}

Server::~Server() { Stop(); }

Status Server::Bind() {
  const ServerSettings& s = impl_->settings;
  if (s.port == 0) {
    const int port = impl_->http.bind_to_any_port(s.host);
    if (port <= 0) {
      return UnavailableError(fmt::format("cannot bind {}: no free port", s.host));
    }
    impl_->port = port;
  } else {
    if (!impl_->http.bind_to_port(s.host, s.port)) {
      return UnavailableError(fmt::format(
          "cannot bind {}:{} (in use, or not a local address); pick another with --port",
          s.host, s.port));
    }
    impl_->port = s.port;
  }
  impl_->http.RaiseListenBacklog();
  return OkStatus();
}

int Server::port() const { return impl_->port; }

Status Server::Run() {
  spdlog::info("serving on http://{}:{} with {} worker threads", impl_->settings.host,
               impl_->port, impl_->threads);
  if (!impl_->http.listen_after_bind() && !impl_->stopping.load()) {
    return InternalError("the HTTP listener stopped unexpectedly");
  }
  return OkStatus();
}

void Server::Stop() {
  impl_->stopping.store(true);
  impl_->CloseStreams();
  impl_->http.stop();
  impl_->StopKvThread();
}

}  // namespace arbiter
