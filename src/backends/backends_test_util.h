// Helpers shared by the backends tests: speech made with Flite at 16 kHz,
// and the process's resident memory from /proc/self/status.
#pragma once

#include <malloc.h>

#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "arbiter/backends/tts.h"
#include "arbiter/formats/audio.h"

namespace arbiter::testing_util {

// `text` spoken by Flite's voice `voice`, resampled to 16 kHz mono.
inline std::vector<int16_t> FliteSpeech16k(const std::string& text,
                                           const std::string& voice = "slt") {
  Result<std::unique_ptr<TtsEngine>> tts = LoadFliteTts();
  if (!tts.ok()) return {};
  std::vector<int16_t> pcm;
  Status s = (*tts)->Synthesize(
      text, voice, 1.0,
      [&](std::span<const int16_t> chunk) {
        pcm.insert(pcm.end(), chunk.begin(), chunk.end());
        return true;
      },
      nullptr);
  if (!s.ok()) return {};
  return ResampleMono(pcm, (*tts)->sample_rate(voice), kAsrSampleRate);
}

// A field of /proc/self/status in KiB ("RssAnon", "RssFile"), after
// returning freed heap to the OS; -1 when absent.
inline int64_t StatusKib(const std::string& field) {
  malloc_trim(0);
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

}  // namespace arbiter::testing_util
