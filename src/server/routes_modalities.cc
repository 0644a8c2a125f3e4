// The OpenAI routes of the other modalities (issue 14 point 2):
//   POST /v1/audio/transcriptions  multipart: file, model, language,
//                                  response_format (json | text | verbose_json),
//                                  temperature (0 only)
//   POST /v1/audio/speech          JSON: model, input, voice, response_format
//                                  (mp3 default | wav | pcm), speed
//   POST /v1/audio/vad             multipart: file, model (extension)
//   POST /v1/vision/describe       JSON: model, image (a data: URL) (extension)
//   POST /v1/images/generations    process-backed image-gen models only
// and the proxy of every OpenAI route to a process-backed model (Note
// [Proxied models]). Each parses its body at the edge, calls the Runtime,
// and serializes the result; a field we do not implement is a 400 naming it.
//
// Note [Proxied models]
// A request whose `model` is an external process (`engine = "process"`) is
// forwarded as received — body, query, headers minus hop-by-hop ones — to
// the child's port while the model is pinned (ProcessLease), and its answer
// relayed, streaming included. The body is only peeked at for `model` (JSON
// or the multipart field), so the child sees every field it supports.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/log_safe.h"
#include "arbiter/backends/tts.h"
#include "arbiter/base/clip.h"
#include "arbiter/formats/image.h"
#include "arbiter/server/multipart.h"
#include "arbiter/server/openai.h"
#include "server/internal/context.h"
#include "server/internal/errors.h"
#include "server/internal/json_fields.h"
#include "server/internal/proxy.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

Status BadRequest(std::string message) {
  return InvalidArgumentError(std::move(message), ErrorReason::kInvalidRequest);
}

SharedBytes BytesOf(std::string_view data) {
  return std::make_shared<const std::vector<uint8_t>>(data.begin(), data.end());
}

// The multipart fields of an audio upload, checked: `allowed` are known,
// any other field is a 400 naming it.
Result<std::vector<FormPart>> AudioForm(const http::Request& req,
                                        std::initializer_list<std::string_view> allowed) {
  Result<std::vector<FormPart>> parts = ParseMultipart(req.header("Content-Type"), req.body);
  if (!parts.ok()) return BadRequest(parts.status().message());
  for (const FormPart& p : *parts) {
    bool known = false;
    for (std::string_view a : allowed) known |= p.name == a;
    if (!known) return BadRequest(fmt::format("\"{}\" is not supported", ClipInput(p.name)));
  }
  const FormPart* model = FindPart(*parts, "model");
  if (model == nullptr || model->data.empty()) return BadRequest("\"model\" is required");
  const FormPart* file = FindPart(*parts, "file");
  if (file == nullptr) return BadRequest("\"file\" is required (the audio file)");
  if (file->data.empty()) return BadRequest("\"file\" is empty");
  return parts;
}

// Note [Proxied models]: the `model` of a body, or "".
std::string PeekModel(const http::Request& req) {
  const std::string type = req.header("Content-Type");
  if (type.rfind("multipart/", 0) == 0) {
    Result<std::vector<FormPart>> parts = ParseMultipart(type, req.body);
    if (!parts.ok()) return "";
    const FormPart* m = FindPart(*parts, "model");
    return m != nullptr ? std::string(m->data) : "";
  }
  // The routes' own reader (Note [One JSON reader]): a body it refuses is
  // not proxied, and the route's parser answers with the reason.
  Result<RequestJson> j = ParseBody(req.body);
  if (!j.ok()) return "";
  auto it = j->find("model");
  return it != j->end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

bool ProxyIfProcessModel(ServerContext& ctx, const http::Request& req, http::Responder& out,
                         Capability capability) {
  // Most servers have no process model of the capability: then the body is
  // not parsed a second time just to find its `model`.
  const std::vector<ModelEntry>& models = ctx.runtime->config().models;
  if (std::none_of(models.begin(), models.end(), [&](const ModelEntry& m) {
        return m.engine == ModelEngine::kProcess && m.capability == capability;
      })) {
    return false;
  }
  const std::string model = PeekModel(req);
  if (model.empty()) return false;
  Result<ModelEntry> entry = ctx.runtime->Model(model);
  if (!entry.ok() || entry->engine != ModelEngine::kProcess) return false;
  Result<ProcessLease> lease = ctx.runtime->AcquireProcess(model, capability);
  if (!lease.ok()) {
    SendStatus(out, lease.status());
    return true;
  }
  ProxyToProcess(req, out, lease->port, model, ctx.settings.request_timeout_s * 10);
  return true;  // the lease (the model's pin) ends here
}

namespace {

void HandleTranscriptions(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  if (ProxyIfProcessModel(ctx, req, out, Capability::kTranscribe)) return;
  Result<std::vector<FormPart>> parts =
      AudioForm(req, {"file", "model", "language", "response_format", "temperature", "prompt",
                      "timestamp_granularities[]", "stream", "chunking_strategy", "include[]"});
  if (!parts.ok()) return SendStatus(out, parts.status());
  auto field = [&](std::string_view name) -> std::string {
    const FormPart* p = FindPart(*parts, name);
    return p != nullptr ? std::string(p->data) : "";
  };
  // PocketSphinx does not sample, has no prompt and no word timings.
  if (const std::string t = field("temperature"); !t.empty()) {
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (end == t.c_str() || *end != '\0' || !std::isfinite(v)) {
      return SendStatus(out, BadRequest(fmt::format("\"temperature\" must be a number (got \"{}\")",
                                                    ClipInput(t))));
    }
    if (v != 0) {
      return SendStatus(out, BadRequest("\"temperature\" must be 0: PocketSphinx does not sample"));
    }
  }
  if (!field("prompt").empty()) {
    return SendStatus(out, BadRequest("\"prompt\" is not supported by PocketSphinx models"));
  }
  if (const std::string s = field("stream"); !s.empty() && s != "false") {
    return SendStatus(out, BadRequest("\"stream\" is not supported for transcriptions"));
  }
  if (FindPart(*parts, "chunking_strategy") != nullptr || FindPart(*parts, "include[]") != nullptr) {
    return SendStatus(out, BadRequest(fmt::format("\"{}\" is not supported",
                                                  FindPart(*parts, "chunking_strategy") != nullptr
                                                      ? "chunking_strategy"
                                                      : "include[]")));
  }
  for (const FormPart& p : *parts) {
    if (p.name == "timestamp_granularities[]" && p.data != "segment") {
      return SendStatus(
          out, BadRequest(fmt::format("\"timestamp_granularities[]\" \"{}\" is not supported (only "
                                      "\"segment\")",
                                      ClipInput(p.data))));
    }
  }
  std::string format = field("response_format");
  if (format.empty()) format = "json";
  if (format != "json" && format != "text" && format != "verbose_json") {
    return SendStatus(out, BadRequest(fmt::format(
                               "\"response_format\" \"{}\" is not supported: one of json, text, "
                               "verbose_json",
                               ClipInput(format))));
  }
  TranscribeRequest r;
  r.model = field("model");
  r.language = field("language");
  r.audio = BytesOf(FindPart(*parts, "file")->data);
  Result<TranscribeResult> t = ctx.runtime->Transcribe(r, out.cancel_token());
  if (!t.ok()) return SendStatus(out, t.status());
  const Transcript& tr = t->transcript;
  if (format == "text") {
    http::Response res;
    res.content_type = "text/plain; charset=utf-8";
    res.body = tr.text + "\n";
    return out.Send(std::move(res));
  }
  json body = {{"text", tr.text}, {"usage", {{"type", "duration"}, {"seconds", std::ceil(tr.seconds)}}}};
  if (format == "verbose_json") {
    json segments = json::array();
    for (size_t i = 0; i < tr.segments.size(); ++i) {
      const TranscriptSegment& s = tr.segments[i];
      segments.push_back({{"id", i},
                          {"seek", 0},
                          {"start", s.start_ms / 1000.0},
                          {"end", s.end_ms / 1000.0},
                          {"text", s.text},
                          {"tokens", json::array()},
                          {"temperature", 0.0}});
    }
    body = {{"task", "transcribe"},
            {"language", "english"},
            {"duration", tr.seconds},
            {"text", tr.text},
            {"segments", std::move(segments)},
            {"usage", {{"type", "duration"}, {"seconds", std::ceil(tr.seconds)}}}};
  }
  SendJson(out, 200, body.dump());
}

void HandleVad(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  Result<std::vector<FormPart>> parts = AudioForm(req, {"file", "model"});
  if (!parts.ok()) return SendStatus(out, parts.status());
  VadRequest r;
  r.model = std::string(FindPart(*parts, "model")->data);
  r.audio = BytesOf(FindPart(*parts, "file")->data);
  Result<VadResult> v = ctx.runtime->DetectSpeech(r, out.cancel_token());
  if (!v.ok()) return SendStatus(out, v.status());
  json segments = json::array();
  for (const SpeechSegment& s : v->segments) {
    segments.push_back({{"start_ms", s.start_ms}, {"end_ms", s.end_ms}});
  }
  SendJson(out, 200,
           json{{"model", r.model},
                {"duration_ms", static_cast<int64_t>(std::llround(v->seconds * 1000))},
                {"segments", std::move(segments)}}
               .dump());
}

// A WAV answer's charge follows its buffer in steps of this many bytes.
constexpr size_t kChargeStepBytes = 256u << 10;

void HandleSpeech(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  if (ProxyIfProcessModel(ctx, req, out, Capability::kSpeak)) return;
  Result<SpeechBody> parsed = ParseSpeechRequest(req.body);
  if (!parsed.ok()) {
    return SendStatus(out, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  }
  Result<AudioFormat> format = ParseAudioFormat(parsed->response_format);
  if (!format.ok()) return SendStatus(out, BadRequest(format.status().message()));
  SpeechRequest r{parsed->model, parsed->input, parsed->voice, parsed->speed};
  std::unique_ptr<AudioEncoder> encoder;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string whole;          // WAV: the header needs the size, so it is sent whole
  // What a WAV answer buffers is charged to the model while it is held
  // (the PCM the encoder keeps, then the file).
  MemoryCharge buffered;
  size_t buffered_bytes = 0;
  bool streaming = false;
  bool client_ok = true;
  Status encode_error;
  auto on_start = [&](const SpeechStart& s) {
    Result<std::unique_ptr<AudioEncoder>> e = AudioEncoder::Create(*format, s.sample_rate);
    if (!e.ok()) {
      encode_error = e.status();
      return false;
    }
    encoder = std::move(e).value();
    headers = {{"X-Sample-Rate", std::to_string(s.sample_rate)},
               {"X-Arbiter-Voice", s.voice}};
    if (*format == AudioFormat::kWav) return true;
    streaming = true;
    std::string type(AudioFormatMime(*format));
    if (*format == AudioFormat::kPcm) {
      type += fmt::format(";rate={};channels=1;encoding=signed-int;bits=16", s.sample_rate);
    }
    client_ok = out.StartStream(200, type, headers);
    return client_ok;
  };
  auto on_pcm = [&](std::span<const int16_t> pcm) {
    Result<std::string> bytes = encoder->Encode(pcm);
    if (!bytes.ok()) {
      encode_error = bytes.status();
      return false;
    }
    if (!streaming) {
      whole += *bytes;
      buffered_bytes += pcm.size_bytes();
      if (buffered.released()) {
        buffered = ctx.runtime->ChargeMemory(ResidentKey(Capability::kSpeak, r.model),
                                             ChargeKind::kScratch, buffered_bytes);
      } else if (buffered_bytes >= buffered.bytes() + kChargeStepBytes) {
        buffered.ForceResize(buffered_bytes);
      }
      return true;
    }
    client_ok = bytes->empty() || out.Write(*bytes);
    return client_ok;
  };
  Status st = ctx.runtime->Speak(r, on_start, on_pcm, out.cancel_token());
  if (!encode_error.ok()) st = encode_error;
  if (!streaming) {
    if (!st.ok()) return SendStatus(out, st);
    if (encoder == nullptr) return SendStatus(out, InternalError("the speech produced no audio"));
    Result<std::string> tail = encoder->Finish();
    if (!tail.ok()) return SendStatus(out, tail.status());
    http::Response res;
    res.content_type = std::string(AudioFormatMime(*format));
    res.headers = std::move(headers);
    res.body = whole.empty() ? std::move(*tail) : whole + *tail;
    buffered.ForceResize(res.body.size());
    return out.Send(std::move(res));
  }
  // Streaming: an error after the first bytes can only end the stream.
  if (client_ok && st.ok()) {
    Result<std::string> tail = encoder->Finish();
    if (tail.ok() && !tail->empty()) client_ok = out.Write(*tail);
  }
  if (!st.ok()) {
    spdlog::warn("speech of \"{}\" ended early: {}", LogSafe(r.model),
                 LogSafe(st.message(), kLogSafeMessageBytes));
  }
  out.End();
}

void HandleDescribe(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  Result<DescribeBody> parsed = ParseDescribeRequest(req.body);
  if (!parsed.ok()) {
    return SendStatus(out, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  }
  Result<std::vector<uint8_t>> bytes =
      DecodeDataUrl(parsed->image, parsed->field, ctx.settings.max_image_bytes);
  if (!bytes.ok()) return SendStatus(out, BadRequest(bytes.status().message()));
  DescribeRequest r;
  r.model = parsed->model;
  r.field = parsed->field;
  r.image = std::make_shared<const std::vector<uint8_t>>(std::move(bytes).value());
  Result<DescribeResult> d = ctx.runtime->Describe(r, out.cancel_token());
  if (!d.ok()) return SendStatus(out, d.status());
  json lines = json::array();
  for (const OcrLine& l : d->ocr->lines) {
    lines.push_back({{"text", l.text},
                     {"confidence", std::round(static_cast<double>(l.confidence) * 10) / 10},
                     {"box", {l.x, l.y, l.w, l.h}}});
  }
  SendJson(out, 200,
           json{{"model", d->model},
                {"text", d->ocr->text},
                {"lines", std::move(lines)},
                {"width", d->width},
                {"height", d->height},
                {"cached", d->cached}}
               .dump());
}

void HandleImages(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  if (ProxyIfProcessModel(ctx, req, out, Capability::kImageGen)) return;
  Result<RequestJson> body = ParseBody(req.body);
  if (!body.ok()) return SendStatus(out, body.status());
  std::string model;
  if (Status st = GetString(*body, "model", true, &model); !st.ok()) {
    return SendStatus(out, BadRequest(st.message()));
  }
  Result<ModelEntry> entry = ctx.runtime->Model(model);
  if (!entry.ok()) return SendStatus(out, entry.status());
  SendStatus(out, InvalidArgumentError(
                      fmt::format("model \"{}\" is a {} model; image generation is served by "
                                  "process-backed image-gen models (engine = \"process\")",
                                  model, CapabilityName(entry->capability)),
                      ErrorReason::kWrongCapability));
}

}  // namespace

Status AddChatImages(const ServerContext& ctx, const std::vector<ChatImagePart>& parts,
                     TextRequest* request) {
  if (parts.empty()) return OkStatus();
  ARBITER_ASSIGN_OR_RETURN(request->images, ChatImagesOf(ctx, parts));
  return OkStatus();
}

Result<std::vector<ChatImage>> ChatImagesOf(const ServerContext& ctx,
                                            const std::vector<ChatImagePart>& parts) {
  std::vector<ChatImage> out;
  for (const ChatImagePart& p : parts) {
    Result<std::vector<uint8_t>> bytes = DecodeDataUrl(p.url, p.field, ctx.settings.max_image_bytes);
    if (!bytes.ok()) return BadRequest(bytes.status().message());
    out.push_back({p.message, p.offset,
                   std::make_shared<const std::vector<uint8_t>>(std::move(bytes).value()), p.field});
  }
  return out;
}

std::vector<Route> ModalityRoutes(ServerContext& ctx) {
  using http::Dispatch;
  using http::Request;
  using http::Responder;
  return {
      {"POST", "/v1/audio/transcriptions", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleTranscriptions(ctx, req, out); }},
      {"POST", "/v1/audio/speech", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleSpeech(ctx, req, out); }},
      {"POST", "/v1/audio/vad", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleVad(ctx, req, out); }},
      {"POST", "/v1/vision/describe", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleDescribe(ctx, req, out); }},
      {"POST", "/v1/images/generations", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleImages(ctx, req, out); }},
  };
}

}  // namespace arbiter::server_internal
