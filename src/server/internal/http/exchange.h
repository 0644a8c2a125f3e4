// server/internal/http/exchange.h — Exchange, the transport's Responder
// (http_server.h): the bytes of one response, produced by its handler on
// any thread and written by the event loop (Note [Event loop and workers]).
//
// Its outbox is the hand-over: the handler appends serialized bytes
// (Send, StartStream, Write, End) and posts a pump to the loop; the loop's
// Connection takes the outbox (TakeOutbox), writes it and reports the
// written bytes back (Written), which is what a blocked Write() waits for
// (back-pressure: at most ServerOptions::stream_buffer_bytes unwritten).
// Cancel() (the client is gone, a write failed, the server stops) makes
// Write() return false and cancelled() true.
//
// Lifetime: shared by the Connection answering the request and the
// handler's job; it only holds a weak reference to the connection, so a
// closed connection's exchange lives on, harmlessly, until the handler
// returns.
// Thread safety: thread-safe. Finish(), Cancel(), TakeOutbox() and
// Written() are called by the transport only.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/base/mutex.h"
#include "server/internal/http/http_server.h"

namespace arbiter::http {

class Connection;

class Exchange final : public Responder, public std::enable_shared_from_this<Exchange> {
 public:
  // `keep_alive`: the connection may serve another request after this one
  // (else the response says Connection: close). `version`: the request's
  // (10 or 11; a stream on HTTP/1.0 is not chunked and closes).
  Exchange(Server::Impl* server, std::weak_ptr<Connection> conn, bool keep_alive, int version)
      : s_(server), conn_(std::move(conn)), keep_alive_(keep_alive), version_(version) {}

  // Responder.
  void Send(Response response) override EXCLUDES(mu_);
  bool StartStream(int status, std::string content_type,
                   std::vector<std::pair<std::string, std::string>> headers) override
      EXCLUDES(mu_);
  bool Write(std::string_view chunk) override EXCLUDES(mu_);
  void End() override EXCLUDES(mu_);
  bool cancelled() const override;
  CancelToken cancel_token() const override { return cancel_source_.token(); }

  // Headers every response of this exchange carries besides its own
  // (Server::SetResponseHeaders). REQUIRES: before Send() / StartStream().
  void AddHeaders(std::vector<std::pair<std::string, std::string>> headers) {
    extra_headers_ = std::move(headers);
  }

  // Called by the transport after the handler returned: answers 500 for a
  // handler that did not, ends an open stream, and marks the response
  // complete.
  void Finish() EXCLUDES(mu_);

  // Loop: the client is gone, a write failed, or the server stops.
  void Cancel() EXCLUDES(mu_);

  // Loop: what is to be written now.
  struct Take {
    std::string bytes;
    bool complete = false;  // finished and nothing left to write
    bool close_after = false;
    int status = 0;
  };
  Take TakeOutbox() EXCLUDES(mu_);

  // Loop: `n` bytes taken from the outbox were written.
  void Written(size_t n) EXCLUDES(mu_);

  // The response's status; 0 before Send() or StartStream().
  int status() const EXCLUDES(mu_);

 private:
  // Set on the loop before the handler runs; read by Send / StartStream.
  std::vector<std::pair<std::string, std::string>> extra_headers_;
  enum State { kFresh, kStreaming, kDone };

  void Append(std::string bytes) REQUIRES(mu_);
  // Has the connection take the outbox (on the loop), once per batch.
  void PostPump() EXCLUDES(mu_);

  Server::Impl* const s_;
  const std::weak_ptr<Connection> conn_;
  const bool keep_alive_;
  const int version_;
  std::atomic<bool> chunked_{true};  // set by StartStream

  mutable Mutex mu_;
  CondVar space_{&mu_};  // unwritten_ dropped, or gone_
  State state_ GUARDED_BY(mu_) = kFresh;
  int status_ GUARDED_BY(mu_) = 0;
  bool close_after_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;
  bool gone_ GUARDED_BY(mu_) = false;
  bool pump_posted_ GUARDED_BY(mu_) = false;
  std::string outbox_ GUARDED_BY(mu_);
  size_t unwritten_ GUARDED_BY(mu_) = 0;  // in the outbox or being written
  std::atomic<bool> cancelled_{false};
  // Fired (outside mu_) whenever cancelled_ is set.
  CancelSource cancel_source_;
};

}  // namespace arbiter::http
