// server/internal/http/request_parsing.h — the transport's text helpers
// (http_server.h): ASCII case folding for header names, percent-decoding,
// path splitting, and the decoding of a request-target into Request::path,
// Request::query and the path segments the route table matches.
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "server/internal/http/http_server.h"

namespace arbiter::http {

// ASCII lower case of `c` (other bytes unchanged).
char Lower(char c);

// ASCII case-insensitive equality (header names and tokens).
bool IEquals(std::string_view a, std::string_view b);

// Percent-decodes `in` into *out ('+' → ' ' when `plus_is_space`). False on
// a malformed escape (*out then holds what was decoded before it).
bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out);

// The segments of `path` between its slashes, undecoded: "/a/b/" →
// {"a", "b", ""}; "/" → {""}. REQUIRES: path starts with '/'.
std::vector<std::string_view> SplitPath(std::string_view path);

// Decodes req->target — an origin-form path ("/v1/x?y=1") or an
// absolute-form URL ("http://host/v1/x?y=1", whose authority is dropped) —
// into req->path (percent-decoded, without the query), req->query
// (percent-decoded, '+' is a space, a '#' fragment dropped) and *segments
// (the decoded path segments, for RouteTable::Find).
// Errors: InvalidArgument with the message of the 400 to answer when the
// target is not a path or has a malformed percent escape (req->path and
// req->query then hold what was decoded before it).
Status DecodeTarget(Request* req, std::vector<std::string>* segments);

}  // namespace arbiter::http
