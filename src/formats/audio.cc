// The audio front door (arbiter/formats/audio.h).
//
// libsndfile reads the upload through SF_VIRTUAL_IO over the request body
// (a MemoryFile: offset into a span; reads are clamped to its end, writes
// refused). The header gives frames, rate and channels; the duration check
// happens there, before any sample is decoded. Samples are then read in
// blocks of kBlockFrames frames as float, downmixed to mono (the mean of the
// channels) and pushed through one libsamplerate state in streaming mode, so
// memory stays at the output plus one block whatever the source rate or
// channel count. The read loop also stops at the duration limit, for headers
// that claim fewer frames than the file holds.
//
// A header that claims more frames than the file holds marks the file as
// damaged (Note [Damaged audio]); what it does decode is not passed on as if
// it were the recording.
//
// Note [Damaged audio]
// libsndfile reports the length it reads from the header, and for a cut-off
// file that length is wrong in two ways: an OGG (Vorbis or Opus) stream whose
// last page is missing has no final granule position, so its length is
// unknown and libsndfile reports SF_COUNT_MAX frames (16 kHz: 576460752303423.5
// s); a cut FLAC keeps the STREAMINFO total of the whole file and decodes
// until the decoder loses sync. (WAV/AIFF data sizes are clamped to the file
// by libsndfile itself.) So the audio is refused as damaged (400) when
//   1. the length is unknown (SF_COUNT_MAX);
//   2. the header claims more than kMaxFramesPerByte frames per byte of the
//      file — no codec libsndfile reads packs sound that densely (silence in
//      FLAC is ~350 frames per byte, in Vorbis and Opus fewer);
//   3. decoding ends more than max(kBlockFrames, 1 %) frames short of the
//      header's count (the slack is for codecs whose count is an estimate).
// Before any of that, an Ogg file (it starts with "OggS") whose first logical
// stream is Vorbis has its three header packets checked (VorbisHeaderCheck);
// if one is missing or refused, the file is damaged and libsndfile never sees
// it. The reason is a leak, not the message: when libsndfile 1.2.0 fails in
// the middle of reading Vorbis headers it returns without vorbis_info_clear,
// and the codec setup libvorbis 1.3.7 allocated in vorbis_info_init (~5.7 KB)
// is lost — per request, so a client repeating a cut upload would grow the
// server without bound. The check walks the pages the way libsndfile does
// (the first page holds the identification header alone, the next two
// packets come from later pages of the same serial number, a hole or an
// end-of-stream page before them is fatal), so whatever it lets through
// gets past libsndfile's header reader, whose later failures free what it
// allocated. It is stricter than libsndfile in one way: the comment and setup
// headers must be accepted by libvorbis too (libsndfile ignores that answer
// and fails later on the zero channels it leaves).
#include "arbiter/formats/audio.h"

#include <ogg/ogg.h>
#include <samplerate.h>
#include <sndfile.h>
#include <vorbis/codec.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

namespace arbiter {
namespace {

constexpr sf_count_t kBlockFrames = 4096;
// Note [Damaged audio], rule 2.
constexpr double kMaxFramesPerByte = 16384;
// More channels than any real recording; bounds the block buffer.
constexpr int kMaxChannels = 64;
// Rates libsamplerate converts within its ratio bounds (1/256 .. 256) of 16 kHz.
constexpr int kMinRate = 1000;
constexpr int kMaxRate = 768000;

struct MemoryFile {
  std::span<const uint8_t> bytes;
  sf_count_t offset = 0;
};

sf_count_t MemLength(void* user) {
  return static_cast<sf_count_t>(static_cast<MemoryFile*>(user)->bytes.size());
}
sf_count_t MemSeek(sf_count_t offset, int whence, void* user) {
  auto* f = static_cast<MemoryFile*>(user);
  const auto size = static_cast<sf_count_t>(f->bytes.size());
  sf_count_t base = 0;
  switch (whence) {
    case SEEK_SET:
      base = 0;
      break;
    case SEEK_CUR:
      base = f->offset;
      break;
    case SEEK_END:
      base = size;
      break;
    default:
      return -1;
  }
  // Offsets can be anything a hostile header says: refuse overflow and
  // negative positions; positions past the end read as EOF.
  if ((offset > 0 && base > INT64_MAX - offset) || base + offset < 0) return -1;
  f->offset = base + offset;
  return f->offset;
}
sf_count_t MemRead(void* ptr, sf_count_t count, void* user) {
  auto* f = static_cast<MemoryFile*>(user);
  const auto size = static_cast<sf_count_t>(f->bytes.size());
  if (count <= 0 || f->offset >= size) return 0;
  const sf_count_t n = std::min(count, size - f->offset);
  std::memcpy(ptr, f->bytes.data() + f->offset, static_cast<size_t>(n));
  f->offset += n;
  return n;
}
sf_count_t MemWrite(const void*, sf_count_t, void*) { return 0; }
sf_count_t MemTell(void* user) { return static_cast<MemoryFile*>(user)->offset; }

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};
struct SrcDeleter {
  void operator()(SRC_STATE* s) const { src_delete(s); }
};

std::string FormatName(const SF_INFO& info) {
  switch (info.format & SF_FORMAT_TYPEMASK) {
    case SF_FORMAT_WAV:
    case SF_FORMAT_WAVEX:
    case SF_FORMAT_RF64:
      return "wav";
    case SF_FORMAT_FLAC:
      return "flac";
    case SF_FORMAT_OGG:
      return "ogg";
    case SF_FORMAT_AIFF:
      return "aiff";
    case SF_FORMAT_AU:
      return "au";
    case SF_FORMAT_CAF:
      return "caf";
    case SF_FORMAT_W64:
      return "w64";
#ifdef SF_FORMAT_MPEG
    case SF_FORMAT_MPEG:
      return "mp3";
#endif
    default:
      break;
  }
  SF_FORMAT_INFO fi{};
  fi.format = info.format & SF_FORMAT_TYPEMASK;
  if (sf_command(nullptr, SFC_GET_FORMAT_MAJOR, &fi, sizeof(fi)) == 0 && fi.extension != nullptr) {
    std::string ext = fi.extension;
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return ext;
  }
  return "unknown";
}

int16_t ToInt16(float v) {
  const float scaled = std::nearbyint(v * 32767.0f);
  return static_cast<int16_t>(std::clamp(scaled, -32768.0f, 32767.0f));
}

// Mono float → int16 at another rate, fed block by block. `to_rate` ≠
// `from_rate`, both within [kMinRate, kMaxRate].
class StreamingResampler {
 public:
  static std::unique_ptr<StreamingResampler> Create(int from_rate, int to_rate) {
    int err = 0;
    SRC_STATE* s = src_new(SRC_SINC_FASTEST, 1, &err);
    if (s == nullptr) return nullptr;
    return std::unique_ptr<StreamingResampler>(
        new StreamingResampler(s, static_cast<double>(to_rate) / from_rate));
  }

  // Appends the converted samples of `in` ([n] mono) to `out`.
  bool Push(const float* in, long n, bool last, std::vector<int16_t>& out) {
    SRC_DATA d{};
    d.src_ratio = ratio_;
    d.end_of_input = last ? 1 : 0;
    const float* cur = in;
    long left = n;
    while (true) {
      d.data_in = cur;
      d.input_frames = left;
      d.data_out = buf_.data();
      d.output_frames = static_cast<long>(buf_.size());
      if (src_process(state_.get(), &d) != 0) return false;
      for (long i = 0; i < d.output_frames_gen; ++i) out.push_back(ToInt16(buf_[i]));
      cur += d.input_frames_used;
      left -= d.input_frames_used;
      // Done with this block when all input is consumed and, at the end of
      // input, the converter has nothing more to give.
      if (left == 0 && (!last || d.output_frames_gen == 0)) return true;
      if (d.input_frames_used == 0 && d.output_frames_gen == 0 && !last) return true;
    }
  }

 private:
  StreamingResampler(SRC_STATE* s, double ratio) : state_(s), ratio_(ratio), buf_(8192) {}
  std::unique_ptr<SRC_STATE, SrcDeleter> state_;
  double ratio_;
  std::vector<float> buf_;
};

// Note [Damaged audio]: the Vorbis headers of an Ogg file, read with libogg
// and libvorbis, everything they allocate freed on every path.
// Thread-compatible; one check per object.
class VorbisHeaderCheck {
 public:
  // `bytes` must outlive the object.
  explicit VorbisHeaderCheck(std::span<const uint8_t> bytes) : bytes_(bytes) {
    ogg_sync_init(&sync_);
    vorbis_info_init(&info_);
    vorbis_comment_init(&comment_);
  }
  ~VorbisHeaderCheck() {
    vorbis_comment_clear(&comment_);
    vorbis_info_clear(&info_);
    if (stream_open_) ogg_stream_clear(&stream_);
    ogg_sync_clear(&sync_);
  }
  VorbisHeaderCheck(const VorbisHeaderCheck&) = delete;
  VorbisHeaderCheck& operator=(const VorbisHeaderCheck&) = delete;

  // What is wrong with the Vorbis headers ("" when they are good, or when
  // the first logical stream is not Vorbis: that is libsndfile's to judge).
  std::string Problem() {
    ogg_page page;
    if (!NextPage(&page)) return "";  // no Ogg page at all: libsndfile refuses it
    // libsndfile picks the codec by the first page's body; the first packet
    // is asked too, for a page whose body does not start with it.
    const bool vorbis_page = StartsVorbis(page.body, page.body_len);
    ogg_stream_init(&stream_, ogg_page_serialno(&page));
    stream_open_ = true;
    ogg_packet packet;
    const bool paged_in = ogg_stream_pagein(&stream_, &page) == 0;
    const bool have_first = paged_in && ogg_stream_packetout(&stream_, &packet) == 1;
    if (!vorbis_page && !(have_first && StartsVorbis(packet.packet, packet.bytes))) return "";
    if (!have_first || !ogg_page_bos(&page) || !packet.b_o_s) {
      return "its first Ogg page does not hold the start of a Vorbis stream";
    }
    if (vorbis_synthesis_headerin(&info_, &comment_, &packet) != 0) {
      return "libvorbis refuses its Vorbis identification header";
    }
    if (ogg_stream_packetpeek(&stream_, nullptr) != 0) {
      return "its first Ogg page holds more than the Vorbis identification header";
    }
    bool end_of_stream = ogg_page_eos(&page) != 0;
    for (int headers = 1; headers < 3;) {
      const int got = ogg_stream_packetout(&stream_, &packet);
      if (got < 0) return "a page of its Vorbis headers is missing or corrupt";
      if (got == 1) {
        if (vorbis_synthesis_headerin(&info_, &comment_, &packet) != 0) {
          return headers == 1 ? "libvorbis refuses its Vorbis comment header"
                              : "libvorbis refuses its Vorbis setup header";
        }
        ++headers;
        continue;
      }
      // The next page of this logical stream (others are skipped).
      do {
        if (end_of_stream || !NextPage(&page)) {
          return "it ends before its three Vorbis headers do (a file cut short?); send the whole "
                 "file";
        }
      } while (ogg_page_serialno(&page) != stream_.serialno);
      if (ogg_stream_pagein(&stream_, &page) != 0) {
        return "a page of its Vorbis headers cannot be read";
      }
      end_of_stream = ogg_page_eos(&page) != 0;
    }
    return "";
  }

 private:
  // Bytes handed to libogg at a time; headers are a few KB, files may be MBs.
  static constexpr size_t kFeedBytes = 16384;

  static bool StartsVorbis(const unsigned char* p, long n) {
    return n >= 7 && std::memcmp(p, "\x01vorbis", 7) == 0;
  }

  // The next whole page with a good checksum (bytes that are not one are
  // skipped, as libogg and libsndfile do); false at the end of the bytes.
  bool NextPage(ogg_page* page) {
    while (true) {
      const int got = ogg_sync_pageout(&sync_, page);
      if (got == 1) return true;
      if (got < 0) continue;
      if (fed_ == bytes_.size()) return false;
      const size_t n = std::min(kFeedBytes, bytes_.size() - fed_);
      char* buffer = ogg_sync_buffer(&sync_, static_cast<long>(n));
      if (buffer == nullptr) return false;
      std::memcpy(buffer, bytes_.data() + fed_, n);
      if (ogg_sync_wrote(&sync_, static_cast<long>(n)) != 0) return false;
      fed_ += n;
    }
  }

  std::span<const uint8_t> bytes_;
  size_t fed_ = 0;  // bytes handed to sync_
  ogg_sync_state sync_;
  ogg_stream_state stream_;
  bool stream_open_ = false;
  vorbis_info info_;
  vorbis_comment comment_;
};

std::string Fmt1(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.1f", v);
  return b;
}
std::string FmtG(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%g", v);
  return b;
}

}  // namespace

Result<DecodedAudio> DecodeAudio(std::span<const uint8_t> bytes, const AudioLimits& limits,
                                 std::string_view field) {
  const std::string f(field);
  if (bytes.empty()) return InvalidArgumentError(f + " is empty");
  if (bytes.size() > limits.max_bytes) {
    return InvalidArgumentError(f + " is " + std::to_string(bytes.size()) +
                                " bytes; the limit is max_audio_bytes (" +
                                std::to_string(limits.max_bytes) + ")");
  }
  // Note [Damaged audio]: Vorbis headers are checked before libsndfile reads them.
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), "OggS", 4) == 0) {
    const std::string problem = VorbisHeaderCheck(bytes).Problem();
    if (!problem.empty()) return InvalidArgumentError(f + " is damaged: " + problem);
  }
  MemoryFile mem{bytes, 0};
  SF_VIRTUAL_IO vio{MemLength, MemSeek, MemRead, MemWrite, MemTell};
  SF_INFO info{};
  std::unique_ptr<SNDFILE, SndfileCloser> sf(sf_open_virtual(&vio, SFM_READ, &info, &mem));
  if (sf == nullptr) {
    if (sf_error(nullptr) == SF_ERR_MALFORMED_FILE) {  // a known format, broken
      return InvalidArgumentError(f +
                                  " is damaged: libsndfile knows its format but cannot read it (" +
                                  sf_strerror(nullptr) + ")");
    }
    return InvalidArgumentError(
        f + " is not audio libsndfile can read (WAV, FLAC, OGG): " + sf_strerror(nullptr));
  }
  if (info.channels <= 0 || info.channels > kMaxChannels || info.samplerate < kMinRate ||
      info.samplerate > kMaxRate) {
    return InvalidArgumentError(
        f + " is not audio libsndfile can read (WAV, FLAC, OGG): " + std::to_string(info.channels) +
        " channels at " + std::to_string(info.samplerate) + " Hz is not supported");
  }
  if (info.frames <= 0) return InvalidArgumentError(f + " has no audio frames");
  // Note [Damaged audio], rules 1 and 2.
  if (info.frames == SF_COUNT_MAX) {
    return InvalidArgumentError(f + " is damaged: its length cannot be read from it (an " +
                                FormatName(info) + " file cut short?); send the whole file");
  }
  const double seconds = static_cast<double>(info.frames) / info.samplerate;
  if (static_cast<double>(info.frames) > kMaxFramesPerByte * static_cast<double>(bytes.size())) {
    return InvalidArgumentError(f + " is damaged: its header claims " + Fmt1(seconds) +
                                " s of audio, more than its " + std::to_string(bytes.size()) +
                                " bytes can hold");
  }
  if (seconds > limits.max_seconds) {
    return InvalidArgumentError(f + " is " + Fmt1(seconds) +
                                " s of audio; the limit is max_audio_seconds (" +
                                FmtG(limits.max_seconds) + ")");
  }

  DecodedAudio out;
  out.source_rate = info.samplerate;
  out.source_channels = info.channels;
  out.format = FormatName(info);
  const bool resample = info.samplerate != kAsrSampleRate;
  std::unique_ptr<StreamingResampler> resampler;
  if (resample) {
    resampler = StreamingResampler::Create(info.samplerate, kAsrSampleRate);
    if (resampler == nullptr) return InternalError(f + ": libsamplerate could not be initialized");
  }
  out.samples.reserve(static_cast<size_t>(seconds * kAsrSampleRate) + 16);

  // Bounds decoding to the limit even if the header under-reports frames.
  const auto max_frames = static_cast<sf_count_t>(limits.max_seconds * info.samplerate) + 1;
  std::vector<float> block(static_cast<size_t>(kBlockFrames) *
                           info.channels);                     // [frames, channels]
  std::vector<float> mono(static_cast<size_t>(kBlockFrames));  // [frames]
  sf_count_t total = 0;
  while (true) {
    const sf_count_t got = sf_readf_float(sf.get(), block.data(), kBlockFrames);
    if (got <= 0) break;
    if (total + got > max_frames) {
      return InvalidArgumentError(f + " is more than " + FmtG(limits.max_seconds) +
                                  " s of audio; the limit is max_audio_seconds (" +
                                  FmtG(limits.max_seconds) + ")");
    }
    total += got;
    for (sf_count_t i = 0; i < got; ++i) {
      float sum = 0;
      for (int c = 0; c < info.channels; ++c)
        sum += block[static_cast<size_t>(i) * info.channels + c];
      mono[static_cast<size_t>(i)] = sum / static_cast<float>(info.channels);
    }
    if (resample) {
      if (!resampler->Push(mono.data(), static_cast<long>(got), false, out.samples)) {
        return InternalError(f + ": resampling failed");
      }
    } else {
      for (sf_count_t i = 0; i < got; ++i)
        out.samples.push_back(ToInt16(mono[static_cast<size_t>(i)]));
    }
  }
  // Note [Damaged audio], rule 3.
  const sf_count_t slack = std::max<sf_count_t>(kBlockFrames, info.frames / 100);
  if (total < info.frames - slack) {
    const int err = sf_error(sf.get());
    return InvalidArgumentError(
        f + " is damaged: its header claims " + Fmt1(seconds) + " s of audio but only " +
        Fmt1(static_cast<double>(total) / info.samplerate) + " s decode" +
        (err != SF_ERR_NO_ERROR ? std::string(" (") + sf_strerror(sf.get()) + ")" : std::string()));
  }
  if (total == 0) return InvalidArgumentError(f + " has no audio frames");
  if (resample && !resampler->Push(mono.data(), 0, true, out.samples)) {
    return InternalError(f + ": resampling failed");
  }
  out.seconds = static_cast<double>(total) / info.samplerate;
  return out;
}

std::vector<int16_t> ResampleMono(std::span<const int16_t> in, int from_rate, int to_rate) {
  if (from_rate <= 0 || to_rate <= 0) return {};
  if (from_rate == to_rate) return std::vector<int16_t>(in.begin(), in.end());
  if (in.empty()) return {};
  std::vector<float> f(in.size());
  src_short_to_float_array(in.data(), f.data(), static_cast<int>(in.size()));
  std::unique_ptr<StreamingResampler> r = StreamingResampler::Create(from_rate, to_rate);
  std::vector<int16_t> out;
  if (r == nullptr) return out;
  out.reserve(static_cast<size_t>(static_cast<double>(in.size()) * to_rate / from_rate) + 16);
  if (!r->Push(f.data(), static_cast<long>(f.size()), true, out)) return {};
  return out;
}

}  // namespace arbiter
