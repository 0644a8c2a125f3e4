// server/internal/ollama.h — Ollama's wire format (docs/http-api.md
// "Ollama compatibility"), parsed into native structs at the edge like the
// OpenAI one (arbiter/server/openai.h).
//
// Parsing policy: `null` is absent; every top-level field, message field
// and `options` key is implemented, a documented no-op (it cannot change
// the result), or a 400 naming it — an unknown field is a 400 too, never
// silently ignored. Model names may carry Ollama's ":latest" tag, which is
// stripped (answers name the model "<name>:latest").
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/runtime/runtime.h"
#include "arbiter/server/openai.h"
#include "server/internal/json_fields.h"

namespace arbiter::server_internal {

// Ollama's "forever": Go's largest time.Duration (2^63 − 1 ns, ~292 years)
// in milliseconds. A keep_alive this long or longer means no TTL.
inline constexpr int64_t kOllamaForeverMs = 9223372036854;

// Ollama's keep_alive: empty = not sent (the TTL stays as it is); else the
// idle TTL to set after the request (`ttl_ms` empty = forever; otherwise in
// [0, kOllamaForeverMs)).
struct OllamaKeepAlive {
  std::optional<int64_t> ttl_ms;
};

// POST /api/chat and POST /api/generate, both as one text request.
struct OllamaTextRequest {
  TextRequest text;                    // model stripped of ":latest"
  std::vector<ChatImagePart> images;   // base64 images as "data:;base64," URLs
  bool stream = true;                  // Ollama's default
  std::optional<OllamaKeepAlive> keep_alive;
  // No messages (chat) or an empty prompt (generate): load the model (or,
  // with keep_alive 0, unload it) and answer done_reason "load"/"unload".
  bool load_only = false;
  // options.num_ctx: must equal the model's context (checked by the route).
  std::optional<int64_t> num_ctx;
};

// POST /api/embed ({"input": string | [string]}) and the legacy
// POST /api/embeddings ({"prompt": string}).
struct OllamaEmbedRequest {
  EmbedRequest embed;
  std::optional<OllamaKeepAlive> keep_alive;
  std::optional<int64_t> num_ctx;
};

// Errors: kInvalidArgument naming the field (see the file comment).
Result<OllamaTextRequest> ParseOllamaChat(std::string_view body);
Result<OllamaTextRequest> ParseOllamaGenerate(std::string_view body);
Result<OllamaEmbedRequest> ParseOllamaEmbed(std::string_view body, bool legacy);
// POST /api/show: {"model"} (or the older {"name"}), "verbose".
Result<std::string> ParseOllamaShow(std::string_view body);

// A keep_alive value: a number of seconds, or a Go duration string ("5m",
// "1h30m", "30s", "500ms", "-1", "0"); negative, or kOllamaForeverMs and
// longer (1e18, "99999999999h"), = forever.
Result<OllamaKeepAlive> ParseKeepAlive(const RequestJson& value);

// "name:latest" → "name"; other tags are kept (and will not be found).
std::string OllamaStripTag(std::string_view model);
// "name" → "name:latest".
std::string OllamaTagged(std::string_view model);
// RFC 3339 UTC with nanoseconds, as Ollama prints: "2026-11-24T13:19:30.123456789Z".
// `unix_s` may lie centuries ahead (Ollama's "forever"); `nanos` may be
// negative or ≥ 1e9 (carried into the seconds). Always a valid RFC 3339
// time: times outside the years 0001..9999 are clamped to them.
std::string OllamaTime(int64_t unix_s, int64_t nanos);
inline std::string OllamaTime(int64_t unix_ns) {
  return OllamaTime(unix_ns / 1000000000, unix_ns % 1000000000);
}
// "stop" | "length" (done_reason).
std::string_view OllamaDoneReason(FinishReason reason);

}  // namespace arbiter::server_internal
