// server/internal/http/connection.h — one accepted socket of the HTTP
// transport (http_server.h): its phases (Note [Connection state machine] in
// connection.cc), its read and write timers, reading requests (through a
// RequestReader) and writing the responses their Exchanges produce.
//
// Lifetime: owned by Server::Impl::connections (and by the completion
// handlers it has pending) from Start() or Reject() until Close(); an
// Exchange holds only a weak reference.
// Thread safety: not thread-safe; the event-loop thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <boost/asio.hpp>

#include "server/internal/http/exchange.h"
#include "server/internal/http/http_server.h"
#include "server/internal/http/request_reader.h"

namespace arbiter::http {

// A steady_timer whose expiry is dropped once it has been re-armed or
// disarmed: each arming carries a sequence number (Note [Connection state
// machine]), so a stale expiry never acts on a later phase.
// Thread safety: not thread-safe; the event-loop thread only.
class PhaseTimer {
 public:
  explicit PhaseTimer(boost::asio::io_context& io) : timer_(io) {}
  PhaseTimer(const PhaseTimer&) = delete;  // pending waits point at this timer
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  // Calls `on_expiry()` at `at` unless Arm() or Disarm() is called first.
  // REQUIRES: `on_expiry` keeps the owner of this timer alive.
  template <typename F>
  void Arm(std::chrono::steady_clock::time_point at, F on_expiry) {
    const uint64_t seq = ++seq_;
    timer_.expires_at(at);
    timer_.async_wait(
        [this, seq, f = std::move(on_expiry)](const boost::system::error_code& ec) {
          if (!ec && seq == seq_) f();
        });
  }
  void Disarm() {
    ++seq_;
    timer_.cancel();
  }

 private:
  boost::asio::steady_timer timer_;
  uint64_t seq_ = 0;  // the armed expiry's number
};

// One accepted socket (Note [Connection state machine]). Loop thread only.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server::Impl* server, boost::asio::ip::tcp::socket socket);

  // Serves requests until the connection closes (kIdle first).
  void Start();
  // Over the cap: 503 and close.
  void Reject(int64_t open);
  bool rejected() const { return rejected_; }

  // Posted by the exchange: writes what `from` has produced, or finishes
  // the response once it is complete and written.
  void Pump(const std::shared_ptr<Exchange>& from);
  // The server stops: closes an idle or reading connection, cancels the
  // exchange of one being answered.
  void OnStop();
  // Closes the socket now and forgets the connection. Idempotent.
  void Close();

 private:
  using SteadyClock = std::chrono::steady_clock;
  enum class Phase { kIdle, kReading, kHandling, kClosing, kClosed };

  // Reading and answering requests.
  void ArmReadTimer(SteadyClock::time_point at);
  void OnReadTimer();
  void StartRead();
  void OnReadable(boost::system::error_code ec);
  void OnRead(const boost::system::error_code& ec);
  void BeginRequest();
  void Parse();
  void OnRequest();
  void AnswerNow(Response r);
  void RespondError(int status, std::string message);

  // Writing responses, and what follows one.
  void SendInterim(std::string bytes);
  void StartWrite();
  void OnWrite(const boost::system::error_code& ec, size_t n);
  void ResponseDone(bool close_after, int status);
  void Log(int status);
  void GracefulClose();

  Server::Impl* const s_;
  boost::asio::ip::tcp::socket socket_;
  PhaseTimer read_timer_;   // idle, request and linger deadlines
  PhaseTimer write_timer_;  // the pending write's deadline
  RequestReader reader_;  // unparsed input and the request being parsed
  Phase phase_ = Phase::kIdle;
  std::string remote_addr_;
  int remote_port_ = 0;
  int served_ = 0;                  // requests parsed on this connection
  bool reading_ = false;            // a read is pending
  bool writing_ = false;            // a write is pending
  bool interim_ = false;            // the pending write is a 100 Continue
  bool peer_eof_ = false;           // the peer closed or reset its side
  bool rejected_ = false;           // over the cap: 503 then close
  bool logged_ = false;             // the current response was logged
  SteadyClock::time_point request_deadline_;
  std::string write_buf_;           // the bytes of the pending write
  std::shared_ptr<Exchange> exchange_;  // the response being produced (kHandling)
  std::shared_ptr<Request> request_;    // its request (for the logger)
};

}  // namespace arbiter::http
