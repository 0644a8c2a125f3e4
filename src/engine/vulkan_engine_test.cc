// The engine on a Vulkan device (lavapipe here and in CI) against the same
// weights on the CPU (block types: dequantized to f32 there, see Load):
// logits within the bound of the CPU's own reference tests, greedy ids identical wherever the CPU's
// top-2 margin exceeds that bound, embeddings, and KV moving between the devices through the host
// layout (Note [The Vulkan forward pass] in engine/internal/vulkan_compute.h).
// The Khronos validation layer is on; any message fails the test.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "arbiter/engine/engine.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/vulkan/vulkan_backend.h"
#include "arbiter/weights/weight_cache.h"
#include "engine/internal/test_model.h"
#include "tools/model_maker/model_maker.h"
#include "vulkan/vulkan_test_util.h"

namespace arbiter {
namespace {

using engine_internal::MakeTempDir;

// Logits agree within this share of the CPU's logit range (the f64
// reference tests' bound for f16 KV; both devices round K/V to f16).
constexpr double kLogitBound = 2e-3;

struct Case {
  std::string preset;
  std::string format;  // "safetensors" | "gguf"
  std::string dtype;   // "" = the preset's
  // The preset's architecture in WideShape's sizes (rows of 256, which the
  // K-quants need; the tiny presets' rows are 64) instead of the preset's.
  bool wide = false;
  // With dtype q4_k: v_proj and down_proj in Q6_K (llama.cpp's Q4_K_M
  // mix), so a layer's q/k/v matrix has segments of two types.
  bool mixed = false;
  std::string Name() const {
    std::string n = preset + (wide ? "_wide" : "") + (mixed ? "_mixed" : "") + "_" + format +
                    (dtype.empty() ? "" : "_" + dtype);
    std::replace(n.begin(), n.end(), '-', '_');
    return n;
  }
};
// gtest prints a parameter by this (the test names use Name() too).
void PrintTo(const Case& c, std::ostream* os) { *os << c.Name(); }

// `preset`'s architecture at hidden 256, intermediate 512, head_dim 64,
// 2 layers: every matrix row a whole number of K-quant super-blocks.
ModelShape WideShape(const std::string& preset) {
  ModelShape s = *PresetShape(preset);
  s.name = preset + "-wide";
  s.hidden = 256;
  s.intermediate = 512;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.layers = 2;
  return s;
}

class VulkanEngineTest : public vulkan::VulkanTest, public ::testing::WithParamInterface<Case> {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (IsSkipped()) return;
    const Case& c = GetParam();
    dir_ = MakeTempDir("arbiter_vulkan_engine_test_");
    path_ = c.format == "gguf" ? dir_ + "/model.gguf" : dir_ + "/model";
    if (c.wide) {
      Result<GeneratedModel> m = GenerateModel(WideShape(c.preset), /*seed=*/7);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      GgufModelOptions g;
      g.type = *ParseModelDtype(c.dtype, ModelFormat::kGguf);
      if (c.mixed) g.matrix_types = {{"v_proj", GgmlType::kQ6_K}, {"down_proj", GgmlType::kQ6_K}};
      Status s = WriteModelGguf(*m, path_, g);
      ASSERT_TRUE(s.ok()) << s.ToString();
      if (c.mixed) {
        Result<GgufFile> f = OpenGguf(path_);
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        EXPECT_EQ(f->FindTensor("blk.0.attn_q.weight")->type, GgmlType::kQ4_K);
        EXPECT_EQ(f->FindTensor("blk.0.attn_v.weight")->type, GgmlType::kQ6_K);
      }
      return;
    }
    MakeModelOptions o;
    o.format = *ParseModelFormat(c.format);
    o.dtype = c.dtype;
    o.seed = 7;
    Status s = MakeModel(c.preset, path_, o);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // The engine on `device`. On "cpu", a model of a block type computes in
  // f32 (compute_dtype "f32": the weights dequantized by the reference
  // dequantizer): the CPU's own decode quantizes the activations for block
  // weights (quant.h ActivationType, errors of ~1e-2 of the logit range),
  // the Vulkan kernels keep them f32, so the f32 CPU is the reference that
  // isolates how the kernels read the blocks.
  std::unique_ptr<Engine> Load(const std::string& device, int n_slots = 1, int batch = 16) {
    EngineOptions o;
    o.n_ctx = 160;
    o.n_slots = n_slots;
    o.prefill_batch = batch;
    o.n_threads = 2;
    o.device = device;
    ModelFilesOptions fo;
    fo.compute_f32 = device == "cpu" && GetParam().dtype.rfind('q', 0) == 0;
    Result<std::shared_ptr<const ModelFiles>> files = OpenModelFiles(path_, fo);
    EXPECT_TRUE(files.ok()) << files.status().ToString();
    if (!files.ok()) return nullptr;
    Result<std::unique_ptr<Engine>> e = Engine::Load(*files, o);
    EXPECT_TRUE(e.ok()) << device << ": " << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }

  std::vector<int32_t> Prompt(const Engine& e, int n) const {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 11) % e.config().vocab_size);
    return ids;
  }

  std::string dir_, path_;
};

// max |a − b| over the row, divided by the range of `want`.
double RangeError(const float* got, const float* want, size_t n) {
  float lo = want[0], hi = want[0];
  double err = 0;
  for (size_t i = 0; i < n; ++i) {
    lo = std::min(lo, want[i]);
    hi = std::max(hi, want[i]);
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  return err / std::max(1e-6, static_cast<double>(hi - lo));
}

TEST_P(VulkanEngineTest, LogitsOfEveryPositionMatchTheCpu) {
  std::unique_ptr<Engine> cpu = Load("cpu");
  std::unique_ptr<Engine> gpu = Load("vulkan");
  ASSERT_TRUE(cpu && gpu);
  const std::vector<int32_t> ids = Prompt(*cpu, 40);
  std::vector<float> want = *cpu->ComputeLogits(ids);
  std::vector<float> got = *gpu->ComputeLogits(ids);
  ASSERT_EQ(got.size(), want.size());
  const size_t vocab = static_cast<size_t>(cpu->config().vocab_size);
  for (size_t t = 0; t < ids.size(); ++t) {
    EXPECT_LT(RangeError(got.data() + t * vocab, want.data() + t * vocab, vocab), kLogitBound)
        << "position " << t;
  }
}

// A prompt longer than the batch runs as several chunks (the last one
// partial), and a batch of 1 runs every token as its own chunk: both give
// the CPU's logits at every position.
TEST_P(VulkanEngineTest, PrefillChunksOfAnyBatchMatchTheCpu) {
  std::unique_ptr<Engine> cpu = Load("cpu");
  ASSERT_TRUE(cpu);
  const std::vector<int32_t> ids = Prompt(*cpu, 40);
  std::vector<float> want = *cpu->ComputeLogits(ids);
  const size_t vocab = static_cast<size_t>(cpu->config().vocab_size);
  for (int batch : {7, 1}) {
    std::unique_ptr<Engine> gpu = Load("vulkan", 1, batch);
    ASSERT_TRUE(gpu);
    std::vector<float> got = *gpu->ComputeLogits(ids);
    ASSERT_EQ(got.size(), want.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      EXPECT_LT(RangeError(got.data() + t * vocab, want.data() + t * vocab, vocab), kLogitBound)
          << "batch " << batch << ", position " << t;
    }
    // The last chunk's logits alone (no all-logits output): the greedy
    // first token is the CPU's argmax up to a near-tie.
    GenerationRequest req;
    req.prompt_ids = ids;
    req.sampling.temperature = 0;
    req.max_tokens = 1;
    GenerationResult b = *gpu->Generate(req, nullptr, {});
    ASSERT_EQ(b.output_ids.size(), 1u);
    const float* last = want.data() + (ids.size() - 1) * vocab;
    const float hi = *std::max_element(last, last + vocab);
    const float lo = *std::min_element(last, last + vocab);
    EXPECT_LE(hi - last[b.output_ids[0]], kLogitBound * (hi - lo)) << "batch " << batch;
  }
}

TEST_P(VulkanEngineTest, GreedyIdsMatchTheCpuUpToNearTies) {
  std::unique_ptr<Engine> cpu = Load("cpu");
  std::unique_ptr<Engine> gpu = Load("vulkan");
  ASSERT_TRUE(cpu && gpu);
  GenerationRequest req;
  req.prompt_ids = Prompt(*cpu, 12);
  req.sampling.temperature = 0;
  req.max_tokens = 64;
  req.ignore_eos = true;
  GenerationResult a = *cpu->Generate(req, nullptr, {});
  GenerationResult b = *gpu->Generate(req, nullptr, {});
  ASSERT_EQ(a.output_ids.size(), 64u);
  ASSERT_EQ(b.output_ids.size(), 64u);
  for (size_t i = 0; i < a.output_ids.size(); ++i) {
    if (a.output_ids[i] == b.output_ids[i]) continue;
    // A difference is allowed only where the CPU's top two are within the bound.
    std::vector<int32_t> prefix = req.prompt_ids;
    prefix.insert(prefix.end(), a.output_ids.begin(), a.output_ids.begin() + i);
    std::vector<float> l = *cpu->ComputeLogits(prefix);
    const size_t vocab = static_cast<size_t>(cpu->config().vocab_size);
    std::vector<float> last(l.end() - vocab, l.end());
    std::vector<float> sorted = last;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    const float range = sorted[0] - *std::min_element(last.begin(), last.end());
    EXPECT_LT(sorted[0] - sorted[1], kLogitBound * range)
        << "greedy ids differ at " << i << " where the CPU's top-2 margin is not a near-tie";
    break;
  }
}

TEST_P(VulkanEngineTest, EmbeddingsMatchTheCpu) {
  std::unique_ptr<Engine> cpu = Load("cpu");
  std::unique_ptr<Engine> gpu = Load("vulkan");
  ASSERT_TRUE(cpu && gpu);
  const std::vector<int32_t> ids = Prompt(*cpu, 20);
  std::vector<float> a = *cpu->Embed(ids, {});
  std::vector<float> b = *gpu->Embed(ids, {});
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3) << i;
}

TEST_P(VulkanEngineTest, KvMovesBetweenTheDevicesThroughTheHostLayout) {
  std::unique_ptr<Engine> cpu = Load("cpu");
  std::unique_ptr<Engine> gpu = Load("vulkan");
  ASSERT_TRUE(cpu && gpu);
  GenerationRequest req;
  req.prompt_ids = Prompt(*cpu, 24);
  req.sampling.temperature = 0;
  req.max_tokens = 1;
  req.slot = 0;
  ASSERT_TRUE(gpu->Generate(req, nullptr, {}).ok());
  KvSnapshot from_gpu = *gpu->SaveSlot(0, {});
  ASSERT_EQ(from_gpu.n_tokens(), 24u);
  // The GPU's rows restore into the CPU model and extend there as the
  // CPU's own would.
  ASSERT_EQ(*cpu->RestoreSlot(0, from_gpu, {}), 24);
  KvSnapshot back = *cpu->SaveSlot(0, {});
  ASSERT_EQ(back.kv.size(), from_gpu.kv.size());
  ASSERT_TRUE(std::equal(back.kv.begin(), back.kv.end(), from_gpu.kv.begin()));
  GenerationRequest more = req;
  more.prompt_ids = Prompt(*cpu, 30);
  more.max_tokens = 8;
  more.ignore_eos = true;
  GenerationResult on_cpu = *cpu->Generate(more, nullptr, {});
  EXPECT_EQ(on_cpu.cached_tokens, 24);
  // And back: the CPU's rows into a fresh GPU slot.
  ASSERT_EQ(*gpu->RestoreSlot(0, back, {}), 24);
  GenerationResult on_gpu = *gpu->Generate(more, nullptr, {});
  EXPECT_EQ(on_gpu.cached_tokens, 24);
  EXPECT_EQ(on_gpu.output_ids, on_cpu.output_ids);
}

// ARBITER_VULKAN_PROFILE=1: the validation layer stays silent with the
// timestamp queries (the fixture checks), results are unchanged, and the
// GPU time per kernel is logged when the engine goes away.
TEST_P(VulkanEngineTest, ProfileLogsGpuTimePerKernel) {
  if (GetParam().Name() != "tiny_qwen3_gguf_f16") GTEST_SKIP() << "one model is enough";
  std::unique_ptr<Engine> cpu = Load("cpu");
  ASSERT_TRUE(cpu);
  const std::vector<int32_t> ids = Prompt(*cpu, 20);
  std::vector<float> want = *cpu->ComputeLogits(ids);
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  ::setenv("ARBITER_VULKAN_PROFILE", "1", 1);
  {
    std::unique_ptr<Engine> gpu = Load("vulkan");
    ::unsetenv("ARBITER_VULKAN_PROFILE");
    ASSERT_TRUE(gpu);
    std::vector<float> got = *gpu->ComputeLogits(ids);
    const size_t vocab = static_cast<size_t>(cpu->config().vocab_size);
    for (size_t t = 0; t < ids.size(); ++t) {
      EXPECT_LT(RangeError(got.data() + t * vocab, want.data() + t * vocab, vocab), kLogitBound);
    }
    GenerationRequest req;
    req.prompt_ids = ids;
    req.max_tokens = 4;
    req.ignore_eos = true;
    ASSERT_TRUE(gpu->Generate(req, nullptr, {}).ok());
  }
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  const std::string text = log.str();
  EXPECT_NE(text.find("vulkan profile (vulkan:0): decode"), std::string::npos) << text;
  EXPECT_NE(text.find("vulkan profile (vulkan:0): prefill"), std::string::npos) << text;
  EXPECT_NE(text.find("gemm_f16 qkv"), std::string::npos) << text;
  EXPECT_NE(text.find("matvec_f16 lm_head"), std::string::npos) << text;
  EXPECT_NE(text.find("attention"), std::string::npos) << text;
}

// A pinned_system model woken from its host floor: on a backend that treats
// lavapipe's memory as VRAM (force_staging), the weight cache imports the
// floor and the wake is GPU copies out of its pages (Note [Imported floors]
// in weights/weight_cache.cc). The logits after the wake are the logits
// before it, bit for bit.
TEST_P(VulkanEngineTest, AWakeFromTheImportedHostFloorGivesIdenticalLogits) {
  Result<std::unique_ptr<vulkan::VulkanDeviceBackend>> backend =
      vulkan::VulkanDeviceBackend::Create(*vulkan::VulkanDevice::Open("vulkan"),
                                          {.force_staging = true});
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  if (!(*backend)->device()->info().external_memory_host) {
    GTEST_SKIP() << "no VK_EXT_external_memory_host";
  }
  WeightCacheOptions wo;
  wo.device = backend->get();
  wo.wiggle = 0;
  Result<std::unique_ptr<WeightCache>> cache = WeightCache::Create(std::move(wo));
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  EngineOptions o;
  o.n_ctx = 160;
  o.prefill_batch = 16;
  o.n_threads = 2;
  o.device = "vulkan";
  o.weight_cache = cache->get();
  o.weight_key = "m";
  Result<std::shared_ptr<const ModelFiles>> files = OpenModelFiles(path_, {});
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  Result<WeightModel> m =
      Engine::WeightModelFor(**files, "m", o, ResidencyState::kPinnedSystem);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE((*cache)->Register(std::move(m).value()).ok());
  Result<std::unique_ptr<Engine>> e = Engine::Load(*files, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const std::vector<int32_t> ids = Prompt(**e, 24);
  Result<std::vector<float>> before = (*e)->ComputeLogits(ids);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  const vulkan::CopyPathStats loaded = (*backend)->copy_stats();
  EXPECT_GT(loaded.imported_copies, 0u);  // the first load came from the floor too
  ASSERT_TRUE(*(*cache)->Evict("m"));
  Result<std::vector<float>> after = (*e)->ComputeLogits(ids);  // wakes the weights
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  const vulkan::CopyPathStats woken = (*backend)->copy_stats();
  EXPECT_GT(woken.imported_copies, loaded.imported_copies);
  EXPECT_EQ(woken.imported_bytes - loaded.imported_bytes, loaded.imported_bytes);
  EXPECT_EQ(woken.imports, 1u);  // once per floor
  EXPECT_EQ(*before, *after);
  e->reset();
  cache->reset();
}

// Partial offload (Note [Partial offload] in engine/internal/split_compute.cc):
// a 4-layer model with its last N layers on the device and the rest on the
// CPU, for N = 1, 2 and 3, against the whole model on the CPU (f16 KV, as
// the split keeps): logits within the bound, greedy ids identical up to
// near-ties, and KV moving split → CPU → split through the host layout.
struct SplitCase {
  std::string preset;
  std::string format;  // "safetensors" (f16) | "gguf" (q8_0)
  bool tied = false;
  std::string Name() const {
    std::string n = preset + "_" + format + (tied ? "_tied" : "");
    std::replace(n.begin(), n.end(), '-', '_');
    return n;
  }
};
void PrintTo(const SplitCase& c, std::ostream* os) { *os << c.Name(); }

class SplitEngineTest : public vulkan::VulkanTest,
                        public ::testing::WithParamInterface<SplitCase> {
 protected:
  static constexpr int kLayers = 4;

  void SetUp() override {
    VulkanTest::SetUp();
    if (IsSkipped()) return;
    const SplitCase& c = GetParam();
    dir_ = MakeTempDir("arbiter_split_engine_test_");
    ModelShape shape = *PresetShape(c.preset);
    shape.layers = kLayers;
    shape.tied = c.tied;
    Result<GeneratedModel> m = GenerateModel(shape, /*seed=*/11);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    if (c.format == "gguf") {
      path_ = dir_ + "/model.gguf";
      GgufModelOptions g;
      g.type = GgmlType::kQ8_0;
      Status s = WriteModelGguf(*m, path_, g);
      ASSERT_TRUE(s.ok()) << s.ToString();
    } else {
      path_ = dir_ + "/model";
      Status s = WriteModelDirectory(*m, path_, GgmlType::kF16);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }

  // The model on "vulkan" with `device_layers` there (−1: all), or on the
  // CPU (a q8_0 file in f32 there, as VulkanEngineTest::Load says why).
  std::unique_ptr<Engine> Load(int device_layers, bool cpu = false) {
    EngineOptions o;
    o.n_ctx = 96;
    o.n_slots = 2;
    o.prefill_batch = 16;
    o.n_threads = 2;
    o.device = cpu ? "cpu" : "vulkan";
    o.device_layers = device_layers;
    ModelFilesOptions fo;
    fo.compute_f32 = GetParam().format == "gguf" && (cpu || device_layers < kLayers);
    Result<std::shared_ptr<const ModelFiles>> files = OpenModelFiles(path_, fo);
    EXPECT_TRUE(files.ok()) << files.status().ToString();
    if (!files.ok()) return nullptr;
    Result<std::unique_ptr<Engine>> e = Engine::Load(*files, o);
    EXPECT_TRUE(e.ok()) << device_layers << ": " << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }

  std::vector<int32_t> Prompt(const Engine& e, int n) const {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 11) % e.config().vocab_size);
    return ids;
  }

  std::string dir_, path_;
};

TEST_P(SplitEngineTest, LogitsAndGreedyIdsMatchTheCpu) {
  std::unique_ptr<Engine> cpu = Load(-1, /*cpu=*/true);
  ASSERT_TRUE(cpu);
  const std::vector<int32_t> ids = Prompt(*cpu, 40);
  const std::vector<float> want = *cpu->ComputeLogits(ids);
  const size_t vocab = static_cast<size_t>(cpu->config().vocab_size);
  GenerationRequest req;
  req.prompt_ids = Prompt(*cpu, 12);
  req.sampling.temperature = 0;
  req.max_tokens = 24;
  req.ignore_eos = true;
  const GenerationResult greedy = *cpu->Generate(req, nullptr, {});
  for (int n : {1, 2, 3}) {
    std::unique_ptr<Engine> split = Load(n);
    ASSERT_TRUE(split);
    EXPECT_EQ(split->device_layers(), n);
    EXPECT_EQ(split->device(), "vulkan:0");
    // The CPU layers' KV and scratch are in the footprint, and are not all of it.
    EXPECT_GT(split->kv_bytes(), 0u);
    const std::vector<float> got = *split->ComputeLogits(ids);
    ASSERT_EQ(got.size(), want.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      EXPECT_LT(RangeError(got.data() + t * vocab, want.data() + t * vocab, vocab), kLogitBound)
          << n << " device layers, position " << t;
    }
    const GenerationResult b = *split->Generate(req, nullptr, {});
    ASSERT_EQ(b.output_ids.size(), greedy.output_ids.size());
    for (size_t i = 0; i < b.output_ids.size(); ++i) {
      if (b.output_ids[i] == greedy.output_ids[i]) continue;
      std::vector<int32_t> prefix = req.prompt_ids;
      prefix.insert(prefix.end(), greedy.output_ids.begin(), greedy.output_ids.begin() + i);
      std::vector<float> l = *cpu->ComputeLogits(prefix);
      std::vector<float> last(l.end() - vocab, l.end());
      std::vector<float> sorted = last;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      const float range = sorted[0] - *std::min_element(last.begin(), last.end());
      EXPECT_LT(sorted[0] - sorted[1], kLogitBound * range)
          << n << " device layers: greedy ids differ at " << i << " without a near-tie";
      break;
    }
  }
  // N = 0 is the CPU; N = n_layers the whole model on the device.
  std::unique_ptr<Engine> none = Load(0);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->device(), "cpu");
  EXPECT_EQ(none->device_layers(), kLayers);
  std::unique_ptr<Engine> all = Load(kLayers);
  ASSERT_TRUE(all);
  EXPECT_EQ(all->device_layers(), kLayers);
  EXPECT_EQ(all->device(), "vulkan:0");
}

TEST_P(SplitEngineTest, KvMovesSplitToCpuAndBack) {
  std::unique_ptr<Engine> cpu = Load(-1, /*cpu=*/true);
  std::unique_ptr<Engine> split = Load(2);
  ASSERT_TRUE(cpu && split);
  GenerationRequest req;
  req.prompt_ids = Prompt(*cpu, 24);
  req.sampling.temperature = 0;
  req.max_tokens = 1;
  req.slot = 0;
  ASSERT_TRUE(split->Generate(req, nullptr, {}).ok());
  KvSnapshot from_split = *split->SaveSlot(0, {});
  ASSERT_EQ(from_split.n_tokens(), 24u);
  ASSERT_EQ(from_split.n_layers, static_cast<uint32_t>(kLayers));
  // The CPU computes the same rows (both in f16) for the whole model.
  req.slot = 1;
  ASSERT_TRUE(cpu->Generate(req, nullptr, {}).ok());
  KvSnapshot own = *cpu->SaveSlot(1, {});
  ASSERT_EQ(own.kv.size(), from_split.kv.size());
  // The split's rows restore into the CPU model and extend there.
  ASSERT_EQ(*cpu->RestoreSlot(0, from_split, {}), 24);
  KvSnapshot back = *cpu->SaveSlot(0, {});
  ASSERT_TRUE(std::equal(back.kv.begin(), back.kv.end(), from_split.kv.begin()));
  GenerationRequest more = req;
  more.slot = 0;
  more.prompt_ids = Prompt(*cpu, 30);
  more.max_tokens = 8;
  more.ignore_eos = true;
  GenerationResult on_cpu = *cpu->Generate(more, nullptr, {});
  EXPECT_EQ(on_cpu.cached_tokens, 24);
  // And back into a split slot (another one: WriteKv, not the old rows).
  more.slot = 1;
  ASSERT_EQ(*split->RestoreSlot(1, back, {}), 24);
  GenerationResult on_split = *split->Generate(more, nullptr, {});
  EXPECT_EQ(on_split.cached_tokens, 24);
  EXPECT_EQ(on_split.output_ids, on_cpu.output_ids);
  // VisitSlot joins the two parts' rows in the host layout.
  Status v = split->VisitSlot(1, [&](const KvRowsView& rows) -> Status {
    EXPECT_EQ(rows.n_layers, static_cast<uint32_t>(kLayers));
    EXPECT_EQ(rows.k.size(), static_cast<size_t>(kLayers));
    const size_t row = rows.row_bytes();
    for (size_t l = 0; l < rows.k.size(); ++l) {
      const uint8_t* want_k = back.kv.data() + 2 * l * 24 * row;
      EXPECT_TRUE(std::equal(rows.k[l], rows.k[l] + 24 * row, want_k)) << "layer " << l;
    }
    return OkStatus();
  }, {});
  EXPECT_TRUE(v.ok()) << v.ToString();
}

INSTANTIATE_TEST_SUITE_P(Models, SplitEngineTest,
                         ::testing::Values(SplitCase{"tiny-qwen3", "safetensors", false},
                                           SplitCase{"tiny", "gguf", true}),
                         [](const auto& info) { return info.param.Name(); });

using VulkanDeviceNamesTest = vulkan::VulkanTest;

TEST_F(VulkanDeviceNamesTest, AMissingDeviceFailsTheLoadNamingIt) {
  const std::string dir = MakeTempDir("arbiter_vulkan_names_test_");
  ASSERT_TRUE(MakeModel("tiny", dir + "/tiny", 3).ok());
  EngineOptions o;
  o.n_ctx = 64;
  o.device = "vulkan:99";
  Result<std::unique_ptr<Engine>> e = Engine::Load(dir + "/tiny", o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound) << e.status().ToString();
  EXPECT_NE(e.status().message().find("vulkan:99"), std::string::npos) << e.status().message();
  o.device = "vulkan";
  o.kv_type = GgmlType::kQ8_0;
  e = Engine::Load(dir + "/tiny", o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("kv_type"), std::string::npos) << e.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Models, VulkanEngineTest,
    ::testing::Values(Case{"tiny", "safetensors", ""}, Case{"tiny", "safetensors", "bf16"},
                      Case{"tiny-qwen2", "safetensors", ""}, Case{"tiny-qwen3", "safetensors", ""},
                      Case{"tiny-qwen3", "gguf", "f32"}, Case{"tiny-qwen3", "gguf", "f16"},
                      Case{"tiny-qwen3", "gguf", "bf16"}, Case{"tiny-qwen3", "gguf", "q8_0"},
                      Case{"tiny-qwen3", "gguf", "q4_0"}, Case{"tiny", "gguf", "q5_1"},
                      Case{"tiny-qwen3", "gguf", "q4_k", true},
                      Case{"tiny-qwen2", "gguf", "q5_k", true}, Case{"tiny", "gguf", "q6_k", true},
                      Case{"tiny-qwen2", "gguf", "q4_k", true, true}),
    [](const auto& info) { return info.param.Name(); });

}  // namespace
}  // namespace arbiter
