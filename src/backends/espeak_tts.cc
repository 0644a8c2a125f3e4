// eSpeak NG speech synthesis (arbiter/backends/tts.h).
//
// eSpeak NG keeps all of its state — the data path, the current voice, the
// synth callback — in process globals, so one engine at a time may be live
// (g_live); a second Load is refused rather than sharing state behind the
// first engine's back.
//
// Note [eSpeak NG is never terminated]
// espeak_Terminate in eSpeak NG 1.51 (Debian's) deadlocks: it waits on a
// condition its internal fifo thread never signals, even in synchronous
// mode. So the library is initialized once per process, by the first Load,
// and stays initialized: destroying the engine only frees the slot, and a
// later Load reuses the library (with the same data directory; another one
// is refused with kFailedPrecondition). The memory eSpeak NG holds (its
// phoneme data and the current voice's dictionary) therefore stays after
// an unload; the runtime should treat it as resident once loaded. Synthesis is synchronous
// (AUDIO_OUTPUT_SYNCHRONOUS): espeak_Synth calls our callback with each buffer (kBufferMs of audio)
// on the calling thread and returns when the text is spoken; the callback's user_data is the call's
// SynthState. Speed maps to the speaking rate in words per minute (espeakRATE, 175 × speed, clamped
// to what eSpeak NG accepts).
#include <espeak-ng/speak_lib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <set>

#include "arbiter/backends/backend_files.h"
#include "arbiter/backends/tts.h"

namespace arbiter {
namespace {

constexpr int kBufferMs = 100;
constexpr int kNormalWpm = 175;
constexpr int kMinWpm = 80;
constexpr int kMaxWpm = 450;

std::atomic<bool> g_live{false};  // an engine is live

// The process-wide eSpeak NG state (Note [eSpeak NG is never terminated]).
struct Library {
  bool initialized = false;
  std::string parent;                         // the path given to espeak_Initialize ("" = default)
  int rate = 0;                               // Hz
  std::map<std::string, std::string> voices;  // language code → voice identifier
  std::vector<std::string> files;
};

struct SynthState {
  const PcmSink* sink = nullptr;
  const Cancellation* cancelled = nullptr;
  bool stopped = false;
};

int SynthCallback(short* wav, int numsamples, espeak_EVENT* events) {
  if (events == nullptr || events->user_data == nullptr) return 0;
  auto* st = static_cast<SynthState*>(events->user_data);
  if (st->stopped) return 1;
  if (st->cancelled->cancelled()) {
    st->stopped = true;
    return 1;
  }
  if (wav != nullptr && numsamples > 0 &&
      !(*st->sink)(std::span<const int16_t>(wav, static_cast<size_t>(numsamples)))) {
    st->stopped = true;
    return 1;
  }
  return 0;
}

class EspeakTts final : public TtsEngine {
 public:
  EspeakTts(int rate, std::map<std::string, std::string> voices, std::vector<std::string> files)
      : rate_(rate), voices_(std::move(voices)), files_(std::move(files)) {}
  // Note [eSpeak NG is never terminated].
  ~EspeakTts() override { g_live.store(false); }

  std::string_view engine_name() const override { return "espeak-ng"; }
  std::vector<std::string> voices() const override {
    std::vector<std::string> v;
    for (const auto& [lang, id] : voices_) v.push_back(lang);
    return v;
  }
  std::string default_voice() const override {
    return voices_.count("en-us") ? "en-us" : voices_.empty() ? "" : voices_.begin()->first;
  }
  int sample_rate(const std::string& voice) const override {
    return voices_.count(voice) ? rate_ : 0;
  }
  std::vector<std::string> files() const override { return files_; }

  Status Synthesize(std::string_view text, const std::string& voice, double speed,
                    const PcmSink& sink, const Cancellation& cancelled) override {
    ARBITER_RETURN_IF_ERROR(CheckSynthesis(*this, text, voice, speed, cancelled));
    auto it = voices_.find(voice);
    if (espeak_SetVoiceByName(it->second.c_str()) != EE_OK) {
      espeak_VOICE spec{};
      spec.languages = it->first.c_str();
      if (espeak_SetVoiceByProperties(&spec) != EE_OK) {
        return InternalError("espeak-ng could not select the voice " + voice);
      }
    }
    const int wpm = std::clamp(static_cast<int>(kNormalWpm * speed), kMinWpm, kMaxWpm);
    espeak_SetParameter(espeakRATE, wpm, 0);
    SynthState st{&sink, &cancelled};
    const std::string text_z(text);
    unsigned int id = 0;
    const espeak_ERROR err = espeak_Synth(text_z.c_str(), text_z.size() + 1, 0, POS_CHARACTER, 0,
                                          espeakCHARS_UTF8, &id, &st);
    if (st.stopped) return CancelledError("speech synthesis cancelled");
    if (err != EE_OK) return InternalError("espeak-ng failed to synthesize the input");
    return OkStatus();
  }

 private:
  int rate_;                                   // Hz, the same for every voice
  std::map<std::string, std::string> voices_;  // language code → voice identifier
  std::vector<std::string> files_;
};

}  // namespace

Result<std::unique_ptr<TtsEngine>> LoadEspeakNgTts(const std::string& data_dir) {
  namespace fs = std::filesystem;
  // eSpeak NG takes the directory that holds espeak-ng-data.
  std::string parent;
  if (!data_dir.empty()) {
    std::error_code ec;
    const fs::path d(data_dir);
    if (fs::exists(d / "phontab", ec) && d.filename() == "espeak-ng-data") {
      parent = d.parent_path().string();
    } else if (fs::exists(d / "espeak-ng-data" / "phontab", ec)) {
      parent = d.string();
    } else {
      return NotFoundError(
          "espeak-ng data directory " + data_dir +
          " has no phoneme data (phontab); install espeak-ng-data or fix data_dir");
    }
  }
  bool expected = false;
  if (!g_live.compare_exchange_strong(expected, true)) {
    return FailedPreconditionError("only one espeak-ng model can be loaded at a time");
  }
  // Note [eSpeak NG is never terminated]: the first Load initializes the
  // library for the life of the process; later ones reuse it.
  static Library lib;  // guarded by g_live: only the thread that set it gets here
  if (!lib.initialized) {
    const int rate =
        espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, kBufferMs,
                          parent.empty() ? nullptr : parent.c_str(), espeakINITIALIZE_DONT_EXIT);
    if (rate <= 0) {
      g_live.store(false);
      return NotFoundError(
          "espeak-ng could not load its data" +
          (data_dir.empty() ? std::string(" (the package default)") : " from " + data_dir));
    }
    espeak_SetSynthCallback(SynthCallback);
    const espeak_VOICE** list = espeak_ListVoices(nullptr);
    for (size_t i = 0; list != nullptr && list[i] != nullptr; ++i) {
      const espeak_VOICE* v = list[i];
      if (v->languages == nullptr || v->languages[0] == 0 || v->identifier == nullptr) continue;
      // languages: (priority byte, NUL-terminated code)*, then a 0 byte; the first is the main one.
      const std::string lang(v->languages + 1);
      if (lang.empty() || lang.rfind("mb-", 0) == 0) continue;  // MBROLA voices need extra data
      lib.voices.emplace(lang, v->identifier);
    }
    const char* data_path = nullptr;
    espeak_Info(&data_path);
    if (data_path != nullptr) {
      for (const char* f : {"phontab", "phonindex", "phondata", "intonations", "en_dict"}) {
        lib.files.push_back((fs::path(data_path) / f).string());
      }
    }
    lib.rate = rate;
    lib.parent = parent;
    lib.initialized = true;
  } else if (lib.parent != parent) {
    g_live.store(false);
    return FailedPreconditionError(
        "espeak-ng was loaded from another data directory in this process and cannot be reloaded "
        "from " +
        (data_dir.empty() ? std::string("the package default") : data_dir) +
        "; restart the server");
  }
  if (lib.voices.empty()) {
    g_live.store(false);
    return NotFoundError("espeak-ng found no voices in its data directory");
  }
  return std::unique_ptr<TtsEngine>(new EspeakTts(lib.rate, lib.voices, lib.files));
}

}  // namespace arbiter
