// Reverse proxy to an external model server (server/internal/proxy.h).
//
// cpp-httplib's Client does the upstream side: `response_handler` sees the
// status line and headers before any body byte, which is where we choose
// between a buffered answer and a relayed stream; `content_receiver` gets
// each body piece as it is read (chunked framing already removed), and
// returning false from either closes the upstream connection. A client that
// hangs up while the upstream is silent (a long prefill) is noticed through
// the Responder's cancel token, whose callback stops the Client's socket.
#include "server/internal/proxy.h"

#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/log_safe.h"
#include "arbiter/base/cancel.h"
#include "server/internal/context.h"
#include "server/internal/errors.h"

namespace arbiter::server_internal {
namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

bool IsHopByHop(std::string_view name) {
  for (std::string_view h : {"Connection", "Keep-Alive", "Transfer-Encoding", "TE", "Trailer",
                             "Upgrade", "Content-Length"}) {
    if (EqualsIgnoreCase(name, h)) return true;
  }
  return name.size() >= 6 && EqualsIgnoreCase(name.substr(0, 6), "Proxy-");
}

bool DropFromRequest(std::string_view name) {
  if (IsHopByHop(name)) return true;
  for (std::string_view h : {"Host", "Authorization", "Expect", "Accept-Encoding"}) {
    if (EqualsIgnoreCase(name, h)) return true;
  }
  return false;
}

}  // namespace

void ProxyToProcess(const http::Request& req, http::Responder& res, int port,
                    std::string_view model_name, int timeout_s) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(timeout_s, 0);
  cli.set_write_timeout(timeout_s, 0);
  cli.set_keep_alive(false);
  // Bytes relay as they come: if the child compresses anyway, its
  // Content-Encoding header goes along with the compressed body.
  cli.set_decompress(false);

  httplib::Request up;
  up.method = req.method;
  up.path = req.target;
  for (const auto& [name, value] : req.headers) {
    if (!DropFromRequest(name)) up.headers.emplace(name, value);
  }
  // Without this the Client offers gzip/br on its own.
  up.headers.emplace("Accept-Encoding", "identity");
  up.body = req.body;

  bool streaming = false;   // relaying as it arrives (StartStream done)
  bool client_gone = false;
  int status = 0;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string buffered;  // the whole body of a non-streamed answer
  up.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    bool chunked = false, has_length = false;
    for (const auto& [name, value] : r.headers) {
      if (EqualsIgnoreCase(name, "Transfer-Encoding")) chunked = true;
      if (EqualsIgnoreCase(name, "Content-Length")) has_length = true;
      if (EqualsIgnoreCase(name, "Content-Type")) {
        content_type = value;
      } else if (!IsHopByHop(name)) {
        headers.emplace_back(name, value);
      }
    }
    streaming = chunked || !has_length || content_type.rfind("text/event-stream", 0) == 0;
    if (streaming && !res.StartStream(status, content_type, headers)) {
      client_gone = true;
      return false;
    }
    return true;
  };
  up.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (res.cancelled()) {
      client_gone = true;
      return false;
    }
    if (!streaming) {
      buffered.append(data, n);
      return true;
    }
    if (!res.Write(std::string_view(data, n))) {
      client_gone = true;
      return false;
    }
    return true;
  };

  httplib::Response answer;
  httplib::Error error = httplib::Error::Success;
  bool ok = false;
  if (!res.cancelled()) {
    CancelRegistration stop_upstream = res.cancel_token().OnCancel([&cli] { cli.stop(); });
    ok = cli.send(up, answer, error);
  }
  if (res.cancelled()) client_gone = true;

  if (streaming) {
    if (!ok && !client_gone) {
      spdlog::warn("model \"{}\" (process, port {}): the stream of {} {} broke off: {}", model_name,
                   port, LogSafe(req.method), LogSafe(req.path), httplib::to_string(error));
    }
    res.End();
    return;
  }
  if (ok) {
    http::Response out;
    out.status = status;
    out.headers = std::move(headers);
    out.content_type = std::move(content_type);
    out.body = std::move(buffered);
    res.Send(std::move(out));
    return;
  }
  // Nothing was sent yet. When the client is gone the answer goes nowhere,
  // but the Responder still needs one.
  const std::string why = client_gone && error == httplib::Error::Success
                              ? std::string("the client went away")
                              : httplib::to_string(error);
  SendError(res, 502,
            fmt::format("model \"{}\" (process) did not answer: {}", model_name, why),
            kServerErrorType, "");
}

}  // namespace arbiter::server_internal
