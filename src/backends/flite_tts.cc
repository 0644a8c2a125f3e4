// Flite speech synthesis (arbiter/backends/tts.h).
//
// Flite's voices are process-global objects: register_cmu_us_slt() hands
// every caller the same voice until it is unregistered. FliteVoices below
// registers the four voices when the first engine loads and unregisters
// them when the last one goes, and one process-wide mutex serializes every
// synthesis — a call sets per-call features (the stream callback, the
// duration stretch) on the shared voice, so two calls must not overlap.
//
// Streaming: the voice's "streaming_info" feature holds our callback, which
// Flite calls with consecutive chunks of the utterance's wave while it
// synthesizes; after flite_text_to_wave returns, whatever the callback did
// not deliver is sent from the returned wave, so the sink sees every sample
// exactly once whichever way the voice synthesizes.
#include <flite/flite.h>

#include <algorithm>
#include <mutex>

#include "arbiter/backends/tts.h"

extern "C" {
cst_voice* register_cmu_us_slt(const char* voxdir);
void unregister_cmu_us_slt(cst_voice* v);
cst_voice* register_cmu_us_kal(const char* voxdir);
void unregister_cmu_us_kal(cst_voice* v);
cst_voice* register_cmu_us_awb(const char* voxdir);
void unregister_cmu_us_awb(cst_voice* v);
cst_voice* register_cmu_us_rms(const char* voxdir);
void unregister_cmu_us_rms(cst_voice* v);
}

namespace arbiter {
namespace {

struct VoiceDef {
  const char* name;
  cst_voice* (*reg)(const char*);
  void (*unreg)(cst_voice*);
};
constexpr VoiceDef kVoices[] = {
    {"slt", register_cmu_us_slt, unregister_cmu_us_slt},
    {"kal", register_cmu_us_kal, unregister_cmu_us_kal},
    {"awb", register_cmu_us_awb, unregister_cmu_us_awb},
    {"rms", register_cmu_us_rms, unregister_cmu_us_rms},
};
constexpr size_t kNumVoices = std::size(kVoices);

// Guards everything Flite: registration, the refcount, synthesis.
std::mutex& FliteMutex() {
  static std::mutex mu;
  return mu;
}
int g_refs = 0;                        // live engines; guarded by FliteMutex()
cst_voice* g_voices[kNumVoices] = {};  // guarded by FliteMutex()
int g_rates[kNumVoices] = {};          // Hz; guarded by FliteMutex()

struct StreamState {
  const PcmSink* sink = nullptr;
  const Cancellation* cancelled = nullptr;
  int delivered = 0;  // samples of the wave sent to the sink
  bool stopped = false;
};

int StreamChunk(const cst_wave* w, int start, int size, int last, cst_audio_streaming_info* asi) {
  auto* st = static_cast<StreamState*>(asi->userdata);
  if (st->stopped) return CST_AUDIO_STREAM_STOP;
  if (st->cancelled->cancelled()) {
    st->stopped = true;
    return CST_AUDIO_STREAM_STOP;
  }
  // Only what has not been sent yet, within the wave.
  const int begin = std::max(start, st->delivered);
  const int end = std::min(start + size, w->num_samples);
  if (end > begin) {
    if (!(*st->sink)(
            std::span<const int16_t>(w->samples + begin, static_cast<size_t>(end - begin)))) {
      st->stopped = true;
      return CST_AUDIO_STREAM_STOP;
    }
    st->delivered = end;
  }
  return CST_AUDIO_STREAM_CONT;
}

class FliteTts final : public TtsEngine {
 public:
  FliteTts() = default;
  ~FliteTts() override {
    std::lock_guard<std::mutex> lock(FliteMutex());
    if (--g_refs == 0) {
      for (size_t i = 0; i < kNumVoices; ++i) {
        kVoices[i].unreg(g_voices[i]);
        g_voices[i] = nullptr;
      }
    }
  }

  std::string_view engine_name() const override { return "flite"; }
  std::vector<std::string> voices() const override {
    std::vector<std::string> v;
    for (const VoiceDef& d : kVoices) v.push_back(d.name);
    return v;
  }
  std::string default_voice() const override { return "slt"; }
  int sample_rate(const std::string& voice) const override {
    const int i = Index(voice);
    if (i < 0) return 0;
    std::lock_guard<std::mutex> lock(FliteMutex());
    return g_rates[i];
  }
  std::vector<std::string> files() const override { return {}; }

  Status Synthesize(std::string_view text, const std::string& voice, double speed,
                    const PcmSink& sink, const Cancellation& cancelled) override {
    const int i = Index(voice);
    if (i < 0) {
      std::string list;
      for (const VoiceDef& d : kVoices) list += std::string(list.empty() ? "" : ", ") + d.name;
      return InvalidArgumentError("voice \"" + voice +
                                  "\" is not one of this model's voices: " + list);
    }
    if (text.empty()) return InvalidArgumentError("input is empty");
    if (!(speed >= 0.25 && speed <= 4.0)) {
      return InvalidArgumentError("speed " + std::to_string(speed) + " is outside 0.25..4.0");
    }
    if (cancelled.cancelled()) return CancelledError("speech synthesis cancelled");
    const std::string text_z(text);
    StreamState st{&sink, &cancelled};

    std::lock_guard<std::mutex> lock(FliteMutex());
    cst_voice* v = g_voices[i];
    cst_audio_streaming_info* asi = new_audio_streaming_info();
    asi->asc = StreamChunk;
    asi->userdata = &st;
    // The feature owns asi from here (freed with the feature).
    feat_set(v->features, "streaming_info", audio_streaming_info_val(asi));
    feat_set_float(v->features, "duration_stretch", static_cast<float>(1.0 / speed));
    cst_wave* w = flite_text_to_wave(text_z.c_str(), v);
    feat_remove(v->features, "streaming_info");
    feat_remove(v->features, "duration_stretch");
    if (w == nullptr) return InternalError("flite failed to synthesize the input");
    if (!st.stopped && w->num_samples > st.delivered) {
      if (!sink(std::span<const int16_t>(w->samples + st.delivered,
                                         static_cast<size_t>(w->num_samples - st.delivered)))) {
        st.stopped = true;
      }
    }
    delete_wave(w);
    if (st.stopped) return CancelledError("speech synthesis cancelled");
    return OkStatus();
  }

 private:
  static int Index(const std::string& voice) {
    for (size_t i = 0; i < kNumVoices; ++i) {
      if (voice == kVoices[i].name) return static_cast<int>(i);
    }
    return -1;
  }
};

}  // namespace

Result<std::unique_ptr<TtsEngine>> LoadFliteTts() {
  std::lock_guard<std::mutex> lock(FliteMutex());
  if (g_refs == 0) {
    static std::once_flag init;
    std::call_once(init, [] { flite_init(); });
    for (size_t i = 0; i < kNumVoices; ++i) {
      g_voices[i] = kVoices[i].reg(nullptr);
      if (g_voices[i] == nullptr) {
        for (size_t j = 0; j < i; ++j) kVoices[j].unreg(g_voices[j]);
        return InternalError(std::string("flite could not register the voice ") + kVoices[i].name);
      }
      // The rate is a property of the voice's data; a one-word synthesis
      // reads it without reaching into Flite's internal structures.
      cst_wave* w = flite_text_to_wave("a", g_voices[i]);
      g_rates[i] = w != nullptr ? w->sample_rate : 0;
      if (w != nullptr) delete_wave(w);
      if (g_rates[i] <= 0) {
        for (size_t j = 0; j <= i; ++j) kVoices[j].unreg(g_voices[j]);
        return InternalError(std::string("flite voice ") + kVoices[i].name + " has no sample rate");
      }
    }
  }
  ++g_refs;
  return std::unique_ptr<TtsEngine>(new FliteTts());
}

}  // namespace arbiter
