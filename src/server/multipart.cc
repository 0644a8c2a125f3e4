// multipart/form-data (RFC 7578 over RFC 2046 5.1): see multipart.h.
//
// The body is
//   preamble CRLF? "--" boundary transport-padding CRLF
//   ( headers CRLF CRLF content CRLF "--" boundary ( CRLF | "--" ) )*
// A delimiter is CRLF "--" boundary; the first one may start the body
// without its CRLF. The content of a part runs to the next delimiter, so it
// may hold any bytes, including CRLFs and partial boundaries.
#include "arbiter/server/multipart.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "arbiter/base/clip.h"

namespace arbiter {
namespace {

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Status Bad(std::string message) {
  return InvalidArgumentError("multipart body: " + std::move(message));
}

// Splits `value` ("form-data; name=\"file\"; filename=\"a b.wav\"") into
// the leading token and its parameters (names lower-cased; quoted strings
// unescaped). False on an unterminated quoted string.
bool ParseParams(std::string_view value, std::string* token,
                 std::vector<std::pair<std::string, std::string>>* params) {
  size_t i = value.find(';');
  *token = std::string(Trim(value.substr(0, i)));
  while (i != std::string_view::npos && i < value.size()) {
    ++i;  // past ';'
    while (i < value.size() && (value[i] == ' ' || value[i] == '\t')) ++i;
    const size_t eq = value.find('=', i);
    if (eq == std::string_view::npos) return true;  // a bare token: ignored
    std::string name(Trim(value.substr(i, eq - i)));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    i = eq + 1;
    while (i < value.size() && (value[i] == ' ' || value[i] == '\t')) ++i;
    std::string v;
    if (i < value.size() && value[i] == '"') {
      ++i;
      bool closed = false;
      while (i < value.size()) {
        char c = value[i++];
        if (c == '\\' && i < value.size()) {
          v += value[i++];
        } else if (c == '"') {
          closed = true;
          break;
        } else {
          v += c;
        }
      }
      if (!closed) return false;
      i = value.find(';', i);
    } else {
      const size_t end = value.find(';', i);
      v = std::string(Trim(value.substr(i, end == std::string_view::npos ? end : end - i)));
      i = end;
    }
    params->emplace_back(std::move(name), std::move(v));
  }
  return true;
}

}  // namespace

Result<std::string> MultipartBoundary(std::string_view content_type) {
  std::string token;
  std::vector<std::pair<std::string, std::string>> params;
  if (!ParseParams(content_type, &token, &params) || !IEquals(token, "multipart/form-data")) {
    return InvalidArgumentError(
        fmt::format("the Content-Type must be multipart/form-data with a boundary (got \"{}\")",
                    ClipInput(content_type)));
  }
  for (const auto& [name, value] : params) {
    if (name != "boundary") continue;
    if (value.empty() || value.size() > 70 || value.back() == ' ') break;
    return value;
  }
  return InvalidArgumentError(
      "the Content-Type multipart/form-data has no valid boundary parameter (1 to 70 characters)");
}

Result<std::vector<FormPart>> ParseMultipart(std::string_view content_type, std::string_view body) {
  ARBITER_ASSIGN_OR_RETURN(std::string boundary, MultipartBoundary(content_type));
  const std::string dash = "--" + boundary;
  const std::string delimiter = "\r\n" + dash;
  // The first delimiter: at the very start, or after a preamble line.
  size_t pos;
  if (body.substr(0, dash.size()) == dash) {
    pos = dash.size();
  } else {
    const size_t d = body.find(delimiter);
    if (d == std::string_view::npos) return Bad("no opening boundary");
    pos = d + delimiter.size();
  }
  std::vector<FormPart> parts;
  for (;;) {
    // After a delimiter: "--" closes the body; else padding then CRLF.
    if (body.substr(pos, 2) == "--") break;
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;
    if (body.substr(pos, 2) != "\r\n") {
      return Bad(fmt::format("part {}: the boundary line does not end with CRLF", parts.size() + 1));
    }
    pos += 2;
    if (parts.size() == kMaxMultipartParts) {
      return Bad(fmt::format("more than {} parts", kMaxMultipartParts));
    }
    const size_t n = parts.size() + 1;
    const size_t header_end = body.find("\r\n\r\n", pos);
    const bool empty_headers = body.substr(pos, 2) == "\r\n";
    if (!empty_headers && header_end == std::string_view::npos) {
      return Bad(fmt::format("part {} has no end of its header block", n));
    }
    const size_t headers_size = empty_headers ? 0 : header_end - pos;
    if (headers_size > kMaxMultipartHeaderBytes) {
      return Bad(fmt::format("part {}'s headers are over {} bytes", n, kMaxMultipartHeaderBytes));
    }
    FormPart part;
    bool has_name = false;
    std::string_view headers = body.substr(pos, headers_size);
    while (!headers.empty()) {
      const size_t eol = headers.find("\r\n");
      std::string_view line = headers.substr(0, eol);
      headers = eol == std::string_view::npos ? std::string_view() : headers.substr(eol + 2);
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos) {
        return Bad(fmt::format("part {} has a header line without a colon", n));
      }
      const std::string_view field = Trim(line.substr(0, colon));
      const std::string_view value = Trim(line.substr(colon + 1));
      if (IEquals(field, "Content-Disposition")) {
        std::string token;
        std::vector<std::pair<std::string, std::string>> params;
        if (!ParseParams(value, &token, &params) || !IEquals(token, "form-data")) {
          return Bad(fmt::format("part {}: Content-Disposition must be form-data", n));
        }
        for (const auto& [k, v] : params) {
          if (k == "name") {
            part.name = v;
            has_name = true;
          } else if (k == "filename") {
            part.filename = v;
            part.has_filename = true;
          }
        }
      } else if (IEquals(field, "Content-Type")) {
        part.content_type = std::string(value);
      } else if (IEquals(field, "Content-Transfer-Encoding")) {
        return Bad(fmt::format("part {}: Content-Transfer-Encoding is not supported", n));
      }
    }
    if (!has_name || part.name.empty()) {
      return Bad(fmt::format("part {} has no Content-Disposition name", n));
    }
    // One value per field, as in a JSON body: only array fields ("name[]",
    // the form encoding of an array) repeat.
    const bool array_field =
        part.name.size() > 2 && part.name.compare(part.name.size() - 2, 2, "[]") == 0;
    if (!array_field && FindPart(parts, part.name) != nullptr) {
      return Bad(
          fmt::format("part {}: the field \"{}\" is sent twice (only fields named "
                      "\"...[]\" may repeat)",
                      n, ClipInput(part.name)));
    }
    const size_t content = empty_headers ? pos + 2 : header_end + 4;
    const size_t next = body.find(delimiter, content);
    if (next == std::string_view::npos) {
      return Bad(fmt::format("part {} (\"{}\") has no closing boundary (a truncated upload?)", n,
                             part.name));
    }
    part.data = body.substr(content, next - content);
    parts.push_back(std::move(part));
    pos = next + delimiter.size();
  }
  return parts;
}

const FormPart* FindPart(const std::vector<FormPart>& parts, std::string_view name) {
  for (const FormPart& p : parts) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

}  // namespace arbiter
