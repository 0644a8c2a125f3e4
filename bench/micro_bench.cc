// bench/micro_bench.cc — Google Benchmark micro-benchmarks for the readers,
// the tokenizer, the BPE trainer and the MemoryArbiter's acquire/release.
// Not part of `make test`; run `build/bench/micro_bench`.
//
// Each throughput figure is reported next to the limit measured in the same
// run: `BM_Memcpy` copies the same number of bytes, so conversion speed reads
// as a fraction of memory bandwidth (BF16 → F32 reads 2 bytes and writes 4 per
// element; memcpy reads and writes 4).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/engine/tokenizer.h"
#include "arbiter/formats/safetensors.h"
#include "tools/model_maker/bpe_trainer.h"

namespace arbiter {
namespace {

constexpr size_t kElements = 16u << 20;  // 16 Mi elements: 64 MiB of f32

void BM_Memcpy(benchmark::State& state) {
  std::vector<float> src(kElements, 1.0f), dst(kElements);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kElements * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kElements * sizeof(float)));
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);

// Output bytes per second, comparable with BM_Memcpy.
void ConvertBench(benchmark::State& state, DType dtype) {
  std::vector<uint16_t> src(kElements);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& h : src) h = dtype == DType::kBF16 ? F32ToBF16(dist(rng)) : F32ToF16(dist(rng));
  TensorInfo t;
  t.name = "bench";
  t.dtype = dtype;
  t.shape = {static_cast<int64_t>(kElements)};
  t.data = reinterpret_cast<const uint8_t*>(src.data());
  t.size_bytes = kElements * 2;
  std::vector<float> out(kElements);
  for (auto _ : state) {
    if (!ConvertToF32(t, out.data()).ok()) state.SkipWithError("ConvertToF32 failed");
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kElements * sizeof(float)));
}
void BM_ConvertBF16(benchmark::State& state) { ConvertBench(state, DType::kBF16); }
void BM_ConvertF16(benchmark::State& state) { ConvertBench(state, DType::kF16); }
BENCHMARK(BM_ConvertBF16)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvertF16)->Unit(benchmark::kMillisecond);

// Trains the byte-level BPE on the license corpus (3700 merges, the
// demo-chat size), as `arbiter make-model` does once per call. Reports input
// bytes per second (docs/BENCHMARKS.md "Tools").
void BM_TrainBpe(benchmark::State& state) {
  auto corpus = DefaultTrainingCorpus();
  if (!corpus.ok()) {
    state.SkipWithError(corpus.status().ToString().c_str());
    return;
  }
  BpeTrainerOptions options;
  options.num_merges = 3700;
  size_t merges = 0;
  for (auto _ : state) {
    auto trained = TrainBpe(*corpus, options);
    if (!trained.ok()) {
      state.SkipWithError(trained.status().ToString().c_str());
      return;
    }
    merges = trained->merges.size();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(corpus->size()));
  state.counters["merges"] = static_cast<double>(merges);
}
BENCHMARK(BM_TrainBpe)->Unit(benchmark::kMillisecond);

// Encodes the license corpus with a tokenizer trained on it (3700 merges,
// the demo-chat size). Reports input bytes per second and tokens.
void BM_TokenizerEncode(benchmark::State& state) {
  auto corpus = DefaultTrainingCorpus();
  if (!corpus.ok()) {
    state.SkipWithError(corpus.status().ToString().c_str());
    return;
  }
  BpeTrainerOptions options;
  options.num_merges = 3700;
  auto trained = TrainBpe(*corpus, options);
  if (!trained.ok()) {
    state.SkipWithError(trained.status().ToString().c_str());
    return;
  }
  auto tokenizer = Tokenizer::FromJson(trained->ToTokenizerJson(), "bench");
  if (!tokenizer.ok()) {
    state.SkipWithError(tokenizer.status().ToString().c_str());
    return;
  }
  size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = (*tokenizer)->Encode(*corpus);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(corpus->size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
}
BENCHMARK(BM_TokenizerEncode)->Unit(benchmark::kMillisecond);

// MemoryArbiter: Acquire + Release of a resident handle (the lock-free fast
// path, Note [Fast path]); `arbiter bench arbiter` reports percentiles and
// the other scenarios. Run with --benchmark_filter=Arbiter; ->Threads(2) has
// both threads on one entry (one shared pin word).
void BM_ArbiterAcquireRelease(benchmark::State& state) {
  static MemoryArbiter* arbiter = [] {
    auto* a = new MemoryArbiter({.idle_check_interval_ms = 0});
    CapabilityRegistration r;
    r.capability = Capability::kText;
    r.load = [](const std::string&) -> Result<LoadedBackend> {
      return LoadedBackend::Of(std::make_shared<int>(0), 0);
    };
    if (!a->RegisterCapability(std::move(r)).ok()) std::abort();
    return a;
  }();
  for (auto _ : state) {
    Result<ArbiterHandle> h =
        arbiter->Acquire(Capability::kText, "demo-chat", ArbiterDeadline::max());
    benchmark::DoNotOptimize(h->backend<int>());
  }
}
BENCHMARK(BM_ArbiterAcquireRelease)->Threads(1)->Threads(2);

}  // namespace
}  // namespace arbiter

BENCHMARK_MAIN();
