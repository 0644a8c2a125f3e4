// The Runtime's non-text operations (arbiter/runtime/modalities.h): each
// decodes its input with the formats layer's front doors under the [server]
// limits, then runs one BackendJob through the model's request queue
// (MemoryArbiter::Request: acquire → run → release, one run at a time per
// model, bounded), waiting for it on the caller's thread.
//
// Note [Speech streams]
// A synthesis runs on the model's queue worker while the HTTP handler waits
// on its own thread, and the handler's Responder belongs to the handler's
// thread. The worker's sink therefore hands PCM to the caller through a
// small bounded channel (at most kSpeechChannelBytes queued: the synthesis
// waits for a slow client instead of buffering the whole answer), and the
// caller's thread calls on_start / on_pcm. A client that leaves cancels the
// run between chunks.
//
// Note [Vision cache keys]
// Describe() consults the VisionEmbeddingCache before every vision run,
// keyed by HashFrame(family, width ‖ height ‖ pixels) of the *normalized*
// image (decoded, EXIF orientation applied, 8-bit grayscale — Tesseract's
// input at its own resolution), with family = "tesseract/<language>": the
// same picture sent as PNG, BMP or lossless WebP is one entry, and an
// entry is never shared across languages. The cached value is the OCR
// result, charged at its size (text, line texts and boxes).
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/backends/tts.h"
#include "arbiter/base/clip.h"
#include "arbiter/base/log_safe.h"
#include "arbiter/base/hash.h"

#include "runtime/internal/runtime_impl.h"

namespace arbiter::runtime_internal {
namespace {

constexpr size_t kSpeechChannelBytes = 1u << 20;
constexpr auto kCancelPoll = std::chrono::milliseconds(50);

// The capability error of a model asked for the wrong kind of work.
arbiter::Status WrongCapability(const std::string& name, Capability have, Capability want) {
  return InvalidArgumentError(fmt::format("model \"{}\" is a {} model, not a {} model", name,
                                          CapabilityName(have), CapabilityName(want)),
                              ErrorReason::kWrongCapability);
}

// Bad client input → kInvalidRequest (400), keeping the message.
arbiter::Status AsInvalidRequest(const arbiter::Status& st) {
  if (st.ok() || st.code() != StatusCode::kInvalidArgument) return st;
  return st.WithReason(ErrorReason::kInvalidRequest);
}

size_t OcrBytes(const OcrResult& r) {
  size_t bytes = sizeof(OcrResult) + r.text.capacity();
  for (const OcrLine& l : r.lines) bytes += sizeof(OcrLine) + l.text.capacity();
  return bytes;
}

// Note [Speech streams]: PCM chunks from the queue worker to the caller.
class PcmChannel {
 public:
  // Worker side. False once the caller stopped reading.
  bool Start(const SpeechStart& start) {
    std::lock_guard<std::mutex> l(mu_);
    start_ = start;
    started_ = true;
    cv_.notify_all();
    return !closed_;
  }
  bool Push(std::span<const int16_t> pcm, const Cancellation& cancelled) {
    std::unique_lock<std::mutex> l(mu_);
    while (!closed_ && queued_bytes_ > kSpeechChannelBytes) {
      cv_.wait_for(l, kCancelPoll);
      if (cancelled.cancelled()) return false;
    }
    if (closed_) return false;
    chunks_.emplace_back(pcm.begin(), pcm.end());
    queued_bytes_ += pcm.size() * sizeof(int16_t);
    cv_.notify_all();
    return true;
  }
  void Finish() {
    std::lock_guard<std::mutex> l(mu_);
    finished_ = true;
    cv_.notify_all();
  }
  // Caller side.
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  // Waits for the next event: the start, a chunk, or the end.
  enum class Event { kStart, kChunk, kEnd, kTimeout };
  Event Next(SpeechStart* start, std::vector<int16_t>* chunk) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, kCancelPoll, [&] { return (started_ && !start_taken_) || !chunks_.empty() || finished_; });
    if (started_ && !start_taken_) {
      start_taken_ = true;
      *start = start_;
      return Event::kStart;
    }
    if (!chunks_.empty()) {
      *chunk = std::move(chunks_.front());
      chunks_.pop_front();
      queued_bytes_ -= chunk->size() * sizeof(int16_t);
      cv_.notify_all();
      return Event::kChunk;
    }
    return finished_ ? Event::kEnd : Event::kTimeout;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  SpeechStart start_;
  bool started_ = false, start_taken_ = false, finished_ = false, closed_ = false;
  std::deque<std::vector<int16_t>> chunks_;
  size_t queued_bytes_ = 0;
};

}  // namespace

Result<ModelEntry> RuntimeImpl::Model(const std::string& name) const {
  for (const ModelEntry& m : config_.models) {
    if (m.name == name) return m;
  }
  return NotFoundError(fmt::format("model \"{}\" not found", ClipInput(name)),
                       ErrorReason::kModelNotFound);
}

Result<std::any> RuntimeImpl::RunBackend(Capability capability, const std::string& model,
                                         std::shared_ptr<BackendJob> job,
                                         const Cancellation& cancelled) {
  if (stopping()) {
    return UnavailableError("the server is shutting down", ErrorReason::kShuttingDown);
  }
  ARBITER_ASSIGN_OR_RETURN(ModelEntry entry, Model(model));
  if (entry.capability != capability) return WrongCapability(model, entry.capability, capability);
  if (entry.engine == ModelEngine::kProcess) {
    return InvalidArgumentError(
        fmt::format("model \"{}\" is served by an external process; its routes are proxied",
                    model),
        ErrorReason::kWrongCapability);
  }
  std::stop_source stop;
  job->cancelled = cancelled;
  std::future<Result<std::any>> f = arbiter_->Request(capability, model, std::any(job),
                                                      stop.get_token());
  while (f.wait_for(kCancelPoll) != std::future_status::ready) {
    if (cancelled.cancelled() || stopping()) stop.request_stop();
  }
  Result<std::any> r = f.get();
  if (!r.ok()) return AsInvalidRequest(r.status());
  return r;
}

Result<TranscribeResult> RuntimeImpl::Transcribe(const TranscribeRequest& request,
                                                 const Cancellation& cancelled) {
  ARBITER_ASSIGN_OR_RETURN(ModelEntry entry, Model(request.model));
  if (entry.capability != Capability::kTranscribe) {
    return WrongCapability(request.model, entry.capability, Capability::kTranscribe);
  }
  if (!request.language.empty() && request.language != "en") {
    return InvalidArgumentError(
        fmt::format("\"language\" \"{}\" is not spoken by model \"{}\" (it transcribes \"en\")",
                    request.language, request.model),
        ErrorReason::kInvalidRequest);
  }
  AudioLimits limits{config_.server.max_audio_bytes, config_.server.max_audio_seconds};
  Result<DecodedAudio> audio = DecodeAudio(*request.audio, limits, "file");
  if (!audio.ok()) return AsInvalidRequest(audio.status());
  auto job = std::make_shared<BackendJob>();
  job->kind = BackendJob::Kind::kTranscribe;
  TranscribeResult out;
  out.format = audio->format;
  job->audio = std::make_shared<const DecodedAudio>(std::move(audio).value());
  ARBITER_ASSIGN_OR_RETURN(std::any r,
                           RunBackend(Capability::kTranscribe, request.model, job, cancelled));
  out.transcript = std::any_cast<Transcript>(std::move(r));
  out.transcript.seconds = job->audio->seconds;
  return out;
}

Result<VadResult> RuntimeImpl::DetectSpeech(const VadRequest& request,
                                            const Cancellation& cancelled) {
  ARBITER_ASSIGN_OR_RETURN(ModelEntry entry, Model(request.model));
  if (entry.capability != Capability::kVad) {
    return WrongCapability(request.model, entry.capability, Capability::kVad);
  }
  AudioLimits limits{config_.server.max_audio_bytes, config_.server.max_audio_seconds};
  Result<DecodedAudio> audio = DecodeAudio(*request.audio, limits, "file");
  if (!audio.ok()) return AsInvalidRequest(audio.status());
  auto job = std::make_shared<BackendJob>();
  job->kind = BackendJob::Kind::kVad;
  VadResult out;
  out.seconds = audio->seconds;
  job->audio = std::make_shared<const DecodedAudio>(std::move(audio).value());
  ARBITER_ASSIGN_OR_RETURN(std::any r, RunBackend(Capability::kVad, request.model, job, cancelled));
  out.segments = std::any_cast<std::vector<SpeechSegment>>(std::move(r));
  return out;
}

arbiter::Status RuntimeImpl::Speak(const SpeechRequest& request,
                          const std::function<bool(const SpeechStart&)>& on_start,
                          const std::function<bool(std::span<const int16_t>)>& on_pcm,
                          const Cancellation& cancelled) {
  ARBITER_ASSIGN_OR_RETURN(ModelEntry entry, Model(request.model));
  if (entry.capability != Capability::kSpeak) {
    return WrongCapability(request.model, entry.capability, Capability::kSpeak);
  }
  if (request.input.empty()) {
    return InvalidArgumentError("\"input\" must not be empty", ErrorReason::kInvalidRequest);
  }
  // Before anything is loaded or queued: Note [Speech in pieces]
  // (backends/speech_pieces.cc) bounds the memory of a synthesis, this
  // bounds its time.
  const size_t max_chars = static_cast<size_t>(config_.server.max_speech_chars);
  if (const size_t n = CountCodePoints(request.input, max_chars); n > max_chars) {
    return InvalidArgumentError(
        fmt::format("\"input\" is longer than {} characters ([server] max_speech_chars; "
                    "characters are Unicode code points): split the text into several requests",
                    max_chars),
        ErrorReason::kInvalidRequest);
  }
  if (!(request.speed >= 0.25 && request.speed <= 4.0)) {
    return InvalidArgumentError(
        fmt::format("\"speed\" must be between 0.25 and 4.0 (got {})", request.speed),
        ErrorReason::kInvalidRequest);
  }
  auto channel = std::make_shared<PcmChannel>();
  auto job = std::make_shared<BackendJob>();
  job->kind = BackendJob::Kind::kSpeak;
  job->text = request.input;
  job->voice = request.voice;
  job->speed = request.speed;
  job->on_start = [channel](const SpeechStart& s) { return channel->Start(s); };
  // The job's cancellation is set by RunBackend; the sink reads it there.
  BackendJob* raw = job.get();
  job->sink = [channel, raw](std::span<const int16_t> pcm) {
    return channel->Push(pcm, raw->cancelled);
  };
  // The run goes on the queue worker; this thread relays the stream.
  Result<std::any> result = InternalError("speech did not run");
  std::thread runner([&] {
    result = RunBackend(Capability::kSpeak, request.model, job, cancelled);
    channel->Finish();
  });
  bool caller_stopped = false;
  bool started = false;
  for (;;) {
    SpeechStart start;
    std::vector<int16_t> chunk;
    PcmChannel::Event ev = channel->Next(&start, &chunk);
    if (ev == PcmChannel::Event::kEnd) break;
    if (ev == PcmChannel::Event::kTimeout) continue;
    if (caller_stopped) continue;
    bool go = true;
    if (ev == PcmChannel::Event::kStart) {
      started = true;
      go = on_start(start);
    } else if (!chunk.empty()) {
      go = on_pcm(chunk);
    }
    if (!go) {
      caller_stopped = true;
      channel->Close();
    }
  }
  runner.join();
  if (!result.ok()) {
    if (started) {
      spdlog::warn("speech of model \"{}\" ended early: {}", LogSafe(request.model),
                   LogSafe(result.status().message(), kLogSafeMessageBytes));
    }
    return result.status();
  }
  return OkStatus();
}

Result<DescribeResult> RuntimeImpl::Describe(const DescribeRequest& request,
                                             const Cancellation& cancelled) {
  ARBITER_ASSIGN_OR_RETURN(ModelEntry entry, Model(request.model));
  if (entry.capability != Capability::kVisionDescribe) {
    return WrongCapability(request.model, entry.capability, Capability::kVisionDescribe);
  }
  ImageLimits limits;
  limits.max_bytes = config_.server.max_image_bytes;
  limits.max_pixels = config_.server.max_image_pixels;
  Result<GrayImage> image = DecodeImageGray(*request.image, limits, request.field);
  if (!image.ok()) return AsInvalidRequest(image.status());
  // Note [Vision cache keys].
  std::string frame(8 + image->pixels.size(), '\0');
  const uint32_t w = static_cast<uint32_t>(image->width), h = static_cast<uint32_t>(image->height);
  std::memcpy(frame.data(), &w, 4);
  std::memcpy(frame.data() + 4, &h, 4);
  std::memcpy(frame.data() + 8, image->pixels.data(), image->pixels.size());
  const std::string key = HashFrame(fmt::format("tesseract/{}", entry.language), frame);
  DescribeResult out;
  out.model = request.model;
  out.width = image->width;
  out.height = image->height;
  if (std::optional<VisionEmbedding> hit = vision_cache_->Get(key)) {
    out.ocr = std::static_pointer_cast<const OcrResult>(hit->result);
    out.cached = true;
    return out;
  }
  auto job = std::make_shared<BackendJob>();
  job->kind = BackendJob::Kind::kDescribe;
  job->image = std::make_shared<const GrayImage>(std::move(image).value());
  ARBITER_ASSIGN_OR_RETURN(std::any r,
                           RunBackend(Capability::kVisionDescribe, request.model, job, cancelled));
  auto ocr = std::make_shared<const OcrResult>(std::any_cast<OcrResult>(std::move(r)));
  VisionEmbedding value;
  value.result = ocr;
  value.result_bytes = OcrBytes(*ocr);
  // A full ledger only costs the next request a miss.
  (void)vision_cache_->Set(key, std::move(value));
  out.ocr = std::move(ocr);
  return out;
}

arbiter::Status RuntimeImpl::DescribeChatImages(const std::string& model,
                                                std::vector<ChatImage> images,
                                                std::vector<ChatMessage>* messages,
                                                const Cancellation& cancelled) {
  ARBITER_ASSIGN_OR_RETURN(ModelEntry entry, Model(model));
  if (entry.vision.empty()) {
    return InvalidArgumentError(
        fmt::format("\"{}\": model \"{}\" has no vision model to read images ([[models]] vision)",
                    images.front().field, model),
        ErrorReason::kInvalidRequest);
  }
  // Blocks are inserted from the last offset backwards, so earlier offsets
  // stay valid.
  std::vector<std::string> blocks(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    DescribeRequest d{entry.vision, images[i].bytes, images[i].field};
    ARBITER_ASSIGN_OR_RETURN(DescribeResult r, Describe(d, cancelled));
    blocks[i] = fmt::format("\n<image {} text, read by {}>\n{}\n</image {} text>\n", i + 1,
                            entry.vision, r.ocr->text, i + 1);
  }
  for (size_t k = images.size(); k-- > 0;) {
    const ChatImage& im = images[k];
    if (im.message >= messages->size()) {
      return InvalidArgumentError(fmt::format("\"{}\" is outside the messages", im.field),
                                  ErrorReason::kInvalidRequest);
    }
    std::string& content = (*messages)[im.message].content;
    content.insert(std::min(im.offset, content.size()), blocks[k]);
  }
  return OkStatus();
}

Result<ProcessLease> RuntimeImpl::AcquireProcess(const std::string& name, Capability capability) {
  ARBITER_ASSIGN_OR_RETURN(ModelEntry entry, Model(name));
  if (entry.capability != capability) return WrongCapability(name, entry.capability, capability);
  if (entry.engine != ModelEngine::kProcess) {
    return InvalidArgumentError(fmt::format("model \"{}\" is not a process model", name),
                                ErrorReason::kWrongCapability);
  }
  if (stopping()) {
    return UnavailableError("the server is shutting down", ErrorReason::kShuttingDown);
  }
  Result<ArbiterHandle> h = arbiter_->Acquire(
      capability, name, Deadline(std::chrono::seconds(config_.server.acquire_timeout_s)));
  if (!h.ok()) return h.status();
  BackendModel* m = h->backend<BackendModel>();
  if (m == nullptr || m->process == nullptr) {
    return InternalError(fmt::format("model \"{}\" has no process backend", name));
  }
  ProcessLease lease;
  lease.port = m->process->port();
  lease.handle = std::move(h).value();
  return lease;
}

VisionCacheStats RuntimeImpl::VisionCache() const { return vision_cache_->Stats(); }

std::vector<ProcessModelStats> RuntimeImpl::ProcessStats() const {
  return backends_ != nullptr ? backends_->ProcessStats() : std::vector<ProcessModelStats>{};
}

}  // namespace arbiter::runtime_internal
