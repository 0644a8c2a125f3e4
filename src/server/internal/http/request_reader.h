// server/internal/http/request_reader.h — the reading half of a connection
// (connection.h): the bytes read and not yet parsed, and Boost.Beast's
// HTTP/1.1 request parser for the request being read (request line,
// headers, Content-Length and chunked bodies, the header and body limits).
//
// The connection appends what it reads, calls Begin() at the first byte of
// a request and Feed() after every read; Feed() says whether the request is
// complete, needs more bytes, or is to be answered with a transport error
// (400, 413, 431), and when `Expect: 100-continue` is to be answered.
// Bytes past the end of a request stay buffered for the next one
// (pipelining).
//
// Thread safety: thread-compatible (the connection's loop thread only).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include <boost/beast/http.hpp>

#include "server/internal/http/http_server.h"

namespace arbiter::http {

// Bytes read from a socket at once (into the loop's one scratch buffer: a
// connection waits for readability with no buffer of its own); an idle
// connection's input buffer keeps at most this capacity.
constexpr size_t kReadChunkBytes = 64 << 10;

class RequestReader {
 public:
  // What Feed() made of the buffered bytes.
  struct Step {
    enum Kind {
      kNeedMore,  // the request is incomplete: read more
      kDone,      // the request is complete: TakeRequest()
      kError,     // answer `status` with `message`, then close
    };
    Kind kind = kNeedMore;
    bool send_continue = false;  // kNeedMore: answer "100 Continue" now
    int status = 0;              // kError: 400, 413 or 431
    std::string message;         // kError: what was wrong, in words
  };

  // Appends `n` bytes read from the socket.
  void Append(const char* data, size_t n) { input_.append(data, n); }
  // Bytes read and not yet parsed.
  size_t buffered() const { return input_.size() - input_off_; }
  // Drops the unparsed bytes (and a grown buffer's memory).
  void DropInput();

  // Starts parsing a new request under `options`' header and body limits.
  void Begin(const ServerOptions& options);
  // Feeds the buffered bytes to the parser. REQUIRES: Begin() and no
  // TakeRequest() or Abandon() since.
  Step Feed(const ServerOptions& options);
  // Moves the complete request (method, target, version, headers, body)
  // into *req and ends the parser. Returns whether the client asked to keep
  // the connection open. REQUIRES: Feed() returned kDone.
  bool TakeRequest(Request* req);
  // Ends the parser of a request that is answered with a transport error;
  // copies to *req what was parsed of it (method, target, path, version),
  // for the logger, if its header was complete.
  void Abandon(Request* req);

 private:
  void ConsumeInput(size_t n);

  std::string input_;  // bytes read and not yet parsed, from input_off_
  size_t input_off_ = 0;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  // Sets body_limit_ from the header's path (ServerOptions::path_body_limits).
  void UsePathLimit(const ServerOptions& options);
  bool header_checked_ = false;  // this request's header was checked (framing, 100-continue)
  size_t body_limit_ = 0;        // this request's body limit (max_body_bytes or its path's)
  std::string body_limit_name_;  // the setting that gave it
};

}  // namespace arbiter::http
