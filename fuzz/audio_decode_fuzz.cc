// libFuzzer target: DecodeAudio over arbitrary bytes (the transcription
// endpoints' upload reader: libsndfile behind our virtual I/O, then the
// mono downmix and the resampler). Small limits keep each input cheap.
// Invariants: it never crashes or reads outside the input; accepted audio
// respects the limits and is 16 kHz mono of about the decoded duration.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "arbiter/formats/audio.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  arbiter::AudioLimits limits;
  limits.max_bytes = 1 << 20;
  limits.max_seconds = 5;
  arbiter::Result<arbiter::DecodedAudio> r = arbiter::DecodeAudio(std::span(data, size), limits);
  if (r.ok()) {
    const arbiter::DecodedAudio& a = *r;
    if (a.source_rate <= 0 || a.source_channels <= 0 || a.format.empty()) std::abort();
    if (a.seconds <= 0 || a.seconds > limits.max_seconds + 1.0 / a.source_rate) std::abort();
    // The resampler's output is the duration at 16 kHz, give or take its filter delay.
    const double expected = a.seconds * arbiter::kAsrSampleRate;
    if (static_cast<double>(a.samples.size()) > expected + 256) std::abort();
  } else if (r.status().code() != arbiter::StatusCode::kInvalidArgument &&
             r.status().code() != arbiter::StatusCode::kInternal) {
    std::abort();
  }
  return 0;
}
