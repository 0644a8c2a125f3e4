// TOML configuration: defaults, file, environment. See config.h and
// docs/config.md for every key and its default.
#include "arbiter/runtime/config.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "arbiter/base/clip.h"
#include "arbiter/base/file.h"
#include "arbiter/base/size.h"
#include "arbiter/memory/memory_pressure.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxParallel = 64;

Status KeyError(const std::string& key, std::string_view what) {
  return InvalidArgumentError(fmt::format("{} must be {}", key, what));
}

// [server] allowed_hosts (Note [Host check] in server/internal/access.h):
// "*", a host name or IPv4 address (RFC 3986 unreserved characters, one
// trailing dot allowed), or an IPv6 address in brackets; never a port.
constexpr std::string_view kAllowedHostsWhat =
    "host names or IP addresses without scheme or port, such as \"myhost.lan\", "
    "\"192.168.1.5\" or \"[fd00::1]\" (\"*\" for any)";

bool ValidAllowedHost(std::string_view h) {
  if (h == "*") return true;
  if (h.empty()) return false;
  const bool bracketed = h.front() == '[';
  if (bracketed) {
    if (h.size() < 3 || h.back() != ']') return false;
    h = h.substr(1, h.size() - 2);
  }
  for (char c : h) {
    const bool name_char = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
    if (!name_char && !(bracketed && c == ':')) return false;
  }
  return true;
}

// Reads an integer key into *out when present. `what` describes the range.
Status ReadInt(const toml::table& t, const char* key, const std::string& path, int64_t lo,
               int64_t hi, std::string_view what, int64_t* out) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return OkStatus();
  auto v = n->value_exact<int64_t>();
  if (!v || *v < lo || *v > hi) return KeyError(path + key, what);
  *out = *v;
  return OkStatus();
}

Status ReadString(const toml::table& t, const char* key, const std::string& path,
                  std::string* out) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return OkStatus();
  auto v = n->value_exact<std::string>();
  if (!v) return KeyError(path + key, "a string");
  *out = *v;
  return OkStatus();
}

Status ReadBool(const toml::table& t, const char* key, const std::string& path, bool* out) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return OkStatus();
  auto v = n->value_exact<bool>();
  if (!v) return KeyError(path + key, "true or false");
  *out = *v;
  return OkStatus();
}

void WarnUnknown(const toml::table& t, const std::set<std::string>& known,
                 const std::string& where, std::vector<std::string>* warnings) {
  for (auto&& [k, v] : t) {
    (void)v;
    if (known.count(std::string(k.str())) == 0) {
      warnings->push_back(fmt::format("unknown key {}{} (ignored)", where, k.str()));
    }
  }
}

// Reads a number (TOML float or integer) into *out when present.
Status ReadDouble(const toml::table& t, const char* key, const std::string& path,
                  std::string_view what, double* out) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return OkStatus();
  if (auto d = n->value_exact<double>()) {
    *out = *d;
  } else if (auto i = n->value_exact<int64_t>()) {
    *out = static_cast<double>(*i);
  } else {
    return KeyError(path + key, what);
  }
  return OkStatus();
}

template <typename T>
Status ReadIntAs(const toml::table& t, const char* key, const std::string& path, int64_t lo,
                 int64_t hi, std::string_view what, T* out) {
  int64_t v = static_cast<int64_t>(*out);
  ARBITER_RETURN_IF_ERROR(ReadInt(t, key, path, lo, hi, what, &v));
  *out = static_cast<T>(v);
  return OkStatus();
}

Status ParseServer(const toml::table& t, Config* c) {
  const std::string p = "[server].";
  ServerSettings& s = c->server;
  ARBITER_RETURN_IF_ERROR(ReadString(t, "host", p, &s.host));
  if (s.host.empty()) return KeyError(p + "host", "a non-empty host name or address");
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "port", p, 0, 65535, "an integer in 0..65535", &s.port));
  ARBITER_RETURN_IF_ERROR(ReadString(t, "api_key", p, &s.api_key));
  // max_body_bytes: an integer or a SIZE string.
  if (const toml::node* n = t.get("max_body_bytes")) {
    if (auto i = n->value_exact<int64_t>()) {
      if (*i <= 0) return KeyError(p + "max_body_bytes", "a positive size");
      s.max_body_bytes = static_cast<size_t>(*i);
    } else if (auto str = n->value_exact<std::string>()) {
      auto size = ParseSize(*str);
      if (!size.ok() || *size == 0) {
        return KeyError(p + "max_body_bytes", "a positive size such as 8MiB");
      }
      s.max_body_bytes = static_cast<size_t>(*size);
    } else {
      return KeyError(p + "max_body_bytes", "a size (bytes or e.g. \"8MiB\")");
    }
  }
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "threads", p, 0, 1024, "an integer in 0..1024", &s.threads));
  ARBITER_RETURN_IF_ERROR(
      ReadIntAs(t, "read_timeout_s", p, 1, 86400, "a positive integer", &s.read_timeout_s));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "request_timeout_s", p, 1, 86400, "a positive integer",
                                    &s.request_timeout_s));
  ARBITER_RETURN_IF_ERROR(
      ReadIntAs(t, "write_timeout_s", p, 1, 86400, "a positive integer", &s.write_timeout_s));
  ARBITER_RETURN_IF_ERROR(
      ReadIntAs(t, "keep_alive_max", p, 1, 1000000, "a positive integer", &s.keep_alive_max));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "keep_alive_timeout_s", p, 1, 3600,
                                    "an integer in 1..3600", &s.keep_alive_timeout_s));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "acquire_timeout_s", p, 1, 86400, "a positive integer",
                                    &s.acquire_timeout_s));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "max_connections", p, 1, 1000000,
                                    "an integer in 1..1000000", &s.max_connections));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "queue_max", p, 0, 1000000, "an integer in 0..1000000",
                                    &s.queue_max));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "max_embedding_inputs", p, 1, 1000000,
                                    "an integer in 1..1000000", &s.max_embedding_inputs));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "max_embedding_tokens", p, 1, int64_t{1} << 40,
                                    "a positive integer", &s.max_embedding_tokens));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "max_audio_bytes", p, 1, int64_t{1} << 34,
                                    "a positive integer (bytes)", &s.max_audio_bytes));
  ARBITER_RETURN_IF_ERROR(ReadDouble(t, "max_audio_seconds", p, "a number of seconds in (0, 86400]",
                                     &s.max_audio_seconds));
  if (!(s.max_audio_seconds > 0 && s.max_audio_seconds <= 86400)) {
    return KeyError(p + "max_audio_seconds", "a number of seconds in (0, 86400]");
  }
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "max_image_bytes", p, 1, int64_t{1} << 32,
                                    "a positive integer (bytes)", &s.max_image_bytes));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "max_image_pixels", p, 1, int64_t{1} << 34,
                                    "a positive integer", &s.max_image_pixels));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "max_speech_chars", p, 1, 1000000,
                                    "an integer in 1..1000000", &s.max_speech_chars));
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "shutdown_timeout_s", p, 1, 3600, "an integer in 1..3600",
                                    &s.shutdown_timeout_s));
  ARBITER_RETURN_IF_ERROR(ReadBool(t, "preload", p, &s.preload));
  ARBITER_RETURN_IF_ERROR(ReadBool(t, "metrics_public", p, &s.metrics_public));
  // Arrays of strings: [server] cors_origins, metrics_compat.
  auto read_strings = [&](const char* key, std::string_view what,
                          std::vector<std::string>* out) -> Status {
    const toml::node* n = t.get(key);
    if (n == nullptr) return OkStatus();
    const toml::array* a = n->as_array();
    if (a == nullptr) return KeyError(p + key, what);
    out->clear();
    for (const toml::node& e : *a) {
      std::optional<std::string> v = e.value_exact<std::string>();
      if (!v || v->empty()) return KeyError(p + key, what);
      out->push_back(*v);
    }
    return OkStatus();
  };
  ARBITER_RETURN_IF_ERROR(read_strings(
      "cors_origins", "an array of origins such as [\"http://localhost:5173\"] or [\"*\"]",
      &s.cors_origins));
  for (const std::string& o : s.cors_origins) {
    if (o != "*" && o.rfind("http://", 0) != 0 && o.rfind("https://", 0) != 0) {
      return KeyError(p + "cors_origins", "origins as scheme://host[:port] (or \"*\")");
    }
    if (o != "*" && o.back() == '/') {
      return KeyError(p + "cors_origins", "origins without a trailing slash (browsers send none)");
    }
  }
  ARBITER_RETURN_IF_ERROR(read_strings(
      "allowed_hosts", fmt::format("an array of {}", kAllowedHostsWhat), &s.allowed_hosts));
  for (const std::string& h : s.allowed_hosts) {
    if (!ValidAllowedHost(h)) {
      return KeyError(p + "allowed_hosts", fmt::format("an array of {}", kAllowedHostsWhat));
    }
  }
  ARBITER_RETURN_IF_ERROR(
      read_strings("metrics_compat", "an array of names: [\"vllm\"]", &s.metrics_compat));
  for (const std::string& m : s.metrics_compat) {
    if (m != "vllm") return KeyError(p + "metrics_compat", "an array of names: [\"vllm\"]");
  }
  WarnUnknown(t,
              {"host", "port", "api_key", "max_body_bytes", "threads", "read_timeout_s",
               "request_timeout_s", "write_timeout_s", "keep_alive_max", "keep_alive_timeout_s",
               "acquire_timeout_s", "preload", "metrics_public", "max_connections", "queue_max",
               "max_embedding_inputs", "max_embedding_tokens", "max_audio_bytes",
               "max_audio_seconds", "max_image_bytes", "max_image_pixels", "cors_origins",
               "allowed_hosts", "metrics_compat", "max_speech_chars", "shutdown_timeout_s"},
              p, &c->warnings);
  return OkStatus();
}

Status ParseBudget(std::string_view text, uint64_t mem_total, const std::string& key,
                   uint64_t* out) {
  auto size = ParseSize(text, mem_total);
  if (!size.ok()) {
    return InvalidArgumentError(fmt::format("{} is invalid: {}", key, size.status().message()));
  }
  if (*size == 0) return KeyError(key, "a positive size");
  *out = *size;
  return OkStatus();
}

// Parses a headroom SIZE (bytes, "1536MiB", "10%") into c->headroom_*.
Status ParseHeadroom(std::string_view text, uint64_t mem_total, const std::string& key,
                     Config* c) {
  auto size = ParseSize(text, mem_total);
  if (!size.ok()) {
    return InvalidArgumentError(fmt::format("{} is invalid: {}", key, size.status().message()));
  }
  c->headroom_bytes = *size;
  c->headroom_text = std::string(text);
  return OkStatus();
}

// Budget = MemTotal − headroom when no budget was given. `key` names the
// headroom's source in errors.
Status DeriveBudget(uint64_t mem_total, const std::string& key, Config* c) {
  if (!c->budget_text.empty()) return OkStatus();
  if (c->headroom_text.empty()) {
    c->budget_bytes = DefaultBudgetBytes(mem_total);
    return OkStatus();
  }
  if (mem_total == 0) return OkStatus();  // unknown RAM: ValidateConfig asks for a budget
  if (c->headroom_bytes >= mem_total) {
    return InvalidArgumentError(fmt::format(
        "{} ({}) must be smaller than total RAM ({} bytes); lower it or set [memory].budget",
        key, c->headroom_text, mem_total));
  }
  c->budget_bytes = mem_total - c->headroom_bytes;
  return OkStatus();
}

Status ParseMemory(const toml::table& t, uint64_t mem_total, Config* c) {
  const std::string p = "[memory].";
  if (const toml::node* n = t.get("headroom")) {
    if (auto i = n->value_exact<int64_t>()) {
      if (*i < 0) return KeyError(p + "headroom", "a size ≥ 0");
      ARBITER_RETURN_IF_ERROR(ParseHeadroom(std::to_string(*i), mem_total, p + "headroom", c));
    } else if (auto str = n->value_exact<std::string>()) {
      ARBITER_RETURN_IF_ERROR(ParseHeadroom(*str, mem_total, p + "headroom", c));
    } else {
      return KeyError(p + "headroom", "a size: bytes, \"1536MiB\", \"2GB\" or \"10%\"");
    }
  }
  if (const toml::node* n = t.get("budget")) {
    if (auto i = n->value_exact<int64_t>()) {
      if (*i <= 0) return KeyError(p + "budget", "a positive size");
      c->budget_text = std::to_string(*i);
      c->budget_bytes = static_cast<uint64_t>(*i);
    } else if (auto str = n->value_exact<std::string>()) {
      ARBITER_RETURN_IF_ERROR(ParseBudget(*str, mem_total, p + "budget", &c->budget_bytes));
      c->budget_text = *str;
    } else {
      return KeyError(p + "budget", "a size: bytes, \"512MiB\", \"2GB\" or \"75%\"");
    }
  }
  // The weight runtime's keys.
  WeightSettings& w = c->weights;
  if (const toml::node* n = t.get("device_arena")) {
    if (auto i = n->value_exact<int64_t>()) {
      if (*i <= 0) return KeyError(p + "device_arena", "a positive size");
      w.device_arena_text = std::to_string(*i);
      w.device_arena_bytes = static_cast<uint64_t>(*i);
    } else if (auto str = n->value_exact<std::string>()) {
      ARBITER_RETURN_IF_ERROR(
          ParseBudget(*str, mem_total, p + "device_arena", &w.device_arena_bytes));
      w.device_arena_text = *str;
    } else {
      return KeyError(p + "device_arena", "a size: bytes, \"4GiB\" or \"50%\"");
    }
  }
  ARBITER_RETURN_IF_ERROR(ReadDouble(t, "weight_cache_fraction", p, "a number in (0, 1]",
                                     &w.weight_cache_fraction));
  if (!(w.weight_cache_fraction > 0 && w.weight_cache_fraction <= 1)) {
    return KeyError(p + "weight_cache_fraction", "a number in (0, 1]");
  }
  ARBITER_RETURN_IF_ERROR(
      ReadDouble(t, "wiggle_fraction", p, "a number in [0, 1)", &w.wiggle_fraction));
  if (!(w.wiggle_fraction >= 0 && w.wiggle_fraction < 1)) {
    return KeyError(p + "wiggle_fraction", "a number in [0, 1)");
  }
  ARBITER_RETURN_IF_ERROR(ReadBool(t, "shared_host_weights", p, &w.shared_host_weights));
  if (const toml::node* n = t.get("shared_host_weights_mode")) {
    // An octal string ("0600", "0660"); a TOML integer would be read as
    // decimal (600), which is never what was meant.
    auto str = n->value_exact<std::string>();
    const std::string what = "an octal mode string such as \"0600\" or \"0660\"";
    if (!str || str->empty() || str->size() > 4) return KeyError(p + "shared_host_weights_mode", what);
    uint32_t mode = 0;
    for (char ch : *str) {
      if (ch < '0' || ch > '7') return KeyError(p + "shared_host_weights_mode", what);
      mode = mode * 8 + static_cast<uint32_t>(ch - '0');
    }
    if ((mode & 0600) != 0600 || mode > 0777) {
      return KeyError(p + "shared_host_weights_mode",
                      what + " that keeps the owner's read and write bits");
    }
    w.shared_host_weights_mode = mode;
  }
  ARBITER_RETURN_IF_ERROR(
      ReadString(t, "shared_host_weights_prefix", p, &w.shared_host_weights_prefix));
  if (w.shared_host_weights_prefix.empty() || w.shared_host_weights_prefix.size() > 64 ||
      w.shared_host_weights_prefix.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
          std::string::npos) {
    return KeyError(p + "shared_host_weights_prefix",
                    "1 to 64 characters of [A-Za-z0-9._-]");
  }
  if (t.get("mode") != nullptr) {
    std::string mode;
    ARBITER_RETURN_IF_ERROR(ReadString(t, "mode", p, &mode));
    Result<ResidencyMode> parsed = ParseResidencyMode(mode);
    if (!parsed.ok()) {
      return KeyError(p + "mode",
                      fmt::format("\"self_managed\" or \"externally_managed\" (got \"{}\")", mode));
    }
    w.mode = *parsed;
  }
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "compaction_interval", p, 0, 1000000000,
                                    "an integer ≥ 0 (loads; 0 = never)",
                                    &w.compaction_every_loads));
  if (t.get("same_role") != nullptr) {
    std::string policy;
    ARBITER_RETURN_IF_ERROR(ReadString(t, "same_role", p, &policy));
    Result<SameRolePolicy> parsed = ParseSameRolePolicy(policy);
    if (!parsed.ok()) return KeyError(p + "same_role", parsed.status().message());
    c->same_role = *parsed;
  }
  WarnUnknown(t,
              {"budget", "headroom", "device_arena", "weight_cache_fraction", "wiggle_fraction",
               "shared_host_weights", "shared_host_weights_mode", "shared_host_weights_prefix",
               "mode", "compaction_interval", "same_role"},
              p, &c->warnings);
  return DeriveBudget(mem_total, p + "headroom", c);
}

// [devices."NAME"]: a SIZE written as bytes or text; the text is checked
// now (a percentage against a stand-in heap) and resolved when the device is
// opened.
Status ReadDeviceSize(const toml::table& t, const char* key, const std::string& p,
                      bool allow_zero, std::optional<std::string>* out) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return OkStatus();
  const std::string what = allow_zero ? "a size ≥ 0" : "a positive size";
  if (auto i = n->value_exact<int64_t>()) {
    if (*i < 0 || (*i == 0 && !allow_zero)) return KeyError(p + key, what);
    *out = std::to_string(*i);
    return OkStatus();
  }
  auto str = n->value_exact<std::string>();
  if (!str) return KeyError(p + key, "a size: bytes, \"512MiB\", \"2GB\" or \"10%\" of the heap");
  auto size = ParseSize(*str, uint64_t{1} << 40);
  if (!size.ok()) {
    return InvalidArgumentError(fmt::format("{}{} is invalid: {}", p, key, size.status().message()));
  }
  if (*size == 0 && !allow_zero) return KeyError(p + key, what);
  *out = *str;
  return OkStatus();
}

Status ParseDevices(const toml::table& devices, Config* c) {
  for (auto&& [k, v] : devices) {
    const std::string name(k.str());
    ARBITER_RETURN_IF_ERROR(ValidateDeviceName(name).WithPrefix("[devices]"));
    const std::string p = fmt::format("[devices.\"{}\"].", name);
    const toml::table* t = v.as_table();
    if (t == nullptr) return KeyError(p.substr(0, p.size() - 1), "a table");
    DeviceSettings d;
    d.name = name;
    ARBITER_RETURN_IF_ERROR(ReadDeviceSize(*t, "budget", p, /*allow_zero=*/false, &d.budget_text));
    std::optional<std::string> headroom;
    ARBITER_RETURN_IF_ERROR(ReadDeviceSize(*t, "headroom", p, /*allow_zero=*/true, &headroom));
    if (headroom) d.headroom_text = *headroom;
    for (auto&& [key, value] : *t) {
      if (key.str() != "budget" && key.str() != "headroom") {
        return InvalidArgumentError(fmt::format(
            "unknown key {}{} (a device takes budget and headroom)", p,
            std::string_view(key.str()).substr(0, 256)));
      }
    }
    c->devices.push_back(std::move(d));
  }
  return OkStatus();
}

Result<PressureSourceKind> ParsePressureSourceKind(std::string_view text, std::string_view key) {
  for (PressureSourceKind k : {PressureSourceKind::kAuto, PressureSourceKind::kMeminfo,
                               PressureSourceKind::kPsi, PressureSourceKind::kCgroup,
                               PressureSourceKind::kNone}) {
    if (text == PressureSourceKindName(k)) return k;
  }
  return InvalidArgumentError(fmt::format(
      "{} must be one of \"auto\", \"meminfo\", \"psi\", \"cgroup\", \"none\" (got \"{}\")",
      key, text));
}

Status ParsePressure(const toml::table& t, Config* c) {
  const std::string p = "[pressure].";
  PressureSettings& s = c->pressure;
  std::string source;
  ARBITER_RETURN_IF_ERROR(ReadString(t, "source", p, &source));
  if (t.get("source") != nullptr) {
    ARBITER_ASSIGN_OR_RETURN(s.source, ParsePressureSourceKind(source, p + "source"));
  }
  ARBITER_RETURN_IF_ERROR(
      ReadInt(t, "interval_ms", p, kMinPressurePollIntervalMs, 3600000,
              fmt::format("an integer in {}..3600000", kMinPressurePollIntervalMs), &s.interval_ms));
  ARBITER_RETURN_IF_ERROR(
      ReadDouble(t, "low_fraction", p, "a number in (0, 1)", &s.low_fraction));
  ARBITER_RETURN_IF_ERROR(
      ReadDouble(t, "critical_fraction", p, "a number in (0, 1)", &s.critical_fraction));
  if (!(s.low_fraction > 0 && s.low_fraction < 1)) {
    return KeyError(p + "low_fraction", "a number in (0, 1)");
  }
  if (!(s.critical_fraction > 0 && s.critical_fraction < 1)) {
    return KeyError(p + "critical_fraction", "a number in (0, 1)");
  }
  ARBITER_RETURN_IF_ERROR(ReadInt(t, "psi_window_ms", p, 500, 10000,
                                  "an integer in 500..10000", &s.psi_window_ms));
  ARBITER_RETURN_IF_ERROR(ReadInt(t, "psi_low_stall_ms", p, 1, 10000,
                                  "an integer in 1..psi_window_ms", &s.psi_low_stall_ms));
  ARBITER_RETURN_IF_ERROR(ReadInt(t, "psi_critical_stall_ms", p, 1, 10000,
                                  "an integer in 1..psi_window_ms", &s.psi_critical_stall_ms));
  ARBITER_RETURN_IF_ERROR(ReadInt(t, "psi_quiet_ms", p, 0, 86400000,
                                  "an integer in 0..86400000", &s.psi_quiet_ms));
  WarnUnknown(t,
              {"source", "interval_ms", "low_fraction", "critical_fraction", "psi_window_ms",
               "psi_low_stall_ms", "psi_critical_stall_ms", "psi_quiet_ms"},
              p, &c->warnings);
  return OkStatus();
}

// Reads a SIZE (integer bytes or a string; "0" allowed) into *bytes / *text.
Status ReadSizeAllowZero(const toml::table& t, const char* key, const std::string& p,
                         uint64_t mem_total, std::string_view what, uint64_t* bytes,
                         std::string* text) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return OkStatus();
  if (auto i = n->value_exact<int64_t>()) {
    if (*i < 0) return KeyError(p + key, what);
    *bytes = static_cast<uint64_t>(*i);
    *text = std::to_string(*i);
  } else if (auto str = n->value_exact<std::string>()) {
    auto size = ParseSize(*str, mem_total);
    if (!size.ok()) {
      return InvalidArgumentError(
          fmt::format("{}{} is invalid: {}", p, key, size.status().message()));
    }
    *bytes = *size;
    *text = *str;
  } else {
    return KeyError(p + key, what);
  }
  return OkStatus();
}

// Reads a duration (integer seconds or "30s", "5m", "1h", "250ms") into *ms,
// within [lo_ms, hi_ms].
Status ReadDuration(const toml::table& t, const char* key, const std::string& p, int64_t lo_ms,
                    int64_t hi_ms, std::string_view what, int64_t* ms) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return OkStatus();
  int64_t v = 0;
  if (auto i = n->value_exact<int64_t>()) {
    if (*i < 0 || *i > std::numeric_limits<int64_t>::max() / 1000) return KeyError(p + key, what);
    v = *i * 1000;
  } else if (auto str = n->value_exact<std::string>()) {
    ARBITER_ASSIGN_OR_RETURN(v, ParseDurationMs(*str, p + key));
  } else {
    return KeyError(p + key, what);
  }
  if (v < lo_ms || v > hi_ms) return KeyError(p + key, what);
  *ms = v;
  return OkStatus();
}

Status ParseKv(const toml::table& t, uint64_t mem_total, Config* c) {
  const std::string p = "[kv].";
  KvSettings& k = c->kv;
  ARBITER_RETURN_IF_ERROR(ReadString(t, "dir", p, &k.dir));
  if (t.get("dir") != nullptr && k.dir.empty()) return KeyError(p + "dir", "a non-empty path");
  constexpr int64_t kDay = 86400000;
  ARBITER_RETURN_IF_ERROR(ReadDuration(t, "ttl_short", p, 1000, 365 * kDay,
                                       "a duration from 1s to 365 days (e.g. \"5m\")",
                                       &k.ttl_short_ms));
  ARBITER_RETURN_IF_ERROR(ReadDuration(t, "ttl_long", p, 1000, 365 * kDay,
                                       "a duration from 1s to 365 days (e.g. \"1h\")",
                                       &k.ttl_long_ms));
  ARBITER_RETURN_IF_ERROR(ReadDuration(t, "ttl_extended", p, 1000, 365 * kDay,
                                       "a duration from 1s to 365 days (e.g. \"24h\")",
                                       &k.ttl_extended_ms));
  ARBITER_RETURN_IF_ERROR(ReadDuration(t, "conversation_ttl", p, 1000, 365 * kDay,
                                       "a duration from 1s to 365 days (e.g. \"1h\")",
                                       &k.conversation_ttl_ms));
  ARBITER_RETURN_IF_ERROR(ReadDuration(t, "eviction_interval", p, 1000, kDay,
                                       "a duration from 1s to 24h (e.g. \"5m\")",
                                       &k.eviction_interval_ms));
  ARBITER_RETURN_IF_ERROR(ReadDuration(t, "keepalive_interval", p, 100, kDay,
                                       "a duration from 100ms to 24h (e.g. \"30s\")",
                                       &k.keepalive_interval_ms));
  ARBITER_RETURN_IF_ERROR(ReadSizeAllowZero(t, "prompt_cache", p, mem_total,
                                            "a size ≥ 0: bytes, \"512MiB\" or \"5%\"",
                                            &k.prompt_cache_bytes, &k.prompt_cache_text));
  ARBITER_RETURN_IF_ERROR(ReadSizeAllowZero(t, "disk_budget", p, 0,
                                            "a size ≥ 0: bytes or \"4GiB\" (0 = unlimited)",
                                            &k.disk_budget_bytes, &k.disk_budget_text));
  WarnUnknown(t,
              {"dir", "ttl_short", "ttl_long", "ttl_extended", "conversation_ttl",
               "eviction_interval", "keepalive_interval", "prompt_cache", "disk_budget"},
              p, &c->warnings);
  return OkStatus();
}

// `engine` (with `language` and the process keys) of one [[models]] entry;
// the capability is already read.
Status ParseModelEngine(const toml::table& t, const std::string& p, const fs::path& base_dir,
                        ModelEntry* m) {
  m->engine = DefaultEngineFor(m->capability);
  const bool has_command = t.get("command") != nullptr;
  if (has_command) m->engine = ModelEngine::kProcess;
  if (t.get("engine") != nullptr) {
    std::string name;
    ARBITER_RETURN_IF_ERROR(ReadString(t, "engine", p, &name));
    std::optional<ModelEngine> parsed;
    for (ModelEngine e : {ModelEngine::kBuiltin, ModelEngine::kPocketSphinx, ModelEngine::kFlite,
                          ModelEngine::kEspeakNg, ModelEngine::kTesseract, ModelEngine::kProcess}) {
      if (ModelEngineName(e) == name) parsed = e;
    }
    if (!parsed) {
      return KeyError(p + "engine", fmt::format("one of \"builtin\", \"pocketsphinx\", \"flite\", "
                                                "\"espeak-ng\", \"tesseract\", \"process\" (got "
                                                "\"{}\")",
                                                name));
    }
    m->engine = *parsed;
  }
  // Which engine serves which capability.
  bool fits = false;
  switch (m->engine) {
    case ModelEngine::kBuiltin:
      fits = m->capability == Capability::kText || m->capability == Capability::kEmbedding;
      break;
    case ModelEngine::kPocketSphinx:
      fits = m->capability == Capability::kTranscribe || m->capability == Capability::kVad;
      break;
    case ModelEngine::kFlite:
    case ModelEngine::kEspeakNg:
      fits = m->capability == Capability::kSpeak;
      break;
    case ModelEngine::kTesseract:
      fits = m->capability == Capability::kVisionDescribe;
      break;
    case ModelEngine::kProcess:
      fits = m->capability != Capability::kVad;
      break;
  }
  if (!fits) {
    return InvalidArgumentError(fmt::format("{}engine \"{}\" cannot serve capability \"{}\"", p,
                                            ModelEngineName(m->engine),
                                            CapabilityName(m->capability)));
  }
  ARBITER_RETURN_IF_ERROR(ReadString(t, "language", p, &m->language));
  if (t.get("language") != nullptr) {
    if (m->engine != ModelEngine::kTesseract) return KeyError(p + "language", "set only on tesseract models");
    if (m->language.empty() || m->language.find_first_not_of(
                                   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+") !=
                                   std::string::npos) {
      return KeyError(p + "language", "a tessdata language name such as \"eng\" or \"eng+deu\"");
    }
  }
  const bool process_keys = has_command || t.get("health") != nullptr ||
                            t.get("ready_timeout_s") != nullptr ||
                            t.get("estimated_size") != nullptr;
  if (m->engine != ModelEngine::kProcess) {
    if (process_keys) {
      return InvalidArgumentError(fmt::format(
          "{}command, health, ready_timeout_s and estimated_size are set only on process models "
          "(engine = \"process\")",
          p));
    }
    return OkStatus();
  }
  ProcessCommand& pc = m->process;
  const toml::array* argv = t.get("command") != nullptr ? t.get("command")->as_array() : nullptr;
  if (argv == nullptr || argv->empty()) {
    return KeyError(p + "command", "a non-empty array of strings: [\"/path/to/server\", \"--port\", "
                                   "\"{port}\", ...]");
  }
  for (const toml::node& n : *argv) {
    auto str = n.value_exact<std::string>();
    if (!str || str->empty()) return KeyError(p + "command", "an array of non-empty strings");
    pc.argv.push_back(*str);
  }
  if (pc.argv[0].find('/') != std::string::npos && fs::path(pc.argv[0]).is_relative()) {
    pc.argv[0] = (base_dir / pc.argv[0]).lexically_normal().string();
  }
  ARBITER_RETURN_IF_ERROR(ReadString(t, "health", p, &pc.health));
  if (pc.health.empty() || pc.health[0] != '/') return KeyError(p + "health", "a path starting with /");
  int64_t ready_s = pc.ready_timeout_ms / 1000;
  ARBITER_RETURN_IF_ERROR(ReadIntAs(t, "ready_timeout_s", p, 1, 86400, "an integer in 1..86400",
                                    &ready_s));
  pc.ready_timeout_ms = ready_s * 1000;
  if (const toml::node* n = t.get("estimated_size")) {
    if (auto i = n->value_exact<int64_t>(); i && *i > 0) {
      pc.estimated_bytes = static_cast<uint64_t>(*i);
      pc.estimated_size_text = std::to_string(*i);
    } else if (auto str = n->value_exact<std::string>()) {
      Result<uint64_t> size = ParseSize(*str, 0);
      if (!size.ok() || *size == 0) return KeyError(p + "estimated_size", "a positive size: bytes or \"2GiB\"");
      pc.estimated_bytes = *size;
      pc.estimated_size_text = *str;
    } else {
      return KeyError(p + "estimated_size", "a positive size: bytes or \"2GiB\"");
    }
  }
  return OkStatus();
}

Status ParseModels(const toml::array& arr, const fs::path& base_dir, Config* c) {
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string p = fmt::format("[[models]][{}].", i);
    const toml::table* t = arr[i].as_table();
    if (t == nullptr) return KeyError(fmt::format("[[models]][{}]", i), "a table");
    ModelEntry m;
    ARBITER_RETURN_IF_ERROR(ReadString(*t, "name", p, &m.name));
    if (m.name.empty()) return KeyError(p + "name", "a non-empty string");
    std::string cap;
    ARBITER_RETURN_IF_ERROR(ReadString(*t, "capability", p, &cap));
    if (!cap.empty()) {
      auto parsed = ParseCapability(cap);
      if (!parsed.ok()) {
        return KeyError(p + "capability",
                        "one of \"text\", \"embedding\", \"vision-describe\", \"image-gen\", "
                        "\"transcribe\", \"speak\", \"vad\"");
      }
      m.capability = *parsed;
    }
    ARBITER_RETURN_IF_ERROR(ParseModelEngine(*t, p, base_dir, &m));
    ARBITER_RETURN_IF_ERROR(ReadString(*t, "path", p, &m.path));
    if (m.engine == ModelEngine::kBuiltin && m.path.empty()) {
      return KeyError(p + "path", "a non-empty string (the model directory)");
    }
    if (t->get("path") != nullptr && m.path.empty()) return KeyError(p + "path", "a non-empty path");
    if (!m.path.empty()) {
      fs::path path(m.path);
      if (path.is_relative()) path = base_dir / path;
      m.path = path.lexically_normal().string();
    }
    ARBITER_RETURN_IF_ERROR(ReadIntAs(*t, "queue", p, 1, 100000, "an integer in 1..100000",
                                      &m.queue));
    ARBITER_RETURN_IF_ERROR(ReadString(*t, "vision", p, &m.vision));
    if (!m.vision.empty() && m.capability != Capability::kText) {
      return KeyError(p + "vision", "set only on text models");
    }
    ARBITER_RETURN_IF_ERROR(ReadIntAs(*t, "parallel", p, 1, kMaxParallel,
                                      fmt::format("an integer in 1..{}", kMaxParallel),
                                      &m.parallel));
    ARBITER_RETURN_IF_ERROR(ReadIntAs(*t, "ctx", p, 1, std::numeric_limits<int32_t>::max(),
                                      "a positive integer", &m.ctx));
    if (t->get("role") != nullptr) {
      std::string role;
      ARBITER_RETURN_IF_ERROR(ReadString(*t, "role", p, &role));
      auto parsed = ParseResidentRole(role);
      if (!parsed.ok()) {
        std::string names;
        for (size_t r = 0; r < kResidentRoleCount; ++r) {
          if (!names.empty()) names += ", ";
          names += fmt::format("\"{}\"", ResidentRoleName(static_cast<ResidentRole>(r)));
        }
        return KeyError(p + "role", fmt::format("one of {} (got \"{}\")", names, role));
      }
      m.role = *parsed;
    }
    if (const toml::node* n = t->get("idle_ttl")) {
      if (auto i = n->value_exact<int64_t>()) {
        if (*i < 0 || *i > std::numeric_limits<int64_t>::max() / 1000) {
          return KeyError(p + "idle_ttl", "a duration ≥ 0 (seconds, or e.g. \"5m\")");
        }
        m.idle_ttl_ms = *i * 1000;
      } else if (auto str = n->value_exact<std::string>()) {
        ARBITER_ASSIGN_OR_RETURN(int64_t ms, ParseDurationMs(*str, p + "idle_ttl"));
        m.idle_ttl_ms = ms;
      } else {
        return KeyError(p + "idle_ttl", "a duration: integer seconds or \"30s\", \"5m\", \"1h\"");
      }
      if (*m.idle_ttl_ms == 0) m.idle_ttl_ms.reset();  // 0 = off
    }
    if (t->get("residency") != nullptr) {
      std::string residency;
      ARBITER_RETURN_IF_ERROR(ReadString(*t, "residency", p, &residency));
      Result<ResidencyState> parsed = ParseResidencyState(residency);
      if (!parsed.ok()) {
        return KeyError(p + "residency",
                        fmt::format("\"unpinned\", \"pinned_system\" or \"pinned_device\" "
                                    "(got \"{}\")",
                                    residency));
      }
      m.residency = *parsed;
    }
    ARBITER_RETURN_IF_ERROR(ReadString(*t, "system_prompt", p, &m.system_prompt));
    if (!m.system_prompt.empty() && m.capability != Capability::kText) {
      return KeyError(p + "system_prompt", "set only on text models");
    }
    if (t->get("same_role") != nullptr) {
      std::string policy;
      ARBITER_RETURN_IF_ERROR(ReadString(*t, "same_role", p, &policy));
      Result<SameRolePolicy> parsed = ParseSameRolePolicy(policy);
      if (!parsed.ok()) return KeyError(p + "same_role", parsed.status().message());
      m.same_role = *parsed;
    }
    if (t->get("compute_dtype") != nullptr) {
      std::string dtype;
      ARBITER_RETURN_IF_ERROR(ReadString(*t, "compute_dtype", p, &dtype));
      if (dtype != "auto" && dtype != "f32") {
        return KeyError(p + "compute_dtype", fmt::format("\"auto\" or \"f32\" (got \"{}\")", dtype));
      }
      m.compute_f32 = dtype == "f32";
    }
    if (t->get("kv_type") != nullptr) {
      std::string name;
      ARBITER_RETURN_IF_ERROR(ReadString(*t, "kv_type", p, &name));
      const std::optional<GgmlType> type = ParseKvType(name);
      if (!type) {
        return KeyError(p + "kv_type", fmt::format("one of \"f16\" (default), \"bf16\", "
                                                   "\"q8_0\", \"f32\" (got \"{}\")",
                                                   name));
      }
      m.kv_type = *type;
    }
    if (t->get("device") != nullptr) {
      ARBITER_RETURN_IF_ERROR(ReadString(*t, "device", p, &m.device));
      if (m.device != "cpu" && m.device != "vulkan" && !ValidateDeviceName(m.device).ok()) {
        return KeyError(p + "device", fmt::format("\"cpu\" (default), \"vulkan\" or "
                                                  "\"vulkan:N\" (`arbiter devices` lists them; "
                                                  "got \"{}\")",
                                                  ClipInput(m.device, 64)));
      }
      if (m.device != "cpu" && m.engine != ModelEngine::kBuiltin) {
        return KeyError(p + "device", fmt::format("only the built-in engine computes on a "
                                                  "device (engine is \"{}\")",
                                                  ModelEngineName(m.engine)));
      }
      if (m.device != "cpu" && m.kv_type != GgmlType::kF16) {
        return KeyError(p + "kv_type", fmt::format("\"f16\" on device \"{}\" (the Vulkan "
                                                   "kernels keep the KV cache in f16)",
                                                   m.device));
      }
    }
    if (t->get("device_layers") != nullptr) {
      ARBITER_RETURN_IF_ERROR(ReadIntAs(*t, "device_layers", p, 0, 100000,
                                        "an integer ≥ 0 (layers on the device)",
                                        &m.device_layers));
      if (m.device == "cpu") {
        return KeyError(p + "device_layers", "used only with device = \"vulkan\" or "
                                             "\"vulkan:N\" (layers on that device)");
      }
    }
    if (t->get("chat_template") != nullptr) {
      std::string name;
      ARBITER_RETURN_IF_ERROR(ReadString(*t, "chat_template", p, &name));
      Result<ChatTemplateKind> kind = ParseChatTemplateName(name);
      if (!kind.ok()) {
        return KeyError(p + "chat_template",
                        fmt::format("one of \"chatml\", \"llama3\", \"llama2\", \"mistral\", "
                                    "\"gemma\", \"phi3\" (got \"{}\")",
                                    name));
      }
      if (m.capability != Capability::kText) {
        return KeyError(p + "chat_template", "set only on text models");
      }
      m.chat_template = *kind;
    }
    WarnUnknown(*t,
                {"name", "path", "capability", "role", "idle_ttl", "parallel", "ctx",
                 "residency", "system_prompt", "same_role", "compute_dtype", "kv_type",
                 "device_layers", "device", "chat_template", "engine", "language", "queue", "vision", "command", "health",
                 "ready_timeout_s", "estimated_size"},
                p, &c->warnings);
    c->models.push_back(std::move(m));
  }
  return OkStatus();
}

}  // namespace

std::string_view ModelEngineName(ModelEngine engine) {
  switch (engine) {
    case ModelEngine::kBuiltin: return "builtin";
    case ModelEngine::kPocketSphinx: return "pocketsphinx";
    case ModelEngine::kFlite: return "flite";
    case ModelEngine::kEspeakNg: return "espeak-ng";
    case ModelEngine::kTesseract: return "tesseract";
    case ModelEngine::kProcess: return "process";
  }
  return "unknown";
}

ModelEngine DefaultEngineFor(Capability capability) {
  switch (capability) {
    case Capability::kText:
    case Capability::kEmbedding: return ModelEngine::kBuiltin;
    case Capability::kTranscribe:
    case Capability::kVad: return ModelEngine::kPocketSphinx;
    case Capability::kSpeak: return ModelEngine::kFlite;
    case Capability::kVisionDescribe: return ModelEngine::kTesseract;
    case Capability::kImageGen: return ModelEngine::kProcess;
  }
  return ModelEngine::kBuiltin;
}

std::string_view PressureSourceKindName(PressureSourceKind kind) {
  switch (kind) {
    case PressureSourceKind::kAuto: return "auto";
    case PressureSourceKind::kMeminfo: return "meminfo";
    case PressureSourceKind::kPsi: return "psi";
    case PressureSourceKind::kCgroup: return "cgroup";
    case PressureSourceKind::kNone: return "none";
  }
  return "auto";
}

Result<int64_t> ParseDurationMs(std::string_view text, std::string_view key) {
  const auto bad = [&] {
    return InvalidArgumentError(fmt::format(
        "{} must be a duration such as \"30s\", \"5m\", \"1h\", \"250ms\" or integer "
        "seconds (got \"{}\")",
        key, text));
  };
  size_t i = 0;
  int64_t n = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (n > (std::numeric_limits<int64_t>::max() / 10 - 9) / 3600000) return bad();
    n = n * 10 + (text[i] - '0');
    ++i;
  }
  if (i == 0) return bad();
  const std::string_view unit = text.substr(i);
  if (unit == "ms") return n;
  if (unit.empty() || unit == "s") return n * 1000;
  if (unit == "m") return n * 60000;
  if (unit == "h") return n * 3600000;
  return bad();
}

Status ValidateDeviceName(std::string_view name) {
  constexpr std::string_view kPrefix = "vulkan:";
  std::string_view index = name.substr(0, std::min(name.size(), kPrefix.size())) == kPrefix
                               ? name.substr(kPrefix.size())
                               : std::string_view();
  bool ok = !index.empty() && index.size() <= 3 && (index.size() == 1 || index[0] != '0');
  for (char ch : index) ok = ok && ch >= '0' && ch <= '9';
  if (ok) return OkStatus();
  return InvalidArgumentError(fmt::format(
      "device \"{}\" is not a device name; use \"vulkan:N\" (N = 0, 1, ...: the N-th Vulkan "
      "device, as `arbiter devices` lists them)",
      name.substr(0, 64)));
}

std::string_view SameRolePolicyName(SameRolePolicy policy) {
  return policy == SameRolePolicy::kSwap ? "swap" : "coexist";
}

Result<SameRolePolicy> ParseSameRolePolicy(std::string_view text) {
  if (text == "coexist") return SameRolePolicy::kCoexist;
  if (text == "swap") return SameRolePolicy::kSwap;
  return InvalidArgumentError(fmt::format("\"coexist\" or \"swap\" (got \"{}\")", text));
}

uint64_t DefaultBudgetBytes(uint64_t mem_total_bytes) {
  if (mem_total_bytes > kDefaultHeadroomBytes &&
      mem_total_bytes - kDefaultHeadroomBytes >= mem_total_bytes / 4) {
    return mem_total_bytes - kDefaultHeadroomBytes;
  }
  return mem_total_bytes / 2;
}

Config DefaultConfig(uint64_t mem_total_bytes) {
  Config c;
  c.budget_bytes = DefaultBudgetBytes(mem_total_bytes);
  return c;
}

Result<Config> ParseConfigToml(std::string_view text, const std::string& file,
                               uint64_t mem_total_bytes) {
  Config c = DefaultConfig(mem_total_bytes);
  toml::table root;
  try {
    root = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    return InvalidArgumentError(fmt::format("{}:{}:{}: {}", file, e.source().begin.line,
                                            e.source().begin.column, e.description()));
  }
  // The non-throwing overload: fs::absolute throws when the working
  // directory is gone.
  std::error_code ec;
  fs::path base_dir = fs::absolute(fs::path(file), ec).parent_path();
  if (ec) base_dir = fs::path(file).parent_path();
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    if (key == "server") {
      const toml::table* t = v.as_table();
      if (t == nullptr) return KeyError("[server]", "a table");
      ARBITER_RETURN_IF_ERROR(ParseServer(*t, &c));
    } else if (key == "memory") {
      const toml::table* t = v.as_table();
      if (t == nullptr) return KeyError("[memory]", "a table");
      ARBITER_RETURN_IF_ERROR(ParseMemory(*t, mem_total_bytes, &c));
    } else if (key == "pressure") {
      const toml::table* t = v.as_table();
      if (t == nullptr) return KeyError("[pressure]", "a table");
      ARBITER_RETURN_IF_ERROR(ParsePressure(*t, &c));
    } else if (key == "kv") {
      const toml::table* t = v.as_table();
      if (t == nullptr) return KeyError("[kv]", "a table");
      ARBITER_RETURN_IF_ERROR(ParseKv(*t, mem_total_bytes, &c));
    } else if (key == "devices") {
      const toml::table* t = v.as_table();
      if (t == nullptr) return KeyError("[devices]", "a table of device tables ([devices.\"vulkan:0\"])");
      ARBITER_RETURN_IF_ERROR(ParseDevices(*t, &c));
    } else if (key == "models") {
      const toml::array* a = v.as_array();
      if (a == nullptr) return KeyError("models", "an array of tables ([[models]])");
      ARBITER_RETURN_IF_ERROR(ParseModels(*a, base_dir, &c));
    } else {
      c.warnings.push_back(fmt::format("unknown section or key \"{}\" (ignored)", key));
    }
  }
  ARBITER_RETURN_IF_ERROR(ValidateConfig(c).WithPrefix(file));
  return c;
}

Result<Config> LoadConfigFile(const std::string& path, uint64_t mem_total_bytes) {
  auto text = ReadFile(path, 16u << 20);
  if (!text.ok()) {
    return Status(text.status().code(),
                  fmt::format("cannot read config file: {}", text.status().message()));
  }
  return ParseConfigToml(*text, path, mem_total_bytes);
}

Status ApplyEnvOverrides(const EnvLookup& env, uint64_t mem_total_bytes, Config* config) {
  if (const char* v = env("ARBITER_HOST"); v != nullptr && *v != '\0') config->server.host = v;
  if (const char* v = env("ARBITER_PORT"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    long port = std::strtol(v, &end, 10);
    if (*end != '\0' || port < 0 || port > 65535) {
      return InvalidArgumentError(
          fmt::format("ARBITER_PORT must be an integer in 0..65535 (got \"{}\")", v));
    }
    config->server.port = static_cast<int>(port);
  }
  if (const char* v = env("ARBITER_API_KEY"); v != nullptr) config->server.api_key = v;
  if (const char* v = env("ARBITER_ALLOWED_HOSTS"); v != nullptr && *v != '\0') {
    // Comma-separated, spaces around the names ignored.
    std::vector<std::string> hosts;
    std::string_view rest = v;
    while (true) {
      const size_t comma = rest.find(',');
      std::string_view h = rest.substr(0, comma);
      while (!h.empty() && h.front() == ' ') h.remove_prefix(1);
      while (!h.empty() && h.back() == ' ') h.remove_suffix(1);
      if (!ValidAllowedHost(h)) {
        return InvalidArgumentError(
            fmt::format("ARBITER_ALLOWED_HOSTS must be {} separated by commas (got \"{}\")",
                        kAllowedHostsWhat, v));
      }
      hosts.emplace_back(h);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    config->server.allowed_hosts = std::move(hosts);
  }
  if (const char* v = env("ARBITER_BUDGET"); v != nullptr && *v != '\0') {
    ARBITER_RETURN_IF_ERROR(ParseBudget(v, mem_total_bytes, "ARBITER_BUDGET", &config->budget_bytes));
    config->budget_text = v;
  }
  if (const char* v = env("ARBITER_HEADROOM"); v != nullptr && *v != '\0') {
    ARBITER_RETURN_IF_ERROR(ParseHeadroom(v, mem_total_bytes, "ARBITER_HEADROOM", config));
    ARBITER_RETURN_IF_ERROR(DeriveBudget(mem_total_bytes, "ARBITER_HEADROOM", config));
  }
  if (const char* v = env("ARBITER_PRESSURE_SOURCE"); v != nullptr && *v != '\0') {
    ARBITER_ASSIGN_OR_RETURN(config->pressure.source,
                             ParsePressureSourceKind(v, "ARBITER_PRESSURE_SOURCE"));
  }
  return OkStatus();
}

Status ValidateConfig(const Config& config) {
  std::set<std::string> names;
  for (size_t i = 0; i < config.models.size(); ++i) {
    if (!names.insert(config.models[i].name).second) {
      return InvalidArgumentError(fmt::format("[[models]][{}].name \"{}\" is used twice; model "
                                              "names must be unique",
                                              i, config.models[i].name));
    }
  }
  for (size_t i = 0; i < config.models.size(); ++i) {
    const ModelEntry& m = config.models[i];
    if (m.vision.empty()) continue;
    auto it = std::find_if(config.models.begin(), config.models.end(),
                           [&](const ModelEntry& o) { return o.name == m.vision; });
    if (it == config.models.end() || it->capability != Capability::kVisionDescribe) {
      return InvalidArgumentError(fmt::format(
          "[[models]][{}].vision \"{}\" must name a configured vision-describe model", i, m.vision));
    }
  }
  if (config.server.port < 0 || config.server.port > 65535) {
    return KeyError("[server].port", "an integer in 0..65535");
  }
  if (config.budget_bytes == 0) return KeyError("[memory].budget", "a positive size");
  const PressureSettings& p = config.pressure;
  if (p.critical_fraction >= p.low_fraction) {
    return InvalidArgumentError(fmt::format(
        "[pressure].critical_fraction ({}) must be < [pressure].low_fraction ({})",
        p.critical_fraction, p.low_fraction));
  }
  if (p.psi_low_stall_ms > p.psi_window_ms) {
    return KeyError("[pressure].psi_low_stall_ms", "≤ [pressure].psi_window_ms");
  }
  if (p.psi_critical_stall_ms > p.psi_window_ms) {
    return KeyError("[pressure].psi_critical_stall_ms", "≤ [pressure].psi_window_ms");
  }
  const KvSettings& k = config.kv;
  if (k.ttl_short_ms > k.ttl_long_ms || k.ttl_long_ms > k.ttl_extended_ms) {
    return InvalidArgumentError(fmt::format(
        "[kv] TTL classes must satisfy ttl_short ({} ms) ≤ ttl_long ({} ms) ≤ ttl_extended ({} ms)",
        k.ttl_short_ms, k.ttl_long_ms, k.ttl_extended_ms));
  }
  // A conversation untouched for 0.8 × ttl_short is re-warmed at the next
  // keep-alive pass, at most one interval later: that must still be inside
  // the short TTL (docs/kv-precache.md "Defects of the reference, fixed":
  // keep-alive before the short TTL).
  if (static_cast<double>(k.keepalive_interval_ms) >=
      (1.0 - kKeepAliveStaleFraction) * static_cast<double>(k.ttl_short_ms)) {
    return InvalidArgumentError(fmt::format(
        "[kv].keepalive_interval ({} ms) must be shorter than {:.0f}% of [kv].ttl_short ({} ms), "
        "so an idle prewarmed conversation is re-warmed before its short TTL runs out",
        k.keepalive_interval_ms, (1.0 - kKeepAliveStaleFraction) * 100, k.ttl_short_ms));
  }
  return OkStatus();
}

Result<std::string> DefaultStateDir(const EnvLookup& env) {
  if (const char* xdg = env("XDG_STATE_HOME"); xdg != nullptr && *xdg == '/') {
    return (fs::path(xdg) / "arbiter").string();
  }
  if (const char* home = env("HOME"); home != nullptr && *home != '\0') {
    return (fs::path(home) / ".local" / "state" / "arbiter").string();
  }
  return FailedPreconditionError(
      "cannot pick a state directory: neither XDG_STATE_HOME nor HOME is set; pass --state-dir");
}

}  // namespace arbiter
