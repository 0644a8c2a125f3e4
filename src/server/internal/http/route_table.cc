// server/internal/http/route_table.cc — parsing route patterns and matching
// request paths against them (route_table.h).
#include "server/internal/http/route_table.h"

#include <algorithm>
#include <utility>

#include "server/internal/http/request_parsing.h"

namespace arbiter::http {

bool RoutePattern::Match(const std::vector<std::string>& path,
                         std::map<std::string, std::string>* params) const {
  params->clear();
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.rest) {
      if (i >= path.size()) return false;
      std::string joined;
      for (size_t k = i; k < path.size(); ++k) {
        if (k > i) joined.push_back('/');
        joined += path[k];
      }
      if (joined.empty()) return false;
      (*params)[s.name] = std::move(joined);
      return true;
    }
    if (i >= path.size()) return false;
    if (s.param) {
      if (path[i].empty()) return false;
      (*params)[s.name] = path[i];
    } else if (path[i] != s.literal) {
      return false;
    }
  }
  return segments.size() == path.size();
}

void RouteTable::Add(std::string method, std::string_view pattern, Dispatch dispatch,
                     Handler handler) {
  RoutePattern r;
  r.method = std::move(method);
  r.dispatch = dispatch;
  r.handler = std::move(handler);
  for (std::string_view seg : SplitPath(pattern)) {
    RoutePattern::Segment s;
    if (seg.size() >= 2 && seg.front() == '{' && seg.back() == '}') {
      s.param = true;
      std::string_view name = seg.substr(1, seg.size() - 2);
      if (name.size() > 3 && name.substr(name.size() - 3) == "...") {
        s.rest = true;
        name.remove_suffix(3);
      }
      s.name = std::string(name);
      r.has_params = true;
    } else {
      PercentDecode(seg, false, &s.literal);
    }
    r.segments.push_back(std::move(s));
  }
  routes_.push_back(std::move(r));
}

const RoutePattern* RouteTable::Find(std::string_view method,
                                     const std::vector<std::string>& segments,
                                     std::map<std::string, std::string>* params,
                                     std::vector<std::string>* allowed) const {
  // Literal routes first, then parameter routes, each in registration order.
  std::map<std::string, std::string> matched;
  for (int pass = 0; pass < 2; ++pass) {
    for (const RoutePattern& r : routes_) {
      if (r.has_params != (pass == 1)) continue;
      if (!r.Match(segments, &matched)) continue;
      if (r.method == method) {
        *params = std::move(matched);
        return &r;
      }
      if (std::find(allowed->begin(), allowed->end(), r.method) == allowed->end()) {
        allowed->push_back(r.method);
      }
    }
  }
  return nullptr;
}

}  // namespace arbiter::http
