// Reverse proxy to an external model server (a child process started by
// backends/process_model.h) on a loopback port: the HTTP half of "external
// model servers as capabilities". The route layer picks the model and its
// port; this only relays bytes.
//
// Thread safety: thread-safe (each call has its own upstream connection).
#pragma once

#include <string_view>

#include "server/internal/http/http_server.h"

namespace arbiter::server_internal {

// Forwards `req` to http://127.0.0.1:<port><req.target> and answers `res`
// with what comes back. Forwarded: method, target (query included), body,
// and the headers minus hop-by-hop ones (Connection, Keep-Alive,
// Transfer-Encoding, TE, Trailer, Upgrade, Proxy-*), Host, Content-Length,
// Expect, Accept-Encoding (replaced by "identity": the child answers
// uncompressed; a body it compresses anyway relays as it is, with its
// Content-Encoding) and Authorization (the child has no key). Relayed:
// status, headers minus hop-by-hop ones and Content-Length, body.
//
// An answer with a Content-Length (and not text/event-stream) is read whole
// and sent with Send(); any other (SSE, chunked, read-until-close) is
// relayed as it arrives: StartStream, then one Write per piece received, so
// each `data:` event reaches the client when the child sends it. The
// upstream connection is closed as soon as res.cancelled() (client gone,
// server stopping). `timeout_s` bounds each read from and write to the
// upstream (seconds without progress); connecting is bounded by 5 s.
//
// Errors: the upstream unreachable, reset or timing out before its status
// line → 502 with {"error":{"message":"model \"NAME\" (process) did not
// answer: <why>","type":"server_error","code":null}}. After the stream has
// started a failure can only end the stream early (logged).
// REQUIRES: `res` not answered yet; runs on a worker (blocks).
void ProxyToProcess(const http::Request& req, http::Responder& res, int port,
                    std::string_view model_name, int timeout_s);

}  // namespace arbiter::server_internal
