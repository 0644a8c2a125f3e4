// Response encoders for synthesized speech (arbiter/backends/tts.h).
#include <lame/lame.h>

#include <algorithm>
#include <cstring>

#include "arbiter/backends/tts.h"

namespace arbiter {

Result<AudioFormat> ParseAudioFormat(std::string_view name) {
  if (name == "mp3") return AudioFormat::kMp3;
  if (name == "wav") return AudioFormat::kWav;
  if (name == "pcm") return AudioFormat::kPcm;
  return InvalidArgumentError("response_format \"" + std::string(name) +
                              "\" is not one of mp3, wav, pcm");
}

std::string_view AudioFormatName(AudioFormat f) {
  switch (f) {
    case AudioFormat::kMp3:
      return "mp3";
    case AudioFormat::kWav:
      return "wav";
    case AudioFormat::kPcm:
      return "pcm";
  }
  return "pcm";
}

std::string_view AudioFormatMime(AudioFormat f) {
  switch (f) {
    case AudioFormat::kMp3:
      return "audio/mpeg";
    case AudioFormat::kWav:
      return "audio/wav";
    case AudioFormat::kPcm:
      return "audio/pcm";
  }
  return "audio/pcm";
}

namespace {

void AppendLe16(std::string& out, std::span<const int16_t> samples) {
  const size_t at = out.size();
  out.resize(at + samples.size() * 2);
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto u = static_cast<uint16_t>(samples[i]);
    out[at + 2 * i] = static_cast<char>(u & 0xFF);
    out[at + 2 * i + 1] = static_cast<char>(u >> 8);
  }
}

Status Spent() { return FailedPreconditionError("audio encoder used after Finish()"); }

class PcmEncoder final : public AudioEncoder {
 public:
  Result<std::string> Encode(std::span<const int16_t> samples) override {
    if (done_) return Spent();
    std::string out;
    AppendLe16(out, samples);
    return out;
  }
  Result<std::string> Finish() override {
    if (done_) return Spent();
    done_ = true;
    return std::string();
  }

 private:
  bool done_ = false;
};

// Buffers the data: the RIFF header holds its size (see tts.h).
class WavEncoder final : public AudioEncoder {
 public:
  explicit WavEncoder(int rate) : rate_(rate) {}
  Result<std::string> Encode(std::span<const int16_t> samples) override {
    if (done_) return Spent();
    if (data_.size() + samples.size() * 2 > kMaxDataBytes) {
      return ResourceExhaustedError("wav output is over 4 GiB; use response_format pcm or mp3");
    }
    AppendLe16(data_, samples);
    return std::string();
  }
  Result<std::string> Finish() override {
    if (done_) return Spent();
    done_ = true;
    std::string out;
    out.reserve(44 + data_.size());
    auto u32 = [&](uint32_t v) {
      for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
    };
    auto u16 = [&](uint16_t v) {
      out.push_back(static_cast<char>(v & 0xFF));
      out.push_back(static_cast<char>(v >> 8));
    };
    const auto data_size = static_cast<uint32_t>(data_.size());
    out += "RIFF";
    u32(36 + data_size);
    out += "WAVEfmt ";
    u32(16);
    u16(1);  // PCM
    u16(1);  // mono
    u32(static_cast<uint32_t>(rate_));
    u32(static_cast<uint32_t>(rate_) * 2);  // byte rate
    u16(2);                                 // block align
    u16(16);                                // bits per sample
    out += "data";
    u32(data_size);
    out += data_;
    data_.clear();
    data_.shrink_to_fit();
    return out;
  }

 private:
  static constexpr size_t kMaxDataBytes = 0xFFFFFFFFu - 36;
  int rate_;
  std::string data_;  // [n] int16 little-endian
  bool done_ = false;
};

class Mp3Encoder final : public AudioEncoder {
 public:
  explicit Mp3Encoder(lame_global_flags* gf) : gf_(gf) {}
  ~Mp3Encoder() override { lame_close(gf_); }
  Result<std::string> Encode(std::span<const int16_t> samples) override {
    if (done_) return Spent();
    std::string out;
    // LAME takes an int count; feed at most kChunk samples per call.
    constexpr size_t kChunk = 1 << 16;
    for (size_t off = 0; off < samples.size(); off += kChunk) {
      const size_t n = std::min(kChunk, samples.size() - off);
      buf_.resize(n + n / 4 + 7200);  // LAME's documented worst case
      const int got = lame_encode_buffer(gf_, samples.data() + off, nullptr, static_cast<int>(n),
                                         buf_.data(), static_cast<int>(buf_.size()));
      if (got < 0) return InternalError("lame_encode_buffer failed (" + std::to_string(got) + ")");
      out.append(reinterpret_cast<const char*>(buf_.data()), static_cast<size_t>(got));
    }
    return out;
  }
  Result<std::string> Finish() override {
    if (done_) return Spent();
    done_ = true;
    buf_.resize(7200);
    const int got = lame_encode_flush(gf_, buf_.data(), static_cast<int>(buf_.size()));
    if (got < 0) return InternalError("lame_encode_flush failed (" + std::to_string(got) + ")");
    return std::string(reinterpret_cast<const char*>(buf_.data()), static_cast<size_t>(got));
  }

 private:
  lame_global_flags* gf_;
  std::vector<unsigned char> buf_;
  bool done_ = false;
};

}  // namespace

Result<std::unique_ptr<AudioEncoder>> AudioEncoder::Create(AudioFormat format, int sample_rate) {
  switch (format) {
    case AudioFormat::kPcm:
    case AudioFormat::kWav:
      if (sample_rate < 1 || sample_rate > 384000) {
        return InvalidArgumentError("sample rate " + std::to_string(sample_rate) +
                                    " Hz is outside 1..384000");
      }
      if (format == AudioFormat::kPcm) return std::unique_ptr<AudioEncoder>(new PcmEncoder());
      return std::unique_ptr<AudioEncoder>(new WavEncoder(sample_rate));
    case AudioFormat::kMp3: {
      if (sample_rate < 8000 || sample_rate > 48000) {
        return InvalidArgumentError("sample rate " + std::to_string(sample_rate) +
                                    " Hz is outside MP3's 8000..48000");
      }
      lame_global_flags* gf = lame_init();
      if (gf == nullptr) return InternalError("lame_init failed");
      lame_set_num_channels(gf, 1);
      lame_set_in_samplerate(gf, sample_rate);
      lame_set_mode(gf, MONO);
      lame_set_brate(gf, 64);
      lame_set_VBR(gf, vbr_off);
      lame_set_bWriteVbrTag(gf, 0);  // the Xing tag needs a seek back to the start
      if (lame_init_params(gf) < 0) {
        lame_close(gf);
        return InternalError("lame_init_params failed for " + std::to_string(sample_rate) +
                             " Hz mono");
      }
      return std::unique_ptr<AudioEncoder>(new Mp3Encoder(gf));
    }
  }
  return InvalidArgumentError("unknown audio format");
}

Status CheckSynthesis(const TtsEngine& engine, std::string_view text, const std::string& voice,
                      double speed, const Cancellation& cancelled) {
  const std::vector<std::string> voices = engine.voices();
  if (std::find(voices.begin(), voices.end(), voice) == voices.end()) {
    std::string list;
    for (const std::string& v : voices) list += (list.empty() ? "" : ", ") + v;
    return InvalidArgumentError("voice \"" + voice + "\" is not one of this model's voices: " + list);
  }
  if (text.empty()) return InvalidArgumentError("input is empty");
  if (!(speed >= 0.25 && speed <= 4.0)) {
    return InvalidArgumentError("speed " + std::to_string(speed) + " is outside 0.25..4.0");
  }
  if (cancelled.cancelled()) return CancelledError("speech synthesis cancelled");
  return OkStatus();
}

}  // namespace arbiter
