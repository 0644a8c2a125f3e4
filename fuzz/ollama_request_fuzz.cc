// libFuzzer target: Ollama's request parsers (server/internal/ollama.h:
// ParseOllamaChat, ParseOllamaGenerate, ParseOllamaEmbed for /api/embed and
// /api/embeddings, ParseOllamaShow) on arbitrary bytes, i.e. an untrusted
// HTTP body. No exception may escape; every error must be kInvalidArgument
// with a message; accepted requests must satisfy the ranges ollama.cc
// promises (Note [Ollama options]), and a `format` schema is handed on as
// the client wrote it (keys in declared order: what nlohmann's own ordered
// parser makes of it).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/internal/ollama.h"

namespace {

template <typename R>
bool CheckError(const arbiter::Result<R>& r) {
  if (r.ok()) return true;
  if (r.status().code() != arbiter::StatusCode::kInvalidArgument) __builtin_trap();
  if (r.status().message().empty()) __builtin_trap();
  return false;
}

void CheckText(const arbiter::server_internal::OllamaTextRequest& r) {
  const arbiter::TextRequest& t = r.text;
  if (t.model.empty()) __builtin_trap();
  const arbiter::SamplingParams& s = t.sampling;
  if (!(s.temperature >= 0) || !(s.top_p > 0 && s.top_p <= 1) || s.top_k < 0) __builtin_trap();
  if (!(s.min_p >= 0 && s.min_p <= 1) || !(s.repetition_penalty > 0)) __builtin_trap();
  if (!(s.presence_penalty >= -2 && s.presence_penalty <= 2)) __builtin_trap();
  if (!(s.frequency_penalty >= -2 && s.frequency_penalty <= 2)) __builtin_trap();
  if (t.max_tokens && *t.max_tokens < 1) __builtin_trap();
  if (r.keep_alive && r.keep_alive->ttl_ms && *r.keep_alive->ttl_ms < 0) __builtin_trap();
  for (const auto& m : t.messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      __builtin_trap();
    }
  }
  for (const auto& img : r.images) {
    if (img.message >= t.messages.size() && t.chat) __builtin_trap();
  }
  if (!t.chat && !t.messages.empty()) __builtin_trap();
}

// The schema text of an accepted `format` object is the client's, compacted.
void CheckFormat(const arbiter::server_internal::OllamaTextRequest& r, std::string_view body) {
  if (r.text.constraint != arbiter::OutputConstraintKind::kJsonSchema) return;
  const auto doc = nlohmann::ordered_json::parse(body.begin(), body.end());
  if (r.text.constraint_text != doc.at("format").dump()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace si = arbiter::server_internal;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  if (auto chat = si::ParseOllamaChat(body); CheckError(chat)) {
    if (!chat->text.chat) __builtin_trap();
    CheckText(*chat);
    CheckFormat(*chat, body);
  }
  if (auto gen = si::ParseOllamaGenerate(body); CheckError(gen)) {
    CheckText(*gen);
    CheckFormat(*gen, body);
  }
  for (bool legacy : {false, true}) {
    if (auto e = si::ParseOllamaEmbed(body, legacy); CheckError(e)) {
      if (e->embed.model.empty() || e->embed.inputs.empty()) __builtin_trap();
    }
  }
  if (auto show = si::ParseOllamaShow(body); CheckError(show)) {
    if (show->empty()) __builtin_trap();
  }
  return 0;
}
