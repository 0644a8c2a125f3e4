// server/internal/http/exchange.cc — the transport's Responder
// (exchange.h): serializing responses and handing their bytes to the loop.
//
// Responses are serialized here rather than by Beast: they are simple, and
// the bytes of a streamed response have to be produced on worker threads.
// The transport writes Content-Length / Transfer-Encoding and Connection
// itself and drops those headers (and any header with a bad name or value)
// from a handler's Response.
#include "server/internal/http/exchange.h"

#include <algorithm>
#include <chrono>

#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/log_safe.h"
#include "server/internal/http/connection.h"
#include "server/internal/http/request_parsing.h"
#include "server/internal/http/server_impl.h"

namespace arbiter::http {

namespace {

using SteadyClock = std::chrono::steady_clock;

// A blocked Write() gives up on its own this long after write_timeout_s
// without progress (the loop's write timer normally ends it first).
constexpr auto kWriteFuseSlack = std::chrono::seconds(5);

std::string_view StatusText(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

// True for the headers the transport writes itself.
bool IsFramingHeader(std::string_view name) {
  return IEquals(name, "Content-Length") || IEquals(name, "Transfer-Encoding") ||
         IEquals(name, "Connection");
}

// The status line and headers, up to the framing headers (the caller adds
// Content-Length or Transfer-Encoding and the blank line).
void AppendHead(std::string* out, int status, const std::string& content_type,
                const std::vector<std::pair<std::string, std::string>>& headers, bool close) {
  *out += fmt::format("HTTP/1.1 {} {}\r\n", status, StatusText(status));
  if (!content_type.empty()) *out += fmt::format("Content-Type: {}\r\n", content_type);
  for (const auto& [name, value] : headers) {
    if (IsFramingHeader(name)) continue;
    if (name.empty() || name.find_first_of(":\r\n") != std::string::npos ||
        value.find_first_of("\r\n") != std::string::npos) {
      spdlog::error("bug: http: dropped a response header with a bad name or value: \"{}\"",
                    LogSafe(name));
      continue;
    }
    *out += name;
    *out += ": ";
    *out += value;
    *out += "\r\n";
  }
  *out += close ? "Connection: close\r\n" : "Connection: keep-alive\r\n";
}

}  // namespace

void Exchange::Send(Response response) {
  std::string bytes;
  bool close = !keep_alive_;
  for (const auto& [name, value] : response.headers) {
    if (IEquals(name, "Connection") && IEquals(value, "close")) close = true;
  }
  for (auto& h : extra_headers_) response.headers.push_back(h);
  AppendHead(&bytes, response.status, response.content_type, response.headers, close);
  bytes += fmt::format("Content-Length: {}\r\n\r\n", response.body.size());
  bytes += response.body;
  {
    MutexLock l(&mu_);
    if (state_ != kFresh) {
      spdlog::error("bug: http: a handler answered its request twice (status {})",
                    response.status);
      return;
    }
    state_ = kDone;
    status_ = response.status;
    close_after_ = close;
    Append(std::move(bytes));
  }
  PostPump();
}

bool Exchange::StartStream(int status, std::string content_type,
                           std::vector<std::pair<std::string, std::string>> headers) {
  bool close = !keep_alive_ || version_ < 11;
  for (const auto& [name, value] : headers) {
    if (IEquals(name, "Connection") && IEquals(value, "close")) close = true;
  }
  chunked_.store(version_ >= 11);
  std::string bytes;
  for (auto& h : extra_headers_) headers.push_back(h);
  AppendHead(&bytes, status, content_type, headers, close);
  if (chunked_) bytes += "Transfer-Encoding: chunked\r\n";
  bytes += "\r\n";
  {
    MutexLock l(&mu_);
    if (state_ != kFresh) {
      spdlog::error("bug: http: StartStream on an answered request (status {})", status);
      return false;
    }
    state_ = kStreaming;
    status_ = status;
    close_after_ = close;
    Append(std::move(bytes));
  }
  PostPump();
  return !cancelled();
}

bool Exchange::Write(std::string_view chunk) {
  if (cancelled()) return false;
  if (chunk.empty()) return true;
  std::string frame;
  if (chunked_) {
    frame = fmt::format("{:x}\r\n", chunk.size());
    frame.append(chunk);
    frame += "\r\n";
  } else {
    frame.assign(chunk);
  }
  const bool on_loop = s_->OnLoopThread();
  bool fired = false, appended = false;
  const auto no_progress =
      std::chrono::seconds(std::max(1, s_->options.write_timeout_s)) + kWriteFuseSlack;
  {
    MutexLock l(&mu_);
    if (state_ != kStreaming) {
      spdlog::error("bug: http: Write outside a stream");
      return false;
    }
    size_t last = unwritten_;
    auto fuse = SteadyClock::now() + no_progress;
    while (!on_loop && !gone_ && !s_->stopping.load() && unwritten_ > 0 &&
           unwritten_ + frame.size() > s_->options.stream_buffer_bytes) {
      space_.WaitUntil(std::min(fuse, SteadyClock::now() + std::chrono::milliseconds(250)));
      const auto now = SteadyClock::now();
      if (unwritten_ < last) {
        last = unwritten_;
        fuse = now + no_progress;
      } else if (now >= fuse) {
        gone_ = true;  // the loop's write timer should have closed it; give up
        cancelled_.store(true);
        break;
      }
    }
    if (gone_ || s_->stopping.load()) {
      fired = cancelled_.load();
    } else {
      Append(std::move(frame));
      appended = true;
    }
  }
  if (fired) cancel_source_.Cancel();  // outside mu_: wakes waiters on other locks
  if (!appended) return false;
  PostPump();
  return true;
}

void Exchange::End() {
  {
    MutexLock l(&mu_);
    if (state_ != kStreaming) return;
    state_ = kDone;
    if (chunked_) Append("0\r\n\r\n");
  }
  PostPump();
}

bool Exchange::cancelled() const { return cancelled_.load() || s_->stopping.load(); }

void Exchange::Finish() {
  bool unanswered = false;
  {
    MutexLock l(&mu_);
    unanswered = state_ == kFresh;
  }
  if (unanswered) {
    spdlog::error("bug: http: a handler returned without answering");
    Send(s_->ErrorResponse(500, "the handler sent no response"));
  }
  {
    MutexLock l(&mu_);
    if (state_ == kStreaming) {
      state_ = kDone;
      if (chunked_) Append("0\r\n\r\n");
    }
    finished_ = true;
  }
  PostPump();
}

void Exchange::Cancel() {
  {
    MutexLock l(&mu_);
    gone_ = true;
    cancelled_.store(true);
    space_.SignalAll();
  }
  cancel_source_.Cancel();  // outside mu_: the callbacks take other locks
}

Exchange::Take Exchange::TakeOutbox() {
  MutexLock l(&mu_);
  pump_posted_ = false;
  Take t;
  t.bytes.swap(outbox_);
  t.complete = finished_ && t.bytes.empty() && unwritten_ == 0;
  t.close_after = close_after_;
  t.status = status_;
  return t;
}

void Exchange::Written(size_t n) {
  MutexLock l(&mu_);
  unwritten_ -= std::min(n, unwritten_);
  space_.SignalAll();
}

int Exchange::status() const {
  MutexLock l(&mu_);
  return status_;
}

void Exchange::Append(std::string bytes) {
  unwritten_ += bytes.size();
  if (outbox_.empty()) {
    outbox_ = std::move(bytes);
  } else {
    outbox_ += bytes;
  }
}

void Exchange::PostPump() {
  {
    MutexLock l(&mu_);
    if (pump_posted_) return;
    pump_posted_ = true;
  }
  boost::asio::post(s_->io, [self = shared_from_this()] {
    if (std::shared_ptr<Connection> c = self->conn_.lock()) {
      c->Pump(self);
    } else {
      MutexLock l(&self->mu_);
      self->pump_posted_ = false;
    }
  });
}

}  // namespace arbiter::http
