// server/internal/http/request_reader.cc — the Boost.Beast parser glue of
// the HTTP transport (request_reader.h): feeding it, mapping its errors to
// transport errors, checking the header once it is complete, and moving the
// parsed message into a native Request.
#include "server/internal/http/request_reader.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>

#include <boost/asio/buffer.hpp>
#include <fmt/format.h>

#include "server/internal/http/request_parsing.h"

namespace arbiter::http {

namespace bhttp = boost::beast::http;
using boost::system::error_code;

namespace {

// The transport error for a parser error.
RequestReader::Step ParseError(const error_code& ec, const ServerOptions& options,
                               size_t body_limit, const std::string& body_limit_name) {
  RequestReader::Step step;
  step.kind = RequestReader::Step::kError;
  if (ec == bhttp::error::body_limit) {
    step.status = 413;
    step.message = fmt::format("the request body is larger than the limit of {} bytes ({})",
                               body_limit, body_limit_name);
  } else if (ec == bhttp::error::header_limit) {
    step.status = 431;
    step.message = fmt::format("the request line and headers are larger than the limit of {} "
                               "bytes",
                               options.max_header_bytes);
  } else {
    step.status = 400;
    step.message = fmt::format("malformed HTTP request: {}", ec.message());
  }
  return step;
}

}  // namespace

void RequestReader::DropInput() {
  input_.clear();
  input_off_ = 0;
  if (input_.capacity() > kReadChunkBytes) input_.shrink_to_fit();
}

void RequestReader::ConsumeInput(size_t n) {
  input_off_ += n;
  if (input_off_ >= input_.size()) {
    DropInput();
  } else if (input_off_ >= (4 << 10)) {
    input_.erase(0, input_off_);
    input_off_ = 0;
  }
}

void RequestReader::Begin(const ServerOptions& options) {
  parser_.emplace();
  // Not eager until the header is checked: the path's body limit is set
  // before any body byte is parsed.
  parser_->eager(false);
  parser_->header_limit(
      static_cast<std::uint32_t>(std::min<size_t>(options.max_header_bytes, UINT32_MAX)));
  // The header is parsed under the largest limit (Beast checks a
  // Content-Length against it as the header ends); Feed() then sets the
  // request's own.
  size_t largest = options.max_body_bytes;
  for (const auto& [path, limit] : options.path_body_limits) largest = std::max(largest, limit.first);
  parser_->body_limit(largest);
  body_limit_ = options.max_body_bytes;
  body_limit_name_ = "max_body_bytes";
  header_checked_ = false;
}

void RequestReader::UsePathLimit(const ServerOptions& options) {
  const auto& h = parser_->get();
  const std::string_view target(h.target().data(), h.target().size());
  auto limit = options.path_body_limits.find(std::string(target.substr(0, target.find('?'))));
  if (limit != options.path_body_limits.end()) {
    body_limit_ = limit->second.first;
    body_limit_name_ = limit->second.second;
  }
}

RequestReader::Step RequestReader::Feed(const ServerOptions& options) {
  error_code ec;
  Step step;
  for (;;) {
    while (buffered() > 0 && !parser_->is_done()) {
      const size_t used =
          parser_->put(boost::asio::const_buffer(input_.data() + input_off_, buffered()), ec);
      ConsumeInput(used);
      if (ec == bhttp::error::need_more) {
        ec = {};
        break;
      }
      if (ec) break;
      if (used == 0) break;
      if (parser_->is_header_done() && !header_checked_) break;
    }
    if (ec) {
      // Beast checks a Content-Length as it reads that field (the request
      // line is parsed by then): name the limit of the request's own path.
      if (ec == bhttp::error::body_limit && !header_checked_) {
        UsePathLimit(options);
      }
      return ParseError(ec, options, body_limit_, body_limit_name_);
    }
    if (!parser_->is_header_done() || header_checked_) break;
    header_checked_ = true;
    const auto& h = parser_->get();
    UsePathLimit(options);
    if (parser_->content_length() && *parser_->content_length() > body_limit_) {
      return ParseError(bhttp::error::body_limit, options, body_limit_, body_limit_name_);
    }
    if (!parser_->is_done()) parser_->body_limit(body_limit_);
    parser_->eager(true);
    // A request body's length must be known (RFC 9112 6.3): a
    // Transfer-Encoding other than a final "chunked" cannot be framed.
    if (h.find(bhttp::field::transfer_encoding) != h.end() && !parser_->chunked()) {
      step.kind = Step::kError;
      step.status = 400;
      step.message = "malformed HTTP request: a Transfer-Encoding other than chunked cannot be "
                     "read";
      return step;
    }
    auto expect = h.find(bhttp::field::expect);
    if (!parser_->is_done() && expect != h.end() && h.version() >= 11 &&
        IEquals(std::string_view(expect->value().data(), expect->value().size()),
                "100-continue")) {
      step.send_continue = true;
    }
    // Loop once more: parse the body bytes already buffered.
  }
  step.kind = parser_->is_done() ? Step::kDone : Step::kNeedMore;
  return step;
}

bool RequestReader::TakeRequest(Request* req) {
  bhttp::request<bhttp::string_body> msg = parser_->release();
  parser_.reset();
  req->method.assign(msg.method_string().data(), msg.method_string().size());
  req->target.assign(msg.target().data(), msg.target().size());
  req->version = static_cast<int>(msg.version());
  for (const auto& f : msg) {
    req->headers.emplace(std::string(f.name_string().data(), f.name_string().size()),
                         std::string(f.value().data(), f.value().size()));
  }
  req->body = std::move(msg.body());
  return msg.keep_alive();
}

void RequestReader::Abandon(Request* req) {
  if (parser_ && parser_->is_header_done()) {
    const auto& h = parser_->get();
    req->method.assign(h.method_string().data(), h.method_string().size());
    req->target.assign(h.target().data(), h.target().size());
    req->path = req->target.substr(0, req->target.find('?'));
    req->version = static_cast<int>(h.version());
  }
  parser_.reset();
}

}  // namespace arbiter::http
