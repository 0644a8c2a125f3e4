#include "arbiter/formats/audio.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <ogg/ogg.h>
#include <sndfile.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "base/testing/sanitizers.h"

namespace arbiter {
namespace {

// A growable in-memory file for sf_open_virtual in write mode.
struct MemOut {
  std::string data;
  sf_count_t pos = 0;
};
sf_count_t OutLen(void* u) { return static_cast<sf_count_t>(static_cast<MemOut*>(u)->data.size()); }
sf_count_t OutSeek(sf_count_t off, int whence, void* u) {
  auto* m = static_cast<MemOut*>(u);
  sf_count_t base = whence == SEEK_SET   ? 0
                    : whence == SEEK_CUR ? m->pos
                                         : static_cast<sf_count_t>(m->data.size());
  m->pos = base + off;
  return m->pos;
}
sf_count_t OutRead(void* p, sf_count_t n, void* u) {
  auto* m = static_cast<MemOut*>(u);
  const auto size = static_cast<sf_count_t>(m->data.size());
  if (m->pos >= size) return 0;
  n = std::min(n, size - m->pos);
  std::memcpy(p, m->data.data() + m->pos, static_cast<size_t>(n));
  m->pos += n;
  return n;
}
sf_count_t OutWrite(const void* p, sf_count_t n, void* u) {
  auto* m = static_cast<MemOut*>(u);
  const size_t end = static_cast<size_t>(m->pos + n);
  if (m->data.size() < end) m->data.resize(end);
  std::memcpy(m->data.data() + m->pos, p, static_cast<size_t>(n));
  m->pos += n;
  return n;
}
sf_count_t OutTell(void* u) { return static_cast<MemOut*>(u)->pos; }

// `seconds` of a 440 Hz tone at `rate` Hz with `channels` channels, encoded as `format`.
std::vector<uint8_t> Encode(int format, int rate, int channels, double seconds) {
  MemOut out;
  SF_VIRTUAL_IO vio{OutLen, OutSeek, OutRead, OutWrite, OutTell};
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = channels;
  info.format = format;
  SNDFILE* f = sf_open_virtual(&vio, SFM_WRITE, &info, &out);
  EXPECT_NE(f, nullptr) << sf_strerror(nullptr);
  if (f == nullptr) return {};
  const auto frames = static_cast<sf_count_t>(seconds * rate);
  std::vector<float> buf(static_cast<size_t>(frames * channels));
  for (sf_count_t i = 0; i < frames; ++i) {
    for (int c = 0; c < channels; ++c) {
      buf[static_cast<size_t>(i * channels + c)] = 0.5f * std::sin(2 * M_PI * 440.0 * i / rate);
    }
  }
  EXPECT_EQ(sf_writef_float(f, buf.data(), frames), frames);
  sf_close(f);
  return std::vector<uint8_t>(out.data.begin(), out.data.end());
}

void ExpectSamples(const DecodedAudio& a, double seconds) {
  const double want = seconds * kAsrSampleRate;
  EXPECT_NEAR(static_cast<double>(a.samples.size()), want, want * 0.01);
}

TEST(DecodeAudioTest, WavStereo44kTo16kMono) {
  std::vector<uint8_t> wav = Encode(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 2, 2.0);
  Result<DecodedAudio> a = DecodeAudio(wav, AudioLimits{});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->format, "wav");
  EXPECT_EQ(a->source_rate, 44100);
  EXPECT_EQ(a->source_channels, 2);
  EXPECT_NEAR(a->seconds, 2.0, 1e-6);
  ExpectSamples(*a, 2.0);
  // The tone survives: its peak is near 0.5 full scale.
  int peak = 0;
  for (int16_t s : a->samples) peak = std::max(peak, std::abs(static_cast<int>(s)));
  EXPECT_NEAR(peak, 16384, 1200);
}

TEST(DecodeAudioTest, Flac48kMono) {
  std::vector<uint8_t> flac = Encode(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 48000, 1, 1.5);
  Result<DecodedAudio> a = DecodeAudio(flac, AudioLimits{});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->format, "flac");
  ExpectSamples(*a, 1.5);
}

TEST(DecodeAudioTest, OggVorbis22k) {
  std::vector<uint8_t> ogg = Encode(SF_FORMAT_OGG | SF_FORMAT_VORBIS, 22050, 1, 1.0);
  Result<DecodedAudio> a = DecodeAudio(ogg, AudioLimits{});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->format, "ogg");
  ExpectSamples(*a, 1.0);
}

TEST(DecodeAudioTest, Wav16kIsNotResampled) {
  std::vector<uint8_t> wav = Encode(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 1.0);
  Result<DecodedAudio> a = DecodeAudio(wav, AudioLimits{});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->samples.size(), 16000u);
}

TEST(DecodeAudioTest, RefusesEmptyGarbageTruncated) {
  Result<DecodedAudio> a = DecodeAudio({}, AudioLimits{});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.status().message(), "file is empty");

  std::vector<uint8_t> garbage(1000, 0x5a);
  a = DecodeAudio(garbage, AudioLimits{}, "audio");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      a.status().message().rfind("audio is not audio libsndfile can read (WAV, FLAC, OGG): ", 0),
      0u)
      << a.status().message();

  std::vector<uint8_t> wav = Encode(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 1.0);
  std::vector<uint8_t> header_only(wav.begin(), wav.begin() + 44);
  a = DecodeAudio(header_only, AudioLimits{});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> cut(wav.begin(), wav.begin() + 20);
  a = DecodeAudio(cut, AudioLimits{});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  // Truncated in the data: what is there decodes.
  std::vector<uint8_t> half(wav.begin(), wav.begin() + 44 + 16000);
  a = DecodeAudio(half, AudioLimits{});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->samples.size(), 8000u);
}

TEST(DecodeAudioTest, RefusesOverBytes) {
  std::vector<uint8_t> wav = Encode(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 1.0);
  AudioLimits limits;
  limits.max_bytes = 1000;
  Result<DecodedAudio> a = DecodeAudio(wav, limits);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(), "file is " + std::to_string(wav.size()) +
                                      " bytes; the limit is max_audio_bytes (1000)");
}

TEST(DecodeAudioTest, RefusesOverLongFromTheHeader) {
  AudioLimits limits;
  limits.max_seconds = 1;
  std::vector<uint8_t> wav = Encode(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 8000, 1, 2.0);
  Result<DecodedAudio> a = DecodeAudio(wav, limits);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(), "file is 2.0 s of audio; the limit is max_audio_seconds (1)");
}

// A hand-written WAV header claiming ~2 hours of 8 kHz 8-bit mono (the data
// size field says 57.6 MB) followed by 1000 bytes.
TEST(DecodeAudioTest, RefusesHeaderClaimingHours) {
  const uint32_t data_size = 57'600'000;
  std::vector<uint8_t> b;
  auto put = [&](const char* s) { b.insert(b.end(), s, s + 4); };
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  auto u16 = [&](uint16_t v) {
    b.push_back(static_cast<uint8_t>(v));
    b.push_back(static_cast<uint8_t>(v >> 8));
  };
  put("RIFF");
  u32(36 + data_size);
  put("WAVE");
  put("fmt ");
  u32(16);
  u16(1);
  u16(1);
  u32(8000);
  u32(8000);
  u16(1);
  u16(8);
  put("data");
  u32(data_size);
  b.resize(b.size() + 1000, 0x80);
  Result<DecodedAudio> a = DecodeAudio(b, AudioLimits{});
  // libsndfile either believes the header (refused for length) or clamps the
  // data to the file (0.125 s decodes); it never decodes hours.
  if (a.ok()) {
    EXPECT_LE(a->samples.size(), 2100u);
  } else {
    EXPECT_EQ(a.status().message(),
              "file is 7200.0 s of audio; the limit is max_audio_seconds (600)");
  }
}

// Note [Damaged audio] in audio.cc: a length the file cannot back is
// refused as damaged, never reported as centuries of audio nor decoded as a
// shorter recording.
void ExpectDamaged(const Result<DecodedAudio>& a, const std::string& why) {
  ASSERT_FALSE(a.ok()) << why;
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument) << why;
  EXPECT_EQ(a.status().message().rfind("file is damaged: ", 0), 0u)
      << why << ": " << a.status().message();
  EXPECT_EQ(a.status().message().find("max_audio_seconds"), std::string::npos) << why;
}

TEST(DecodeAudioTest, TruncatedOggIsDamaged) {
  // Cut before the last page: no final granule position, so libsndfile
  // cannot tell the length (it reports SF_COUNT_MAX frames).
  for (int format : {SF_FORMAT_OGG | SF_FORMAT_VORBIS, SF_FORMAT_OGG | SF_FORMAT_OPUS}) {
    const int rate = (format & SF_FORMAT_SUBMASK) == SF_FORMAT_OPUS ? 48000 : 16000;
    std::vector<uint8_t> ogg = Encode(format, rate, 1, 3.0);
    ASSERT_TRUE(DecodeAudio(ogg, AudioLimits{}).ok());
    for (double kept : {0.9, 0.5}) {
      std::vector<uint8_t> cut(ogg.begin(), ogg.begin() + static_cast<long>(ogg.size() * kept));
      // Cut early, libsndfile may not open it at all ("malformed"): damaged too.
      ExpectDamaged(DecodeAudio(cut, AudioLimits{}),
                    "format " + std::to_string(format) + " kept " + std::to_string(kept));
    }
  }
}

// Where the Vorbis header packets of a libsndfile Ogg Vorbis file end: the
// offset of the first byte after the page that completes the setup header.
size_t VorbisHeadersEnd(const std::vector<uint8_t>& ogg) {
  ogg_sync_state sync;
  ogg_sync_init(&sync);
  char* buffer = ogg_sync_buffer(&sync, static_cast<long>(ogg.size()));
  std::memcpy(buffer, ogg.data(), ogg.size());
  ogg_sync_wrote(&sync, static_cast<long>(ogg.size()));
  ogg_page page;
  size_t end = 0;
  int packets = 0;
  while (packets < 3 && ogg_sync_pageout(&sync, &page) == 1) {
    end += static_cast<size_t>(page.header_len + page.body_len);
    // Packets that end on this page: lacing values below 255.
    for (int i = 0; i < page.header[26]; ++i) packets += page.header[27 + i] < 255 ? 1 : 0;
  }
  ogg_sync_clear(&sync);
  return packets >= 3 ? end : 0;
}

// Note [Damaged audio]: an Ogg Vorbis file cut or corrupted anywhere in its
// headers is decoded or refused as damaged; never another error, and (under
// LeakSanitizer) never a leak. Cuts every 64 bytes through the header pages,
// and single bytes flipped through the setup header.
TEST(DecodeAudioTest, VorbisCutOrCorruptInItsHeadersIsDecodedOrDamaged) {
  std::vector<uint8_t> ogg = Encode(SF_FORMAT_OGG | SF_FORMAT_VORBIS, 16000, 1, 3.0);
  const size_t headers_end = VorbisHeadersEnd(ogg);
  ASSERT_GT(headers_end, 1000u);  // the setup header is a few KB
  ASSERT_LT(headers_end + 512, ogg.size());
  for (size_t n = 64; n <= headers_end + 256; n += 64) {
    std::vector<uint8_t> cut(ogg.begin(), ogg.begin() + static_cast<long>(n));
    // Past the headers, a cut before the last page leaves the length
    // unknown: damaged too.
    ExpectDamaged(DecodeAudio(cut, AudioLimits{}),
                  "cut at " + std::to_string(n) + " of " + std::to_string(ogg.size()));
  }
  // Cut inside the headers, the header check itself says so.
  std::vector<uint8_t> cut(ogg.begin(), ogg.begin() + static_cast<long>(headers_end / 2));
  Result<DecodedAudio> a = DecodeAudio(cut, AudioLimits{}, "audio");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(),
            "audio is damaged: it ends before its three Vorbis headers do (a file cut short?); "
            "send the whole file");

  // Flipped bytes: the page checksum catches most, so the flips are done on
  // a copy whose page CRCs are recomputed, letting libvorbis see the damage.
  int refused = 0;
  int decoded = 0;
  for (size_t at = 200; at < headers_end; at += 97) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0xff}}) {
      std::vector<uint8_t> bad = ogg;
      bad[at] ^= mask;
      // Re-checksum every page so the damage reaches libvorbis.
      size_t pos = 0;
      while (pos + 27 <= bad.size() && std::memcmp(bad.data() + pos, "OggS", 4) == 0) {
        const size_t segments = bad[pos + 26];
        if (pos + 27 + segments > bad.size()) break;
        size_t body = 0;
        for (size_t i = 0; i < segments; ++i) body += bad[pos + 27 + i];
        const size_t header_len = 27 + segments;
        if (pos + header_len + body > bad.size()) break;
        ogg_page page{bad.data() + pos, static_cast<long>(header_len), bad.data() + pos + header_len,
                      static_cast<long>(body)};
        ogg_page_checksum_set(&page);
        pos += header_len + body;
      }
      Result<DecodedAudio> r = DecodeAudio(bad, AudioLimits{});
      const std::string why = "byte " + std::to_string(at) + " ^ " + std::to_string(mask);
      if (r.ok()) {
        ++decoded;
        EXPECT_LE(r->seconds, 3.1) << why;
      } else {
        ++refused;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << why;
        const std::string m = r.status().message();
        EXPECT_TRUE(m.rfind("file is damaged: ", 0) == 0 ||
                    m.rfind("file is not audio libsndfile can read", 0) == 0)
            << why << ": " << m;
      }
    }
  }
  EXPECT_GT(refused, 0);
  std::printf("[vorbis] setup-header flips: %d refused, %d decoded\n", refused, decoded);
}

// RssAnon in KiB after returning freed heap to the OS; -1 when absent.
int64_t RssAnonKib() {
  malloc_trim(0);
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

// Note [Damaged audio]: a cut Ogg Vorbis upload costs nothing that stays.
// Without the header check, libsndfile's failed open lost ~5.7 KB of
// libvorbis codec setup each time: 2000 uploads would hold ~11 MiB.
// (Under a sanitizer LeakSanitizer checks this instead.)
TEST(DecodeAudioTest, CutVorbisHeadersDoNotLeak) {
  if (testing::kSanitized) GTEST_SKIP() << "RSS is not meaningful under a sanitizer";
  std::vector<uint8_t> ogg = Encode(SF_FORMAT_OGG | SF_FORMAT_VORBIS, 16000, 1, 3.0);
  const size_t headers_end = VorbisHeadersEnd(ogg);
  ASSERT_GT(headers_end, 1000u);
  std::vector<uint8_t> cut(ogg.begin(), ogg.begin() + static_cast<long>(headers_end / 2));
  ExpectDamaged(DecodeAudio(cut, AudioLimits{}), "warm-up");
  const int64_t before = RssAnonKib();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 2000; ++i) ASSERT_FALSE(DecodeAudio(cut, AudioLimits{}).ok());
  const int64_t growth = RssAnonKib() - before;
  std::printf("[memory] 2000 cut Ogg Vorbis decodes: RssAnon %+lld KiB\n",
              static_cast<long long>(growth));
  EXPECT_LT(growth, 2048);
}

TEST(DecodeAudioTest, TruncatedFlacIsDamaged) {
  // STREAMINFO still counts the whole recording; the decoder loses sync
  // where the bytes end.
  std::vector<uint8_t> flac = Encode(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 22050, 1, 3.0);
  std::vector<uint8_t> cut(flac.begin(), flac.begin() + static_cast<long>(flac.size() / 2));
  Result<DecodedAudio> a = DecodeAudio(cut, AudioLimits{});
  ExpectDamaged(a, "half a FLAC");
  if (!a.ok()) {
    EXPECT_NE(a.status().message().find("its header claims 3.0 s of audio but only "),
              std::string::npos)
        << a.status().message();
  }
}

TEST(DecodeAudioTest, HeaderDenserThanAnyCodecIsDamaged) {
  // STREAMINFO's 36-bit total-samples field set to its largest value
  // (~49 days at 16 kHz) in a file of a few KB: refused as damaged before
  // anything decodes, not as over max_audio_seconds.
  std::vector<uint8_t> flac = Encode(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, 0.5);
  ASSERT_GT(flac.size(), 26u);
  ASSERT_EQ(std::memcmp(flac.data(), "fLaC", 4), 0);
  // "fLaC", the 4-byte block header, then STREAMINFO: the total is the low
  // 36 bits of the 8 bytes at offset 18.
  flac[21] |= 0x0F;
  for (size_t i = 22; i < 26; ++i) flac[i] = 0xFF;
  Result<DecodedAudio> a = DecodeAudio(flac, AudioLimits{});
  ExpectDamaged(a, "STREAMINFO claiming 2^36 frames");
  if (!a.ok()) {
    EXPECT_NE(a.status().message().find("bytes can hold"), std::string::npos)
        << a.status().message();
  }
}

TEST(DecodeAudioTest, WavCutInTheDataIsNotDamaged) {
  // libsndfile clamps a WAV's data size to the file: the header never claims
  // more than is there, and what is there decodes.
  std::vector<uint8_t> wav = Encode(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 22050, 1, 3.0);
  std::vector<uint8_t> cut(wav.begin(), wav.begin() + static_cast<long>(wav.size() / 2));
  Result<DecodedAudio> a = DecodeAudio(cut, AudioLimits{});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_NEAR(a->seconds, 1.5, 0.01);
}

TEST(ResampleMonoTest, LengthsAndIdentity) {
  std::vector<int16_t> in(22050, 1000);
  EXPECT_NEAR(static_cast<double>(ResampleMono(in, 22050, 16000).size()), 16000, 16);
  EXPECT_NEAR(static_cast<double>(ResampleMono(in, 22050, 44100).size()), 44100, 44);
  EXPECT_EQ(ResampleMono(in, 16000, 16000), in);
  EXPECT_TRUE(ResampleMono(in, 0, 16000).empty());
  EXPECT_TRUE(ResampleMono({}, 8000, 16000).empty());
}

}  // namespace
}  // namespace arbiter
