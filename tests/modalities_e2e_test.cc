// End-to-end, issue 14: every modality through the real `arbiter serve`
// binary on a free loopback port, with real trained models from Debian:
//   chat   the tiny text model, vision = "ocr"
//   asr    PocketSphinx en-us (transcribe)
//   tts    Flite (speak)        tts2  eSpeak NG (speak)
//   ocr    Tesseract eng (vision-describe)
//   vad    PocketSphinx (vad)
// ModalitiesE2E: the official openai Node SDK (tests/clients/modalities_sdk.mjs)
// speaks, transcribes back, reads an image in chat and via describe; bad
// input gets a 400 naming the field and the server keeps serving; two
// speech models run side by side; metrics per capability.
// CrossModalE2E: the cross-modal scenario under a budget that holds the
// text model plus one other model (issue 14 point 5).
//
// No wall-clock speed assertions: every wait has a generous deadline.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server_process.h"
#include "tools/model_maker/model_maker.h"
#include "tools/model_maker/test_media.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;

bool MakeOcrPng(const std::string& path) { return WriteTextPng(path, OcrTestLines()).ok(); }

std::string Base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += k[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// A 16-bit mono WAV header for `frames` frames at `rate`, then the samples.
std::string Wav(int rate, int bits, size_t frames) {
  const uint32_t data = static_cast<uint32_t>(frames * (bits / 8));
  std::string w = "RIFF";
  auto u32 = [&](uint32_t v) { w.append(reinterpret_cast<const char*>(&v), 4); };
  auto u16 = [&](uint16_t v) { w.append(reinterpret_cast<const char*>(&v), 2); };
  u32(36 + data);
  w += "WAVEfmt ";
  u32(16);
  u16(1);
  u16(1);
  u32(static_cast<uint32_t>(rate));
  u32(static_cast<uint32_t>(rate * bits / 8));
  u16(static_cast<uint16_t>(bits / 8));
  u16(static_cast<uint16_t>(bits));
  w += "data";
  u32(data);
  w.append(data, bits == 8 ? '\x80' : '\0');
  return w;
}

class Server {
 public:
  // Starts arbiter serve with `models_toml` and [memory] budget `budget`.
  void Start(const std::string& dir, const std::string& models_toml, const std::string& budget) {
    std::ostringstream config;
    config << "[memory]\nbudget = \"" << budget << "\"\n"
           << "[pressure]\nsource = \"none\"\n"
           << "[kv]\nprompt_cache = 0\n"
           << models_toml;
    std::string error;
    ASSERT_TRUE(::arbiter::testing::StartServeIn(ARBITER_BINARY, dir, config.str(), &proc_, &error))
        << error;
  }
  void Stop() { ::arbiter::testing::KillServer(proc_, SIGTERM); }
  ~Server() { ::arbiter::testing::KillServer(proc_, SIGKILL); }

  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", proc_.port);
    c.set_read_timeout(300, 0);
    c.set_write_timeout(300, 0);
    return c;
  }
  int port() const { return proc_.port; }
  pid_t pid() const { return proc_.pid; }
  std::string log() const { return ::arbiter::testing::ReadAll(proc_.log); }

  httplib::Result PostJson(const std::string& path, const json& body) const {
    return Client().Post(path, body.dump(), "application/json");
  }
  httplib::Result Speak(const std::string& model, const std::string& text,
                        const std::string& format = "wav", const std::string& voice = "") const {
    json body = {{"model", model}, {"input", text}, {"response_format", format}};
    if (!voice.empty()) body["voice"] = voice;
    return PostJson("/v1/audio/speech", body);
  }
  httplib::Result Upload(const std::string& path, const std::string& model,
                         const std::string& file,
                         std::vector<httplib::MultipartFormData> extra = {}) const {
    httplib::MultipartFormDataItems items = {{"model", model, "", ""},
                                             {"file", file, "audio.wav", "audio/wav"}};
    for (auto& e : extra) items.push_back(std::move(e));
    return Client().Post(path, items);
  }
  json Status() const {
    auto r = Client().Get("/admin/status");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
    return r && r->status == 200 ? json::parse(r->body) : json();
  }
  json Model(const std::string& name) const {
    const json status = Status();  // not a temporary in the range-for
    for (const json& m : status["models"]) {
      if (m["name"] == name) return m;
    }
    return json();
  }
  uint64_t RssAnon() const { return ProcStatusBytes("RssAnon:"); }
  // A "Name:" field of /proc/<pid>/status in bytes (0 when absent).
  uint64_t ProcStatusBytes(const std::string& field) const {
    std::ifstream in("/proc/" + std::to_string(proc_.pid) + "/status");
    std::string key;
    uint64_t kb = 0;
    while (in >> key) {
      if (key == field) {
        in >> kb;
        return kb * 1024;
      }
    }
    return 0;
  }

 private:
  ::arbiter::testing::ServerProc proc_;
};

constexpr const char* kModels = R"(
[[models]]
name = "chat"
path = "chat"
vision = "ocr"
[[models]]
name = "asr"
capability = "transcribe"
[[models]]
name = "tts"
capability = "speak"
[[models]]
name = "tts2"
capability = "speak"
engine = "espeak-ng"
[[models]]
name = "ocr"
capability = "vision-describe"
[[models]]
name = "vad"
capability = "vad"
)";

// A suite whose tests share one Server, started by the suite's
// SetUpTestSuite in dir_ (a scratch directory); gone with it at the end.
// gtest runs one suite at a time, so the suites below share these fields.
class SharedServerSuite : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "---- serve.log ----\n" << server_->log();
  }

  static inline std::string dir_;
  static inline Server* server_ = nullptr;
};

class ModalitiesE2E : public SharedServerSuite {
 protected:
  static void SetUpTestSuite() {
    dir_ = ::arbiter::testing::MakeScratchDir("modalities-e2e");
    ASSERT_FALSE(dir_.empty());
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/chat", 7).ok());
    ASSERT_TRUE(MakeOcrPng(dir_ + "/ocr.png"));
    server_ = new Server();
    server_->Start(dir_, kModels, "4GiB");
  }
  static std::string Png() { return ::arbiter::testing::ReadAll(dir_ + "/ocr.png"); }
};

// The official openai SDK, unmodified (skips without Node 20 and the
// packages install-deps puts in ARBITER_CLIENT_DEPS_DIR).
TEST_F(ModalitiesE2E, OpenAiSdkSpeaksTranscribesAndReadsImages) {
  const std::string deps = ARBITER_CLIENT_DEPS_DIR;
  if (!fs::exists(deps + "/node_modules/openai/package.json") ||
      std::system("node -e 'process.exit(process.versions.node.split(\".\")[0] < 20 ? 1 : 0)'") != 0) {
    GTEST_SKIP() << "Node 20 and the openai package (scripts/install-deps.sh) are needed";
  }
  // The script imports 'openai' by name: run it from a copy beside the packages.
  fs::copy_file(ARBITER_SOURCE_DIR "/tests/clients/modalities_sdk.mjs", deps + "/modalities_sdk.mjs",
                fs::copy_options::overwrite_existing);
  const std::string out_path = dir_ + "/sdk.out";
  const std::string cmd = "cd " + deps + " && node modalities_sdk.mjs " +
                          std::to_string(server_->port()) + " " + dir_ + "/ocr.png > " + out_path +
                          " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string out = ::arbiter::testing::ReadAll(out_path);
  EXPECT_EQ(rc, 0) << out;
  std::cerr << "sdk: " << out;
}

TEST_F(ModalitiesE2E, SpeechRoundTripAndFormats) {
  auto wav = server_->Speak("tts", "the quick brown fox jumps over the lazy dog");
  ASSERT_TRUE(wav);
  ASSERT_EQ(wav->status, 200) << wav->body;
  EXPECT_EQ(wav->body.substr(0, 4), "RIFF");
  EXPECT_EQ(wav->get_header_value("Content-Type"), "audio/wav");
  const int rate = std::stoi(wav->get_header_value("X-Sample-Rate"));
  EXPECT_GT(rate, 0);
  auto pcm = server_->Speak("tts", "the quick brown fox jumps over the lazy dog", "pcm");
  ASSERT_TRUE(pcm);
  ASSERT_EQ(pcm->status, 200);
  // The same synthesis, without the 44-byte header.
  EXPECT_EQ(pcm->body.size() + 44, wav->body.size());
  auto mp3 = server_->PostJson("/v1/audio/speech", {{"model", "tts"}, {"input", "hello there"}});
  ASSERT_TRUE(mp3);
  ASSERT_EQ(mp3->status, 200);
  EXPECT_EQ(mp3->get_header_value("Content-Type"), "audio/mpeg");
  EXPECT_GT(mp3->body.size(), 500u);
  // eSpeak NG, the second engine.
  auto espeak = server_->Speak("tts2", "the quick brown fox jumps over the lazy dog");
  ASSERT_TRUE(espeak);
  ASSERT_EQ(espeak->status, 200) << espeak->body;
  auto t = server_->Upload("/v1/audio/transcriptions", "asr", wav->body,
                           {{"response_format", "verbose_json", "", ""}});
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200) << t->body;
  const json j = json::parse(t->body);
  EXPECT_THAT(j["text"].get<std::string>(), HasSubstr("fox"));
  EXPECT_GE(j["segments"].size(), 1u);
  EXPECT_GT(j["duration"].get<double>(), 1.0);
}

// Bad input: a 400 naming the field, never a crash; the server keeps serving.
TEST_F(ModalitiesE2E, BadInputIsA400NamingTheField) {
  auto expect400 = [](const httplib::Result& r, const std::string& part) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_THAT(r->body, HasSubstr(part));
  };
  expect400(server_->Upload("/v1/audio/transcriptions", "asr", "this is not audio at all"), "file");
  expect400(server_->Upload("/v1/audio/transcriptions", "asr", ""), "file");
  // Two hours (8 kHz, 8-bit: 57.6 MB, under the upload limit) is over
  // max_audio_seconds, refused from the header.
  expect400(server_->Upload("/v1/audio/transcriptions", "asr", Wav(8000, 8, 7200 * 8000)),
            "max_audio_seconds");
  expect400(server_->Upload("/v1/audio/transcriptions", "asr", Wav(16000, 16, 16000),
                            {{"temperature", "0.7", "", ""}}),
            "temperature");
  expect400(server_->Upload("/v1/audio/transcriptions", "asr", Wav(16000, 16, 16000),
                            {{"response_format", "srt", "", ""}}),
            "response_format");
  expect400(server_->Upload("/v1/audio/transcriptions", "asr", Wav(16000, 16, 16000),
                            {{"bogus", "1", "", ""}}),
            "bogus");
  expect400(server_->Speak("tts", "hello", "wav", "darth"), "slt");
  expect400(server_->Speak("tts", ""), "input");
  expect400(server_->Speak("tts", "hi", "flac"), "response_format");
  expect400(server_->PostJson("/v1/vision/describe",
                              {{"model", "ocr"}, {"image", "data:image/png;base64,AAAAbm90IGFuIGltYWdl"}}),
            "image");
  expect400(server_->PostJson("/v1/vision/describe",
                              {{"model", "ocr"}, {"image", "https://example.com/x.png"}}),
            "no outbound");
  // A decompression bomb: a valid 20000×20000 PNG header, refused before decoding.
  {
    std::string bomb = "\x89PNG\r\n\x1a\n";
    std::string ihdr = std::string("\0\0\0\x0dIHDR", 8) + std::string("\0\0\x4e\x20\0\0\x4e\x20\x08\0\0\0\0", 13);
    bomb += ihdr + std::string(4, '\0');  // CRC: refused on the size before any check of it
    expect400(server_->PostJson("/v1/vision/describe",
                                {{"model", "ocr"}, {"image", "data:image/png;base64," + Base64(bomb)}}),
              "image");
  }
  expect400(server_->PostJson("/v1/chat/completions",
                              {{"model", "chat"},
                               {"messages", {{{"role", "user"},
                                              {"content", {{{"type", "image_url"},
                                                            {"image_url", {{"url", "http://x/y.png"}}}}}}}}}}),
            "messages[0].content[0].image_url");
  // Wrong capability, unknown model.
  auto wrong = server_->Speak("asr", "hello");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 400);
  auto unknown = server_->Speak("nope", "hello");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  // Still serving.
  auto ok = server_->Speak("tts", "still here");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// Queues are per model: the two speech engines run side by side, and each
// model's runs are counted per capability in the metrics.
// A cut-off OGG has no final granule position, so libsndfile cannot tell
// its length (it reports 2^63 − 1 frames): a 400 naming the file as
// damaged (Note [Damaged audio] in src/formats/audio.cc), not "576460752303423.5
// s of audio" over max_audio_seconds; the whole file transcribes.
TEST_F(ModalitiesE2E, ATruncatedOggIsA400NamingTheFileAsDamaged) {
  const std::string ogg =
      ::arbiter::testing::ReadAll(ARBITER_SOURCE_DIR "/fuzz/corpus/audio_decode/tone_22k.ogg");
  ASSERT_GT(ogg.size(), 1000u);
  auto whole = server_->Upload("/v1/audio/transcriptions", "asr", ogg);
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->status, 200) << whole->body;
  for (size_t kept : {ogg.size() * 9 / 10, ogg.size() / 2}) {
    auto r = server_->Upload("/v1/audio/transcriptions", "asr", ogg.substr(0, kept));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_THAT(r->body, HasSubstr("file is damaged"));
    EXPECT_THAT(r->body, ::testing::Not(HasSubstr("max_audio_seconds")));
  }
}

TEST_F(ModalitiesE2E, TwoSpeechModelsRunSideBySideAndRunsAreMetered) {
  const std::string text(400, 'a');
  auto a = std::async(std::launch::async, [&] { return server_->Speak("tts", "one two three " + text); });
  auto b = std::async(std::launch::async, [&] { return server_->Speak("tts2", "one two three " + text); });
  auto ra = a.get();
  auto rb = b.get();
  ASSERT_TRUE(ra && rb);
  EXPECT_EQ(ra->status, 200);
  EXPECT_EQ(rb->status, 200);
  EXPECT_TRUE(server_->Model("tts")["resident"].get<bool>());
  EXPECT_TRUE(server_->Model("tts2")["resident"].get<bool>());
  EXPECT_GE(server_->Model("tts")["runs"].get<int>(), 1);
  auto m = server_->Client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_THAT(m->body, HasSubstr("arbiter_capability_run_seconds_count{capability=\"speak\",model=\"tts\"}"));
  EXPECT_THAT(m->body, HasSubstr("arbiter_model_queue_depth{capability=\"speak\",model=\"tts2\"}"));
  EXPECT_THAT(m->body, HasSubstr("arbiter_memory_charged_by_kind_bytes{kind=\"model\"}"));
}

// Footprints are measured and charged under kind `model`, and returned on
// unload.
TEST_F(ModalitiesE2E, FootprintsAreMeasuredChargedAndReturned) {
  ASSERT_EQ(server_->Client().Post("/admin/models/ocr/load", "", "application/json")->status, 200);
  const json ocr = server_->Model("ocr");
  EXPECT_TRUE(ocr["bytes_measured"].get<bool>());
  EXPECT_GT(ocr["bytes"].get<uint64_t>(), 1u << 20);
  const json by_kind = server_->Status()["charged_by_kind"];
  EXPECT_GE(by_kind["model"].get<uint64_t>(), ocr["bytes"].get<uint64_t>()) << by_kind.dump();
  auto r = server_->Client().Post("/admin/models/ocr/unload", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(server_->Model("ocr")["resident"].get<bool>());
}

// ---------------------------------------------------------------------------
// Bounded speech: [server] max_speech_chars, synthesis in pieces (Note
// [Speech in pieces] in src/backends/speech_pieces.cc), the ledger true
// during and after a long synthesis, a client that leaves frees the model.
// A server of its own, with Flite alone, so nothing else moves its memory.

// `n` characters (Unicode code points) of English sentences, with a few
// two-byte characters so characters and bytes differ.
std::string SpeechText(size_t n) {
  const std::string sentence = "The na\u00efve fox jumps over the lazy dog at the caf\u00e9 again. ";
  std::string out;
  size_t chars = 0;
  while (chars < n) {
    for (size_t i = 0; i < sentence.size() && chars < n;) {
      const size_t len = (static_cast<unsigned char>(sentence[i]) & 0xE0) == 0xC0 ? 2 : 1;
      out += sentence.substr(i, len);
      i += len;
      ++chars;
    }
  }
  return out;
}

class SpeechLimitsE2E : public SharedServerSuite {
 protected:
  static void SetUpTestSuite() {
    dir_ = ::arbiter::testing::MakeScratchDir("speech-limits-e2e");
    ASSERT_FALSE(dir_.empty());
    server_ = new Server();
    server_->Start(dir_, "[[models]]\nname = \"tts\"\ncapability = \"speak\"\n", "4GiB");
  }

  // The ledger against the process: as ../shared/checks/07-ledger-truth
  // compares them (RssAnon + RssShmem against charged + runtime bytes) and
  // as /admin/status does (unaccounted_bytes: the charges outside RssAnon +
  // RssShmem, Flite's voice pages, on the measured side). Each must be
  // within max(5 %, 16 MiB).
  struct Gap {
    bool ok = false;
    double gap_mib = 0, unaccounted_mib = 0, scratch_mib = 0;
    std::string text;
  };
  static Gap LedgerGap() {
    const json st = server_->Status();
    const uint64_t rss = server_->ProcStatusBytes("RssAnon:") + server_->ProcStatusBytes("RssShmem:");
    const uint64_t ledger = st["charged_bytes"].get<uint64_t>() + st["runtime_bytes"].get<uint64_t>();
    const double tolerance = std::max(0.05 * static_cast<double>(ledger), 16.0 * (1 << 20));
    const double gap = static_cast<double>(rss) - static_cast<double>(ledger);
    const double unaccounted = static_cast<double>(st["unaccounted_bytes"].get<int64_t>());
    Gap g;
    g.ok = std::abs(gap) <= tolerance && std::abs(unaccounted) <= tolerance;
    g.gap_mib = gap / 1048576.0;
    g.unaccounted_mib = unaccounted / 1048576.0;
    g.scratch_mib = st["charged_by_kind"]["scratch"].get<uint64_t>() / 1048576.0;
    g.text = fmt::format("RssAnon+RssShmem {:.1f} MiB, charged+runtime {:.1f} MiB (gap {:+.1f} MiB; "
                         "unaccounted {:+.1f} MiB; scratch {:.1f} MiB)",
                         rss / 1048576.0, ledger / 1048576.0, g.gap_mib, g.unaccounted_mib,
                         g.scratch_mib);
    return g;
  }
};

TEST_F(SpeechLimitsE2E, AnInputOverMaxSpeechCharsIsRefusedAtOnce) {
  const std::string huge = std::string(1000000, 'a');
  auto r = server_->Speak("tts", huge, "pcm");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_THAT(r->body, HasSubstr("max_speech_chars"));
  EXPECT_THAT(r->body, HasSubstr("4096"));
  // Counted in characters, not bytes: 4,097 characters are refused.
  r = server_->Speak("tts", SpeechText(4097), "pcm");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_THAT(r->body, HasSubstr("max_speech_chars"));
  // Refused before anything was loaded or run.
  const json tts = server_->Model("tts");
  EXPECT_EQ(tts["runs"].get<int>(), 0) << tts.dump();
}

// 4,096 characters (more bytes): audio streams piece by piece; during and
// after the synthesis the ledger matches the process's memory.
TEST_F(SpeechLimitsE2E, ALongSynthesisKeepsTheLedgerTrue) {
  ASSERT_EQ(server_->Speak("tts", "warm up", "pcm")->status, 200);  // load + first run measured
  const Gap before = LedgerGap();
  EXPECT_TRUE(before.ok) << "before: " << before.text;
  const std::string text = SpeechText(4096);
  ASSERT_GT(text.size(), 4096u);
  for (const char* format : {"pcm", "wav"}) {
    // The ledger, read every 100 ms while the synthesis runs.
    std::atomic<bool> done{false};
    std::vector<std::string> failed;
    int readings = 0;
    double worst_gap = 0, worst_unaccounted = 0, max_scratch = 0;
    std::thread poller([&] {
      while (!done.load()) {
        const Gap g = LedgerGap();
        ++readings;
        if (!g.ok) failed.push_back(g.text);
        if (std::abs(g.gap_mib) > std::abs(worst_gap)) worst_gap = g.gap_mib;
        if (std::abs(g.unaccounted_mib) > std::abs(worst_unaccounted)) {
          worst_unaccounted = g.unaccounted_mib;
        }
        max_scratch = std::max(max_scratch, g.scratch_mib);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    auto r = server_->Speak("tts", text, format);
    done.store(true);
    poller.join();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << format << ": " << r->body;
    // Flite's 16 kHz voice: minutes of speech.
    EXPECT_GT(r->body.size(), 60u * 16000 * 2) << format;
    EXPECT_GT(readings, 0);
    EXPECT_TRUE(failed.empty()) << format << ": " << failed.size() << " of " << readings
                                << " readings during the synthesis out of bounds, e.g. "
                                << failed.front();
    if (std::string(format) == "wav") {
      EXPECT_GT(max_scratch, 1.0) << "the buffered WAV is charged";
    }
    const Gap after = LedgerGap();
    EXPECT_TRUE(after.ok) << format << " after: " << after.text;
    std::cerr << fmt::format("[ledger] {}: {} bytes; {} readings during, worst gap {:+.1f} MiB, "
                             "worst unaccounted {:+.1f} MiB, scratch up to {:.1f} MiB; after: {}\n",
                             format, r->body.size(), readings, worst_gap, worst_unaccounted,
                             max_scratch, after.text);
  }
}

// A client that leaves mid-synthesis stops it within a piece: the model is
// released (ref_count 0, no run) and the next request is served.
TEST_F(SpeechLimitsE2E, AClientThatLeavesMidSynthesisFreesTheModel) {
  const int fd = ::arbiter::testing::ConnectLoopback(server_->port());
  ASSERT_GE(fd, 0);
  const std::string body =
      json{{"model", "tts"}, {"input", SpeechText(4096)}, {"response_format", "pcm"}}.dump();
  const std::string request = "POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              "Content-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  // The first audio arrives (after the first piece), then the client goes.
  std::string got;
  char buf[16384];
  while (got.size() < 64 * 1024) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << got.substr(0, 200);
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got.substr(0, 200);
  EXPECT_TRUE(server_->Model("tts")["running"].get<bool>());
  ::close(fd);
  json tts;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    tts = server_->Model("tts");
    if (tts["ref_count"] == 0 && !tts["running"].get<bool>()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(tts["ref_count"], 0) << tts.dump();
  EXPECT_FALSE(tts["running"].get<bool>()) << tts.dump();
  auto next = server_->Speak("tts", "the next request", "pcm");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 200);
  EXPECT_GT(next->body.size(), 16000u);
}

// ---------------------------------------------------------------------------
// The cross-modal scenario (issue 14 point 5).

class CrossModalE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::arbiter::testing::MakeScratchDir("crossmodal-e2e");
    ASSERT_FALSE(dir_.empty());
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/chat", 7).ok());
    ASSERT_TRUE(MakeOcrPng(dir_ + "/ocr.png"));
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(CrossModalE2E, VoiceAndVisionTakeTurnsUnderABudgetAndMemoryComesBack) {
  constexpr const char* kScenarioModels = R"(
[[models]]
name = "chat"
path = "chat"
vision = "ocr"
[[models]]
name = "asr"
capability = "transcribe"
[[models]]
name = "tts"
capability = "speak"
[[models]]
name = "ocr"
capability = "vision-describe"
)";
  const std::string image = "data:image/png;base64," + Base64(::arbiter::testing::ReadAll(dir_ + "/ocr.png"));
  const json image_chat = {
      {"model", "chat"},
      {"max_tokens", 2},
      {"messages", {{{"role", "user"},
                     {"content", {{{"type", "text"}, {"text", "read"}},
                                  {{"type", "image_url"}, {"image_url", {{"url", image}}}}}}}}}};
  const json chat = {{"model", "chat"}, {"max_tokens", 2},
                     {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  // Phase 1: each model's measured bytes with room for all.
  std::map<std::string, uint64_t> bytes;
  {
    fs::create_directories(dir_ + "/p1");
    fs::create_symlink(dir_ + "/chat", dir_ + "/p1/chat");
    Server s;
    s.Start(dir_ + "/p1", kScenarioModels, "4GiB");
    auto wav = s.Speak("tts", "open the pod bay doors");
    ASSERT_TRUE(wav);
    ASSERT_EQ(wav->status, 200);
    ASSERT_EQ(s.Upload("/v1/audio/transcriptions", "asr", wav->body)->status, 200);
    ASSERT_EQ(s.PostJson("/v1/chat/completions", image_chat)->status, 200) << s.log();
    for (const char* m : {"chat", "tts", "asr", "ocr"}) bytes[m] = s.Model(m)["bytes"].get<uint64_t>();
  }
  const uint64_t other = std::max({bytes["tts"], bytes["asr"], bytes["ocr"]});
  const uint64_t budget = bytes["chat"] + other + (8u << 20);
  std::cerr << "bytes: chat " << bytes["chat"] << " tts " << bytes["tts"] << " asr " << bytes["asr"]
            << " ocr " << bytes["ocr"] << " → budget " << budget << "\n";
  // Phase 2: a budget that holds the text model plus any one other.
  fs::create_directories(dir_ + "/p2");
  fs::create_symlink(dir_ + "/chat", dir_ + "/p2/chat");
  Server s;
  s.Start(dir_ + "/p2", kScenarioModels, std::to_string(budget));
  ASSERT_EQ(s.PostJson("/v1/chat/completions", chat)->status, 200);
  const uint64_t base = s.RssAnon();
  // A voice turn: speak, transcribe, chat with the text.
  auto wav = s.Speak("tts", "open the pod bay doors");
  ASSERT_TRUE(wav);
  ASSERT_EQ(wav->status, 200);
  auto heard = s.Upload("/v1/audio/transcriptions", "asr", wav->body);
  ASSERT_TRUE(heard);
  ASSERT_EQ(heard->status, 200) << heard->body;
  json turn = chat;
  turn["messages"][0]["content"] = json::parse(heard->body)["text"];
  ASSERT_EQ(s.PostJson("/v1/chat/completions", turn)->status, 200);
  EXPECT_TRUE(s.Model("chat")["resident"].get<bool>());
  EXPECT_TRUE(s.Model("asr")["resident"].get<bool>());
  EXPECT_FALSE(s.Model("tts")["resident"].get<bool>()) << "asr did not evict tts";
  // An image: OCR evicts the idle voice model, never the text model.
  ASSERT_EQ(s.PostJson("/v1/chat/completions", image_chat)->status, 200);
  EXPECT_TRUE(s.Model("chat")["resident"].get<bool>());
  EXPECT_TRUE(s.Model("ocr")["resident"].get<bool>());
  EXPECT_FALSE(s.Model("asr")["resident"].get<bool>());
  const json runs_before = s.Model("ocr")["runs"];
  ASSERT_EQ(s.PostJson("/v1/chat/completions", image_chat)->status, 200);
  EXPECT_EQ(s.Model("ocr")["runs"], runs_before) << "the repeated image ran OCR again";
  EXPECT_GE(s.Status()["vision_cache"]["hits"].get<int>(), 1);
  // Critical pressure: non-text work is refused, chat answers; nominal restores.
  ASSERT_EQ(s.PostJson("/admin/pressure", {{"level", "critical"}})->status, 200);
  auto refused = s.Speak("tts", "hello");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(s.PostJson("/v1/chat/completions", chat)->status, 200);
  ASSERT_EQ(s.PostJson("/admin/pressure", {{"level", "nominal"}})->status, 200);
  EXPECT_EQ(s.Speak("tts", "hello")->status, 200);
  // The budget held throughout.
  const json st = s.Status();
  EXPECT_LE(st["charged_bytes"].get<uint64_t>(), st["budget_bytes"].get<uint64_t>());
  // Everything but the text model unloaded: RSS back near the start.
  for (const char* m : {"tts", "asr", "ocr"}) {
    auto r = s.Client().Post(std::string("/admin/models/") + m + "/unload", "", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t end = s.RssAnon();
  const double slack = std::max(0.02 * static_cast<double>(base), 8.0 * (1 << 20));
  EXPECT_LE(static_cast<double>(end), static_cast<double>(base) + slack)
      << "RSS " << base / (1 << 20) << " → " << end / (1 << 20) << " MiB";
}

// ---------------------------------------------------------------------------
// External model servers (issue 14 point 3): a second `arbiter serve`, with
// its own config and state directory, started as a process model.

// Pids of running processes whose command line contains `needle`.
std::vector<pid_t> ProcessesWith(const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = ::arbiter::testing::ReadAll(e.path() / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    const std::string stat = ::arbiter::testing::ReadAll(e.path() / "stat");
    const bool zombie = stat.find(") Z ") != std::string::npos;
    if (!zombie && cmd.find(needle) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

// Waits up to `seconds` for `done()`.
template <typename F>
bool WaitFor(F done, int seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

class ProcessModelsE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::arbiter::testing::MakeScratchDir("process-e2e");
    ASSERT_FALSE(dir_.empty());
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/chat", 7).ok());
    // The child serves the same tiny model under the name the parent proxies.
    std::ofstream(dir_ + "/child.toml") << "[pressure]\nsource = \"none\"\n"
                                        << "[[models]]\nname = \"remote\"\npath = \"chat\"\n";
    models_ = "[[models]]\nname = \"chat\"\npath = \"chat\"\n"
              "[[models]]\nname = \"remote\"\ncommand = [\"" ARBITER_BINARY "\", \"serve\", "
              "\"--config\", \"" + dir_ + "/child.toml\", \"--port\", \"{port}\", "
              "\"--state-dir\", \"" + dir_ + "/child-state\"]\n"
              "ready_timeout_s = 60\nestimated_size = \"64MiB\"\n";
  }
  void TearDown() override {
    for (pid_t p : ProcessesWith(dir_ + "/child.toml")) kill(p, SIGKILL);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_, models_;
};

TEST_F(ProcessModelsE2E, ProxiedMeasuredStoppedAndRestartedAfterACrash) {
  Server s;
  s.Start(dir_, models_, "2GiB");
  const json chat = {{"model", "remote"}, {"max_tokens", 3},
                     {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  // First request: the child starts, becomes healthy, answers through the proxy.
  auto r = s.PostJson("/v1/chat/completions", chat);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body << s.log();
  EXPECT_EQ(json::parse(r->body)["model"], "remote");
  ASSERT_EQ(ProcessesWith(dir_ + "/child.toml").size(), 1u);
  // Streaming passes through.
  json stream = chat;
  stream["stream"] = true;
  auto st = s.PostJson("/v1/chat/completions", stream);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->status, 200);
  EXPECT_THAT(st->body, HasSubstr("data: [DONE]"));
  // Its RSS is measured and charged (kind model) within a few seconds.
  ASSERT_TRUE(WaitFor([&] { return s.Model("remote")["bytes"].get<uint64_t>() != (64u << 20); }, 10));
  const uint64_t bytes = s.Model("remote")["bytes"].get<uint64_t>();
  EXPECT_GT(bytes, 8u << 20);
  EXPECT_GE(s.Status()["charged_by_kind"]["model"].get<uint64_t>(), bytes);
  // Unload: the child is stopped.
  ASSERT_EQ(s.Client().Post("/admin/models/remote/unload", "", "application/json")->status, 200);
  EXPECT_TRUE(WaitFor([&] { return ProcessesWith(dir_ + "/child.toml").empty(); }, 10));
  // A crash: the watcher notices, the next request starts it again.
  ASSERT_EQ(s.PostJson("/v1/chat/completions", chat)->status, 200);
  const std::vector<pid_t> child = ProcessesWith(dir_ + "/child.toml");
  ASSERT_EQ(child.size(), 1u);
  kill(child[0], SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return !s.Model("remote")["resident"].get<bool>(); }, 10));
  auto again = s.PostJson("/v1/chat/completions", chat);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;
  auto m = s.Client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_THAT(m->body, HasSubstr("arbiter_process_model_crashes_total{model=\"remote\"} 1"));
  EXPECT_THAT(m->body, HasSubstr("arbiter_process_model_starts_total{model=\"remote\"} 3"));
  const json process = s.Model("remote")["process"];
  EXPECT_EQ(process["crashes"], 1) << process.dump();
  EXPECT_THAT(process["last_exit"].get<std::string>(), HasSubstr("signal 9"));
  // SIGKILL of arbiter itself: the child dies with it (PR_SET_PDEATHSIG).
  kill(s.pid(), SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return ProcessesWith(dir_ + "/child.toml").empty(); }, 10));
}

// A child that grows past what the budget allows, with nothing else to
// evict, is stopped and reported as over budget.
TEST_F(ProcessModelsE2E, AChildOverTheBudgetIsStopped) {
  std::string models = models_;
  models.replace(models.find("[[models]]\nname = \"chat\"\npath = \"chat\"\n"),
                 std::string("[[models]]\nname = \"chat\"\npath = \"chat\"\n").size(), "");
  models.replace(models.find("64MiB"), 5, "1MiB");
  Server s;
  s.Start(dir_, models, "12MiB");
  const json chat = {{"model", "remote"}, {"max_tokens", 2},
                     {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto r = s.PostJson("/v1/chat/completions", chat);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(WaitFor([&] { return ProcessesWith(dir_ + "/child.toml").empty(); }, 15));
  EXPECT_TRUE(WaitFor([&] { return !s.Model("remote")["resident"].get<bool>(); }, 5));
  EXPECT_EQ(s.Model("remote")["process"]["over_budget_stops"], 1);
  EXPECT_THAT(s.log(), HasSubstr("the budget cannot hold it"));
}

}  // namespace
}  // namespace arbiter
