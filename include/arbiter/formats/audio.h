// arbiter/formats/audio.h — the audio front door: uploaded sound files
// decoded to the PCM that speech models take.
//
// DecodeAudio reads an uploaded file (WAV, FLAC, OGG/Vorbis, and whatever
// else the installed libsndfile reads) from memory — no temporary files —
// downmixes it to mono and resamples it to kAsrSampleRate (16 kHz) 16-bit
// PCM. It is a reader of bytes from outside: every size is checked before it
// is used, the duration is checked from the header before any sample is
// decoded, and decoding stops at the limit even when the header lies; a
// header claiming more audio than the file holds is refused as damaged.
// Memory: bounded by the output ([n] int16) plus a fixed block buffer.
//
// Usage:
//   ARBITER_ASSIGN_OR_RETURN(DecodedAudio audio, DecodeAudio(body, AudioLimits{}));
//   asr->Transcribe(audio.samples, cancelled);
//
// Thread safety: the functions are thread-safe (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

// Limits on an uploaded audio file (server config max_audio_bytes,
// max_audio_seconds).
struct AudioLimits {
  size_t max_bytes = 64u << 20;  // size of the encoded file, bytes
  double max_seconds = 600;      // duration of the source, seconds
};

// 16 kHz mono 16-bit PCM decoded from an uploaded file.
struct DecodedAudio {
  std::vector<int16_t> samples;  // [n] at kAsrSampleRate (16000 Hz), mono
  int source_rate = 0;           // Hz
  int source_channels = 0;
  double seconds = 0;  // duration of the source, seconds
  std::string format;  // "wav" | "flac" | "ogg" | "aiff" | "mp3" | ... (lowercase)
};

// The sample rate of DecodedAudio::samples and of the speech models' input.
inline constexpr int kAsrSampleRate = 16000;

// Decodes `bytes` with libsndfile (virtual I/O over the memory), downmixes
// to mono (the mean of the channels), resamples to 16 kHz with libsamplerate
// (SRC_SINC_FASTEST). The duration is checked from the header BEFORE
// decoding. Errors, all kInvalidArgument, each message starting with `field`:
//   "<field> is empty"
//   "<field> is N bytes; the limit is max_audio_bytes (M)"
//   "<field> is not audio libsndfile can read (WAV, FLAC, OGG): <sf_strerror>"
//   "<field> is 7200.0 s of audio; the limit is max_audio_seconds (600)"
//   "<field> has no audio frames"
//   "<field> is damaged: ..." — a format libsndfile knows but a malformed
//     file, or a length in its header the file cannot back (unknown, denser
//     than any codec, or more than decodes; Note [Damaged audio] in audio.cc)
Result<DecodedAudio> DecodeAudio(std::span<const uint8_t> bytes, const AudioLimits& limits,
                                 std::string_view field = "file");

// Resamples mono PCM from `from_rate` to `to_rate` Hz (libsamplerate,
// SRC_SINC_FASTEST; used by TTS speed changes and by DecodeAudio). Returns
// `in` unchanged when the rates are equal, and an empty vector when a rate is
// not positive. Output length ≈ in.size() × to_rate / from_rate.
std::vector<int16_t> ResampleMono(std::span<const int16_t> in, int from_rate, int to_rate);

}  // namespace arbiter
