// bench/decode_bench.cc — see decode_bench.h for the method.
#include "bench/decode_bench.h"

#include <cblas.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "arbiter/engine/engine.h"
#include "arbiter/engine/model_files.h"
#include "bench/bench_stats.h"
#include "bench/memory_bandwidth.h"
#include "engine/internal/engine_impl.h"

namespace arbiter {
namespace {

std::vector<int32_t> BenchPrompt(int n, int vocab, uint64_t seed) {
  std::vector<int32_t> ids(n);
  uint64_t s = seed;
  for (int i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  ids[0] = static_cast<int32_t>(seed % static_cast<uint64_t>(vocab));
  return ids;
}

}  // namespace

Result<DecodeBenchResult> RunDecodeBench(const std::string& model_dir, int n_threads,
                                         int prompt_tokens, int gen_tokens, int repetitions,
                                         bool compute_f32, GgmlType kv_type,
                                         const std::string& device) {
  if (n_threads < 1 || prompt_tokens < 1 || gen_tokens < 1 || repetitions < 1) {
    return InvalidArgumentError(
        "bench: n_threads, prompt_tokens, gen_tokens and repetitions "
        "must be ≥ 1");
  }
  DecodeBenchResult r;
  r.model_dir = model_dir;
  r.n_threads = n_threads;
  r.prompt_tokens = prompt_tokens;
  r.gen_tokens = gen_tokens;
  r.repetitions = repetitions;
  openblas_set_num_threads(n_threads);
  const char* core = openblas_get_corename();
  r.blas_core = core != nullptr ? core : "";

  EngineOptions opts;
  opts.n_slots = 1;
  opts.n_ctx = prompt_tokens + gen_tokens + 8;
  opts.prefill_batch = 512;
  opts.n_threads = n_threads;
  opts.kv_type = kv_type;
  opts.device = device;
  r.device = device;
  const double t0 = NowSeconds();
  ARBITER_ASSIGN_OR_RETURN(
      std::shared_ptr<const ModelFiles> files,
      OpenModelFiles(model_dir, ModelFilesOptions{.compute_f32 = compute_f32}));
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(std::move(files), opts));
  r.load_ms = MsSince(t0);
  if (engine->n_ctx() < prompt_tokens + gen_tokens + 1) {
    return InvalidArgumentError("bench: the model's context (" + std::to_string(engine->n_ctx()) +
                                ") is shorter than prompt_tokens + gen_tokens + 1");
  }
  const auto* impl = dynamic_cast<const engine_internal::EngineImpl*>(engine.get());
  const engine_internal::ModelDims& d = impl->decoder().dims();
  r.weight_bytes = engine->weight_bytes();
  r.weight_bytes_per_token = impl->layout().decode_bytes_per_token();
  // Step at position p reads p + 1 K and V rows per layer.
  const double mean_positions = prompt_tokens + (gen_tokens + 1) / 2.0;
  r.kv_bytes_per_token =
      mean_positions * 2.0 * d.n_layers * static_cast<double>(KvRowBytes(kv_type, d.kv_dim));
  r.kv_type = std::string(KvTypeName(kv_type));

  const int vocab = engine->config().vocab_size;
  GenerationRequest warm;
  warm.prompt_ids = BenchPrompt(16, vocab, 1);
  warm.sampling.temperature = 0;
  warm.max_tokens = 4;
  warm.ignore_eos = true;
  ARBITER_RETURN_IF_ERROR(engine->Generate(warm, nullptr, nullptr).status());

  std::vector<double> prefill_ms, decode_ms;  // the engine's timings, per repetition
  for (int rep = 0; rep < repetitions; ++rep) {
    GenerationRequest req;
    req.prompt_ids = BenchPrompt(prompt_tokens, vocab, 1000 + rep);
    req.sampling.temperature = 0;
    req.max_tokens = gen_tokens + 1;  // gen_tokens decode steps (the last sample is not fed)
    req.ignore_eos = true;
    ARBITER_ASSIGN_OR_RETURN(GenerationResult g, engine->Generate(req, nullptr, nullptr));
    if (g.cached_tokens != 0 || g.timings.decode_tokens != gen_tokens) {
      return InternalError("bench: unexpected run shape (cached " +
                           std::to_string(g.cached_tokens) + ", decode steps " +
                           std::to_string(g.timings.decode_tokens) + ")");
    }
    prefill_ms.push_back(g.timings.prefill_ms);
    decode_ms.push_back(g.timings.decode_ms);
  }
  r.prefill_ms = Summarize(prefill_ms).min;
  r.decode_ms = Summarize(decode_ms).min;
  r.prefill_tok_s = prompt_tokens / (r.prefill_ms / 1e3);
  r.decode_tok_s = gen_tokens / (r.decode_ms / 1e3);
  engine.reset();  // free the weights before the memcpy buffers

  r.memcpy_bytes_per_s = MeasureMemcpyBandwidth(size_t{256} << 20, n_threads);
  r.roofline_tok_s = r.memcpy_bytes_per_s / static_cast<double>(r.weight_bytes_per_token);
  r.roofline_fraction = r.decode_tok_s / r.roofline_tok_s;
  r.read_bytes_per_s = MeasureReadBandwidth(size_t{256} << 20, n_threads);
  r.read_roofline_tok_s = r.read_bytes_per_s / static_cast<double>(r.weight_bytes_per_token);
  r.read_roofline_fraction = r.decode_tok_s / r.read_roofline_tok_s;
  return r;
}

std::string FormatDecodeBench(const DecodeBenchResult& r) {
  char buf[2048];
  std::snprintf(buf, sizeof(buf),
                "model           %s\n"
                "threads         %d (OpenBLAS core %s)\n"
                "load            %.0f ms\n"
                "prefill         %d tokens: %.1f ms, %.1f tok/s (best of %d)\n"
                "decode          %d tokens: %.1f ms, %.2f tok/s (best of %d)\n"
                "weights         %.1f MB; %.1f MB streamed per decoded token (+%.2f MB KV, %s)\n"
                "memcpy          %.2f GB/s (%d threads, bytes copied per second, best of 5)\n"
                "roofline        %.2f tok/s = memcpy bandwidth / weight bytes per token\n"
                "achieved        %.0f%% of roofline\n"
                "read bandwidth  %.2f GB/s (%d threads, sequential sum, best of 5)\n"
                "read roofline   %.2f tok/s; achieved %.0f%%\n",
                r.model_dir.c_str(), r.n_threads, r.blas_core.c_str(), r.load_ms, r.prompt_tokens,
                r.prefill_ms, r.prefill_tok_s, r.repetitions, r.gen_tokens, r.decode_ms,
                r.decode_tok_s, r.repetitions, r.weight_bytes / 1e6, r.weight_bytes_per_token / 1e6,
                r.kv_bytes_per_token / 1e6, r.kv_type.c_str(), r.memcpy_bytes_per_s / 1e9,
                r.n_threads,
                r.roofline_tok_s, r.roofline_fraction * 100, r.read_bytes_per_s / 1e9, r.n_threads,
                r.read_roofline_tok_s, r.read_roofline_fraction * 100);
  return buf;
}

std::string FormatDecodeBenchJson(const DecodeBenchResult& r) {
  const nlohmann::json j = {{"model_dir", r.model_dir},
                            {"blas_core", r.blas_core},
                            {"n_threads", r.n_threads},
                            {"prompt_tokens", r.prompt_tokens},
                            {"gen_tokens", r.gen_tokens},
                            {"repetitions", r.repetitions},
                            {"load_ms", r.load_ms},
                            {"prefill_ms", r.prefill_ms},
                            {"prefill_tok_s", r.prefill_tok_s},
                            {"decode_ms", r.decode_ms},
                            {"decode_tok_s", r.decode_tok_s},
                            {"weight_bytes", r.weight_bytes},
                            {"weight_bytes_per_token", r.weight_bytes_per_token},
                            {"kv_bytes_per_token", r.kv_bytes_per_token},
                            {"kv_type", r.kv_type},
                            {"device", r.device},
                            {"memcpy_bytes_per_s", r.memcpy_bytes_per_s},
                            {"roofline_tok_s", r.roofline_tok_s},
                            {"roofline_fraction", r.roofline_fraction},
                            {"read_bytes_per_s", r.read_bytes_per_s},
                            {"read_roofline_tok_s", r.read_roofline_tok_s},
                            {"read_roofline_fraction", r.read_roofline_fraction}};
  return j.dump(2) + "\n";
}

}  // namespace arbiter
