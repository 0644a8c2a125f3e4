// Flite speech synthesis (arbiter/backends/tts.h).
//
// Flite's voices are process-global objects: register_cmu_us_slt() hands
// every caller the same voice until it is unregistered. The four voices are
// registered when the first engine loads and unregistered when the last one
// goes, and one process-wide mutex serializes every utterance — an
// utterance sets per-call features (the stream callback, the duration
// stretch) on the shared voice, so two must not overlap. It is held per
// piece of a synthesis, not for the whole call, so engines take turns.
//
// Note [Flite voices are loaded, not linked]
// A Flite voice is its compiled data: a 1.4–4.8 MB shared library
// (libflite_cmu_us_<voice>.so, with the lexicon and English front end it
// needs). Linked into arbiter those pages would stay mapped whatever the
// arbiter decides, so "unloading tts" could not give them back and its
// footprint would be whatever pages a first sentence happened to touch.
// The voices are therefore dlopen()ed when the engine loads and dlclose()d
// when the last engine goes, and each voice's loaded segments are read once
// at load (every page faulted in: the first request does not wait on the
// disk). The model's measured footprint is then its real cost — the voices'
// file-backed pages plus Flite's heap — and unloading unmaps them.
//
// Streaming: the input is synthesized piece by piece, one utterance each
// (Note [Speech in pieces] in speech_pieces.cc). The voice's
// "streaming_info" feature holds our callback, which Flite calls with
// consecutive chunks of the utterance's wave while it synthesizes; after
// flite_text_to_wave returns, whatever the callback did not deliver is sent
// from the returned wave, so the sink sees every sample exactly once
// whichever way the voice synthesizes.
#include <dlfcn.h>
#include <flite/flite.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "arbiter/backends/tts.h"

namespace arbiter {
namespace {

struct VoiceDef {
  const char* name;
  const char* library;   // dlopen()ed (Note [Flite voices are loaded, not linked])
  const char* voice_id;  // register_<id> / unregister_<id>
};
constexpr VoiceDef kVoices[] = {
    {"slt", "libflite_cmu_us_slt.so.1", "cmu_us_slt"},
    {"kal", "libflite_cmu_us_kal.so.1", "cmu_us_kal"},
    {"awb", "libflite_cmu_us_awb.so.1", "cmu_us_awb"},
    {"rms", "libflite_cmu_us_rms.so.1", "cmu_us_rms"},
};
constexpr size_t kNumVoices = std::size(kVoices);

// One dlopen()ed voice.
struct LoadedVoice {
  void* library = nullptr;
  cst_voice* voice = nullptr;
  void (*unreg)(cst_voice*) = nullptr;
};

void Unload(LoadedVoice* v) {
  if (v->voice != nullptr && v->unreg != nullptr) v->unreg(v->voice);
  if (v->library != nullptr) dlclose(v->library);
  *v = LoadedVoice{};
}

// Reads one byte of every page of the loaded segments of the object whose
// name ends with `library`, so its pages are resident now.
void FaultIn(const char* library) {
  struct Arg {
    const char* library;
    long page;
  } arg{library, sysconf(_SC_PAGESIZE)};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        const Arg* a = static_cast<const Arg*>(data);
        const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        const size_t n = std::strlen(name), m = std::strlen(a->library);
        if (n < m || std::strcmp(name + n - m, a->library) != 0) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const auto* begin = reinterpret_cast<const volatile char*>(info->dlpi_addr + ph.p_vaddr);
          for (size_t off = 0; off < ph.p_filesz; off += static_cast<size_t>(a->page)) {
            (void)begin[off];
          }
        }
        return 1;
      },
      &arg);
}

Result<LoadedVoice> LoadVoice(const VoiceDef& d) {
  LoadedVoice v;
  v.library = dlopen(d.library, RTLD_NOW | RTLD_LOCAL);
  if (v.library == nullptr) {
    const char* err = dlerror();
    return NotFoundError(std::string("flite voice ") + d.name + ": cannot load " + d.library + ": " +
                         (err != nullptr ? err : "unknown error") + " (package flite1-dev)");
  }
  auto reg = reinterpret_cast<cst_voice* (*)(const char*)>(
      dlsym(v.library, (std::string("register_") + d.voice_id).c_str()));
  v.unreg = reinterpret_cast<void (*)(cst_voice*)>(
      dlsym(v.library, (std::string("unregister_") + d.voice_id).c_str()));
  if (reg == nullptr || v.unreg == nullptr) {
    Unload(&v);
    return InternalError(std::string(d.library) + " has no register_/unregister_" + d.voice_id);
  }
  FaultIn(d.library);
  v.voice = reg(nullptr);
  if (v.voice == nullptr) {
    Unload(&v);
    return InternalError(std::string("flite could not register the voice ") + d.name);
  }
  return v;
}

// Guards everything Flite: registration, the refcount, synthesis.
std::mutex& FliteMutex() {
  static std::mutex mu;
  return mu;
}
int g_refs = 0;                         // live engines; guarded by FliteMutex()
LoadedVoice g_voices[kNumVoices] = {};  // guarded by FliteMutex()
int g_rates[kNumVoices] = {};           // Hz; guarded by FliteMutex()

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
      for (LoadedVoice& v : g_voices) Unload(&v);
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
    ARBITER_RETURN_IF_ERROR(CheckSynthesis(*this, text, voice, speed, cancelled));
    const int i = Index(voice);
    // Note [Speech in pieces]: one utterance per piece, cancellable between
    // them; the lock is taken per piece, so engines take turns.
    for (std::string_view piece : SplitSpeechText(text)) {
      if (cancelled.cancelled()) return CancelledError("speech synthesis cancelled");
      bool stopped = false;
      ARBITER_RETURN_IF_ERROR(SynthesizePiece(piece, i, speed, sink, cancelled, &stopped));
      if (stopped) return CancelledError("speech synthesis cancelled");
    }
    return OkStatus();
  }

 private:
  // One utterance of voice `i`, streamed to `sink`; *stopped when the sink
  // or `cancelled` stopped it.
  static Status SynthesizePiece(std::string_view piece, int i, double speed, const PcmSink& sink,
                                const Cancellation& cancelled, bool* stopped) {
    const std::string text_z(piece);
    StreamState st{&sink, &cancelled};
    std::lock_guard<std::mutex> lock(FliteMutex());
    cst_voice* v = g_voices[i].voice;
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
    *stopped = st.stopped;
    return OkStatus();
  }

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
      Result<LoadedVoice> v = LoadVoice(kVoices[i]);
      if (!v.ok()) {
        for (size_t j = 0; j < i; ++j) Unload(&g_voices[j]);
        return v.status();
      }
      g_voices[i] = *v;
      // The rate is a property of the voice's data; a one-word synthesis
      // reads it without reaching into Flite's internal structures.
      cst_wave* w = flite_text_to_wave("a", g_voices[i].voice);
      g_rates[i] = w != nullptr ? w->sample_rate : 0;
      if (w != nullptr) delete_wave(w);
      if (g_rates[i] <= 0) {
        for (size_t j = 0; j <= i; ++j) Unload(&g_voices[j]);
        return InternalError(std::string("flite voice ") + kVoices[i].name + " has no sample rate");
      }
    }
  }
  ++g_refs;
  return std::unique_ptr<TtsEngine>(new FliteTts());
}

}  // namespace arbiter
