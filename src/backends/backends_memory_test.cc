// Each backend loaded, used once and destroyed kCycles times: after the
// first cycle (which may leave one-time state: library globals, caches) the
// process's anonymous memory must not keep growing. Prints the footprint of
// one load (RssAnon and RssFile deltas), which the runtime charges to the
// memory budget. Run each test in its own process (ctest does) for the
// first-load figures to include the libraries' one-time state.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "arbiter/backends/pocketsphinx.h"
#include "arbiter/backends/tesseract_ocr.h"
#include "arbiter/backends/tts.h"
#include "backends/backends_test_util.h"

#include "base/testing/sanitizers.h"

namespace arbiter {
namespace {

using testing_util::StatusKib;

constexpr int kCycles = 5;
constexpr int64_t kMaxGrowthKib = 4 * 1024;

// `load_and_use` loads the backend, uses it, and returns a function that
// destroys it (so the test can measure in between).
void CheckCycles(const char* name, const std::function<std::function<void()>()>& load_and_use) {
#ifdef ARBITER_SANITIZED
  GTEST_SKIP() << "RSS is not meaningful under a sanitizer";
#endif
  int64_t after_first = 0, after_last = 0;
  int64_t anon_delta = 0, file_delta = 0;  // the last cycle's
  int64_t first_anon = 0, first_file = 0;  // the first load's, with one-time state
  for (int i = 0; i < kCycles; ++i) {
    const int64_t anon0 = StatusKib("RssAnon"), file0 = StatusKib("RssFile");
    std::function<void()> destroy = load_and_use();
    const int64_t anon1 = StatusKib("RssAnon"), file1 = StatusKib("RssFile");
    destroy();
    const int64_t anon2 = StatusKib("RssAnon");
    if (i == 0) after_first = anon2;
    after_last = anon2;
    anon_delta = anon1 - anon0;
    file_delta = file1 - file0;
    if (i == 0) {
      first_anon = anon_delta;
      first_file = file_delta;
    }
  }
  std::printf(
      "[memory] %-16s first load: RssAnon %+7.1f MiB, RssFile %+7.1f MiB; later loads: RssAnon "
      "%+7.1f MiB, "
      "RssFile %+7.1f MiB; growth over %d cycles after the first: %+.1f MiB\n",
      name, first_anon / 1024.0, first_file / 1024.0, anon_delta / 1024.0, file_delta / 1024.0,
      kCycles - 1, (after_last - after_first) / 1024.0);
  ::testing::Test::RecordProperty(std::string(name) + "_rss_anon_kib",
                                  static_cast<int>(anon_delta));
  ::testing::Test::RecordProperty(std::string(name) + "_rss_file_kib",
                                  static_cast<int>(file_delta));
  EXPECT_LE(after_last - after_first, kMaxGrowthKib) << name << " leaks across load/unload";
}

TEST(BackendsMemoryTest, PocketSphinxAsr) {
  std::vector<int16_t> silence(16000, 0);
  CheckCycles("pocketsphinx-asr", [&]() -> std::function<void()> {
    auto asr = PocketSphinxAsr::Load({});
    EXPECT_TRUE(asr.ok());
    if (!asr.ok()) return [] {};
    EXPECT_TRUE((*asr)->Transcribe(silence, nullptr).ok());
    auto* p = asr->release();
    return [p] { delete p; };
  });
}

TEST(BackendsMemoryTest, PocketSphinxVad) {
  std::vector<int16_t> silence(16000, 0);
  CheckCycles("pocketsphinx-vad", [&]() -> std::function<void()> {
    auto vad = PocketSphinxVad::Load({});
    EXPECT_TRUE(vad.ok());
    if (!vad.ok()) return [] {};
    EXPECT_TRUE((*vad)->Detect(silence, nullptr).ok());
    auto* p = vad->release();
    return [p] { delete p; };
  });
}

std::function<void()> LoadSpeakDestroy(Result<std::unique_ptr<TtsEngine>> tts) {
  EXPECT_TRUE(tts.ok()) << tts.status().ToString();
  if (!tts.ok()) return [] {};
  size_t n = 0;
  EXPECT_TRUE((*tts)
                  ->Synthesize(
                      "memory test", (*tts)->default_voice(), 1.0,
                      [&](std::span<const int16_t> s) {
                        n += s.size();
                        return true;
                      },
                      nullptr)
                  .ok());
  EXPECT_GT(n, 0u);
  auto* p = tts->release();
  return [p] { delete p; };
}

TEST(BackendsMemoryTest, Flite) {
  CheckCycles("flite", [] { return LoadSpeakDestroy(LoadFliteTts()); });
}

TEST(BackendsMemoryTest, EspeakNg) {
  CheckCycles("espeak-ng", [] { return LoadSpeakDestroy(LoadEspeakNgTts()); });
}

TEST(BackendsMemoryTest, Tesseract) {
  GrayImage blank{300, 100, std::vector<uint8_t>(300 * 100, 255), "png"};
  CheckCycles("tesseract-eng", [&]() -> std::function<void()> {
    auto ocr = TesseractOcr::Load({});
    EXPECT_TRUE(ocr.ok());
    if (!ocr.ok()) return [] {};
    EXPECT_TRUE((*ocr)->Recognize(blank, nullptr).ok());
    auto* p = ocr->release();
    return [p] { delete p; };
  });
}

}  // namespace
}  // namespace arbiter
