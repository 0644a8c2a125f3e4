// arbiter/runtime/modalities.h — the requests and results of the Runtime's
// non-text operations (issue 14: speech recognition, speech synthesis,
// vision-describe, voice-activity detection) and of process-backed models.
//
// Native structs: the HTTP edge parses multipart and JSON bodies into them;
// nothing below the runtime sees HTTP. Audio and images travel as the bytes
// the client sent (shared, so a queued run never copies them); the runtime
// decodes them with the formats layer's front doors (formats/audio.h,
// formats/image.h) under the [server] limits, so every path — HTTP, CLI,
// bench — gets the same checks.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/backends/pocketsphinx.h"
#include "arbiter/backends/tesseract_ocr.h"
#include "arbiter/backends/tts.h"

namespace arbiter {

// Bytes as received (an uploaded file, a decoded data: URL).
using SharedBytes = std::shared_ptr<const std::vector<uint8_t>>;

// POST /v1/audio/transcriptions.
struct TranscribeRequest {
  std::string model;
  SharedBytes audio;                  // the uploaded file (WAV, FLAC, OGG)
  std::string language;               // "" or an ISO-639-1 code the model speaks ("en")
};
struct TranscribeResult {
  Transcript transcript;              // text, segments (VAD-split, ms), seconds of audio
  std::string format;                 // the decoded container ("wav", "flac", ...)
};

// POST /v1/audio/vad.
struct VadRequest {
  std::string model;
  SharedBytes audio;
};
struct VadResult {
  std::vector<SpeechSegment> segments;  // start_ms < end_ms, in order
  double seconds = 0;                   // of audio
};

// POST /v1/audio/speech.
struct SpeechRequest {
  std::string model;
  std::string input;                  // non-empty text
  std::string voice;                  // "" = the model's default voice
  double speed = 1.0;                 // 0.25..4.0
};
// What a synthesis stream reports before its first audio.
struct SpeechStart {
  int sample_rate = 0;                // Hz of the PCM that follows
  std::string voice;                  // the voice used
};

// POST /v1/vision/describe, and the image parts of a chat.
struct DescribeRequest {
  std::string model;                  // a vision-describe model
  SharedBytes image;                  // PNG, JPEG, WebP or BMP bytes
  std::string field = "image";        // names the image in errors
};
struct DescribeResult {
  std::string model;
  std::shared_ptr<const OcrResult> ocr;  // text and lines (boxes, confidences)
  bool cached = false;                // served by the VisionEmbeddingCache
  int width = 0, height = 0;          // the normalized image
};

// A chat image part: the vision model's text is placed at `offset` (a byte
// offset into messages[message].content) as a delimited block.
struct ChatImage {
  size_t message = 0;
  size_t offset = 0;
  SharedBytes bytes;
  std::string field;                  // "messages[0].content[1].image_url"
};

// A process-backed model pinned for one proxied request: its port stays
// valid while `handle` is held.
struct ProcessLease {
  ArbiterHandle handle;
  int port = 0;
};

}  // namespace arbiter
