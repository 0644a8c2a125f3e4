// Test support: a Runtime over tiny models (tools/model_maker's "tiny"
// preset, ~1 MB), for the runtime's and the server's in-process tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "arbiter/runtime/config.h"
#include "tools/model_maker/model_maker.h"

namespace arbiter::testing {

// <tmp>/arbiter-<suite>-<pid> with a "tiny" model directory in it.
// Errors: MakeModel's.
inline Result<std::filesystem::path> MakeTinyModelDir(const std::string& suite) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("arbiter-" + suite + "-" +
                                                    std::to_string(getpid()));
  std::error_code ec;
  fs::create_directories(dir, ec);
  ARBITER_RETURN_IF_ERROR(MakeModel("tiny", (dir / "tiny").string(), 1, nullptr));
  return dir;
}

// A config serving `models` (name, capability), each the tiny model of
// `dir` with a 256-token context, a 256 MiB budget, no OS pressure source
// and its state in `state_dir`.
inline Config TinyRuntimeConfig(const std::filesystem::path& dir, const std::string& state_dir,
                                const std::vector<std::pair<std::string, Capability>>& models) {
  Config c = DefaultConfig(0);
  c.budget_bytes = 256ull << 20;
  c.state_dir = state_dir;
  c.pressure.source = PressureSourceKind::kNone;
  for (const auto& [name, cap] : models) {
    ModelEntry m;
    m.name = name;
    m.path = (dir / "tiny").string();
    m.capability = cap;
    m.ctx = 256;
    c.models.push_back(m);
  }
  return c;
}

}  // namespace arbiter::testing
