// The cross-modal scenario: see modalities_bench.h.
#include "bench/modalities_bench.h"

#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arbiter/backends/tts.h"
#include "arbiter/base/buffer_memory.h"
#include "arbiter/base/file.h"
#include "arbiter/base/size.h"
#include "arbiter/memory/system_memory.h"
#include "arbiter/runtime/runtime.h"
#include "tools/model_maker/model_maker.h"
#include "tools/model_maker/test_media.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

// The first two Harvard sentence lists (IEEE 1969, public domain).
constexpr const char* kHarvard[] = {
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon.",
    "The source of the huge river is the clear spring.",
    "Kick the ball straight and follow through.",
    "Help the woman get back to her feet.",
    "A pot of tea helps to pass the evening.",
    "Smoky fires lack flame and heat.",
    "The soft cushion broke the man's fall.",
    "The salt breeze came across from the sea.",
    "The girl at the booth sold fifty bonds.",
};

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "arbiter-bench-modalities-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

double MsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count();
}

uint64_t RssAnonFile() {
  TrimProcessHeap();
  Result<ProcessMemoryInfo> m = ReadProcessMemory();
  return m.ok() ? m->anon_bytes + m->file_bytes : 0;
}

uint64_t RssAnon() {
  TrimProcessHeap();
  Result<ProcessMemoryInfo> m = ReadProcessMemory();
  return m.ok() ? m->anon_bytes : 0;
}

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  std::string w;
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '\'') {
      w += static_cast<char>(std::tolower(c));
    } else if (!w.empty()) {
      out.push_back(std::move(w));
      w.clear();
    }
  }
  if (!w.empty()) out.push_back(std::move(w));
  return out;
}

constexpr const char* kAdaptedAsrModel = "asr-adapted";

// `adapted_asr`: "" or the directory of a second PocketSphinx transcribe
// model, added as kAdaptedAsrModel.
Config BaseConfig(const std::string& chat_dir, const std::string& state_dir, uint64_t budget,
                  const std::string& adapted_asr = "") {
  Config c = DefaultConfig(budget * 4);
  c.budget_bytes = budget;
  c.state_dir = state_dir;
  c.pressure.source = PressureSourceKind::kNone;
  c.kv.prompt_cache_bytes = 0;
  auto add = [&](const char* name, Capability cap, ModelEngine engine) {
    ModelEntry m;
    m.name = name;
    m.capability = cap;
    m.engine = engine;
    c.models.push_back(m);
  };
  ModelEntry chat;
  chat.name = "demo-chat";
  chat.path = chat_dir;
  chat.vision = "ocr";
  c.models.push_back(chat);
  add("asr", Capability::kTranscribe, ModelEngine::kPocketSphinx);
  add("tts", Capability::kSpeak, ModelEngine::kFlite);
  add("ocr", Capability::kVisionDescribe, ModelEngine::kTesseract);
  add("vad", Capability::kVad, ModelEngine::kPocketSphinx);
  if (!adapted_asr.empty()) {
    add(kAdaptedAsrModel, Capability::kTranscribe, ModelEngine::kPocketSphinx);
    c.models.back().path = adapted_asr;
  }
  return c;
}

// Speaks `text` with tts/slt into a WAV file's bytes.
Result<SharedBytes> SpeakWav(Runtime& rt, const std::string& text) {
  std::unique_ptr<AudioEncoder> enc;
  std::string wav;
  Status failed;
  Status st = rt.Speak(
      SpeechRequest{"tts", text, "slt", 1.0},
      [&](const SpeechStart& s) {
        Result<std::unique_ptr<AudioEncoder>> e = AudioEncoder::Create(AudioFormat::kWav, s.sample_rate);
        if (!e.ok()) {
          failed = e.status();
          return false;
        }
        enc = std::move(e).value();
        return true;
      },
      [&](std::span<const int16_t> pcm) {
        Result<std::string> b = enc->Encode(pcm);
        if (!b.ok()) {
          failed = b.status();
          return false;
        }
        wav += *b;
        return true;
      },
      nullptr);
  if (!failed.ok()) return failed;
  ARBITER_RETURN_IF_ERROR(st);
  if (enc == nullptr) return InternalError("speech produced no audio");
  ARBITER_ASSIGN_OR_RETURN(std::string tail, enc->Finish());
  wav += tail;
  return std::make_shared<const std::vector<uint8_t>>(wav.begin(), wav.end());
}

Result<std::string> Transcribe(Runtime& rt, const SharedBytes& wav,
                               const std::string& model = "asr") {
  TranscribeRequest r;
  r.model = model;
  r.audio = wav;
  ARBITER_ASSIGN_OR_RETURN(TranscribeResult t, rt.Transcribe(r, nullptr));
  return t.transcript.text;
}

Result<SharedBytes> OcrPng(const fs::path& dir) {
  const std::string path = (dir / "ocr.png").string();
  ARBITER_RETURN_IF_ERROR(WriteTextPng(path, OcrTestLines()));
  ARBITER_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return std::make_shared<const std::vector<uint8_t>>(bytes.begin(), bytes.end());
}

Status Chat(Runtime& rt, const std::string& text, std::vector<ChatImage> images = {}) {
  TextRequest t;
  t.model = "demo-chat";
  t.messages = {{"user", text}};
  t.max_tokens = 2;
  t.images = std::move(images);
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<TextGeneration> g, rt.StartText(std::move(t)));
  return g->Run([](std::string_view) { return true; }, nullptr).status();
}

bool Resident(Runtime& rt, const std::string& name) {
  for (const ModelStatus& m : rt.Status().models) {
    if (m.arbiter.name == name) return m.arbiter.state == ModelState::kLoaded;
  }
  return false;
}

uint64_t Runs(Runtime& rt, const std::string& name) {
  for (const ModelStatus& m : rt.Status().models) {
    if (m.arbiter.name == name) return m.arbiter.runs;
  }
  return 0;
}

}  // namespace

int WordEditDistance(const std::string& reference, const std::string& hypothesis, int* ref_words) {
  const std::vector<std::string> r = Words(reference), h = Words(hypothesis);
  if (ref_words != nullptr) *ref_words = static_cast<int>(r.size());
  std::vector<int> prev(h.size() + 1), cur(h.size() + 1);
  for (size_t j = 0; j <= h.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= r.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= h.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r[i - 1] == h[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[h.size()];
}

bool ModalitiesBenchResult::all_ok() const {
  return std::all_of(checks.begin(), checks.end(), [](const ScenarioCheck& c) { return c.ok; });
}

Result<ModalitiesBenchResult> RunModalitiesBench(const ModalitiesBenchOptions& options) {
  TempDir tmp;
  if (tmp.path.empty()) return InternalError("cannot create a temp directory");
  std::string chat_dir = options.chat_dir;
  if (chat_dir.empty()) {
    chat_dir = (tmp.path / "demo-chat").string();
    ARBITER_RETURN_IF_ERROR(MakeModel("demo-chat", chat_dir, 1, nullptr));
  }
  chat_dir = fs::absolute(chat_dir).string();
  ARBITER_ASSIGN_OR_RETURN(SharedBytes png, OcrPng(tmp.path));
  ModalitiesBenchResult out;
  auto add_asr = [&](std::string model, std::string tag, std::string label, std::string path) {
    AsrWerFigures& a = out.asr.emplace_back();
    a.model = std::move(model);
    a.tag = std::move(tag);
    a.label = std::move(label);
    a.path = std::move(path);
  };
  add_asr("asr", "en-us", "PocketSphinx en-us", "");
  std::string adapted_dir;
  if (!options.asr_path.empty()) {
    adapted_dir = fs::absolute(options.asr_path).string();
    add_asr(kAdaptedAsrModel, "adapted",
            "PocketSphinx en-us MAP-adapted to slt (scripts/asr-adapt)", adapted_dir);
  }

  // 1 + 2: room for every model.
  {
    ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt,
                             Runtime::Create(BaseConfig(chat_dir, (tmp.path / "state1").string(),
                                                        8ull << 30, adapted_dir)));
    ARBITER_RETURN_IF_ERROR(Chat(*rt, "hello"));
    for (const char* name : {"tts", "asr", "ocr", "vad"}) {
      ModalityModelFigures f;
      f.name = name;
      const uint64_t before = RssAnonFile();
      ARBITER_ASSIGN_OR_RETURN(ModelStatus loaded, rt->LoadModel(name));
      const uint64_t after = RssAnonFile();
      f.rss_growth_bytes = after > before ? after - before : 0;
      f.load_ms = loaded.arbiter.last_load_ms;
      f.capability = std::string(CapabilityName(loaded.arbiter.capability));
      const auto t0 = SteadyClock::now();
      if (f.name == "tts") {
        ARBITER_RETURN_IF_ERROR(SpeakWav(*rt, "the first result").status());
      } else if (f.name == "asr") {
        ARBITER_ASSIGN_OR_RETURN(SharedBytes wav, SpeakWav(*rt, "the first result"));
        const auto t1 = SteadyClock::now();
        ARBITER_RETURN_IF_ERROR(Transcribe(*rt, wav).status());
        f.first_result_ms = MsSince(t1);
      } else if (f.name == "ocr") {
        ARBITER_RETURN_IF_ERROR(rt->Describe(DescribeRequest{"ocr", png, "image"}, nullptr).status());
      } else {
        ARBITER_ASSIGN_OR_RETURN(SharedBytes wav, SpeakWav(*rt, "one two three"));
        const auto t1 = SteadyClock::now();
        ARBITER_RETURN_IF_ERROR(rt->DetectSpeech(VadRequest{"vad", wav}, nullptr).status());
        f.first_result_ms = MsSince(t1);
      }
      if (f.first_result_ms == 0) f.first_result_ms = MsSince(t0);
      const RuntimeStatus st = rt->Status();
      for (const ModelStatus& m : st.models) {
        if (m.arbiter.name == f.name) f.measured_bytes = m.arbiter.bytes;
      }
      auto owner = st.ledger.by_owner.find(ResidentKey(loaded.arbiter.capability, f.name));
      if (owner != st.ledger.by_owner.end()) f.charged_bytes = owner->second.total_bytes;
      out.models.push_back(f);
    }
    const int n = std::clamp(options.sentences, 1, 20);
    for (int i = 0; i < n; ++i) {
      ARBITER_ASSIGN_OR_RETURN(SharedBytes wav, SpeakWav(*rt, kHarvard[i]));
      out.references.push_back(kHarvard[i]);
      for (AsrWerFigures& a : out.asr) {  // the same speech through each model
        ARBITER_ASSIGN_OR_RETURN(std::string heard, Transcribe(*rt, wav, a.model));
        int words = 0;
        a.word_errors += WordEditDistance(kHarvard[i], heard, &words);
        a.reference_words += words;
        a.heard.push_back(std::move(heard));
      }
    }
    out.sentences = n;
    rt->Shutdown();
  }

  // 3: the scenario under a budget of text + the largest other model.
  uint64_t chat_bytes = 0, other = 0;
  {
    ARBITER_ASSIGN_OR_RETURN(
        std::unique_ptr<Runtime> rt,
        Runtime::Create(BaseConfig(chat_dir, (tmp.path / "state2").string(), 8ull << 30)));
    ARBITER_RETURN_IF_ERROR(Chat(*rt, "hello"));
    for (const ModelStatus& m : rt->Status().models) {
      if (m.arbiter.name == "demo-chat") chat_bytes = m.arbiter.bytes;
    }
    // The text model's charges beyond its entry (weights) count too.
    chat_bytes = rt->Status().ledger.charged_bytes;
    rt->Shutdown();
  }
  for (const ModalityModelFigures& f : out.models) {
    if (f.name != "vad") other = std::max(other, f.measured_bytes);
  }
  out.budget_bytes = chat_bytes + other + (8u << 20);
  ARBITER_ASSIGN_OR_RETURN(
      std::unique_ptr<Runtime> rt,
      Runtime::Create(BaseConfig(chat_dir, (tmp.path / "state3").string(), out.budget_bytes)));
  auto check = [&](std::string name, bool ok, std::string detail) {
    out.checks.push_back({std::move(name), ok, std::move(detail)});
  };
  ARBITER_RETURN_IF_ERROR(Chat(*rt, "hello"));
  const uint64_t base = RssAnon();
  ARBITER_ASSIGN_OR_RETURN(SharedBytes wav, SpeakWav(*rt, "open the pod bay doors"));
  const bool tts_after_speak = Resident(*rt, "tts");
  ARBITER_ASSIGN_OR_RETURN(std::string heard, Transcribe(*rt, wav));
  ARBITER_RETURN_IF_ERROR(Chat(*rt, heard));
  check("voice turn: tts loaded, then asr evicts it; text stays",
        tts_after_speak && Resident(*rt, "asr") && !Resident(*rt, "tts") &&
            Resident(*rt, "demo-chat"),
        fmt::format("heard \"{}\"", heard));
  std::vector<ChatImage> image = {{0, 4, png, "messages[0].content[1].image_url"}};
  ARBITER_RETURN_IF_ERROR(Chat(*rt, "read", image));
  check("image chat: ocr evicts the idle voice model; text stays",
        Resident(*rt, "ocr") && !Resident(*rt, "asr") && Resident(*rt, "demo-chat"), "");
  const uint64_t runs = Runs(*rt, "ocr");
  ARBITER_RETURN_IF_ERROR(Chat(*rt, "read", image));
  check("repeated image: a vision-cache hit, no second OCR run",
        Runs(*rt, "ocr") == runs && rt->VisionCache().hits >= 1,
        fmt::format("ocr runs {} → {}, cache hits {}", runs, Runs(*rt, "ocr"),
                    rt->VisionCache().hits));
  rt->DispatchPressure(MemoryPressureLevel::kCritical, std::nullopt);
  Result<SharedBytes> refused = SpeakWav(*rt, "hello");
  const Status chat_critical = Chat(*rt, "hello");
  check("critical: speech refused, chat answers",
        !refused.ok() && refused.status().reason() == ErrorReason::kMemoryPressure &&
            chat_critical.ok(),
        refused.ok() ? "speech answered" : refused.status().message());
  rt->DispatchPressure(MemoryPressureLevel::kNominal, std::nullopt);
  check("nominal: speech again", SpeakWav(*rt, "hello").ok(), "");
  const RuntimeStatus st = rt->Status();
  check("budget honoured", st.ledger.charged_bytes <= st.ledger.budget_bytes,
        fmt::format("charged {} of {}", FormatSize(st.ledger.charged_bytes),
                    FormatSize(st.ledger.budget_bytes)));
  for (const char* name : {"tts", "asr", "ocr", "vad"}) {
    ARBITER_RETURN_IF_ERROR(rt->UnloadModel(name, 10000).status());
  }
  const uint64_t end = RssAnon();
  const double slack = std::max(0.02 * static_cast<double>(base), 8.0 * (1 << 20));
  check("memory returned after unloading voice and vision",
        static_cast<double>(end) <= static_cast<double>(base) + slack,
        fmt::format("RssAnon {} → {} (slack {})", FormatSize(base), FormatSize(end),
                    FormatSize(static_cast<uint64_t>(slack))));
  rt->Shutdown();
  return out;
}

std::string FormatModalitiesBench(const ModalitiesBenchResult& r) {
  std::ostringstream o;
  o << fmt::format("{:<6} {:<16} {:>9} {:>12} {:>10} {:>10} {:>11}\n", "model", "capability",
                   "load ms", "1st result ms", "measured", "charged", "RSS growth");
  for (const ModalityModelFigures& f : r.models) {
    o << fmt::format("{:<6} {:<16} {:>9.1f} {:>12.1f} {:>10} {:>10} {:>11}\n", f.name,
                     f.capability, f.load_ms, f.first_result_ms, FormatSize(f.measured_bytes),
                     FormatSize(f.charged_bytes), FormatSize(f.rss_growth_bytes));
  }
  const AsrWerFigures& en_us = r.asr.at(0);
  if (r.asr.size() == 1) {
    o << fmt::format("\nTTS (Flite slt) → ASR ({}), {} Harvard sentences: WER "
                     "{:.1f} % ({} errors / {} words; target ≤ 20 %)\n",
                     en_us.label, r.sentences, 100 * en_us.wer(), en_us.word_errors,
                     en_us.reference_words);
    for (size_t i = 0; i < r.references.size(); ++i) {
      o << "  " << r.references[i] << "\n    → " << en_us.heard[i] << "\n";
    }
  } else {
    o << fmt::format("\nTTS (Flite slt) → ASR, {} Harvard sentences, WER (target ≤ 20 %):\n",
                     r.sentences);
    for (const AsrWerFigures& a : r.asr) {
      o << fmt::format("  {:<58} {:>5.1f} % ({} errors / {} words)\n", a.label, 100 * a.wer(),
                       a.word_errors, a.reference_words);
    }
    for (const AsrWerFigures& a : r.asr) {
      if (!a.path.empty()) o << fmt::format("  ({} model: {})\n", a.tag, a.path);
    }
    for (size_t i = 0; i < r.references.size(); ++i) {
      o << "  " << r.references[i];
      for (const AsrWerFigures& a : r.asr) o << fmt::format("\n    {:<7} → {}", a.tag, a.heard[i]);
      o << "\n";
    }
  }
  o << fmt::format("\nscenario under a budget of {} (demo-chat + the largest other + 8 MiB):\n",
                   FormatSize(r.budget_bytes));
  for (const ScenarioCheck& c : r.checks) {
    o << fmt::format("  {} {}{}\n", c.ok ? "ok  " : "FAIL", c.name,
                     c.detail.empty() ? "" : " — " + c.detail);
  }
  return o.str();
}

std::string FormatModalitiesBenchJson(const ModalitiesBenchResult& r) {
  nlohmann::json models = nlohmann::json::array();
  for (const ModalityModelFigures& f : r.models) {
    models.push_back({{"name", f.name},
                      {"capability", f.capability},
                      {"load_ms", f.load_ms},
                      {"first_result_ms", f.first_result_ms},
                      {"measured_bytes", f.measured_bytes},
                      {"charged_bytes", f.charged_bytes},
                      {"rss_growth_bytes", f.rss_growth_bytes}});
  }
  nlohmann::json checks = nlohmann::json::array();
  for (const ScenarioCheck& c : r.checks) {
    checks.push_back({{"name", c.name}, {"ok", c.ok}, {"detail", c.detail}});
  }
  // The top-level WER fields are en-us's; with a second model, both lines
  // side by side in asr_wer and asr_transcripts.
  const AsrWerFigures& en_us = r.asr.at(0);
  nlohmann::json out{{"models", models},
                     {"sentences", r.sentences},
                     {"reference_words", en_us.reference_words},
                     {"word_errors", en_us.word_errors},
                     {"wer", en_us.wer()},
                     {"budget_bytes", r.budget_bytes},
                     {"checks", checks},
                     {"all_ok", r.all_ok()}};
  if (r.asr.size() > 1) {
    nlohmann::json lines = nlohmann::json::array();
    for (const AsrWerFigures& a : r.asr) {
      nlohmann::json line{{"label", a.label},
                          {"reference_words", a.reference_words},
                          {"word_errors", a.word_errors},
                          {"wer", a.wer()}};
      if (!a.path.empty()) line["path"] = a.path;
      lines.push_back(std::move(line));
    }
    nlohmann::json heard = nlohmann::json::array();
    for (size_t i = 0; i < r.references.size(); ++i) {
      nlohmann::json sentence{{"reference", r.references[i]}};
      for (const AsrWerFigures& a : r.asr) {
        std::string key = a.tag;  // "en-us" -> "en_us"
        std::replace(key.begin(), key.end(), '-', '_');
        sentence[key] = a.heard[i];
      }
      heard.push_back(std::move(sentence));
    }
    out["asr_wer"] = lines;
    out["asr_transcripts"] = heard;
  }
  return out.dump(2) + "\n";
}

}  // namespace arbiter
