// arbiter/backends/tts.h — speech synthesis (capability "tts") and the
// encoders for its responses.
//
// A TtsEngine turns text into mono 16-bit PCM at its voice's sample rate,
// streaming it to a PcmSink as it is produced. Two engines:
//   Flite    (LoadFliteTts): voices compiled into the library (slt, kal,
//            awb, rms); no data files.
//   eSpeak NG (LoadEspeakNgTts): the espeak-ng-data directory; eSpeak NG
//            keeps its state in globals, so at most one engine is live per
//            process.
// An AudioEncoder turns the PCM into the bytes of a response (mp3, wav,
// pcm), incrementally so responses can stream.
//
// Usage:
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<TtsEngine> tts, LoadFliteTts());
//   const int rate = tts->sample_rate("slt");
//   ARBITER_ASSIGN_OR_RETURN(auto enc, AudioEncoder::Create(AudioFormat::kMp3, rate));
//   Status s = tts->Synthesize("hello", "slt", 1.0, [&](std::span<const int16_t> pcm) {
//     Result<std::string> bytes = enc->Encode(pcm);
//     return bytes.ok() && Send(*bytes);
//   }, cancel_token);
//   Send(enc->Finish());
//
// Thread safety: TtsEngine and AudioEncoder are thread-compatible — one
// call at a time per instance. Flite's utterances (the pieces of a
// synthesis) are additionally serialized process-wide (its voices are
// process-global objects shared by engines).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/cancel.h"
#include "arbiter/base/status.h"

namespace arbiter {

// Receives synthesized audio as it is produced: [n] int16 mono at the
// voice's sample_rate. Return false to stop synthesis (Synthesize then
// returns kCancelled). Called on the Synthesize caller's thread.
using PcmSink = std::function<bool(std::span<const int16_t> samples)>;

class TtsEngine {
 public:
  virtual ~TtsEngine() = default;
  // "flite" | "espeak-ng".
  virtual std::string_view engine_name() const = 0;
  // Flite: slt, kal, awb, rms. eSpeak NG: the language codes of the
  // installed voices ("en", "en-us", "de", ...), sorted.
  virtual std::vector<std::string> voices() const = 0;
  // "slt" / "en-us".
  virtual std::string default_voice() const = 0;
  // Hz; 0 for a voice that is not one of voices().
  virtual int sample_rate(const std::string& voice) const = 0;
  // Synthesizes `text` (non-empty, UTF-8) with `voice` at `speed`
  // (0.25..4.0; 1 = normal; changes the speaking rate, not the pitch) and
  // streams the audio to `sink` as it is produced. Flite: the text is cut
  // by SplitSpeechText and each piece is one utterance, whose wave comes
  // in chunks from Flite's audio stream callback; eSpeak NG: per synth
  // callback buffer (kBufferMs of audio; eSpeak NG works clause by clause
  // itself). Checks `cancelled` between pieces and in those callbacks, so
  // a cancellation stops the work within one piece (one buffer for eSpeak
  // NG), and what one piece holds bounds the memory of the call.
  // Errors: kInvalidArgument for empty text, a speed out of range, or an
  // unknown voice (`voice "x" is not one of this model's voices: slt, kal,
  // awb, rms`); kCancelled when `cancelled` fires or the sink returns false;
  // kInternal when the engine fails.
  virtual Status Synthesize(std::string_view text, const std::string& voice, double speed,
                            const PcmSink& sink, const Cancellation& cancelled) = 0;
  // The voice/data files it reads (empty for Flite's compiled-in voices).
  virtual std::vector<std::string> files() const = 0;
};

// Flite with its four US English voices registered. Errors: kInternal when
// a voice cannot be registered.
// The checks every engine's Synthesize makes first: a voice of the engine
// (kInvalidArgument `voice "x" is not one of this model's voices: a, b`),
// non-empty text, speed in 0.25..4.0, not cancelled (kCancelled).
Status CheckSynthesis(const TtsEngine& engine, std::string_view text, const std::string& voice,
                      double speed, const Cancellation& cancelled);

Result<std::unique_ptr<TtsEngine>> LoadFliteTts();

// The longest piece SplitSpeechText makes, in bytes of UTF-8.
inline constexpr size_t kMaxSpeechPieceBytes = 400;

// Cuts `text` into the pieces a TtsEngine synthesizes one at a time (Note
// [Speech in pieces] in src/backends/speech_pieces.cc): a piece ends after
// a sentence (. ! ? ; or CJK 。！？, with closing quotes or brackets, then
// white space) once it holds at least 32 bytes, at a blank line, and
// otherwise at the last white space (else the last UTF-8 character
// boundary) before `max_piece_bytes`. Pieces are views of `text`, in
// order, trimmed of white space, never empty; together they hold every
// non-space byte of `text`. REQUIRES: max_piece_bytes ≥ 4.
std::vector<std::string_view> SplitSpeechText(std::string_view text,
                                              size_t max_piece_bytes = kMaxSpeechPieceBytes);

// The number of Unicode code points of UTF-8 `text` (bytes that do not
// continue a sequence), counting at most up to `stop_after` + 1 so a huge
// input costs no more than the limit it is checked against.
size_t CountCodePoints(std::string_view text, size_t stop_after = SIZE_MAX);

// eSpeak NG. `data_dir`: the espeak-ng-data directory (or the directory
// holding it); "" = the package default. Errors: kFailedPrecondition "only
// one espeak-ng model can be loaded at a time" while another is live;
// kNotFound when the data directory has no phoneme data.
// Memory: eSpeak NG 1.51's espeak_Terminate deadlocks, so the library is
// initialized by the first Load and never terminated; destroying the engine
// frees the slot but not eSpeak NG's data (Note [eSpeak NG is never
// terminated] in src/backends/espeak_tts.cc). A later Load with another
// data_dir → kFailedPrecondition.
Result<std::unique_ptr<TtsEngine>> LoadEspeakNgTts(const std::string& data_dir = "");

enum class AudioFormat { kMp3, kWav, kPcm };

// "mp3" | "wav" | "pcm". Others: kInvalidArgument
// `response_format "x" is not one of mp3, wav, pcm`.
Result<AudioFormat> ParseAudioFormat(std::string_view name);
std::string_view AudioFormatName(AudioFormat f);  // "mp3" | "wav" | "pcm"
std::string_view AudioFormatMime(AudioFormat f);  // audio/mpeg, audio/wav, audio/pcm

// Incremental encoder of [n] int16 mono PCM at `sample_rate` Hz.
// Encode() returns the bytes ready so far (possibly empty), Finish() the
// rest; after Finish() the encoder is spent (kFailedPrecondition).
//   kPcm: raw int16 little-endian, streamed (2 bytes per sample).
//   kWav: RIFF/WAVE 16-bit PCM mono. The header holds the data size, so
//         the WAV encoder buffers everything and Encode() returns nothing:
//         the whole file comes from Finish().
//   kMp3: LAME, mono, CBR 64 kbps, streamed (no Xing/ID3 tag; frames only).
class AudioEncoder {
 public:
  // Errors: kInvalidArgument for a sample rate outside 8000..48000 (MP3) or
  // 1..384000 (WAV, PCM); kInternal when LAME cannot be initialized.
  static Result<std::unique_ptr<AudioEncoder>> Create(AudioFormat format, int sample_rate);
  virtual ~AudioEncoder() = default;
  virtual Result<std::string> Encode(std::span<const int16_t> samples) = 0;
  virtual Result<std::string> Finish() = 0;
};

}  // namespace arbiter
