// arbiter/server/config.h — the TOML configuration of `arbiter serve`.
//
// Sources, lowest precedence first: built-in defaults < the TOML file <
// environment (ARBITER_HOST, ARBITER_PORT, ARBITER_API_KEY, ARBITER_BUDGET) <
// command-line flags. Every setting and its default is in docs/config.md.
//
//   [server]  host, port, api_key, max_body_bytes, threads, read_timeout_s,
//             request_timeout_s, write_timeout_s, keep_alive_max, keep_alive_timeout_s,
//             acquire_timeout_s, preload
//   [memory]  budget (SIZE: bytes, "512MiB", "2GB", "75%" of MemTotal)
//   [[models]] name, path, capability ("text" | "embedding"), parallel, ctx
//
// Unknown keys and sections are not errors: they are collected in
// Config::warnings for the caller to log. Bad values are kInvalidArgument
// naming the key, e.g. "[[models]][1].ctx must be a positive integer"
// (model indexes are 0-based); a TOML syntax error names the file, line and
// column. Relative model paths are resolved against the config file's
// directory.
//
// Thread safety: pure functions over values (the env lookup is injected).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/status.h"

namespace arbiter {

// Headroom left to the OS and other processes by the default budget
// (bytes): budget = MemTotal − 1536 MiB.
inline constexpr uint64_t kDefaultHeadroomBytes = 1536ull << 20;

struct ServerSettings {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0 = any free port (logged)
  std::string api_key;                   // empty = no auth
  size_t max_body_bytes = 8u << 20;      // request bodies above → 413
  int threads = 0;                       // HTTP worker threads; 0 = 8 + Σ parallel
  int read_timeout_s = 30;               // per read of request bytes
  int request_timeout_s = 60;            // to send one whole request (headers + body) → 408
  int write_timeout_s = 30;
  int keep_alive_max = 100;              // requests per connection
  int keep_alive_timeout_s = 5;          // idle seconds before closing
  int acquire_timeout_s = 300;           // wait for a model load before 503
  bool preload = false;                  // load every model at startup
};

struct ModelEntry {
  std::string name;                      // the "model" of requests
  std::string path;                      // model directory (absolute after load)
  Capability capability = Capability::kText;
  int parallel = 1;                      // KV slots = concurrent requests
  int ctx = 2048;                        // tokens per slot
};

struct Config {
  ServerSettings server;
  std::string budget_text;               // as written ("" = default)
  uint64_t budget_bytes = 0;             // resolved [memory] budget
  std::vector<ModelEntry> models;
  std::string state_dir;                 // resolved by the CLI
  std::vector<std::string> warnings;     // unknown keys etc., for logging
};

// MemTotal − kDefaultHeadroomBytes; half of MemTotal when that would leave
// less than a quarter of it.
uint64_t DefaultBudgetBytes(uint64_t mem_total_bytes);

// A default config (no models), budget = DefaultBudgetBytes(mem_total_bytes).
Config DefaultConfig(uint64_t mem_total_bytes);

// Parses TOML `text` over the defaults. `file` names it in errors and its
// directory anchors relative model paths. `mem_total_bytes` is 100% for "75%".
Result<Config> ParseConfigToml(std::string_view text, const std::string& file,
                               uint64_t mem_total_bytes);
// Reads `path` and parses it. kNotFound when missing.
Result<Config> LoadConfigFile(const std::string& path, uint64_t mem_total_bytes);

// getenv-like lookup: returns nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

// Applies ARBITER_HOST, ARBITER_PORT, ARBITER_API_KEY, ARBITER_BUDGET.
// Errors name the variable (`ARBITER_PORT must be an integer in 0..65535`).
Status ApplyEnvOverrides(const EnvLookup& env, uint64_t mem_total_bytes, Config* config);

// Checks cross-field rules: unique model names, port range, etc.
Status ValidateConfig(const Config& config);

// $XDG_STATE_HOME/arbiter, else $HOME/.local/state/arbiter.
// kFailedPrecondition when neither variable is set.
Result<std::string> DefaultStateDir(const EnvLookup& env);

}  // namespace arbiter
