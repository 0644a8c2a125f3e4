// server/internal/http/route_table.h — the transport's routes
// (Server::Route in http_server.h): (method, path pattern, dispatch,
// handler) entries, matched against a request's decoded path segments.
//
// A pattern is literal segments and "{name}" segments (one non-empty
// segment, its decoded value in Request::params["name"]); a last segment
// "{name...}" matches the rest of the path (one or more segments, joined
// with '/'). Literal routes win over parameter routes; otherwise the first
// registered match wins.
//
// Thread safety: thread-compatible; the server only reads the table once
// Bind() is called.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "server/internal/http/http_server.h"

namespace arbiter::http {

struct RoutePattern {
  struct Segment {
    std::string literal;  // when !param
    std::string name;     // parameter name when param
    bool param = false;
    bool rest = false;  // "{name...}": the rest of the path
  };
  std::string method;
  std::vector<Segment> segments;
  bool has_params = false;
  Dispatch dispatch = Dispatch::kWorker;
  Handler handler;

  // Matches the decoded segments; fills `params` on success.
  bool Match(const std::vector<std::string>& path,
             std::map<std::string, std::string>* params) const;
};

class RouteTable {
 public:
  // REQUIRES: pattern starts with '/'.
  void Add(std::string method, std::string_view pattern, Dispatch dispatch, Handler handler);

  // The route for `method` on the decoded path `segments`, its path
  // parameters moved into *params; nullptr when there is none, with the
  // methods of the routes that match the path (for 405's Allow) in
  // *allowed, empty when none does (404).
  const RoutePattern* Find(std::string_view method, const std::vector<std::string>& segments,
                           std::map<std::string, std::string>* params,
                           std::vector<std::string>* allowed) const;

 private:
  std::vector<RoutePattern> routes_;  // in registration order
};

}  // namespace arbiter::http
