// arbiter — the command-line tool (docs/architecture.md, the layer table: tools).
//
//   arbiter serve [--config FILE] [--host H] [--port P] [--state-dir DIR]
//                 [--budget SIZE] [--api-key KEY]
//   arbiter make-model --preset NAME --out DIR|FILE.gguf [--seed N]
//                      [--format safetensors|gguf] [--dtype TYPE]
//   arbiter inspect PATH [--json]
//   arbiter generate --model DIR|FILE.gguf (--prompt TEXT | --prompt-ids 1,2,3) [...]
//   arbiter bench decode|arbiter|weights|kv ...  (tools/arbiter/bench_commands.h)
//   arbiter budget --arena SIZE [--fraction F] [--wiggle W] [--max-scratch SIZE]
//                  [--pinned SIZE] [--json]
//
// Exit status: 0 on success (serve: after SIGINT/SIGTERM and a clean
// shutdown), 1 on any error (message on stderr; serve: also a shutdown that
// did not finish within [server] shutdown_timeout_s), 2 on bad usage.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/buffer_memory.h"
#include "arbiter/base/size.h"
#include "arbiter/engine/engine.h"
#include "arbiter/engine/tokenizer.h"
#include "arbiter/formats/inspect.h"
#include "arbiter/memory/system_memory.h"
#include "arbiter/runtime/config.h"
#include "arbiter/runtime/models.h"
#include "arbiter/runtime/runtime.h"
#include "arbiter/server/server.h"
#include "arbiter/server/shutdown_deadline.h"
#include "arbiter/weights/weight_budget.h"
#include "tools/arbiter/bench_commands.h"
#include "tools/arbiter/devices_command.h"
#include "tools/model_maker/model_maker.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

int Fail(const std::string& message) {
  std::fprintf(stderr, "arbiter: %s\n", message.c_str());
  return 1;
}

const char* GetEnv(const char* name) { return std::getenv(name); }

// ---- make-model -------------------------------------------------------------

Status MakeModelWithProgress(const std::string& preset, const std::string& out,
                             const MakeModelOptions& options) {
  std::string last_stage;
  int last_pct = -1;
  auto progress = [&](std::string_view stage, double fraction) {
    const int pct = static_cast<int>(fraction * 100.0);
    if (stage != last_stage || pct / 10 != last_pct / 10) {
      std::fprintf(stderr, "  %-10.*s %3d%%\n", static_cast<int>(stage.size()), stage.data(), pct);
      last_stage = std::string(stage);
      last_pct = pct;
    }
  };
  std::fprintf(stderr, "making model \"%s\" (seed %llu%s%s) in %s\n", preset.c_str(),
               static_cast<unsigned long long>(options.seed),
               options.format == ModelFormat::kGguf ? ", gguf" : "",
               options.dtype.empty() ? "" : (", " + options.dtype).c_str(), out.c_str());
  return MakeModel(preset, out, options, progress);
}

Status MakeModelWithProgress(const std::string& preset, const std::string& out, uint64_t seed) {
  MakeModelOptions options;
  options.seed = seed;
  return MakeModelWithProgress(preset, out, options);
}

struct MakeModelFlags {
  std::string preset;
  std::string out;
  uint64_t seed = 0;
  std::string format = "safetensors";
  std::string dtype;
};

int RunMakeModel(const MakeModelFlags& flags) {
  if (ModelPresetDescription(flags.preset).empty()) {
    std::string names;
    for (const std::string& p : ModelPresetNames()) {
      if (!names.empty()) names += ", ";
      names += p;
    }
    return Fail(fmt::format("unknown preset \"{}\"; presets: {}", flags.preset, names));
  }
  MakeModelOptions options;
  options.seed = flags.seed;
  options.dtype = flags.dtype;
  Result<ModelFormat> format = ParseModelFormat(flags.format);
  if (!format.ok()) return Fail(format.status().message());
  options.format = *format;
  if (!options.dtype.empty()) {
    Result<GgmlType> type = ParseModelDtype(options.dtype, options.format);
    if (!type.ok()) return Fail(type.status().message());
  }
  Status s = MakeModelWithProgress(flags.preset, flags.out, options);
  if (!s.ok()) return Fail(s.message());
  std::printf("wrote %s\n", flags.out.c_str());
  return 0;
}

// ---- inspect ----------------------------------------------------------------

// Prints the inspection (even of a model with problems, so the tensors can
// be seen) and exits 1 when its config did not parse or map (config.json, or
// a GGUF file's metadata); then, for a model directory with a config.json,
// runs the engine's header-only validation (config.json, tokenizer.json,
// every tensor's presence and shape against the config) and exits 1 with its
// error when `serve` could not load the model.
int RunInspect(const std::string& path, bool as_json) {
  Result<ModelInspection> info = InspectModel(path);
  if (!info.ok()) return Fail(fmt::format("cannot inspect {}: {}", path, info.status().message()));
  if (as_json) {
    std::cout << RenderInspectionJson(*info) << "\n";
  } else {
    std::cout << RenderInspectionText(*info);
  }
  std::cout.flush();
  if (!info->config_error.empty()) return Fail(info->config_error);  // names the file
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) &&
      std::filesystem::exists(std::filesystem::path(path) / "config.json", ec)) {
    if (Status s = Engine::Validate(path); !s.ok()) return Fail(s.message());
  }
  return 0;
}

// ---- generate ---------------------------------------------------------------

struct GenerateFlags {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  int max_tokens = 32;
  double temperature = 0.0;
  double top_p = 1.0;
  int top_k = 0;
  int64_t seed = -1;
  int ctx = 2048;
  bool ignore_eos = false;
  bool json = false;
  std::string compute_dtype = "auto";
  std::string kv_type = "f16";
  std::string device = "cpu";
};

Result<std::vector<int32_t>> ParseIdList(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX) {
      return InvalidArgumentError(
          fmt::format("--prompt-ids: \"{}\" is not a token id (expected e.g. 1,2,3)", item));
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return InvalidArgumentError("--prompt-ids is empty");
  return ids;
}

// One generation through the same Runtime path as `serve` (weights in the
// ledger-charged WeightCache, the model's KV precache, the arbiter), on a
// one-model config in a temporary state directory removed afterwards.
int RunGenerate(const GenerateFlags& f) {
  // Runtime components log at info level; only warnings and errors (on
  // stderr) are wanted beside the result.
  spdlog::set_level(spdlog::level::warn);
  uint64_t mem_total = 0;
  if (Result<SystemMemoryInfo> mem = ReadSystemMemory(); mem.ok()) mem_total = mem->total_bytes;
  Config config = DefaultConfig(mem_total);
  if (config.budget_bytes == 0) config.budget_bytes = 8ull << 30;
  config.pressure.source = PressureSourceKind::kNone;
  config.kv.prompt_cache_bytes = 0;
  std::string tmpl = (fs::temp_directory_path() / "arbiter-generate-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return Fail(fmt::format("cannot create a temporary state directory: {}", std::strerror(errno)));
  }
  config.state_dir = tmpl;
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove_state{tmpl};
  ModelEntry m;
  m.name = "model";
  m.path = fs::absolute(f.model).string();
  m.ctx = f.ctx;
  m.parallel = 1;
  m.compute_f32 = f.compute_dtype == "f32";
  m.kv_type = *ParseKvType(f.kv_type);
  m.device = f.device;
  config.models.push_back(m);
  Result<std::unique_ptr<Runtime>> runtime = Runtime::Create(config);
  if (!runtime.ok()) return Fail(fmt::format("cannot load {}: {}", f.model, runtime.status().message()));
  TextRequest tr;
  tr.model = m.name;
  tr.chat = false;
  if (!f.prompt_ids.empty()) {
    Result<std::vector<int32_t>> ids = ParseIdList(f.prompt_ids);
    if (!ids.ok()) return Fail(ids.status().message());
    tr.prompt_ids = *ids;
    tr.prompt_is_ids = true;
  } else {
    tr.prompt = f.prompt;
  }
  tr.max_tokens = f.max_tokens;
  tr.ignore_eos = f.ignore_eos;
  tr.sampling.temperature = static_cast<float>(f.temperature);
  tr.sampling.top_p = static_cast<float>(f.top_p);
  tr.sampling.top_k = f.top_k;
  if (f.seed >= 0) {
    tr.sampling.has_seed = true;
    tr.sampling.seed = static_cast<uint64_t>(f.seed);
  }
  Result<std::unique_ptr<TextGeneration>> admitted = (*runtime)->StartText(std::move(tr));
  if (!admitted.ok()) {
    return Fail(fmt::format("cannot load {}: {}", f.model, admitted.status().message()));
  }
  GenerationRequest req;
  req.prompt_ids = (*admitted)->prompt_ids();
  Result<TextResult> ran = (*admitted)->Run([](std::string_view) { return true; }, nullptr);
  if (!ran.ok()) return Fail(fmt::format("generation failed: {}", ran.status().message()));
  const GenerationResult* r = &ran->generation;
  const GenerationTimings& t = r->timings;
  const double decode_tok_s = t.decode_ms > 0 ? t.decode_tokens / (t.decode_ms / 1000.0) : 0;
  const double prefill_tok_s = t.prefill_ms > 0 ? t.prefill_tokens / (t.prefill_ms / 1000.0) : 0;
  if (f.json) {
    nlohmann::json j = {
        {"prompt_ids", req.prompt_ids},
        {"output_ids", r->output_ids},
        {"text", r->text},
        {"finish_reason", FinishReasonName(r->finish_reason)},
        {"timings",
         {{"prefill_ms", t.prefill_ms},
          {"decode_ms", t.decode_ms},
          {"prefill_tokens", t.prefill_tokens},
          {"decode_tokens", t.decode_tokens},
          {"prefill_tokens_per_s", prefill_tok_s},
          {"decode_tokens_per_s", decode_tok_s}}}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  auto join = [](const std::vector<int32_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) s += ',';
      s += std::to_string(v[i]);
    }
    return s;
  };
  std::cout << "prompt_ids: " << join(req.prompt_ids) << "\n"
            << "output_ids: " << join(r->output_ids) << "\n"
            << "text: " << r->text << "\n"
            << "finish_reason: " << FinishReasonName(r->finish_reason) << "\n"
            << fmt::format("timings: prefill {} tokens in {:.1f} ms ({:.1f} tok/s), decode {} "
                           "tokens in {:.1f} ms ({:.1f} tok/s)\n",
                           t.prefill_tokens, t.prefill_ms, prefill_tok_s, t.decode_tokens,
                           t.decode_ms, decode_tok_s);
  return 0;
}

// ---- budget -----------------------------------------------------------------

struct BudgetFlags {
  std::string arena;
  double fraction = kDefaultWeightFraction;
  double wiggle = kDefaultWeightWiggle;
  std::string max_scratch = "0";
  std::string pinned = "0";
  bool json = false;
};

int BudgetUsage(const std::string& message) {
  std::fprintf(stderr, "arbiter budget: %s\n", message.c_str());
  return 2;
}

std::string SizeText(uint64_t bytes) { return fmt::format("{} ({} bytes)", FormatSize(bytes), bytes); }

// Solves the WeightBudget (the formula in docs/config.md "[memory]"). Bad values
// are usage errors (exit 2) naming the flag.
int RunBudget(const BudgetFlags& f) {
  // Only --arena may be a percentage of RAM; without /proc/meminfo a
  // percentage is refused by ParseSize ("percent not allowed here").
  uint64_t ram_bytes = 0;
  if (Result<SystemMemoryInfo> mem = ReadSystemMemory(); mem.ok()) ram_bytes = mem->total_bytes;
  Result<uint64_t> arena = ParseSize(f.arena, ram_bytes);
  if (!arena.ok()) return BudgetUsage("--arena: " + arena.status().message());
  Result<uint64_t> max_scratch = ParseSize(f.max_scratch);
  if (!max_scratch.ok()) return BudgetUsage("--max-scratch: " + max_scratch.status().message());
  Result<uint64_t> pinned = ParseSize(f.pinned);
  if (!pinned.ok()) return BudgetUsage("--pinned: " + pinned.status().message());
  // Its messages start with the parameter's name ("fraction ...", "wiggle ...").
  Result<WeightBudget> b = SolveWeightBudget(*arena, f.fraction, f.wiggle, *max_scratch, *pinned);
  if (!b.ok()) return BudgetUsage("--" + b.status().message());

  if (f.json) {
    nlohmann::json j = {{"scratch_ceiling", b->scratch_ceiling_bytes},
                        {"weight_pool", b->weight_pool_bytes},
                        {"on_demand_budget", b->on_demand_budget_bytes},
                        {"pinned_over_commit", b->pinned_over_commit}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("arena               %s\n", SizeText(*arena).c_str());
  std::printf("fraction            %g\n", f.fraction);
  std::printf("wiggle              %g\n", f.wiggle);
  std::printf("max scratch         %s\n", SizeText(*max_scratch).c_str());
  std::printf("pinned              %s\n", SizeText(*pinned).c_str());
  std::printf("scratch ceiling     %s\n", SizeText(b->scratch_ceiling_bytes).c_str());
  std::printf("weight pool         %s\n", SizeText(b->weight_pool_bytes).c_str());
  std::printf("on-demand budget    %s\n", SizeText(b->on_demand_budget_bytes).c_str());
  std::printf("pinned over-commit  %s\n",
              b->pinned_over_commit ? "yes: pinned weights exceed the weight pool" : "no");
  return 0;
}

// ---- serve ------------------------------------------------------------------

struct ServeFlags {
  std::string config;
  std::string host;
  int port = -1;
  std::string state_dir;
  std::string budget;
  std::string api_key;
  bool api_key_set = false;
};

// Demo models: generated into <state>/models/<preset> on first run.
// config.json is written last by MakeModel, so a directory whose files all
// validate is complete; anything else is regenerated.
Result<std::vector<ModelEntry>> EnsureDemoModels(const std::string& state_dir) {
  std::vector<ModelEntry> entries;
  for (const char* preset : {"demo-chat", "demo-embed"}) {
    ModelEntry m;
    m.name = preset;
    m.path = (fs::path(state_dir) / "models" / preset).string();
    m.capability = ModelPresetIsEmbedding(preset) ? Capability::kEmbedding : Capability::kText;
    if (!EstimateModelFootprint(m).ok()) {
      std::error_code ec;
      fs::create_directories(m.path, ec);
      if (ec) {
        return UnavailableError(fmt::format("cannot create {}: {}", m.path, ec.message()));
      }
      ARBITER_RETURN_IF_ERROR(MakeModelWithProgress(preset, m.path, 0));
    } else {
      spdlog::info("demo model \"{}\" found in {}", preset, m.path);
    }
    if (m.name == "demo-chat") m.vision = "ocr";
    entries.push_back(std::move(m));
  }
  // The other modalities, from Debian's trained models (issue 14 point 4):
  // speech recognition and VAD (PocketSphinx en-us), speech synthesis
  // (Flite), OCR (Tesseract eng). Nothing to generate.
  auto backend = [&](const char* name, Capability capability, ModelEngine engine) {
    ModelEntry m;
    m.name = name;
    m.capability = capability;
    m.engine = engine;
    entries.push_back(std::move(m));
  };
  backend("asr", Capability::kTranscribe, ModelEngine::kPocketSphinx);
  backend("tts", Capability::kSpeak, ModelEngine::kFlite);
  backend("ocr", Capability::kVisionDescribe, ModelEngine::kTesseract);
  backend("vad", Capability::kVad, ModelEngine::kPocketSphinx);
  return entries;
}

// Shutdown signals go through a self-pipe: the handler (async-signal-safe)
// writes the signal number; a normal thread reads it and stops the server.
// A handler rather than sigwait(), because libraries (OpenBLAS) start
// threads before main() that would not have the signals blocked.
int g_signal_pipe[2] = {-1, -1};

extern "C" void OnShutdownSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const int saved = errno;
  (void)!write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

Status InstallShutdownSignals() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    return InternalError(fmt::format("pipe2: {}", std::strerror(errno)));
  }
  struct sigaction sa {};
  sa.sa_handler = OnShutdownSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a kill
  return OkStatus();
}

// Reads one byte from the signal pipe; returns the signal, or 0 when the
// pipe was closed/woken for exit.
int WaitSignal() {
  unsigned char b = 0;
  for (;;) {
    ssize_t n = read(g_signal_pipe[0], &b, 1);
    if (n == 1) return b;
    if (n < 0 && errno == EINTR) continue;
    return 0;
  }
}

// Refuses a host that is not an IP address and a port another socket holds
// (even one bound with SO_REUSEPORT, which the kernel would otherwise let a
// second server share, splitting connections between the two). A probe
// socket bound without SO_REUSEPORT and closed again; the real listener binds
// right after. Port 0 is always free.
Status CheckListenAddress(const std::string& host, int port) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in6);
  } else {
    return InvalidArgumentError(fmt::format(
        "host \"{}\" is not a valid IP address (--host, ARBITER_HOST or [server] host; e.g. "
        "127.0.0.1 or ::1)",
        host));
  }
  if (port == 0) return OkStatus();
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return UnavailableError(fmt::format("socket: {}", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  const int err = errno;
  ::close(fd);
  if (rc == 0) return OkStatus();
  const std::string where = addr.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, port)
                                                       : fmt::format("{}:{}", host, port);
  if (err == EADDRINUSE) {
    return UnavailableError(fmt::format(
        "address {} is already in use (another arbiter serve?); pick another with --port", where));
  }
  return UnavailableError(fmt::format("cannot bind {}: {}", where, std::strerror(err)));
}

// Holds a flock on the state directory itself for the life of the process,
// so two `arbiter serve` never share a state directory (their KV files and
// demo models would collide). No lock file is created; the kernel drops the
// lock when the process exits, crash included. A previous holder that is
// shutting down is waited for, up to 10 s. Returns the directory's fd (kept
// open) or an error.
Result<int> LockStateDir(const std::string& state_dir) {
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) return UnavailableError(fmt::format("cannot create {}: {}", state_dir, ec.message()));
  const int fd = ::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return UnavailableError(fmt::format("cannot open {}: {}", state_dir, std::strerror(errno)));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool told = false;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const int err = errno;
      ::close(fd);
      return UnavailableError(fmt::format("cannot lock {}: {}", state_dir, std::strerror(err)));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      return UnavailableError(fmt::format(
          "state directory {} is in use by another arbiter serve; stop it or pick another with "
          "--state-dir",
          state_dir));
    }
    if (!told) {
      spdlog::info("state directory {} is locked by another arbiter serve; waiting up to 10 s",
                   state_dir);
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return fd;
}

// Many idle clients each hold a descriptor: use the hard limit.
void RaiseFileLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      spdlog::warn("cannot raise the open-file limit: {}", std::strerror(errno));
    }
  }
}

int RunServe(const ServeFlags& f) {
  if (Status s = InstallShutdownSignals(); !s.ok()) return Fail(s.message());
  RaiseFileLimit();

  uint64_t mem_total = 0;
  if (Result<SystemMemoryInfo> mem = ReadSystemMemory(); mem.ok()) {
    mem_total = mem->total_bytes;
  } else {
    spdlog::warn("cannot read total RAM ({}); set the budget explicitly with --budget",
                 mem.status().message());
  }

  Config config = DefaultConfig(mem_total);
  if (!f.config.empty()) {
    Result<Config> loaded = LoadConfigFile(f.config, mem_total);
    if (!loaded.ok()) return Fail(loaded.status().message());
    config = std::move(loaded).value();
  }
  for (const std::string& w : config.warnings) spdlog::warn("config: {}", w);
  if (Status s = ApplyEnvOverrides(GetEnv, mem_total, &config); !s.ok()) return Fail(s.message());
  if (!f.host.empty()) config.server.host = f.host;
  if (f.port >= 0) config.server.port = f.port;
  if (f.api_key_set) config.server.api_key = f.api_key;
  if (!f.budget.empty()) {
    Result<uint64_t> b = ParseSize(f.budget, mem_total);
    if (!b.ok() || *b == 0) {
      return Fail(fmt::format("--budget: {}", b.ok() ? "must be positive" : b.status().message()));
    }
    config.budget_bytes = *b;
    config.budget_text = f.budget;
  }
  if (!f.state_dir.empty()) {
    config.state_dir = f.state_dir;
  } else {
    Result<std::string> dir = DefaultStateDir(GetEnv);
    if (!dir.ok()) return Fail(dir.status().message());
    config.state_dir = *dir;
  }

  // Before any slow start-up work (demo models, loads): the address and the
  // state directory must be ours.
  if (Status s = CheckListenAddress(config.server.host, config.server.port); !s.ok()) {
    return Fail(s.message());
  }
  Result<int> state_lock = LockStateDir(config.state_dir);
  if (!state_lock.ok()) return Fail(state_lock.status().message());

  if (f.config.empty()) {
    Result<std::vector<ModelEntry>> demo = EnsureDemoModels(config.state_dir);
    if (!demo.ok()) return Fail(fmt::format("cannot prepare the demo models: {}",
                                            demo.status().message()));
    config.models = std::move(demo).value();
  }
  if (Status s = ValidateConfig(config); !s.ok()) return Fail(s.message());
  if (config.models.empty()) spdlog::warn("no models configured; add [[models]] to the config");

  spdlog::info("memory budget {}{}", FormatSize(config.budget_bytes),
               !config.budget_text.empty() ? " (" + config.budget_text + ")"
               : config.headroom_text.empty()
                   ? std::string(" (total RAM − 1.5 GiB headroom)")
                   : " (total RAM − " + config.headroom_text + " headroom)");

  // Everything that runs: the Runtime (runtime/runtime.h) — pressure
  // sources, ledger, KV tiers, weights, engines, arbiter, reclaim policy.
  Result<std::unique_ptr<Runtime>> runtime = Runtime::Create(config);
  if (!runtime.ok()) return Fail(runtime.status().message());

  Server server(config.server, runtime->get());
  if (Status s = server.Bind(); !s.ok()) return Fail(s.message());

  const std::string url = fmt::format("http://{}:{}", config.server.host, server.port());
  std::string example_model = "MODEL";
  for (const ModelEntry& m : config.models) {
    if (m.capability == Capability::kText) {
      example_model = m.name;
      break;
    }
  }
  std::printf("arbiter listening on %s\n", url.c_str());
  std::printf("try:\n  curl %s/v1/chat/completions -H 'Content-Type: application/json'%s \\\n"
              "    -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],"
              "\"max_tokens\":32}'\n",
              url.c_str(),
              config.server.api_key.empty() ? "" : " -H \"Authorization: Bearer $ARBITER_API_KEY\"",
              example_model.c_str());
  std::printf("dashboard (live memory, models, KV, pressure, events):\n  %s/ui\n", url.c_str());
  std::fflush(stdout);

  // The signal thread: the first SIGINT/SIGTERM stops the server (retrying
  // until Run() has returned, so a signal that lands before the listener
  // started is not lost), bounded by [server] shutdown_timeout_s (Note
  // [Bounded shutdown] in src/server/shutdown_deadline.cc); a second one
  // forces an exit.
  std::atomic<bool> run_returned{false};
  std::mutex mu;
  std::condition_variable cv;
  std::optional<ShutdownDeadline> deadline;  // guarded by mu
  std::thread signal_thread([&] {
    const int sig = WaitSignal();
    if (sig == 0) return;  // Run() returned on its own
    spdlog::info("received {}; shutting down (at most {} s: [server] shutdown_timeout_s)",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", config.server.shutdown_timeout_s);
    {
      std::lock_guard<std::mutex> l(mu);
      deadline.emplace(&server, runtime->get(),
                       std::chrono::seconds(config.server.shutdown_timeout_s));
    }
    std::thread force([] {
      if (WaitSignal() == 0) return;
      std::fprintf(stderr, "arbiter: second signal; exiting now\n");
      std::_Exit(1);
    });
    force.detach();
    std::unique_lock<std::mutex> l(mu);
    while (!run_returned.load()) {
      server.Stop();
      cv.wait_for(l, std::chrono::milliseconds(100));
    }
  });

  Status run = server.Run();
  {
    std::lock_guard<std::mutex> l(mu);
    run_returned.store(true);
  }
  cv.notify_all();
  const unsigned char wake = 0;  // "0": exit without a signal
  (void)!write(g_signal_pipe[1], &wake, 1);
  signal_thread.join();
  server.Stop();
  // Note [Runtime shutdown]: frees every engine (each one's slots are saved
  // to the KV directory), spills the prompt cache, frees the weights.
  {
    std::lock_guard<std::mutex> l(mu);
    if (deadline) deadline->StopReadingRuntime();
  }
  (*runtime)->Shutdown();
  {
    std::lock_guard<std::mutex> l(mu);
    if (deadline) deadline->Disarm();
  }
  if (!run.ok()) return Fail(run.message());
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace arbiter

int main(int argc, char** argv) {
  using namespace arbiter;
  ConfigureProcessHeap();  // before any thread: Note [Where freed memory goes]
  // Logs go to stderr: stdout carries each command's result (the `bench`,
  // `generate` and `budget` --json output is parsed), and spdlog's default
  // logger writes to stdout.
  spdlog::set_default_logger(spdlog::stderr_color_mt("arbiter"));
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");

  CLI::App app{"arbiter — local inference runtime: every model under one memory budget, "
               "served over an OpenAI-compatible HTTP API"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "arbiter 0.1.0");

  ServeFlags serve;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve",
      "Serve models over HTTP. Without --config, serves the built-in demo models "
      "(demo-chat with vision = \"ocr\", demo-embed — generated into <state-dir>/models on "
      "first run — and asr, vad (PocketSphinx en-us), tts (Flite) and ocr (Tesseract eng)).");
  serve_cmd->add_option("--config", serve.config, "TOML config file (see docs/config.md)")
      ->check(CLI::ExistingFile);
  serve_cmd->add_option("--host", serve.host, "Address to bind (default 127.0.0.1)");
  serve_cmd->add_option("--port", serve.port, "Port to bind (default 8080; 0 = any free port)")
      ->check(CLI::Range(0, 65535));
  serve_cmd->add_option("--state-dir", serve.state_dir,
                        "State directory (default $XDG_STATE_HOME/arbiter, else "
                        "~/.local/state/arbiter)");
  serve_cmd->add_option("--budget", serve.budget,
                        "Memory budget for models: bytes, 512MiB, 2GB or 75% of RAM "
                        "(default: total RAM - [memory] headroom, 1536MiB)");
  CLI::Option* key_opt = serve_cmd->add_option(
      "--api-key", serve.api_key,
      "Require 'Authorization: Bearer KEY' on /v1/*, /admin/* and /metrics");

  MakeModelFlags mm;
  std::string presets;
  for (const std::string& p : ModelPresetNames()) {
    if (!presets.empty()) presets += ", ";
    presets += p;
  }
  std::string float_dtypes, block_dtypes;
  for (const std::string& n : ModelDtypeNames(ModelFormat::kGguf)) {
    std::string& list = n[0] == 'q' ? block_dtypes : float_dtypes;
    list += (list.empty() ? "" : ", ") + n;
  }
  CLI::App* mm_cmd = app.add_subcommand(
      "make-model",
      "Write a deterministic demo/test model: a Hugging Face directory (safetensors) or one GGUF "
      "file");
  mm_cmd->add_option("--preset", mm.preset, "Preset: " + presets)->required();
  mm_cmd->add_option("--out", mm.out, "Output: a directory (safetensors) or the .gguf file (gguf)")
      ->required();
  mm_cmd->add_option("--seed", mm.seed, "Weight seed (default 0; same seed, same files)");
  mm_cmd->add_option("--format", mm.format, "safetensors (default) or gguf")
      ->check(CLI::IsMember({"safetensors", "gguf"}));
  mm_cmd->add_option("--dtype", mm.dtype,
                     "How matrices are stored (default: the preset's, bf16 or f32): " +
                         float_dtypes + "; with --format gguf also " + block_dtypes +
                         " (quantized by arbiter; K-quants need rows of 256: demo-chat)");

  std::string inspect_path;
  bool inspect_json = false;
  CLI::App* inspect_cmd = app.add_subcommand(
      "inspect",
      "Describe a GGUF file, safetensors file or model directory (metadata, tensors, types, config)");
  inspect_cmd->add_option("PATH", inspect_path, "A .gguf file, a .safetensors file or a model directory")
      ->required();
  inspect_cmd->add_flag("--json", inspect_json, "Print one JSON object instead of text");

  GenerateFlags gen;
  CLI::App* gen_cmd = app.add_subcommand(
      "generate",
      "Run one generation on a model (directory or .gguf file) and print ids, text and timings");
  gen_cmd->add_option("--model", gen.model, "Model directory or .gguf file")->required();
  CLI::Option* prompt_opt = gen_cmd->add_option("--prompt", gen.prompt, "Prompt text");
  CLI::Option* ids_opt =
      gen_cmd->add_option("--prompt-ids", gen.prompt_ids, "Prompt token ids, e.g. 1,2,3");
  prompt_opt->excludes(ids_opt);
  gen_cmd->add_option("--max-tokens", gen.max_tokens, "Tokens to generate (default 32)")
      ->check(CLI::PositiveNumber);
  gen_cmd->add_option("--temperature", gen.temperature, "Sampling temperature (default 0: greedy)")
      ->check(CLI::Range(0.0, 2.0));
  gen_cmd->add_option("--top-p", gen.top_p, "Nucleus sampling mass (default 1)")
      ->check(CLI::Range(0.0, 1.0));
  gen_cmd->add_option("--top-k", gen.top_k, "Top-k (default 0: off)")->check(CLI::NonNegativeNumber);
  gen_cmd->add_option("--seed", gen.seed, "Sampling seed (default: random)");
  gen_cmd->add_option("--ctx", gen.ctx, "Context tokens (default 2048)")->check(CLI::PositiveNumber);
  gen_cmd->add_flag("--ignore-eos", gen.ignore_eos, "Keep generating past end-of-sequence");
  gen_cmd->add_option("--compute-dtype", gen.compute_dtype,
                      "auto (weights computed in their stored type, default) or f32")
      ->check(CLI::IsMember({"auto", "f32"}));
  gen_cmd->add_option("--kv-type", gen.kv_type, "KV cache type: f16 (default), bf16, q8_0, f32")
      ->check(CLI::IsMember({"f16", "bf16", "q8_0", "f32"}));
  gen_cmd->add_option("--device", gen.device,
                      "Compute device: cpu (default), vulkan or vulkan:N (arbiter devices)");
  gen_cmd->add_flag("--json", gen.json,
                    "Print {prompt_ids, output_ids, text, finish_reason, timings} as JSON");

  BenchCommands bench(&app);

  bool devices_json = false;
  CLI::App* devices_cmd = app.add_subcommand(
      "devices",
      "List the compute devices: cpu and every Vulkan device (heaps, budget, features); "
      "a model's `device` names one");
  devices_cmd->add_flag("--json", devices_json, "Print one JSON object");

  BudgetFlags budget;
  CLI::App* budget_cmd = app.add_subcommand(
      "budget",
      "Solve the device WeightBudget: scratch ceiling, weight pool and on-demand budget of an "
      "arena");
  budget_cmd->add_option("--arena", budget.arena,
                         "Device arena: bytes, 512MiB, 2GB or 75% of RAM")
      ->required();
  budget_cmd->add_option("--fraction", budget.fraction,
                         "Share of the arena weights may use, in (0, 1] (default 1.0)");
  budget_cmd->add_option("--wiggle", budget.wiggle,
                         "Share of the arena kept free, in [0, 1) (default 0.1)");
  budget_cmd->add_option("--max-scratch", budget.max_scratch,
                         "Scratch the models need to run: bytes, 512MiB, 2GB (default 0)");
  budget_cmd->add_option("--pinned", budget.pinned,
                         "Weight bytes of device-pinned models: bytes, 512MiB, 2GB (default 0)");
  budget_cmd->add_flag("--json", budget.json,
                       "Print {scratch_ceiling, weight_pool, on_demand_budget, "
                       "pinned_over_commit} (sizes in bytes)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (serve_cmd->parsed()) {
    serve.api_key_set = key_opt->count() > 0;
    return RunServe(serve);
  }
  if (mm_cmd->parsed()) return RunMakeModel(mm);
  if (inspect_cmd->parsed()) return RunInspect(inspect_path, inspect_json);
  if (gen_cmd->parsed()) {
    if (gen.prompt.empty() && gen.prompt_ids.empty()) {
      std::fprintf(stderr, "arbiter generate: one of --prompt or --prompt-ids is required\n");
      return 2;
    }
    return RunGenerate(gen);
  }
  if (bench.parsed()) return bench.Run();
  if (devices_cmd->parsed()) return tools::RunDevices(devices_json);
  if (budget_cmd->parsed()) return RunBudget(budget);
  return 2;
}
