// bench/vram_bench.cc — `arbiter bench vram` (vram_bench.h).
#include "bench/vram_bench.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/base/clock.h"
#include "bench/bench_stats.h"
#include "arbiter/runtime/config.h"
#include "arbiter/runtime/runtime.h"
#include "arbiter/vulkan/vulkan_device.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

}  // namespace

Result<VramBenchResult> RunVramBench(const std::string& model_path, const std::string& device,
                                     int cycles) {
  if (cycles < 1) return InvalidArgumentError("bench vram: --cycles must be ≥ 1");
  VramBenchResult r;
  r.model = model_path;
  r.cycles = cycles;
  ARBITER_ASSIGN_OR_RETURN(std::shared_ptr<vulkan::VulkanDevice> dev,
                           vulkan::VulkanDevice::Open(device));
  r.device = dev->domain();
  r.device_name = dev->info().name;
  auto usage = [&]() -> std::optional<uint64_t> {
    std::optional<vulkan::VulkanHeapInfo> h = dev->QueryWeightHeap();
    if (!h || !h->usage_bytes) return std::nullopt;
    return *h->usage_bytes;
  };
  const std::optional<uint64_t> base = usage();
  r.driver_report = base.has_value();
  r.baseline_usage_bytes = base.value_or(0);

  std::string tmpl = (fs::temp_directory_path() / "arbiter-bench-vram-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return InternalError("bench vram: no temporary directory");
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove_state{tmpl};
  Config config = DefaultConfig(0);
  config.budget_bytes = uint64_t{64} << 30;
  config.pressure.source = PressureSourceKind::kNone;
  config.kv.prompt_cache_bytes = 0;
  config.state_dir = tmpl;
  ModelEntry m;
  m.name = "model";
  m.path = fs::absolute(model_path).string();
  m.ctx = 2048;
  m.parallel = 8;
  m.device = r.device;
  m.residency = ResidencyState::kPinnedSystem;
  config.models.push_back(m);
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt, Runtime::Create(config));

  auto record = [&](int cycle, const std::string& state) {
    RuntimeStatus st = rt->Status();
    VramState s;
    s.cycle = cycle;
    s.state = state;
    auto it = st.ledger.domains.find(r.device);
    if (it != st.ledger.domains.end()) {
      s.ledger_bytes = it->second.charged_bytes;
      s.runtime_bytes = it->second.runtime_bytes;
    }
    if (std::optional<uint64_t> u = usage(); u && base) {
      s.driver_bytes = *u > *base ? *u - *base : 0;
      s.difference_bytes = static_cast<int64_t>(*s.driver_bytes) -
                           static_cast<int64_t>(s.ledger_bytes + s.runtime_bytes);
      const double bound = std::max(16.0 * (1 << 20), 0.02 * static_cast<double>(*s.driver_bytes));
      s.within = std::abs(static_cast<double>(*s.difference_bytes)) <= bound;
    }
    r.all_within &= s.within;
    r.states.push_back(s);
  };
  auto chat = [&](const std::string& conversation, int max_tokens) -> Result<double> {
    TextRequest tr;
    tr.model = "model";
    tr.chat = true;
    tr.messages = {ChatMessage{"user", "Tell me about the ocean, conversation " + conversation}};
    tr.max_tokens = max_tokens;
    tr.ignore_eos = true;
    tr.sampling.temperature = 0;
    tr.conversation_id = conversation;
    const double t0 = NowSeconds();
    ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<TextGeneration> g, rt->StartText(std::move(tr)));
    ARBITER_RETURN_IF_ERROR(g->Run([](std::string_view) { return true; }, nullptr).status());
    return MsSince(t0);
  };
  record(0, "started");
  r.wake_seconds = 0;
  const vulkan::UploadPath kPaths[] = {vulkan::UploadPath::kMapped, vulkan::UploadPath::kImported,
                                       vulkan::UploadPath::kStaged};
  for (int c = 1; c <= cycles; ++c) {
    uint64_t before[3];
    for (vulkan::UploadPath p : kPaths) before[static_cast<int>(p)] = dev->upload_bytes(p);
    ARBITER_RETURN_IF_ERROR(rt->LoadModel("model").status());
    // The path that carried most of this load's bytes.
    std::string path;
    uint64_t most = 0;
    for (vulkan::UploadPath p : kPaths) {
      const uint64_t n = dev->upload_bytes(p) - before[static_cast<int>(p)];
      if (n > most) {
        most = n;
        path = std::string(vulkan::UploadPathName(p));
      }
    }
    const RuntimeStatus status = rt->Status();
    for (const WeightModelStatus& w : status.weights->models) {
      if (w.key != "model") continue;
      r.weight_bytes = w.weight_bytes;
      if (c == 1) {
        r.first_load_seconds = w.last_load_seconds;
      } else if (w.last_load_source == WeightLoadSource::kFloor &&
                 (r.wake_seconds == 0 || w.last_load_seconds < r.wake_seconds)) {
        r.wake_seconds = w.last_load_seconds;
        r.wake_path = path;
        ARBITER_ASSIGN_OR_RETURN(r.wake_first_token_ms, chat("wake", 1));
      }
    }
    record(c, "loaded");
    ARBITER_RETURN_IF_ERROR(chat("first", 16).status());
    record(c, "chat");
    for (int i = 0; i < 8; ++i) ARBITER_RETURN_IF_ERROR(chat(fmt::format("conv-{}", i), 16).status());
    record(c, "conversations");
    ARBITER_RETURN_IF_ERROR(rt->UnloadModel("model", 60000).status());
    record(c, "unloaded");
  }
  if (r.wake_seconds > 0) r.wake_bytes_per_s = static_cast<double>(r.weight_bytes) / r.wake_seconds;
  if (r.states.back().difference_bytes) {
    r.final_difference_bytes = static_cast<int64_t>(*r.states.back().driver_bytes) -
                               static_cast<int64_t>(r.states.back().runtime_bytes);
  }
  rt->Shutdown();
  return r;
}

std::string FormatVramBench(const VramBenchResult& r) {
  std::string out = fmt::format(
      "model           {}\ndevice          {} ({})\nweights         {:.1f} MB\n"
      "driver report   {}\n",
      r.model, r.device, r.device_name, r.weight_bytes / 1e6,
      r.driver_report ? fmt::format("yes (baseline heapUsage {:.1f} MB)", r.baseline_usage_bytes / 1e6)
                      : "none (no VK_EXT_memory_budget): ledger columns only");
  out += fmt::format("{:>5} {:<14} {:>12} {:>12} {:>12} {:>12}\n", "cycle", "state", "ledger MB",
                     "runtime MB", "driver MB", "diff MB");
  for (const VramState& s : r.states) {
    out += fmt::format("{:>5} {:<14} {:>12.2f} {:>12.2f} {:>12} {:>12}{}\n", s.cycle, s.state,
                       s.ledger_bytes / 1e6, s.runtime_bytes / 1e6,
                       s.driver_bytes ? fmt::format("{:.2f}", *s.driver_bytes / 1e6) : "-",
                       s.difference_bytes ? fmt::format("{:.2f}", *s.difference_bytes / 1e6) : "-",
                       s.within ? "" : "  OUT OF BOUND");
  }
  out += fmt::format("first load      {:.1f} ms (from the file)\n", r.first_load_seconds * 1e3);
  if (r.wake_seconds > 0) {
    out += fmt::format("wake            {:.1f} ms from the host floor, {:.2f} GB/s ({} path); "
                       "first token after {:.1f} ms\n",
                       r.wake_seconds * 1e3, r.wake_bytes_per_s / 1e9, r.wake_path,
                       r.wake_first_token_ms);
  }
  out += fmt::format("truth           {}\n", r.all_within ? "every state within 2 % or 16 MiB"
                                                           : "SOME STATE OUT OF BOUND");
  return out;
}

std::string FormatVramBenchJson(const VramBenchResult& r) {
  nlohmann::ordered_json states = nlohmann::ordered_json::array();
  for (const VramState& s : r.states) {
    states.push_back({{"cycle", s.cycle},
                      {"state", s.state},
                      {"ledger_bytes", s.ledger_bytes},
                      {"runtime_bytes", s.runtime_bytes},
                      {"driver_bytes", s.driver_bytes ? nlohmann::ordered_json(*s.driver_bytes) : nullptr},
                      {"difference_bytes",
                       s.difference_bytes ? nlohmann::ordered_json(*s.difference_bytes) : nullptr},
                      {"within", s.within}});
  }
  nlohmann::ordered_json j = {
      {"model", r.model},
      {"device", r.device},
      {"device_name", r.device_name},
      {"cycles", r.cycles},
      {"weight_bytes", r.weight_bytes},
      {"driver_report", r.driver_report},
      {"baseline_usage_bytes", r.baseline_usage_bytes},
      {"first_load_seconds", r.first_load_seconds},
      {"wake_seconds", r.wake_seconds},
      {"wake_bytes_per_s", r.wake_bytes_per_s},
      {"wake_first_token_ms", r.wake_first_token_ms},
      {"wake_path", r.wake_path},
      {"final_difference_bytes",
       r.final_difference_bytes ? nlohmann::ordered_json(*r.final_difference_bytes) : nullptr},
      {"all_within", r.all_within},
      {"states", states}};
  return j.dump() + "\n";
}

}  // namespace arbiter
