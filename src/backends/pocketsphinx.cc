// PocketSphinx speech recognition and VAD (arbiter/backends/pocketsphinx.h).
//
// Note [PocketSphinx continuous decoding]
// Audio is fed to one utterance in 10 ms blocks. PocketSphinx's front end
// runs a VAD and drops silence before the search, and ps_get_in_speech tells
// whether it is inside speech. As in PocketSphinx's own continuous-listening
// example, a speech→silence transition ends the utterance (ps_end_utt, the
// hypothesis is that segment's text) and starts the next, so a long file is
// decoded segment by segment in one pass and the search never holds more
// than one segment. The VAD switches late: "in speech" after
// -vad_startspeech speech frames, "silence" after -vad_postspeech silent
// frames (10 ms each), so segment bounds are moved back by those latencies
// and clamped to the audio.
//
// PocketSphinx logs through a process-wide FILE; it is switched off once
// (err_set_logfp(NULL)) before the first decoder is made.
#include "arbiter/backends/pocketsphinx.h"

#include <pocketsphinx.h>
#include <sphinxbase/err.h>

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "arbiter/backends/backend_files.h"

namespace arbiter {

struct PocketSphinxAsr::Decoder {
  cmd_ln_t* config = nullptr;
  ps_decoder_t* ps = nullptr;
  int64_t start_latency_ms = 0;  // speech began this long before "in speech"
  int64_t end_latency_ms = 0;    // speech ended this long before "silence"
  ~Decoder() {
    if (ps != nullptr) ps_free(ps);
    if (config != nullptr) cmd_ln_free_r(config);
  }
};

namespace {

constexpr int kRate = 16000;
constexpr size_t kBlockSamples = kRate / 100;  // 10 ms
constexpr size_t kCancelEveryBlocks = 100;     // 1 s of audio

int64_t SamplesToMs(size_t n) { return static_cast<int64_t>(n) * 1000 / kRate; }

void SilenceSphinxLog() {
  static std::once_flag once;
  std::call_once(once, [] { err_set_logfp(nullptr); });
}

struct Paths {
  std::string hmm, lm, dict, phone_lm;
};
Paths PathsOf(const PocketSphinxOptions& o) {
  const std::filesystem::path d(o.model_dir);
  return {(d / "en-us").string(), (d / "en-us.lm.bin").string(),
          (d / "cmudict-en-us.dict").string(), (d / "en-us-phone.lm.bin").string()};
}

Status CheckExists(const std::string& path, const char* what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return NotFoundError("pocketsphinx " + std::string(what) + " " + path +
                         " does not exist (install pocketsphinx-en-us or set model_dir)");
  }
  return OkStatus();
}

// `args`: name/value pairs after the common ones. Takes a copy of strings.
Result<std::unique_ptr<PocketSphinxAsr::Decoder>> MakeDecoder(const std::string& hmm,
                                                              std::vector<std::string> args) {
  SilenceSphinxLog();
  ARBITER_RETURN_IF_ERROR(CheckExists(hmm + "/mdef", "acoustic model file"));
  ARBITER_RETURN_IF_ERROR(CheckExists(hmm + "/means", "acoustic model file"));
  // No -logfn: ps_init would swap the process-wide log FILE (closing the
  // old one) on every load, racing with decoders on other threads; logging
  // is off process-wide instead (SilenceSphinxLog).
  args.insert(args.begin(), {"-hmm", hmm, "-samprate", "16000"});
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>("arbiter"));
  for (std::string& a : args) argv.push_back(a.data());
  auto d = std::make_unique<PocketSphinxAsr::Decoder>();
  d->config =
      cmd_ln_parse_r(nullptr, ps_args(), static_cast<int32>(argv.size()), argv.data(), TRUE);
  if (d->config == nullptr)
    return InternalError("pocketsphinx: the decoder arguments were refused");
  ps_default_search_args(d->config);
  d->ps = ps_init(d->config);
  if (d->ps == nullptr) {
    return DataLossError("pocketsphinx could not load the model from " + hmm +
                         " (corrupt or mismatched model files)");
  }
  d->start_latency_ms = 10 * int64_t{cmd_ln_int32_r(d->config, "-vad_startspeech")};
  d->end_latency_ms = 10 * int64_t{cmd_ln_int32_r(d->config, "-vad_postspeech")};
  return d;
}

// Note [PocketSphinx continuous decoding]. Appends segments (and, when
// `texts` is set, their hypotheses) of pcm.
Status Run(PocketSphinxAsr::Decoder& d, std::span<const int16_t> pcm, const Cancellation* cancelled,
           std::vector<SpeechSegment>& segments, std::vector<std::string>* texts) {
  ps_decoder_t* ps = d.ps;
  if (ps_start_utt(ps) < 0) return InternalError("pocketsphinx: ps_start_utt failed");
  bool in_speech = false;
  int64_t start_ms = 0;
  const int64_t total_ms = SamplesToMs(pcm.size());
  auto close_segment = [&](int64_t end_ms) -> Status {
    if (ps_end_utt(ps) < 0) return InternalError("pocketsphinx: ps_end_utt failed");
    SpeechSegment s{std::clamp<int64_t>(start_ms, 0, total_ms),
                    std::clamp<int64_t>(end_ms, 0, total_ms)};
    if (!segments.empty()) s.start_ms = std::max(s.start_ms, segments.back().end_ms);
    s.end_ms = std::max(s.end_ms, s.start_ms);
    segments.push_back(s);
    if (texts != nullptr) {
      int32 score = 0;
      const char* hyp = ps_get_hyp(ps, &score);
      texts->push_back(hyp != nullptr ? hyp : "");
    }
    return OkStatus();
  };
  size_t blocks = 0;
  for (size_t off = 0; off < pcm.size(); off += kBlockSamples) {
    if (cancelled != nullptr && ++blocks % kCancelEveryBlocks == 0 && cancelled->cancelled()) {
      ps_end_utt(ps);
      return CancelledError("speech recognition cancelled");
    }
    const size_t n = std::min(kBlockSamples, pcm.size() - off);
    if (ps_process_raw(ps, pcm.data() + off, n, FALSE, FALSE) < 0) {
      ps_end_utt(ps);
      return InternalError("pocketsphinx: ps_process_raw failed");
    }
    const bool now = ps_get_in_speech(ps) != 0;
    const int64_t at_ms = SamplesToMs(off + n);
    if (now && !in_speech) {
      start_ms = at_ms - d.start_latency_ms;
    } else if (!now && in_speech) {
      ARBITER_RETURN_IF_ERROR(close_segment(at_ms - d.end_latency_ms));
      if (ps_start_utt(ps) < 0) return InternalError("pocketsphinx: ps_start_utt failed");
    }
    in_speech = now;
  }
  if (in_speech) return close_segment(total_ms);
  if (ps_end_utt(ps) < 0) return InternalError("pocketsphinx: ps_end_utt failed");
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<PocketSphinxAsr>> PocketSphinxAsr::Load(const PocketSphinxOptions& options) {
  const Paths p = PathsOf(options);
  ARBITER_RETURN_IF_ERROR(CheckExists(p.hmm, "acoustic model directory"));
  ARBITER_RETURN_IF_ERROR(CheckExists(p.lm, "language model"));
  ARBITER_RETURN_IF_ERROR(CheckExists(p.dict, "dictionary"));
  std::unique_ptr<PocketSphinxAsr> asr(new PocketSphinxAsr());
  ARBITER_ASSIGN_OR_RETURN(asr->decoder_, MakeDecoder(p.hmm, {"-lm", p.lm, "-dict", p.dict}));
  asr->files_ = {p.hmm, p.lm, p.dict};
  return asr;
}

PocketSphinxAsr::~PocketSphinxAsr() = default;

Result<Transcript> PocketSphinxAsr::Transcribe(std::span<const int16_t> pcm,
                                               const Cancellation& cancelled) {
  Transcript t;
  t.seconds = static_cast<double>(pcm.size()) / kRate;
  if (cancelled.cancelled()) return CancelledError("speech recognition cancelled");
  std::vector<SpeechSegment> segments;
  std::vector<std::string> texts;
  ARBITER_RETURN_IF_ERROR(Run(*decoder_, pcm, &cancelled, segments, &texts));
  for (size_t i = 0; i < segments.size(); ++i) {
    t.segments.push_back({segments[i].start_ms, segments[i].end_ms, texts[i]});
    if (texts[i].empty()) continue;
    if (!t.text.empty()) t.text += ' ';
    t.text += texts[i];
  }
  return t;
}

Result<std::vector<SpeechSegment>> PocketSphinxAsr::DetectSpeech(std::span<const int16_t> pcm) {
  std::vector<SpeechSegment> segments;
  ARBITER_RETURN_IF_ERROR(Run(*decoder_, pcm, nullptr, segments, nullptr));
  return segments;
}

std::vector<std::string> PocketSphinxAsr::files() const { return files_; }

uint64_t PocketSphinxAsr::EstimateBytes(const PocketSphinxOptions& options) {
  const Paths p = PathsOf(options);
  return FilesBytes({p.hmm, p.lm, p.dict});
}

Result<std::unique_ptr<PocketSphinxVad>> PocketSphinxVad::Load(const PocketSphinxOptions& options) {
  const Paths p = PathsOf(options);
  ARBITER_RETURN_IF_ERROR(CheckExists(p.hmm, "acoustic model directory"));
  ARBITER_RETURN_IF_ERROR(CheckExists(p.phone_lm, "phone language model"));
  std::unique_ptr<PocketSphinxVad> vad(new PocketSphinxVad());
  ARBITER_ASSIGN_OR_RETURN(
      vad->decoder_,
      MakeDecoder(p.hmm, {"-allphone", p.phone_lm, "-allphone_ci", "yes", "-bestpath", "no"}));
  vad->files_ = {p.hmm, p.phone_lm};
  return vad;
}

PocketSphinxVad::~PocketSphinxVad() = default;

Result<std::vector<SpeechSegment>> PocketSphinxVad::Detect(std::span<const int16_t> pcm,
                                                           const Cancellation& cancelled) {
  if (cancelled.cancelled()) return CancelledError("voice activity detection cancelled");
  std::vector<SpeechSegment> segments;
  ARBITER_RETURN_IF_ERROR(Run(*decoder_, pcm, &cancelled, segments, nullptr));
  return segments;
}

std::vector<std::string> PocketSphinxVad::files() const { return files_; }

uint64_t PocketSphinxVad::EstimateBytes(const PocketSphinxOptions& options) {
  const Paths p = PathsOf(options);
  return FilesBytes({p.hmm, p.phone_lm});
}

}  // namespace arbiter
