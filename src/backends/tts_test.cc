#include "arbiter/backends/tts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/formats/audio.h"
#include "backends/backends_test_util.h"
#include "base/testing/sanitizers.h"

namespace arbiter {
namespace {

constexpr char kFox[] = "the quick brown fox jumps over the lazy dog";

struct Collected {
  std::vector<int16_t> pcm;
  int chunks = 0;
};

Status SynthesizeAll(TtsEngine& tts, const std::string& text, const std::string& voice,
                     Collected& out, double speed = 1.0) {
  return tts.Synthesize(
      text, voice, speed,
      [&](std::span<const int16_t> chunk) {
        out.pcm.insert(out.pcm.end(), chunk.begin(), chunk.end());
        ++out.chunks;
        return true;
      },
      nullptr);
}

// Synthesizes `text`, cancelling from the sink's thread in its `at_chunk`th
// callback (every callback asks for more): returns the status, with the
// number of callbacks in `*chunks`.
Status SynthesizeCancellingAt(TtsEngine& tts, const std::string& text, const std::string& voice,
                              int at_chunk, int* chunks) {
  CancelSource source;
  *chunks = 0;
  return tts.Synthesize(
      text, voice, 1.0,
      [&](std::span<const int16_t>) {
        if (++*chunks == at_chunk) source.Cancel();
        return true;
      },
      source.token());
}

TEST(FliteTtsTest, SltSpeaksTheFox) {
  Result<std::unique_ptr<TtsEngine>> tts = LoadFliteTts();
  ASSERT_TRUE(tts.ok()) << tts.status().ToString();
  EXPECT_EQ((*tts)->engine_name(), "flite");
  EXPECT_EQ((*tts)->voices(), (std::vector<std::string>{"slt", "kal", "awb", "rms"}));
  EXPECT_EQ((*tts)->default_voice(), "slt");
  EXPECT_TRUE((*tts)->files().empty());
  const int rate = (*tts)->sample_rate("slt");
  EXPECT_GE(rate, 8000);
  EXPECT_EQ((*tts)->sample_rate("nobody"), 0);
  Collected c;
  Status s = SynthesizeAll(**tts, kFox, "slt", c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(c.chunks, 1);  // streamed as synthesized, not as one buffer at the end
  RecordProperty("slt_rate_hz", rate);
  RecordProperty("slt_chunks", c.chunks);
  const double seconds = static_cast<double>(c.pcm.size()) / rate;
  EXPECT_GT(seconds, 1.0);
  EXPECT_LT(seconds, 10.0);
  int peak = 0;
  for (int16_t v : c.pcm) peak = std::max(peak, std::abs(static_cast<int>(v)));
  EXPECT_GT(peak, 1000);

  // Slower speech is longer.
  Collected slow;
  ASSERT_TRUE(SynthesizeAll(**tts, kFox, "slt", slow, 0.5).ok());
  EXPECT_GT(slow.pcm.size(), c.pcm.size() * 3 / 2);
}

TEST(FliteTtsTest, EveryVoiceSpeaks) {
  Result<std::unique_ptr<TtsEngine>> tts = LoadFliteTts();
  ASSERT_TRUE(tts.ok());
  for (const std::string& v : (*tts)->voices()) {
    Collected c;
    ASSERT_TRUE(SynthesizeAll(**tts, "hello world", v, c).ok()) << v;
    EXPECT_GT(c.pcm.size(), static_cast<size_t>((*tts)->sample_rate(v) / 4)) << v;
  }
}

TEST(FliteTtsTest, TwoEnginesShareTheVoices) {
  Result<std::unique_ptr<TtsEngine>> a = LoadFliteTts();
  Result<std::unique_ptr<TtsEngine>> b = LoadFliteTts();
  ASSERT_TRUE(a.ok() && b.ok());
  a->reset();
  Collected c;
  ASSERT_TRUE(SynthesizeAll(**b, "still here", "kal", c).ok());
  EXPECT_FALSE(c.pcm.empty());
}

TEST(FliteTtsTest, Errors) {
  Result<std::unique_ptr<TtsEngine>> tts = LoadFliteTts();
  ASSERT_TRUE(tts.ok());
  Collected c;
  Status s = SynthesizeAll(**tts, "hi", "bob", c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "voice \"bob\" is not one of this model's voices: slt, kal, awb, rms");
  EXPECT_EQ(SynthesizeAll(**tts, "", "slt", c).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SynthesizeAll(**tts, "hi", "slt", c, 5.0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SynthesizeAll(**tts, "hi", "slt", c, 0.1).code(), StatusCode::kInvalidArgument);

  // The sink stops it.
  int calls = 0;
  s = (*tts)->Synthesize(
      kFox, "slt", 1.0,
      [&](std::span<const int16_t>) {
        ++calls;
        return false;
      },
      nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
  EXPECT_EQ(calls, 1);
  // Cancelled from the sink's thread mid-stream: seen in the next callback.
  int chunks = 0;
  s = SynthesizeCancellingAt(**tts, kFox, "slt", 2, &chunks);
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
  EXPECT_EQ(chunks, 2);
  // Cancelled before it starts.
  CancelSource source;
  source.Cancel();
  s = (*tts)->Synthesize(
      kFox, "slt", 1.0, [&](std::span<const int16_t>) { return true; }, source.token());
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
}

// ---- Note [Speech in pieces] ------------------------------------------------

// The non-space bytes of `s`, in order.
std::string Ink(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != ' ' && c != '\n' && c != '\t' && c != '\r') out += c;
  }
  return out;
}

std::string Joined(const std::vector<std::string_view>& pieces) {
  std::string out;
  for (std::string_view p : pieces) out += std::string(p) + "|";
  return out;
}

TEST(SplitSpeechTextTest, SentencesAreThePieces) {
  const std::string a = "The first sentence is long enough to stand alone.";
  const std::string b = "So is the second one, which asks a question?";
  const std::string c = "And the third \"quotes\" and exclaims!\"";
  const std::string text = "  " + a + " " + b + "\n" + c + "  ";
  EXPECT_EQ(Joined(SplitSpeechText(text)), a + "|" + b + "|" + c + "|");
  // Abbreviations (under 32 bytes in) and short sentences stay with what
  // follows.
  EXPECT_EQ(Joined(SplitSpeechText("Dr. Smith met Mr. Jones, e.g. at 3.14 pm. Then they left.")),
            "Dr. Smith met Mr. Jones, e.g. at 3.14 pm.|Then they left.|");
  EXPECT_EQ(Joined(SplitSpeechText("Yes. No. Maybe so. I do not know, really. Fine.")),
            "Yes. No. Maybe so. I do not know, really.|Fine.|");
  // A blank line ends a paragraph, however short.
  EXPECT_EQ(Joined(SplitSpeechText("Title\n\n  \nBody text")), "Title|Body text|");
  // CJK full stops need no space after them.
  const std::string ja1 = "\u4eca\u65e5\u306f\u3068\u3066\u3082\u3044\u3044\u5929\u6c17\u3067\u3059"
                          "\u306d\u3002";  // 14 characters, 42 bytes
  const std::string ja2 = "\u660e\u65e5\u3082\u6674\u308c\u308b\u3068\u3044\u3044\u3067\u3059\u306d"
                          "\u3002";
  EXPECT_EQ(Joined(SplitSpeechText(ja1 + ja2)), ja1 + "|" + ja2 + "|");
  EXPECT_TRUE(SplitSpeechText("").empty());
  EXPECT_TRUE(SplitSpeechText(" \n\t ").empty());
  EXPECT_EQ(Joined(SplitSpeechText("hi")), "hi|");
}

TEST(SplitSpeechTextTest, LongRunsAreCutAtSpacesThenAtCharacterBoundaries) {
  std::string words;
  for (int i = 0; i < 300; ++i) words += "word" + std::to_string(i) + " ";
  const std::vector<std::string_view> pieces = SplitSpeechText(words, 100);
  ASSERT_GT(pieces.size(), 10u);
  for (std::string_view p : pieces) {
    EXPECT_LE(p.size(), 100u);
    EXPECT_NE(p.back(), ' ');
    EXPECT_EQ(p.substr(0, 4), "word") << p;  // cut between words, never inside one
  }
  std::string ink;
  for (std::string_view p : pieces) ink += Ink(p);
  EXPECT_EQ(ink, Ink(words));
  // One 2,000-byte word of two-byte characters: cut at character boundaries.
  std::string e;
  for (int i = 0; i < 1000; ++i) e += "\u00e9";
  const std::vector<std::string_view> cut = SplitSpeechText(e, 101);
  ASSERT_EQ(cut.size(), 20u);
  for (std::string_view p : cut) {
    EXPECT_EQ(p.size(), 100u);
    EXPECT_NE(static_cast<unsigned char>(p.front()) & 0xC0, 0x80);
  }
}

// Random texts (fixed seed): every piece is non-empty, trimmed and within
// the maximum, and the pieces hold every non-space byte of the text, in order.
TEST(SplitSpeechTextTest, PiecesKeepEveryCharacterInOrder) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"a",  "bc", "def", "Dr.", ".",  "!",  "?", ";",
                                          " ",  " ",  "  ", "\n", "\n\n", "\"", ")", "\u00e9",
                                          "\u3002", "x.y", "toolongwordtoolongword"};
  for (int round = 0; round < 500; ++round) {
    std::string text;
    const int n = std::uniform_int_distribution<int>(0, 400)(rng);
    for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    const size_t max = std::uniform_int_distribution<size_t>(4, 120)(rng);
    const std::vector<std::string_view> pieces = SplitSpeechText(text, max);
    std::string ink;
    for (std::string_view p : pieces) {
      ASSERT_FALSE(p.empty());
      ASSERT_LE(p.size(), max) << text;
      ASSERT_NE(p.front(), ' ');
      ASSERT_NE(p.back(), ' ');
      ASSERT_GE(p.data(), text.data());
      ASSERT_LE(p.data() + p.size(), text.data() + text.size());
      ink += Ink(p);
    }
    ASSERT_EQ(ink, Ink(text)) << "round " << round;
  }
}

TEST(SplitSpeechTextTest, CountCodePoints) {
  EXPECT_EQ(CountCodePoints(""), 0u);
  EXPECT_EQ(CountCodePoints("naive"), 5u);
  EXPECT_EQ(CountCodePoints("na\u00efve"), 5u);              // 6 bytes
  EXPECT_EQ(CountCodePoints("\u4eca\u65e5\U0001F600"), 3u);  // 3 + 3 + 4 bytes
  // Stops counting one past the limit.
  EXPECT_EQ(CountCodePoints(std::string(1000000, 'a'), 4096), 4097u);
  EXPECT_EQ(CountCodePoints(std::string(4096, 'a'), 4096), 4096u);
}

// A text of `n` sentences, ~70 bytes each.
std::string Sentences(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += "Sentence number " + std::to_string(i) + " tells of the quick brown fox and the lazy dog. ";
  }
  return s;
}

// Note [Speech in pieces]: the work is cut into utterances, so a
// cancellation stops it within one piece, and what a synthesis holds does
// not grow with its text.
TEST(FliteTtsTest, LongInputIsSynthesizedPieceByPieceAndStopsWithinOne) {
  Result<std::unique_ptr<TtsEngine>> tts = LoadFliteTts();
  ASSERT_TRUE(tts.ok());
  const std::string text = Sentences(60);  // ~4,200 bytes
  const size_t n_pieces = SplitSpeechText(text).size();
  ASSERT_GE(n_pieces, 30u);
  // Cancelled as the first audio comes out: no later piece is begun.
  CancelSource source;
  size_t samples = 0;
  int calls = 0;
  Status s = (*tts)->Synthesize(
      text, "slt", 1.0,
      [&](std::span<const int16_t> pcm) {
        samples += pcm.size();
        ++calls;
        source.Cancel();
        return true;
      },
      source.token());
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
  EXPECT_EQ(calls, 1);
  // Everything heard came from the first piece.
  Collected whole_first;
  ASSERT_TRUE(SynthesizeAll(**tts, std::string(SplitSpeechText(text)[0]), "slt", whole_first).ok());
  EXPECT_LE(samples, whole_first.pcm.size());
}

// What one synthesis holds is one piece's work: RssAnon grows by no more
// while 60 sentences are spoken than while 3 are (plus slack for heap
// growth), where one utterance of the whole text held ~20× more.
TEST(FliteTtsTest, MemoryDoesNotGrowWithTheInput) {
  if (testing::kSanitized) GTEST_SKIP() << "RSS is not meaningful under a sanitizer";
  Result<std::unique_ptr<TtsEngine>> tts = LoadFliteTts();
  ASSERT_TRUE(tts.ok());
  // RssAnon now, without trimming the heap first (StatusKib trims).
  auto rss_anon_kib = [] {
    std::ifstream in("/proc/self/status");
    std::string key;
    int64_t kib = 0;
    while (in >> key) {
      if (key == "RssAnon:" && (in >> kib)) return kib;
    }
    return int64_t{-1};
  };
  auto peak_growth_kib = [&](const std::string& text) {
    const int64_t base = testing_util::StatusKib("RssAnon");  // trimmed
    int64_t peak = base;
    size_t samples = 0;
    Status s = (*tts)->Synthesize(
        text, "slt", 1.0,
        [&](std::span<const int16_t> pcm) {
          samples += pcm.size();
          peak = std::max(peak, rss_anon_kib());
          return true;
        },
        nullptr);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_GT(samples, 0u);
    return peak - base;
  };
  (void)peak_growth_kib(Sentences(3));  // one-time state
  const int64_t small = peak_growth_kib(Sentences(3));
  const int64_t large = peak_growth_kib(Sentences(60));
  std::printf("[memory] flite peak RssAnon growth: 3 sentences %+.1f MiB, 60 sentences %+.1f MiB\n",
              small / 1024.0, large / 1024.0);
  EXPECT_LE(large, small + 8 * 1024);
}

TEST(EspeakNgTtsTest, SpeaksAndIsSingleInstance) {
  Result<std::unique_ptr<TtsEngine>> tts = LoadEspeakNgTts();
  ASSERT_TRUE(tts.ok()) << tts.status().ToString();
  EXPECT_EQ((*tts)->engine_name(), "espeak-ng");
  std::vector<std::string> voices = (*tts)->voices();
  EXPECT_NE(std::find(voices.begin(), voices.end(), "en-us"), voices.end());
  EXPECT_NE(std::find(voices.begin(), voices.end(), "de"), voices.end());
  EXPECT_EQ((*tts)->default_voice(), "en-us");
  EXPECT_FALSE((*tts)->files().empty());
  const int rate = (*tts)->sample_rate("en-us");
  EXPECT_GT(rate, 8000);

  Collected c;
  Status s = SynthesizeAll(**tts, kFox, "en-us", c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(c.chunks, 1);
  EXPECT_GT(static_cast<double>(c.pcm.size()) / rate, 1.0);
  Collected de;
  ASSERT_TRUE(SynthesizeAll(**tts, "Guten Tag", "de", de).ok());
  EXPECT_FALSE(de.pcm.empty());
  Collected fast;
  ASSERT_TRUE(SynthesizeAll(**tts, kFox, "en-us", fast, 2.0).ok());
  EXPECT_LT(fast.pcm.size(), c.pcm.size() * 3 / 4);

  s = SynthesizeAll(**tts, "hi", "xx-nope", c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("voice \"xx-nope\" is not one of this model's voices: ", 0), 0u);

  int calls = 0;
  s = (*tts)->Synthesize(
      kFox, "en-us", 1.0,
      [&](std::span<const int16_t>) {
        ++calls;
        return false;
      },
      nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
  EXPECT_EQ(calls, 1);

  Result<std::unique_ptr<TtsEngine>> second = LoadEspeakNgTts();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(), "only one espeak-ng model can be loaded at a time");

  // After the first goes, a new one loads and speaks.
  tts->reset();
  Result<std::unique_ptr<TtsEngine>> again = LoadEspeakNgTts();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  Collected c2;
  ASSERT_TRUE(SynthesizeAll(**again, "again", "en-us", c2).ok());
  EXPECT_FALSE(c2.pcm.empty());
}

// eSpeak NG works clause by clause and calls back every kBufferMs: a long
// input cancelled after two buffers stops there.
TEST(EspeakNgTtsTest, LongInputStopsWithinABufferOfTheCancellation) {
  Result<std::unique_ptr<TtsEngine>> tts = LoadEspeakNgTts();
  ASSERT_TRUE(tts.ok()) << tts.status().ToString();
  int chunks = 0;
  Status s = SynthesizeCancellingAt(**tts, Sentences(60), "en-us", 2, &chunks);
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
  EXPECT_EQ(chunks, 2);
}

TEST(EspeakNgTtsTest, MissingDataDir) {
  Result<std::unique_ptr<TtsEngine>> tts = LoadEspeakNgTts("/nonexistent/espeak-ng-data");
  ASSERT_FALSE(tts.ok());
  EXPECT_EQ(tts.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tts.status().message().find("/nonexistent/espeak-ng-data"), std::string::npos);
}

TEST(AudioFormatTest, ParseNamesMimes) {
  EXPECT_EQ(*ParseAudioFormat("mp3"), AudioFormat::kMp3);
  EXPECT_EQ(*ParseAudioFormat("wav"), AudioFormat::kWav);
  EXPECT_EQ(*ParseAudioFormat("pcm"), AudioFormat::kPcm);
  Result<AudioFormat> bad = ParseAudioFormat("opus");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "response_format \"opus\" is not one of mp3, wav, pcm");
  EXPECT_EQ(AudioFormatName(AudioFormat::kWav), "wav");
  EXPECT_EQ(AudioFormatMime(AudioFormat::kMp3), "audio/mpeg");
  EXPECT_EQ(AudioFormatMime(AudioFormat::kWav), "audio/wav");
  EXPECT_EQ(AudioFormatMime(AudioFormat::kPcm), "audio/pcm");
}

std::vector<int16_t> Tone(size_t n) {
  std::vector<int16_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<int16_t>(8000 * std::sin(0.05 * static_cast<double>(i)));
  return v;
}

TEST(AudioEncoderTest, WavReadsBack) {
  Result<std::unique_ptr<AudioEncoder>> enc = AudioEncoder::Create(AudioFormat::kWav, 16000);
  ASSERT_TRUE(enc.ok());
  std::vector<int16_t> pcm = Tone(12345);
  std::string out;
  for (size_t off = 0; off < pcm.size(); off += 1000) {
    Result<std::string> r =
        (*enc)->Encode(std::span(pcm).subspan(off, std::min<size_t>(1000, pcm.size() - off)));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->empty());  // WAV is emitted by Finish
  }
  Result<std::string> fin = (*enc)->Finish();
  ASSERT_TRUE(fin.ok());
  out = *fin;
  ASSERT_EQ(out.size(), 44 + 2 * pcm.size());
  EXPECT_EQ(out.substr(0, 4), "RIFF");
  EXPECT_EQ(out.substr(8, 4), "WAVE");
  Result<DecodedAudio> back = DecodeAudio(
      std::span(reinterpret_cast<const uint8_t*>(out.data()), out.size()), AudioLimits{});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->format, "wav");
  EXPECT_EQ(back->source_rate, 16000);
  EXPECT_EQ(back->samples, pcm);
  EXPECT_EQ((*enc)->Finish().status().code(), StatusCode::kFailedPrecondition);
}

TEST(AudioEncoderTest, PcmIsLittleEndianInt16) {
  Result<std::unique_ptr<AudioEncoder>> enc = AudioEncoder::Create(AudioFormat::kPcm, 22050);
  ASSERT_TRUE(enc.ok());
  std::vector<int16_t> pcm = {1, -2, 0x1234};
  Result<std::string> r = (*enc)->Encode(pcm);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::string("\x01\x00\xfe\xff\x34\x12", 6));
  EXPECT_TRUE((*enc)->Finish()->empty());
  Result<std::unique_ptr<AudioEncoder>> enc2 = AudioEncoder::Create(AudioFormat::kPcm, 22050);
  std::vector<int16_t> tone = Tone(5000);
  EXPECT_EQ((*enc2)->Encode(tone)->size(), 2 * tone.size());
}

TEST(AudioEncoderTest, Mp3HasFrames) {
  for (int rate : {16000, 22050, 44100}) {
    Result<std::unique_ptr<AudioEncoder>> enc = AudioEncoder::Create(AudioFormat::kMp3, rate);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    std::vector<int16_t> pcm = Tone(static_cast<size_t>(rate));  // 1 s
    std::string out;
    for (size_t off = 0; off < pcm.size(); off += 4000) {
      Result<std::string> r =
          (*enc)->Encode(std::span(pcm).subspan(off, std::min<size_t>(4000, pcm.size() - off)));
      ASSERT_TRUE(r.ok());
      out += *r;
    }
    Result<std::string> fin = (*enc)->Finish();
    ASSERT_TRUE(fin.ok());
    out += *fin;
    ASSERT_GT(out.size(), 1000u) << rate;  // ~8 KB at 64 kbps
    EXPECT_LT(out.size(), 16000u) << rate;
    const bool id3 = out.substr(0, 3) == "ID3";
    const bool sync =
        static_cast<uint8_t>(out[0]) == 0xFF && (static_cast<uint8_t>(out[1]) & 0xE0) == 0xE0;
    EXPECT_TRUE(id3 || sync) << rate;
  }
  EXPECT_EQ(AudioEncoder::Create(AudioFormat::kMp3, 96000).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace arbiter
