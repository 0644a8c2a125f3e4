// server/internal/http/request_parsing.cc — text helpers and request-target
// decoding of the HTTP transport (request_parsing.h), and the member
// functions of the public value types (CaseInsensitiveLess, Request).
#include "server/internal/http/request_parsing.h"

#include <algorithm>

#include <fmt/format.h>

namespace arbiter::http {

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = HexValue(in[i + 1]);
      const int lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out->push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out->push_back(' ');
    } else {
      out->push_back(c);
    }
  }
  return true;
}

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> segments;
  size_t start = 1;  // path starts with '/'
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string_view::npos ? path.size() : slash;
    segments.push_back(path.substr(start, end - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return segments;
}

Status DecodeTarget(Request* req, std::vector<std::string>* segments) {
  std::string_view target = req->target;
  if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0) {
    const size_t authority = target.find("//") + 2;
    const size_t slash = target.find('/', authority);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  if (target.empty() || target[0] != '/') {
    return InvalidArgumentError(
        fmt::format("malformed HTTP request: the target \"{}\" is not a path", req->target));
  }
  const size_t qpos = target.find('?');
  const std::string_view raw_path = target.substr(0, qpos);
  if (!PercentDecode(raw_path, false, &req->path)) {
    return InvalidArgumentError("malformed HTTP request: bad percent-encoding in the path");
  }
  for (std::string_view raw : SplitPath(raw_path)) {
    std::string seg;
    PercentDecode(raw, false, &seg);
    segments->push_back(std::move(seg));
  }
  if (qpos != std::string_view::npos) {
    std::string_view q = target.substr(qpos + 1);
    const size_t hash = q.find('#');
    if (hash != std::string_view::npos) q = q.substr(0, hash);
    while (!q.empty()) {
      const size_t amp = q.find('&');
      const std::string_view pair = q.substr(0, amp);
      q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
      if (pair.empty()) continue;
      const size_t eq = pair.find('=');
      std::string name;
      std::string value;
      if (!PercentDecode(pair.substr(0, eq), true, &name) ||
          (eq != std::string_view::npos && !PercentDecode(pair.substr(eq + 1), true, &value))) {
        return InvalidArgumentError("malformed HTTP request: bad percent-encoding in the query");
      }
      req->query.emplace(std::move(name), std::move(value));
    }
  }
  return OkStatus();
}

// ---- the public value types ----------------------------------------------------

bool CaseInsensitiveLess::operator()(std::string_view a, std::string_view b) const {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const char x = Lower(a[i]);
    const char y = Lower(b[i]);
    if (x != y) return x < y;
  }
  return a.size() < b.size();
}

bool Request::has_query(std::string_view name) const {
  return query.find(std::string(name)) != query.end();
}

std::string Request::query_value(std::string_view name) const {
  auto it = query.find(std::string(name));
  return it == query.end() ? std::string() : it->second;
}

bool Request::has_header(std::string_view name) const { return headers.find(name) != headers.end(); }

std::string Request::header(std::string_view name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

}  // namespace arbiter::http
