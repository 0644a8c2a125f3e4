// server/internal/http/connection.cc — one accepted socket of the HTTP
// transport (connection.h; Note [Client gone] in http_server.h).
//
// Note [Connection state machine]
// Every Connection lives on the event-loop thread; only its Exchange (the
// Responder of the request being answered) is shared with a worker. Phases:
//   kIdle      waiting for the first byte of a request; the read timer
//              closes the connection after keep_alive_timeout_s.
//   kReading   a request has begun: bytes are fed to the parser as they
//              arrive; the read timer fires at min(last byte +
//              read_timeout_s, first byte + request_timeout_s) and answers
//              408. `Expect: 100-continue` is answered when the header is
//              complete and the body still to come.
//   kHandling  the request (or a transport error) is being answered through
//              `exchange_`. The loop keeps a read pending (Note [Client
//              gone]): bytes are kept for the next request, EOF or an error
//              cancels the exchange. Whenever the exchange has bytes the loop
//              writes them (one write in flight, write_timeout_s each, else
//              the connection is closed). When the exchange is finished and
//              everything is written: the next request (kReading at once if
//              pipelined bytes are buffered, else kIdle), or kClosing.
//   kClosing   lingering close: our side is shut down for sending and the
//              peer's remaining bytes are read and dropped (so the kernel
//              does not answer them with a reset that could destroy the
//              response in flight) until EOF or 2 s; then kClosed.
//   kClosed    the socket is closed and the connection forgotten; pending
//              handlers see operation_aborted and return.
// Timer and read completions carry a sequence number so a stale expiry never
// acts on a later phase. A read is never cancelled except by closing: when a
// timer ends a request, its pending read simply becomes the watch read of
// the error response.
#include "server/internal/http/connection.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/log_safe.h"
#include "server/internal/http/request_parsing.h"
#include "server/internal/http/server_impl.h"

namespace arbiter::http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

// While a request is being answered, pipelined bytes buffered beyond this
// stop the watch read (Note [Client gone]).
constexpr size_t kMaxPipelinedBytes = 64 << 10;
// Lingering close: how long the peer's remaining bytes are drained.
constexpr auto kLingerTime = std::chrono::seconds(2);

}  // namespace

Connection::Connection(Server::Impl* server, tcp::socket socket)
    : s_(server), socket_(std::move(socket)), read_timer_(server->io), write_timer_(server->io) {
  error_code ec;
  const tcp::endpoint remote = socket_.remote_endpoint(ec);
  if (!ec) {
    remote_addr_ = remote.address().to_string();
    remote_port_ = remote.port();
  }
  socket_.set_option(tcp::no_delay(true), ec);
  socket_.non_blocking(true, ec);
}

void Connection::Start() {
  phase_ = Phase::kIdle;
  ArmReadTimer(SteadyClock::now() + std::chrono::seconds(s_->options.keep_alive_timeout_s));
  StartRead();
}

void Connection::Reject(int64_t open) {
  rejected_ = true;
  phase_ = Phase::kHandling;
  exchange_ = std::make_shared<Exchange>(s_, weak_from_this(), /*keep_alive=*/false, 11);
  exchange_->Send(s_->ErrorResponse(
      503, fmt::format("the server has {} open connections, its limit (max_connections); "
                       "retry later",
                       open)));
  exchange_->Finish();
  StartRead();  // drains the request, if any, while the 503 is written
}

void Connection::Pump(const std::shared_ptr<Exchange>& from) {
  if (phase_ == Phase::kClosed || exchange_ != from || writing_) return;
  Exchange::Take t = exchange_->TakeOutbox();
  if (!t.bytes.empty()) {
    write_buf_ = std::move(t.bytes);
    StartWrite();
    return;
  }
  if (t.complete) ResponseDone(t.close_after, t.status);
}

void Connection::OnStop() {
  switch (phase_) {
    case Phase::kIdle:
    case Phase::kReading:
      Close();
      break;
    case Phase::kHandling:
      if (exchange_) exchange_->Cancel();
      break;
    case Phase::kClosing:
    case Phase::kClosed:
      break;
  }
}

void Connection::Close() {
  if (phase_ == Phase::kClosed) return;
  if (exchange_ && !logged_ && exchange_->status() != 0) Log(exchange_->status());
  phase_ = Phase::kClosed;
  read_timer_.Disarm();
  write_timer_.Disarm();
  error_code ec;
  socket_.close(ec);
  if (exchange_) exchange_->Cancel();
  exchange_.reset();
  s_->Forget(this);
}

// ---- reading ----------------------------------------------------------------------

void Connection::ArmReadTimer(SteadyClock::time_point at) {
  read_timer_.Arm(at, [self = shared_from_this()] { self->OnReadTimer(); });
}

void Connection::OnReadTimer() {
  switch (phase_) {
    case Phase::kIdle:  // keep_alive_timeout_s without a request
      s_->timeouts_total.fetch_add(1);
      Close();
      break;
    case Phase::kReading: {
      s_->timeouts_total.fetch_add(1);
      const bool whole = SteadyClock::now() >= request_deadline_;
      RespondError(408, whole ? fmt::format("the request did not arrive whole within {} s "
                                            "(request_timeout_s); the connection is closed",
                                            s_->options.request_timeout_s)
                              : fmt::format("no byte of the request arrived for {} s "
                                            "(read_timeout_s); the connection is closed",
                                            s_->options.read_timeout_s));
      break;
    }
    case Phase::kClosing:  // linger time over
      Close();
      break;
    case Phase::kHandling:
    case Phase::kClosed:
      break;
  }
}

// Waits for the socket to become readable (no buffer is held meanwhile),
// then reads what is there into the reader.
void Connection::StartRead() {
  if (reading_ || phase_ == Phase::kClosed || peer_eof_) return;
  reading_ = true;
  socket_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this()](const error_code& ec) { self->OnReadable(ec); });
}

void Connection::OnReadable(error_code ec) {
  size_t n = 0;
  if (!ec && phase_ != Phase::kClosed) {
    std::vector<char>& scratch = s_->read_scratch;
    n = socket_.read_some(asio::buffer(scratch), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      reading_ = false;
      StartRead();
      return;
    }
    if (!ec) reader_.Append(scratch.data(), n);
  }
  OnRead(ec);
}

void Connection::OnRead(const error_code& ec) {
  reading_ = false;
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    peer_eof_ = true;
    switch (phase_) {
      case Phase::kIdle:
      case Phase::kReading:  // the client gave up (mid-request: nothing to answer)
      case Phase::kClosing:
        Close();
        return;
      case Phase::kHandling:
        if (exchange_) exchange_->Cancel();  // Note [Client gone]
        return;
      case Phase::kClosed:
        return;
    }
    return;
  }
  switch (phase_) {
    case Phase::kIdle:
      BeginRequest();
      Parse();
      return;
    case Phase::kReading:
      Parse();
      return;
    case Phase::kHandling:
      if (rejected_) reader_.DropInput();
      if (reader_.buffered() < kMaxPipelinedBytes) StartRead();
      return;
    case Phase::kClosing:
      reader_.DropInput();
      StartRead();
      return;
    case Phase::kClosed:
      return;
  }
}

// The first byte of a request is here (or buffered).
void Connection::BeginRequest() {
  phase_ = Phase::kReading;
  request_deadline_ = SteadyClock::now() + std::chrono::seconds(s_->options.request_timeout_s);
  reader_.Begin(s_->options);
}

// Feeds the buffered bytes to the parser; dispatches a complete request,
// answers a malformed one, or waits for more.
void Connection::Parse() {
  RequestReader::Step step = reader_.Feed(s_->options);
  if (step.kind == RequestReader::Step::kError) {
    return RespondError(step.status, std::move(step.message));
  }
  if (step.send_continue) SendInterim("HTTP/1.1 100 Continue\r\n\r\n");
  if (step.kind == RequestReader::Step::kDone) return OnRequest();
  const auto now = SteadyClock::now();
  ArmReadTimer(std::min(request_deadline_,
                        now + std::chrono::seconds(s_->options.read_timeout_s)));
  StartRead();
}

// Builds the Request from the parsed message and answers it.
void Connection::OnRequest() {
  read_timer_.Disarm();
  auto req = std::make_shared<Request>();
  req->remote_addr = remote_addr_;
  req->remote_port = remote_port_;
  const bool wants_keep_alive = reader_.TakeRequest(req.get());
  ++served_;
  const bool keep_alive = wants_keep_alive && served_ < s_->options.keep_alive_max &&
                          !s_->stopping.load();
  request_ = req;
  phase_ = Phase::kHandling;
  exchange_ = std::make_shared<Exchange>(s_, weak_from_this(), keep_alive, req->version);
  if (s_->response_headers) {
    try {
      exchange_->AddHeaders(s_->response_headers(*req));
    } catch (const std::exception& e) {
      spdlog::error("bug: http: the response-headers hook threw: {}",
                    LogSafe(e.what(), kLogSafeMessageBytes));
    }
  }

  std::vector<std::string> segments;
  if (Status decoded = DecodeTarget(req.get(), &segments); !decoded.ok()) {
    return AnswerNow(s_->ErrorResponse(400, decoded.message()));
  }
  Response answer;
  switch (s_->DispatchRequest(req, segments, exchange_, &answer)) {
    case Server::Impl::Dispatched::kAnswerNow:
      return AnswerNow(std::move(answer));
    case Server::Impl::Dispatched::kRanInline:
      return;  // Finish() posted the pump
    case Server::Impl::Dispatched::kQueued:
      // Note [Client gone]: watch the socket while the handler runs.
      if (reader_.buffered() < kMaxPipelinedBytes) StartRead();
      return;
  }
}

// Answers the current request (kHandling, exchange_ set) with `r` from the
// loop, without a handler.
void Connection::AnswerNow(Response r) {
  exchange_->Send(std::move(r));
  exchange_->Finish();
  if (reader_.buffered() < kMaxPipelinedBytes) StartRead();
}

// A transport error while reading a request: answer and close.
void Connection::RespondError(int status, std::string message) {
  read_timer_.Disarm();
  request_ = std::make_shared<Request>();
  request_->remote_addr = remote_addr_;
  request_->remote_port = remote_port_;
  request_->version = 0;
  reader_.Abandon(request_.get());  // what was parsed, for the logger
  phase_ = Phase::kHandling;
  exchange_ = std::make_shared<Exchange>(s_, weak_from_this(), /*keep_alive=*/false, 11);
  exchange_->Send(s_->ErrorResponse(status, std::move(message)));
  exchange_->Finish();
  StartRead();  // no-op when a read is already pending
}

// ---- writing ----------------------------------------------------------------------

void Connection::SendInterim(std::string bytes) {
  // Only while reading a request: no exchange is writing.
  if (writing_) return;
  write_buf_ = std::move(bytes);
  interim_ = true;
  StartWrite();
}

void Connection::StartWrite() {
  writing_ = true;
  write_timer_.Arm(
      SteadyClock::now() + std::chrono::seconds(std::max(1, s_->options.write_timeout_s)),
      [self = shared_from_this()] {
        if (!self->writing_) return;
        self->s_->timeouts_total.fetch_add(1);
        self->Close();
      });
  asio::async_write(socket_, asio::buffer(write_buf_),
                    [self = shared_from_this()](const error_code& ec, size_t n) {
                      self->OnWrite(ec, n);
                    });
}

void Connection::OnWrite(const error_code& ec, size_t n) {
  writing_ = false;
  write_timer_.Disarm();
  const bool interim = interim_;
  interim_ = false;
  write_buf_.clear();
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    Close();
    return;
  }
  if (!interim && exchange_) exchange_->Written(n);
  if (exchange_) Pump(exchange_);
}

void Connection::ResponseDone(bool close_after, int status) {
  Log(status);
  exchange_.reset();
  request_.reset();
  if (close_after || peer_eof_ || s_->stopping.load() || rejected_) {
    GracefulClose();
    return;
  }
  logged_ = false;
  if (reader_.buffered() > 0) {  // a pipelined request
    BeginRequest();
    Parse();
    return;
  }
  phase_ = Phase::kIdle;
  ArmReadTimer(SteadyClock::now() + std::chrono::seconds(s_->options.keep_alive_timeout_s));
  StartRead();
}

void Connection::Log(int status) {
  logged_ = true;
  s_->LogResponse(request_.get(), status);
}

void Connection::GracefulClose() {
  if (peer_eof_) {
    Close();
    return;
  }
  phase_ = Phase::kClosing;
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    Close();
    return;
  }
  reader_.DropInput();
  // Stopping: no lingering unless the peer has bytes in flight already.
  if (s_->stopping.load() && socket_.available(ec) == 0 && !ec) {
    Close();
    return;
  }
  ArmReadTimer(SteadyClock::now() + kLingerTime);
  StartRead();
}

}  // namespace arbiter::http
