// tools/arbiter/bench_commands.cc — see bench_commands.h.
#include "tools/arbiter/bench_commands.h"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "arbiter/base/status.h"
#include "bench/arbiter_bench.h"
#include "bench/decode_bench.h"
#if ARBITER_HAS_VULKAN
#include "bench/vram_bench.h"
#endif
#include "bench/grammar_bench.h"
#include "bench/kernel_bench.h"
#include "bench/kv_bench.h"
#include "bench/memory_bench.h"
#include "bench/modalities_bench.h"
#include "bench/weights_bench.h"

namespace arbiter {
namespace {

int Fail(const char* bench, const Status& status) {
  std::fprintf(stderr, "arbiter: bench %s failed: %s\n", bench, status.message().c_str());
  return 1;
}

struct DecodeFlags {
  std::string model;
  int threads = 0;
  int prompt_tokens = 512;
  int gen_tokens = 128;
  int repetitions = 3;
  bool json = false;
  std::string compute_dtype = "auto";
  std::string kv_type = "f16";
  std::string device = "cpu";
};

int RunDecode(const DecodeFlags& f) {
  // The engine's private weight cache logs each load at info level on
  // stderr (main.cc); only warnings and errors are wanted beside the report.
  spdlog::set_level(spdlog::level::warn);
  const int threads = f.threads > 0
                          ? f.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Result<DecodeBenchResult> r =
      RunDecodeBench(f.model, threads, f.prompt_tokens, f.gen_tokens, f.repetitions,
                     f.compute_dtype == "f32", *ParseKvType(f.kv_type), f.device);
  if (!r.ok()) return Fail("decode", r.status());
  std::cout << (f.json ? FormatDecodeBenchJson(*r) : FormatDecodeBench(*r));
  return 0;
}

int RunArbiter(int iterations, bool json) {
  Result<ArbiterBenchResult> r = RunArbiterBench(iterations);
  if (!r.ok()) return Fail("arbiter", r.status());
  std::cout << (json ? FormatArbiterBenchJson(*r) : FormatArbiterBench(*r));
  return 0;
}

int RunWeights(const WeightsBenchOptions& options, bool json) {
  Result<WeightsBenchResult> r = RunWeightsBench(options);
  if (!r.ok()) return Fail("weights", r.status());
  std::cout << (json ? FormatWeightsBenchJson(*r) : FormatWeightsBench(*r));
  return 0;
}

int RunKv(const KvBenchOptions& options, bool json) {
  // As RunDecode: keep stdout to the report.
  spdlog::set_level(spdlog::level::warn);
  Result<KvBenchResult> r = RunKvBench(options);
  if (!r.ok()) return Fail("kv", r.status());
  std::cout << (json ? FormatKvBenchJson(*r) : FormatKvBench(*r));
  return 0;
}

int RunKernels(const KernelBenchOptions& options, bool json) {
  Result<KernelBenchResult> r = RunKernelBench(options);
  if (!r.ok()) return Fail("kernels", r.status());
  std::cout << (json ? FormatKernelBenchJson(*r) : FormatKernelBench(*r));
  return 0;
}

int RunModalities(const ModalitiesBenchOptions& options, bool json) {
  // As RunDecode: keep stdout to the report.
  spdlog::set_level(spdlog::level::warn);
  Result<ModalitiesBenchResult> r = RunModalitiesBench(options);
  if (!r.ok()) return Fail("modalities", r.status());
  std::cout << (json ? FormatModalitiesBenchJson(*r) : FormatModalitiesBench(*r));
  return r->all_ok() ? 0 : 1;
}

int RunGrammar(const GrammarBenchOptions& options, bool json) {
  // As RunDecode: keep stdout to the report.
  spdlog::set_level(spdlog::level::warn);
  Result<GrammarBenchResult> r = RunGrammarBench(options);
  if (!r.ok()) return Fail("grammar", r.status());
  std::cout << (json ? FormatGrammarBenchJson(*r) : FormatGrammarBench(*r));
  return 0;
}

int RunMemory(const MemoryBenchOptions& options, bool json) {
  // As RunDecode: keep stdout to the report.
  spdlog::set_level(spdlog::level::warn);
  Result<MemoryBenchResult> r = RunMemoryBench(options);
  if (!r.ok()) return Fail("memory", r.status());
  std::cout << (json ? FormatMemoryBenchJson(*r) : FormatMemoryBench(*r));
  return r->all_within() ? 0 : 1;
}

int RunVram(const std::string& model, const std::string& device, int cycles, bool json) {
#if ARBITER_HAS_VULKAN
  spdlog::set_level(spdlog::level::warn);
  Result<VramBenchResult> r = RunVramBench(model, device, cycles);
  if (!r.ok()) return Fail("vram", r.status());
  std::cout << (json ? FormatVramBenchJson(*r) : FormatVramBench(*r));
  return r->all_within ? 0 : 1;
#else
  return Fail("vram", UnavailableError("this build has no Vulkan device (ARBITER_VULKAN=OFF)"));
#endif
}

}  // namespace

struct BenchCommands::Commands {
  CLI::App* decode = nullptr;
  CLI::App* arbiter = nullptr;
  CLI::App* weights = nullptr;
  CLI::App* kv = nullptr;
  CLI::App* memory = nullptr;
  CLI::App* kernels = nullptr;
  CLI::App* modalities = nullptr;
  CLI::App* grammar = nullptr;
  CLI::App* vram = nullptr;
  std::string vram_model;
  std::string vram_device = "vulkan";
  int vram_cycles = 3;
  bool vram_json = false;
  GrammarBenchOptions grammar_options;
  bool grammar_json = false;
  ModalitiesBenchOptions modalities_options;
  bool modalities_json = false;
  DecodeFlags decode_flags;
  int arbiter_iterations = 100000;
  bool arbiter_json = false;
  WeightsBenchOptions weights_options;
  bool weights_json = false;
  KvBenchOptions kv_options;
  std::string kv_type = "f16";
  bool kv_json = false;
  MemoryBenchOptions memory_options;
  bool memory_json = false;
  KernelBenchOptions kernels_options;
  int kernels_stream_mb = 128;
  bool kernels_json = false;
};

BenchCommands::BenchCommands(CLI::App* app) : commands_(std::make_unique<Commands>()) {
  Commands& c = *commands_;
  CLI::App* bench = app->add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);

  DecodeFlags& d = c.decode_flags;
  c.decode = bench->add_subcommand(
      "decode", "Decode/prefill throughput against the memory-bandwidth roofline");
  c.decode->add_option("--model", d.model, "Model directory or .gguf file")->required();
  c.decode->add_option("--threads", d.threads, "BLAS threads (default: all hardware threads)")
      ->check(CLI::NonNegativeNumber);
  c.decode->add_option("--prompt-tokens", d.prompt_tokens, "Prompt length (default 512)")
      ->check(CLI::PositiveNumber);
  c.decode->add_option("--gen-tokens", d.gen_tokens, "Decode steps (default 128)")
      ->check(CLI::PositiveNumber);
  c.decode->add_option("--repetitions", d.repetitions, "Repetitions, best kept (default 3)")
      ->check(CLI::PositiveNumber);
  c.decode->add_flag("--json", d.json, "Print the result as JSON");
  c.decode->add_option("--compute-dtype", d.compute_dtype,
                       "auto (weights computed in their stored type, default) or f32")
      ->check(CLI::IsMember({"auto", "f32"}));
  c.decode->add_option("--kv-type", d.kv_type, "KV cache type: f16 (default), bf16, q8_0, f32")
      ->check(CLI::IsMember({"f16", "bf16", "q8_0", "f32"}));
  c.decode->add_option("--device", d.device,
                       "Compute device: cpu (default), vulkan or vulkan:N (arbiter devices); "
                       "ARBITER_VULKAN_PROFILE=1 logs GPU time per kernel");

  c.vram = bench->add_subcommand(
      "vram", "A device model's VRAM against the ledger in every state (load, chat, 8 "
              "conversations, unload) and its wake from the host floor");
  c.vram->add_option("--model", c.vram_model, "Model directory or .gguf file")->required();
  c.vram->add_option("--device", c.vram_device, "vulkan (default) or vulkan:N");
  c.vram->add_option("--cycles", c.vram_cycles, "Load/unload cycles (default 3)")
      ->check(CLI::PositiveNumber);
  c.vram->add_flag("--json", c.vram_json, "Print the result as JSON");

  c.arbiter = bench->add_subcommand(
      "arbiter", "MemoryArbiter latencies (acquire/release, fit eviction, pressure) vs targets");
  c.arbiter
      ->add_option("--iterations", c.arbiter_iterations,
                   "Timed operations per scenario (default 100000)")
      ->check(CLI::PositiveNumber);
  c.arbiter->add_flag("--json", c.arbiter_json, "Print the result as JSON");

  WeightsBenchOptions& w = c.weights_options;
  c.weights = bench->add_subcommand(
      "weights",
      "Weight runtime on a real model, each figure against a limit measured in the same run: "
      "(a) on-demand load from the host floor vs memcpy, (b) load from the file (page cache "
      "warm and cold) vs read() and memcpy, (c) two models alternating under a budget that "
      "holds one (floors vs file reloads, vs both fitting), (d) summed PSS of N worker "
      "processes with shared vs private floors. See docs/BENCHMARKS.md. Drops the model "
      "files from the page cache and forks; run it on a quiet machine");
  c.weights->add_option("--model", w.model_dir,
                        "Safetensors model directory (e.g. preset demo-chat)")
      ->required();
  c.weights->add_option("--model2", w.model2_dir,
                        "Second model for (c), same architecture or not (default: a byte copy "
                        "of --model in a temp dir, removed afterwards)");
  c.weights
      ->add_option("--repetitions", w.repetitions,
                   "Repetitions of (a) and of each (b) case; rounds A,B of (c) (default 10)")
      ->check(CLI::PositiveNumber);
  c.weights->add_option("--workers", w.workers, "Worker processes of (d) (default 3)")
      ->check(CLI::PositiveNumber);
  c.weights->add_option("--gen-tokens", w.gen_tokens, "Tokens per request in (c) (default 4)")
      ->check(CLI::PositiveNumber);
  c.weights->add_option("--threads", w.threads, "Engine and OpenBLAS threads in (c) (default 1)")
      ->check(CLI::PositiveNumber);
  c.weights->add_flag("--json", c.weights_json, "Print the result as JSON");

  KvBenchOptions& k = c.kv_options;
  c.kv = bench->add_subcommand(
      "kv",
      "KV precache on a real model, each figure against an ideal or a limit measured in the "
      "same run: TTFT of one turn over a stable prefix (cold, after prewarm, from the host "
      "prompt cache, restored from disk) vs prefilling only the turn; slot save/restore and KV "
      "file write/read vs memcpy and llama.cpp's figures; a shared-prefix workload; multi-round "
      "QA with more users than slots. See docs/BENCHMARKS.md. Writes KV files under $TMPDIR "
      "(removed afterwards)");
  c.kv->add_option("--model", k.model_dir, "Model directory or .gguf file (e.g. demo-chat)")
      ->required();
  c.kv->add_option("--prefix-tokens", k.prefix_tokens,
                   "Stable prefix of the TTFT and save/restore scenarios (default 2000)")
      ->check(CLI::PositiveNumber);
  c.kv->add_option("--turn-tokens", k.turn_tokens, "User turn / question length (default 32)")
      ->check(CLI::PositiveNumber);
  c.kv->add_option("--repetitions", k.repetitions,
                   "Repetitions of the TTFT and save/restore cases: best and p50 (default 5)")
      ->check(CLI::PositiveNumber);
  c.kv->add_option("--threads", k.threads,
                   "OpenBLAS and engine threads (default 0: OpenBLAS's default)")
      ->check(CLI::NonNegativeNumber);
  c.kv->add_option("--only", k.only,
                   "Run one scenario: ttft, save_restore, shared_prefix or qa (default: all)")
      ->check(CLI::IsMember({"ttft", "save_restore", "shared_prefix", "qa"}));
  c.kv->add_option("--device", k.device,
                   "Compute device of every scenario: cpu (default), vulkan or vulkan:N "
                   "(arbiter devices)");
  c.kv->add_option("--kv-type", c.kv_type, "KV cache type: f16 (default), bf16, q8_0, f32")
      ->check(CLI::IsMember({"f16", "bf16", "q8_0", "f32"}));
  c.kv->add_flag("--json", c.kv_json, "Print the result as JSON");

  MemoryBenchOptions& m = c.memory_options;
  c.memory = bench->add_subcommand(
      "memory",
      "The ledger against the kernel: walks idle → demo-chat loaded → + demo-embed → + "
      "conversations parked in the prompt cache → + a pinned_system host floor → + the same "
      "floor attached by a second `arbiter serve` → everything unloaded, and prints per state "
      "the ledger by kind, RssAnon + RssShmem and their ratio. Exits 1 when a state is off by "
      "more than max(5 %, 16 MiB). See docs/BENCHMARKS.md \"Memory truth\"");
  m.arbiter_binary = "/proc/self/exe";
  c.memory->add_option("--chat", m.chat_dir, "demo-chat model directory (default: generated)");
  c.memory->add_option("--embed", m.embed_dir, "demo-embed model directory (default: generated)");
  c.memory->add_option("--conversations", m.conversations, "Conversations parked (default 8)")
      ->check(CLI::PositiveNumber);
  c.memory->add_option("--prompt-tokens", m.prompt_tokens,
                       "About this many tokens per conversation (default 400)")
      ->check(CLI::PositiveNumber);
  c.memory->add_flag("--json", c.memory_json, "Print the result as JSON");

  c.modalities = bench->add_subcommand(
      "modalities",
      "The cross-modal scenario: each backend model's load time, first-result latency and "
      "footprint (measured vs charged); the TTS → ASR word error rate on 20 Harvard sentences; "
      "then a budget of demo-chat + the largest other model: voice turn, image chat, vision-cache "
      "hit, critical pressure, memory returned. Exits 1 when a scenario check fails. See "
      "docs/BENCHMARKS.md \"Modalities\"");
  c.modalities->add_option("--chat", c.modalities_options.chat_dir,
                           "demo-chat model directory (default: generated)");
  c.modalities->add_option("--sentences", c.modalities_options.sentences,
                           "Harvard sentences spoken and transcribed (1..20, default 20)")
      ->check(CLI::Range(1, 20));
  c.modalities
      ->add_option("--asr-path", c.modalities_options.asr_path,
                   "Also measure the TTS → ASR word error rate with a second PocketSphinx model "
                   "from DIR (laid out like /usr/share/pocketsphinx/model/en-us), reported beside "
                   "en-us's: same speech, sentences and scoring. scripts/asr-adapt/adapt.sh makes "
                   "one: en-us MAP-adapted to Flite's slt voice")
      ->check(CLI::ExistingDirectory);
  c.modalities->add_flag("--json", c.modalities_json, "Print the result as JSON");

  KernelBenchOptions& kn = c.kernels_options;
  c.kernels = bench->add_subcommand(
      "kernels",
      "The quantized decode kernels, 1 thread: GB/s of weight bytes streamed per type and kernel "
      "path (scalar, avx2) against the read and memcpy bandwidth measured in the same run, on a "
      "cache-resident matrix, and the dequantize-to-f32 alternative; prefill's integer product "
      "against dequantize + sgemm. See docs/BENCHMARKS.md \"Quantized kernels\"");
  c.kernels->add_option("--n", kn.n, "Row length, a multiple of 256 (default 768)")
      ->check(CLI::PositiveNumber);
  c.kernels
      ->add_option("--stream-mb", c.kernels_stream_mb,
                   "Weight MB of the streamed matrix (default 128)")
      ->check(CLI::PositiveNumber);
  c.kernels->add_option("--repetitions", kn.repetitions, "Timed passes, best kept (default 7)")
      ->check(CLI::PositiveNumber);
  c.kernels
      ->add_option("--prefill-tokens", kn.prefill_tokens,
                   "Tokens of the prefill product (default 512)")
      ->check(CLI::PositiveNumber);
  c.kernels
      ->add_option("--prefill-rows", kn.prefill_rows,
                   "Rows of the prefill product's matrix (default 1024)")
      ->check(CLI::PositiveNumber);
  c.kernels->add_flag("--json", c.kernels_json, "Print the result as JSON");

  GrammarBenchOptions& g = c.grammar_options;
  c.grammar = bench->add_subcommand(
      "grammar",
      "Constrained decoding: the token mask's cost (GrammarConstraint::FillAllowed for a JSON "
      "schema, at the start, at an object boundary and inside a string) against the engine's "
      "decode step measured in the same run; target mask ≤ 10 % of a step. See "
      "docs/BENCHMARKS.md \"Constrained decoding\"");
  c.grammar->add_option("--model", g.model_dir, "Model directory or .gguf file (e.g. demo-chat)")
      ->required();
  c.grammar->add_option("--threads", g.threads, "BLAS and engine threads (default: all hardware threads)")
      ->check(CLI::NonNegativeNumber);
  c.grammar->add_option("--iterations", g.iterations, "Mask computations per state (default 200)")
      ->check(CLI::PositiveNumber);
  c.grammar->add_option("--gen-tokens", g.gen_tokens, "Decode steps per run (default 32)")
      ->check(CLI::PositiveNumber);
  c.grammar->add_option("--repetitions", g.repetitions, "Decode runs, best kept (default 3)")
      ->check(CLI::PositiveNumber);
  c.grammar->add_option("--tokenizer", g.tokenizer_path,
                        "Time the mask over this tokenizer.json's vocabulary instead of the model's");
  c.grammar->add_flag("--json", c.grammar_json, "Print the result as JSON");
}

BenchCommands::~BenchCommands() = default;

bool BenchCommands::parsed() const {
  const Commands& c = *commands_;
  return c.decode->parsed() || c.arbiter->parsed() || c.weights->parsed() || c.kv->parsed() ||
         c.memory->parsed() || c.kernels->parsed() || c.modalities->parsed() ||
         c.grammar->parsed() || c.vram->parsed();
}

int BenchCommands::Run() {
  Commands& c = *commands_;
  if (c.decode->parsed()) return RunDecode(c.decode_flags);
  if (c.vram->parsed()) return RunVram(c.vram_model, c.vram_device, c.vram_cycles, c.vram_json);
  if (c.arbiter->parsed()) return RunArbiter(c.arbiter_iterations, c.arbiter_json);
  if (c.weights->parsed()) return RunWeights(c.weights_options, c.weights_json);
  if (c.kv->parsed()) {
    c.kv_options.kv_type = *ParseKvType(c.kv_type);
    return RunKv(c.kv_options, c.kv_json);
  }
  if (c.memory->parsed()) return RunMemory(c.memory_options, c.memory_json);
  if (c.modalities->parsed()) return RunModalities(c.modalities_options, c.modalities_json);
  if (c.grammar->parsed()) return RunGrammar(c.grammar_options, c.grammar_json);
  if (c.kernels->parsed()) {
    c.kernels_options.stream_bytes = static_cast<size_t>(c.kernels_stream_mb) << 20;
    return RunKernels(c.kernels_options, c.kernels_json);
  }
  return 2;  // not parsed: bad usage
}

}  // namespace arbiter
