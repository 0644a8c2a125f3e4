#include "arbiter/backends/tts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "arbiter/formats/audio.h"

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
  {
    CancelSource mid;
    int chunks = 0;
    s = (*tts)->Synthesize(
        kFox, "slt", 1.0,
        [&](std::span<const int16_t>) {
          if (++chunks == 2) mid.Cancel();
          return true;
        },
        mid.token());
    EXPECT_EQ(s.code(), StatusCode::kCancelled);
    EXPECT_EQ(chunks, 2);
  }
  // Cancelled before it starts.
  CancelSource source;
  source.Cancel();
  s = (*tts)->Synthesize(
      kFox, "slt", 1.0, [&](std::span<const int16_t>) { return true; }, source.token());
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
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
