// arbiter/backends/pocketsphinx.h — speech recognition (capability "asr")
// and voice activity detection (capability "vad") with CMU PocketSphinx.
//
// Both classes own one PocketSphinx decoder (ps_decoder_t) configured from a
// model directory laid out as the Debian package lays it out:
//   <model_dir>/en-us/            acoustic model (mdef, means, ...)
//   <model_dir>/en-us.lm.bin      trigram language model   (ASR only)
//   <model_dir>/cmudict-en-us.dict pronunciation dictionary (ASR only)
//   <model_dir>/en-us-phone.lm.bin phone language model     (VAD only)
// PocketSphinx's own log is switched off process-wide (err_set_logfp(NULL))
// by the first Load.
//
// Audio: [n] int16 mono at 16 kHz (kAsrSampleRate; DecodeAudio makes it).
// Times are milliseconds from the start of `pcm`.
//
// Usage:
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<PocketSphinxAsr> asr, PocketSphinxAsr::Load({}));
//   ARBITER_ASSIGN_OR_RETURN(Transcript t, asr->Transcribe(audio.samples, cancel_token));
//
// Thread safety: thread-compatible — one call at a time per instance (the
// caller serializes); separate instances may run on separate threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "arbiter/base/cancel.h"
#include "arbiter/base/status.h"

namespace arbiter {

struct SpeechSegment {
  int64_t start_ms = 0;
  int64_t end_ms = 0;
};

struct TranscriptSegment {
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  std::string text;  // lowercase words separated by single spaces; may be ""
};

struct Transcript {
  std::string text;  // the non-empty segment texts joined by " "
  std::vector<TranscriptSegment> segments;
  double seconds = 0;  // duration of the input audio, seconds
};

struct PocketSphinxOptions {
  // hmm = model_dir/en-us, lm = model_dir/en-us.lm.bin,
  // dict = model_dir/cmudict-en-us.dict, VAD lm = model_dir/en-us-phone.lm.bin.
  std::string model_dir = "/usr/share/pocketsphinx/model/en-us";
};

class PocketSphinxAsr {
 public:
  // Errors: kNotFound naming the first missing model file; kDataLoss when
  // PocketSphinx cannot initialize from the files (corrupt or mismatched).
  static Result<std::unique_ptr<PocketSphinxAsr>> Load(const PocketSphinxOptions& options);
  ~PocketSphinxAsr();
  PocketSphinxAsr(const PocketSphinxAsr&) = delete;
  PocketSphinxAsr& operator=(const PocketSphinxAsr&) = delete;

  // pcm: [n] int16 at 16 kHz mono. Splits the audio at the speech segments
  // of PocketSphinx's VAD and decodes each as its own utterance, in one pass
  // (Note [PocketSphinx continuous decoding] in src/backends/pocketsphinx.cc);
  // text = the non-empty segment texts joined by " ". Checks `cancelled`
  // every second of audio, so between and within segments (kCancelled; the
  // decoder stays usable). No speech → text "" and no segments. Errors:
  // kInternal when PocketSphinx fails mid-utterance.
  Result<Transcript> Transcribe(std::span<const int16_t> pcm, const Cancellation& cancelled);

  // The speech segments of pcm ([n] int16 at 16 kHz), from ps_get_in_speech
  // over the decoder's frames (fed in 10 ms blocks), moved back by the VAD's
  // start and end latency; ordered, non-overlapping, within [0, duration].
  // Runs the full search too (it is the same decoder); PocketSphinxVad is
  // the light way to get segments only.
  Result<std::vector<SpeechSegment>> DetectSpeech(std::span<const int16_t> pcm);

  // The model files it reads (the acoustic model directory, the LM, the dict).
  std::vector<std::string> files() const;
  // Σ sizes of those files, bytes.
  static uint64_t EstimateBytes(const PocketSphinxOptions& options);

  struct Decoder;  // internal: the PocketSphinx decoder and its config

 private:
  PocketSphinxAsr() = default;
  std::unique_ptr<Decoder> decoder_;
  std::vector<std::string> files_;
};

// VAD as its own model (capability "vad"): the same decoder machinery
// configured as lightly as PocketSphinx allows — the acoustic model with a
// phone-loop search over the small phone LM (en-us-phone.lm.bin), no word
// LM or dictionary — returning only segments.
class PocketSphinxVad {
 public:
  // Errors as PocketSphinxAsr::Load.
  static Result<std::unique_ptr<PocketSphinxVad>> Load(const PocketSphinxOptions& options);
  ~PocketSphinxVad();
  PocketSphinxVad(const PocketSphinxVad&) = delete;
  PocketSphinxVad& operator=(const PocketSphinxVad&) = delete;

  // As PocketSphinxAsr::DetectSpeech; checks `cancelled` every second of
  // audio (kCancelled).
  Result<std::vector<SpeechSegment>> Detect(std::span<const int16_t> pcm,
                                            const Cancellation& cancelled);

  std::vector<std::string> files() const;
  static uint64_t EstimateBytes(const PocketSphinxOptions& options);

 private:
  PocketSphinxVad() = default;
  std::unique_ptr<PocketSphinxAsr::Decoder> decoder_;
  std::vector<std::string> files_;
};

}  // namespace arbiter
