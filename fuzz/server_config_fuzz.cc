// libFuzzer target: ParseConfigToml (the `arbiter serve --config` file) on
// arbitrary text. No exception may escape; errors are kInvalidArgument with a
// message; accepted configs satisfy the ranges config.h and docs/config.md
// promise, and ValidateConfig accepts them.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "arbiter/runtime/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr uint64_t kMemTotal = 16ull << 30;
  arbiter::Result<arbiter::Config> config =
      arbiter::ParseConfigToml(text, "/fuzz/arbiter.toml", kMemTotal);
  if (!config.ok()) {
    if (config.status().code() != arbiter::StatusCode::kInvalidArgument) __builtin_trap();
    if (config.status().message().empty()) __builtin_trap();
    return 0;
  }
  const arbiter::Config& c = *config;
  const arbiter::ServerSettings& s = c.server;
  if (s.host.empty() || s.port < 0 || s.port > 65535) __builtin_trap();
  if (s.max_body_bytes == 0 || s.threads < 0) __builtin_trap();
  if (s.read_timeout_s < 1 || s.write_timeout_s < 1 || s.keep_alive_max < 1 ||
      s.keep_alive_timeout_s < 1 || s.acquire_timeout_s < 1) {
    __builtin_trap();
  }
  if (c.budget_bytes == 0) __builtin_trap();
  std::set<std::string> names;
  for (const arbiter::ModelEntry& m : c.models) {
    if (m.name.empty()) __builtin_trap();
    // `path` is required for builtin models only; the other engines fall
    // back to their package's data (docs/config.md). Any path given is made
    // absolute against the config file's directory.
    if (m.engine == arbiter::ModelEngine::kBuiltin && m.path.empty()) __builtin_trap();
    if (!m.path.empty() && m.path[0] != '/') __builtin_trap();
    if (m.parallel < 1 || m.ctx < 1) __builtin_trap();
    if (!names.insert(m.name).second) __builtin_trap();
    if (m.idle_ttl_ms && *m.idle_ttl_ms <= 0) __builtin_trap();  // 0 means off (empty)
  }
  const arbiter::PressureSettings& p = c.pressure;
  if (!(p.low_fraction > 0 && p.low_fraction < 1)) __builtin_trap();
  if (!(p.critical_fraction > 0 && p.critical_fraction < p.low_fraction)) __builtin_trap();
  if (p.interval_ms < 500 || p.psi_window_ms < 500 || p.psi_window_ms > 10000) __builtin_trap();
  if (p.psi_low_stall_ms < 1 || p.psi_low_stall_ms > p.psi_window_ms) __builtin_trap();
  if (p.psi_critical_stall_ms < 1 || p.psi_critical_stall_ms > p.psi_window_ms) __builtin_trap();
  if (!arbiter::ValidateConfig(c).ok()) __builtin_trap();
  return 0;
}
