// GGUF models in the engine (issue 13, point 3), on small models that
// make-model's GGUF writer (tools/model_maker) writes in every weight type
// the engine computes:
//
//   - LogitsMatchNumpy: the engine's logits against scripts/reference_logits.py,
//     which reads the same GGUF file itself, dequantizes every tensor to
//     float64 from the ggml block layouts (written independently of the C++
//     kernels) and runs the forward pass in float64. Measured per prompt as
//     max|Δlogit| ÷ (max logit − min logit) of the reference, for the batch
//     path (prefill: the integer product with activations quantized to 8
//     bits where the kernel path has a tile kernel for the type, else
//     dequantized panels + sgemm with f32 activations; forward.cc Note
//     [Prefill on typed weights]) and for the decode path (the last 4 tokens
//     one by one: DotRows, activations quantized to 8 bits for the block
//     types), each on every kernel path the CPU has. Bounds: 1e-3 for
//     F32/F16/BF16 weights, 2e-2 where decode quantizes activations. KV is f32.
//   - GgufF32MatchesSafetensors: the GGUF f32 file and the safetensors f32
//     directory of one generated model give the same token ids and logits
//     (llama: q/k rows permuted in the file; qwen2: biases, tied).
//   - UnpermutedLlamaQkIsCaught: a llama file written without the q/k
//     permutation (Note [GGUF q/k row order]) gives other logits, so the
//     comparison above would catch a permutation the loader got wrong.
//
// Models: hidden 256, intermediate 512, 4 heads of 64 (2 KV heads), 2 layers,
// ~800 tokens — every row a multiple of 256, so the K-quants apply. llama is
// untied (output.weight in the block type), qwen3 tied. A missing numpy
// FAILS the test (it is a required dependency).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "arbiter/base/file.h"
#include "arbiter/engine/engine.h"
#include "arbiter/formats/gguf.h"
#include "engine/internal/engine_impl.h"
#include "engine/internal/quant.h"
#include "engine/internal/test_model.h"
#include "tools/model_maker/model_maker.h"

namespace arbiter {
namespace {

using engine_internal::EngineImpl;
using engine_internal::KernelPath;
using engine_internal::MaxRangeRelativeError;

constexpr int kPrefillBatch = 8;  // small, so prompts span several sgemm chunks
constexpr int kDecodeTokens = 4;  // the last tokens of a prompt, decoded one by one
constexpr uint64_t kSeed = 5;

const std::vector<std::string>& Prompts() {
  static const std::vector<std::string> texts = {
      "Hi",
      "The licence grants you the right to copy it.",
      "Permission is hereby granted, free of charge, to any person obtaining a copy of this "
      "software and associated documentation files, to deal in the Software without "
      "restriction.",
  };
  return texts;
}

ModelShape TestShape(const std::string& arch) {
  ModelShape s;
  s.name = "gguf-test-" + arch;
  s.model_type = arch;
  s.hidden = 256;
  s.layers = 2;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.intermediate = 512;
  s.tied = arch != "llama";
  s.merges = 512;
  s.max_position = 512;
  s.rope_theta = arch == "llama" ? 10000.0 : 1000000.0;
  return s;
}

EngineOptions Options() {
  EngineOptions opts;
  opts.n_ctx = 128;
  opts.n_slots = 1;
  opts.prefill_batch = kPrefillBatch;
  opts.n_threads = 2;  // decode matvecs split across the pool
  opts.kv_type = GgmlType::kF32;  // the weights' error alone (issue 13 point 3)
  return opts;
}

// Whether decode quantizes activations for weights of `type` (the 2e-2 bound).
bool QuantizesActivations(GgmlType type) {
  return engine_internal::ActivationType(type) != GgmlType::kF32;
}

struct Case {
  const char* arch;
  GgmlType type;
};
// gtest prints the parameter in test names and failures ("qwen3 Q4_K").
void PrintTo(const Case& c, std::ostream* os) { *os << c.arch << " " << GgmlTypeName(c.type); }

class GgufReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(GgufReferenceTest, LogitsMatchNumpy) {
  const Case c = GetParam();
  const std::string type_name(GgmlTypeName(c.type));
  const std::string dir = engine_internal::MakeTempDir("arbiter_gguf_ref_");
  ASSERT_FALSE(dir.empty());
  Result<GeneratedModel> model = GenerateModel(TestShape(c.arch), kSeed);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::string path = dir + "/model.gguf";
  GgufModelOptions go;
  go.type = c.type;
  Status written = WriteModelGguf(*model, path, go);
  ASSERT_TRUE(written.ok()) << written.ToString();

  Result<std::unique_ptr<Engine>> engine = Engine::Load(path, Options());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto* impl = dynamic_cast<EngineImpl*>(engine->get());
  ASSERT_NE(impl, nullptr);
  const int vocab = (*engine)->config().vocab_size;
  ASSERT_EQ(vocab, model->vocab_size());

  // The weights are the file's tensor bytes, computed in place.
  Result<GgufFile> gguf = OpenGguf(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  size_t tensor_bytes = 0;
  for (const GgufTensorInfo& t : gguf->tensors()) {
    tensor_bytes += t.size_bytes;
    if (t.dims.size() == 2) EXPECT_EQ(t.type, c.type) << t.name;
  }
  EXPECT_EQ((*engine)->weight_bytes(), tensor_bytes);

  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& text : Prompts()) {
    prompts.push_back((*engine)->tokenizer().Encode(text, false));
    ASSERT_GT(prompts.back().size(), 0u);
  }
  ASSERT_GT(prompts.back().size(), static_cast<size_t>(kPrefillBatch));
  Result<std::vector<std::vector<double>>> ref =
      engine_internal::RunReferenceLogitsBatch(path, prompts, vocab);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();

  const double bound = QuantizesActivations(c.type) ? 2e-2 : 1e-3;
  const KernelPath active = engine_internal::ActiveKernelPath();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& ids = prompts[p];
    const std::vector<double>& want = (*ref)[p];
    // The batch path on every kernel path: prefill through the block types
    // computes in integers where the path has a tile kernel (quant_gemm.h),
    // else on dequantized panels.
    std::string batch_text;
    for (KernelPath path_k : engine_internal::SupportedKernelPaths()) {
      engine_internal::SetKernelPathForTest(path_k);
      Result<std::vector<float>> got = (*engine)->ComputeLogits(ids);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      const double err = MaxRangeRelativeError(got->data(), want.data(), got->size());
      EXPECT_LE(err, bound) << c.arch << " " << type_name << " prompt " << p << " (batch, "
                            << engine_internal::KernelPathName(path_k) << ")";
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%s%s %.2e", batch_text.empty() ? "" : ", ",
                    std::string(engine_internal::KernelPathName(path_k)).c_str(), err);
      batch_text += buf;
    }
    engine_internal::SetKernelPathForTest(active);

    const int n = static_cast<int>(ids.size());
    const int n_prefill = std::max(1, n - kDecodeTokens);
    const double* want_last = want.data() + static_cast<size_t>(n - 1) * vocab;
    std::string decode_text;
    for (KernelPath path_k : engine_internal::SupportedKernelPaths()) {
      engine_internal::SetKernelPathForTest(path_k);
      Result<std::vector<float>> inc = impl->IncrementalLogits(ids, n_prefill);
      ASSERT_TRUE(inc.ok()) << inc.status().ToString();
      const double decode = MaxRangeRelativeError(inc->data(), want_last, vocab);
      EXPECT_LE(decode, bound) << c.arch << " " << type_name << " prompt " << p << " (decode, "
                               << engine_internal::KernelPathName(path_k) << ")";
      char buf[64];
      std::snprintf(buf, sizeof(buf), ", decode %s %.2e",
                    std::string(engine_internal::KernelPathName(path_k)).c_str(), decode);
      decode_text += buf;
    }
    engine_internal::SetKernelPathForTest(active);
    std::printf(
        "[ gguf ref ] %-5s %-4s prompt %zu (%2d tokens): max|dlogit|/range batch %s%s "
        "(bound %.0e)\n",
        c.arch, type_name.c_str(), p, n, batch_text.c_str(), decode_text.c_str(), bound);
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.arch) + "_" + std::string(GgmlTypeName(info.param.type));
}

const GgmlType kAllTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                              GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                              GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const char* arch : {"llama", "qwen3"}) {
    for (GgmlType t : kAllTypes) cases.push_back({arch, t});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Types, GgufReferenceTest, ::testing::ValuesIn(AllCases()), CaseName);

// ---- GGUF f32 against the safetensors f32 directory of the same model ------

// Loads both encodings of one generated model; `permute` false writes a
// llama file without its q/k permutation.
struct TwoEncodings {
  std::unique_ptr<Engine> safetensors;
  std::unique_ptr<Engine> gguf;
};

Result<TwoEncodings> LoadBoth(const std::string& arch, bool permute) {
  const std::string dir = engine_internal::MakeTempDir("arbiter_gguf_st_");
  ModelShape shape = TestShape(arch);
  if (arch == "qwen2") shape.tied = true;
  ARBITER_ASSIGN_OR_RETURN(GeneratedModel model, GenerateModel(shape, kSeed));
  ARBITER_RETURN_IF_ERROR(WriteModelDirectory(model, dir + "/hf", GgmlType::kF32));
  GgufModelOptions go;
  go.type = GgmlType::kF32;
  go.permute_llama_qk = permute;
  ARBITER_RETURN_IF_ERROR(WriteModelGguf(model, dir + "/model.gguf", go));
  TwoEncodings out;
  ARBITER_ASSIGN_OR_RETURN(out.safetensors, Engine::Load(dir + "/hf", Options()));
  ARBITER_ASSIGN_OR_RETURN(out.gguf, Engine::Load(dir + "/model.gguf", Options()));
  return out;
}

class GgufSafetensorsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufSafetensorsTest, GgufF32MatchesSafetensors) {
  const std::string arch = GetParam();
  Result<TwoEncodings> both = LoadBoth(arch, /*permute=*/true);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  Engine& st = *both->safetensors;
  Engine& gg = *both->gguf;
  ASSERT_EQ(st.config().vocab_size, gg.config().vocab_size);
  EXPECT_EQ(st.config().tie_word_embeddings, gg.config().tie_word_embeddings);
  EXPECT_EQ(st.config().attention_bias, gg.config().attention_bias);
  EXPECT_EQ(st.weight_bytes(), gg.weight_bytes());
  EXPECT_EQ(dynamic_cast<EngineImpl&>(st).eos_ids(), dynamic_cast<EngineImpl&>(gg).eos_ids());
  const int vocab = st.config().vocab_size;
  for (const std::string& text : Prompts()) {
    // The GGUF tokenizer (tokenizer.ggml.*) tokenizes as tokenizer.json does.
    const std::vector<int32_t> ids = st.tokenizer().Encode(text, false);
    ASSERT_EQ(gg.tokenizer().Encode(text, false), ids) << text;
    ASSERT_EQ(gg.tokenizer().Decode(ids), text);
    Result<std::vector<float>> a = st.ComputeLogits(ids);
    Result<std::vector<float>> b = gg.ComputeLogits(ids);
    ASSERT_TRUE(a.ok() && b.ok());
    std::vector<double> want(a->begin(), a->end());
    const double batch = MaxRangeRelativeError(b->data(), want.data(), want.size());
    const int n = static_cast<int>(ids.size());
    Result<std::vector<float>> ia =
        dynamic_cast<EngineImpl&>(st).IncrementalLogits(ids, std::max(1, n - kDecodeTokens));
    Result<std::vector<float>> ib =
        dynamic_cast<EngineImpl&>(gg).IncrementalLogits(ids, std::max(1, n - kDecodeTokens));
    ASSERT_TRUE(ia.ok() && ib.ok());
    std::vector<double> want_last(ia->begin(), ia->end());
    const double decode = MaxRangeRelativeError(ib->data(), want_last.data(), vocab);
    std::printf(
        "[ gguf=st  ] %-5s %2d tokens: GGUF f32 vs safetensors f32 max|dlogit|/range "
        "batch %.2e, decode %.2e\n",
        arch.c_str(), n, batch, decode);
    EXPECT_LE(batch, 1e-5) << arch << " \"" << text << "\"";
    EXPECT_LE(decode, 1e-5) << arch << " \"" << text << "\"";
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufSafetensorsTest, ::testing::Values("llama", "qwen2"));

// Note [GGUF q/k row order]: a llama file whose q/k rows were NOT permuted
// is read as if they were, which scrambles RoPE's pairs: the logits move far
// from the safetensors model's. Guards the test above against a loader and
// writer that agree on a wrong order (the numpy reference, which undoes
// llama.cpp's permutation on its own, guards against that too).
TEST(GgufQkPermutationTest, UnpermutedLlamaQkIsCaught) {
  Result<TwoEncodings> both = LoadBoth("llama", /*permute=*/false);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  const std::vector<int32_t> ids = both->safetensors->tokenizer().Encode(Prompts()[2], false);
  Result<std::vector<float>> a = both->safetensors->ComputeLogits(ids);
  Result<std::vector<float>> b = both->gguf->ComputeLogits(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<double> want(a->begin(), a->end());
  const double err = MaxRangeRelativeError(b->data(), want.data(), want.size());
  std::printf("[ gguf qk  ] llama file without the q/k permutation: max|dlogit|/range %.2e\n", err);
  EXPECT_GT(err, 1e-2);
}

// Llama 3.1+ GGUF files carry their "llama3" RoPE scaling as per-dimension
// factors (tensor rope_freqs.weight, inv_freq_i / factor_i), where the
// safetensors config.json has rope_scaling. The same generated llama model,
// with rope_scaling llama3 in config.json and with the factors in the GGUF
// file (computed here from transformers' rule, independently of
// RopeInverseFrequencies), gives the same logits, which the numpy reference
// (reading the factors from the file itself) agrees with; the GGUF file
// without the factors does not (so the comparison can fail).
TEST(GgufRopeFreqsTest, Llama3FactorsMatchSafetensorsRopeScaling) {
  const std::string dir = engine_internal::MakeTempDir("arbiter_gguf_rope_freqs_");
  const ModelShape shape = TestShape("llama");
  Result<GeneratedModel> model = GenerateModel(shape, kSeed);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ASSERT_TRUE(WriteModelDirectory(*model, dir + "/hf", GgmlType::kF32).ok());
  constexpr double kFactor = 8, kLow = 1, kHigh = 4, kOriginal = 64;
  {
    Result<std::string> text = ReadFile(dir + "/hf/config.json");
    ASSERT_TRUE(text.ok());
    nlohmann::json cfg = nlohmann::json::parse(*text);
    cfg["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", kFactor},
                           {"low_freq_factor", kLow},
                           {"high_freq_factor", kHigh},
                           {"original_max_position_embeddings", static_cast<int>(kOriginal)}};
    ASSERT_TRUE(WriteFileAtomic(dir + "/hf/config.json", cfg.dump(2)).ok());
  }
  GgufModelOptions go;
  go.type = GgmlType::kF32;
  ASSERT_TRUE(WriteModelGguf(*model, dir + "/plain.gguf", go).ok());

  // plain.gguf + rope_freqs.weight → freqs.gguf.
  std::vector<float> factors(static_cast<size_t>(shape.head_dim / 2));
  for (size_t i = 0; i < factors.size(); ++i) {
    const double base = std::pow(shape.rope_theta, -2.0 * i / shape.head_dim);
    const double wavelen = 2.0 * std::numbers::pi / base;
    double scaled = base;
    if (wavelen > kOriginal / kLow) {
      scaled = base / kFactor;
    } else if (wavelen >= kOriginal / kHigh) {
      const double smooth = (kOriginal / wavelen - kLow) / (kHigh - kLow);
      scaled = (1 - smooth) * base / kFactor + smooth * base;
    }
    factors[i] = static_cast<float>(base / scaled);
  }
  Result<GgufFile> plain = OpenGguf(dir + "/plain.gguf");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  Result<MappedFile> bytes = MappedFile::Open(dir + "/plain.gguf");
  ASSERT_TRUE(bytes.ok());
  GgufWriter w;
  for (const GgufMetadataEntry& e : plain->metadata()) ASSERT_TRUE(w.Add(e.key, e.value).ok());
  for (const GgufTensorInfo& t : plain->tensors()) {
    const char* at = reinterpret_cast<const char*>(bytes->data()) + plain->data_offset() + t.offset;
    ASSERT_TRUE(w.AddTensor(t.name, t.dims, t.type, std::string_view(at, t.size_bytes)).ok());
  }
  const std::string_view factor_bytes(reinterpret_cast<const char*>(factors.data()),
                                      factors.size() * sizeof(float));
  ASSERT_TRUE(w.AddTensor("rope_freqs.weight", {static_cast<int64_t>(factors.size())},
                          GgmlType::kF32, factor_bytes)
                  .ok());
  ASSERT_TRUE(w.Write(dir + "/freqs.gguf").ok());

  Result<std::unique_ptr<Engine>> st = Engine::Load(dir + "/hf", Options());
  Result<std::unique_ptr<Engine>> with = Engine::Load(dir + "/freqs.gguf", Options());
  Result<std::unique_ptr<Engine>> without = Engine::Load(dir + "/plain.gguf", Options());
  ASSERT_TRUE(st.ok() && with.ok() && without.ok())
      << st.status().ToString() << with.status().ToString() << without.status().ToString();
  EXPECT_EQ((*st)->config().rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ((*with)->config().rope_scaling.freq_factors, factors);
  const std::vector<int32_t> ids = (*st)->tokenizer().Encode(Prompts()[2], false);
  Result<std::vector<float>> a = (*st)->ComputeLogits(ids);
  Result<std::vector<float>> b = (*with)->ComputeLogits(ids);
  Result<std::vector<float>> c = (*without)->ComputeLogits(ids);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const std::vector<double> want(a->begin(), a->end());
  const double err = MaxRangeRelativeError(b->data(), want.data(), want.size());
  const double err_plain = MaxRangeRelativeError(c->data(), want.data(), want.size());
  std::printf("[ gguf rope] llama3 scaling as rope_freqs vs config.json: %.2e (without: %.2e)\n",
              err, err_plain);
  EXPECT_LE(err, 1e-5);
  EXPECT_GT(err_plain, 1e-3);
  // scripts/reference_logits.py reads the factors from the file too.
  Result<std::vector<double>> ref = engine_internal::RunReferenceLogits(
      dir + "/freqs.gguf", ids, (*with)->config().vocab_size);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EXPECT_LE(MaxRangeRelativeError(b->data(), ref->data(), ref->size()), 1e-3);
}

}  // namespace
}  // namespace arbiter
