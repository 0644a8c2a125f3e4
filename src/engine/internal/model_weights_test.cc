// The compute layout: presence/shape validation, buffer order and fusion,
// filling, and the decoder against the numpy reference on synthetic
// checkpoints (no tokenizer needed).
#include "engine/internal/model_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"
#include "engine/internal/forward.h"
#include "engine/internal/test_model.h"

namespace arbiter::engine_internal {
namespace {

Result<TestWeights> LoadDir(const std::string& dir) { return LoadTestWeights(dir); }

std::string WriteModel(const TestModelSpec& spec) {
  std::string dir = MakeTempDir("arbiter_weights_test_");
  EXPECT_FALSE(dir.empty());
  Status s = WriteTestModel(dir, spec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return dir;
}

TEST(ModelWeightsTest, LoadsAndFusesLlama) {
  TestModelSpec spec;
  const std::string dir = WriteModel(spec);
  Result<TestWeights> w = LoadDir(dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->w.layers.size(), 2u);
  EXPECT_EQ(w->w.dims.qkv_dim, 4 * 16 + 2 * 2 * 16);
  EXPECT_EQ(w->w.layers[0].wqkv.bytes(), size_t{128} * 64 * 4);
  EXPECT_EQ(w->w.layers[0].w_gate_up.bytes(), size_t{2} * 96 * 64 * 4);
  EXPECT_EQ(w->w.layers[0].wqkv.n_segments, 1);  // fused: one f32 buffer
  EXPECT_TRUE(w->w.layers[0].bqkv.empty());
  EXPECT_TRUE(w->w.has_lm_head);
  EXPECT_FALSE(w->w.lm_head.empty());
  for (const WeightMatrix* buf :
       {&w->w.embed, &w->w.layers[1].wqkv, &w->w.layers[1].w_down, &w->w.lm_head}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->segments[0].data) % 64, 0u);
  }
  // k_proj rows start right after q_proj rows in the fused matrix.
  Result<SafetensorsModel> st = SafetensorsModel::Open(dir);
  ASSERT_TRUE(st.ok());
  const TensorInfo* k = st->Find("model.layers.1.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  float first;
  std::memcpy(&first, k->data, 4);
  float got;
  std::memcpy(&got, w->w.layers[1].wqkv.segments[0].data + size_t{64} * 64 * 4, 4);
  EXPECT_EQ(got, first);
}

TEST(ModelWeightsTest, WrongShapeNamesFileTensorAndShapes) {
  TestModelSpec spec;  // k_proj expected [2 × 16, 64] = [32, 64]
  spec.edit = [](auto& list) {
    for (auto& [name, shape] : list) {
      if (name == "model.layers.1.self_attn.k_proj.weight") shape = {64, 64};
    }
  };
  Result<TestWeights> w = LoadDir(WriteModel(spec));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(w.status().message(),
            "model.safetensors: tensor \"model.layers.1.self_attn.k_proj.weight\" has shape "
            "[64, 64], expected [32, 64]");
}

TEST(ModelWeightsTest, MissingTensorIsNamed) {
  TestModelSpec spec;
  spec.edit = [](auto& list) {
    list.erase(std::remove_if(list.begin(), list.end(),
                              [](auto& e) { return e.first == "model.layers.0.mlp.up_proj.weight"; }),
               list.end());
  };
  Result<TestWeights> w = LoadDir(WriteModel(spec));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
  EXPECT_NE(w.status().message().find("tensor \"model.layers.0.mlp.up_proj.weight\" not found in "
                                      "model.safetensors"),
            std::string::npos)
      << w.status().message();
}

TEST(ModelWeightsTest, MissingBiasAndQkNormAreNamed) {
  TestModelSpec q2;
  q2.architecture = "Qwen2ForCausalLM";
  q2.edit = [](auto& list) {
    list.erase(std::remove_if(list.begin(), list.end(),
                              [](auto& e) { return e.first.find("v_proj.bias") != std::string::npos; }),
               list.end());
  };
  Result<TestWeights> w = LoadDir(WriteModel(q2));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.layers.0.self_attn.v_proj.bias"), std::string::npos);

  TestModelSpec q3;
  q3.architecture = "Qwen3ForCausalLM";
  q3.edit = [](auto& list) {
    for (auto& [name, shape] : list) {
      if (name == "model.layers.0.self_attn.q_norm.weight") shape = {8};
    }
  };
  w = LoadDir(WriteModel(q3));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(),
            "model.safetensors: tensor \"model.layers.0.self_attn.q_norm.weight\" has shape [8], "
            "expected [16]");
}

TEST(ModelWeightsTest, TiedModelNeedsNoLmHead) {
  TestModelSpec spec;
  spec.tied = true;
  Result<TestWeights> w = LoadDir(WriteModel(spec));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(w->w.lm_head.empty());
  EXPECT_EQ(&w->w.output(), &w->w.embed);

  TestModelSpec untied;
  untied.edit = [](auto& list) { list.pop_back(); };  // drop lm_head.weight
  w = LoadDir(WriteModel(untied));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("\"lm_head.weight\" not found"), std::string::npos);
}

// The decoder (prefill in small chunks, and one-token decode steps) against
// the float64 numpy reference, for each architecture and bf16 storage.
TEST(DecoderTest, MatchesNumpyReference) {
  struct Case {
    const char* arch;
    bool tied;
    DType dtype;
  };
  for (const Case& c : {Case{"LlamaForCausalLM", false, DType::kF32},
                        Case{"Qwen2ForCausalLM", true, DType::kBF16},
                        Case{"Qwen3ForCausalLM", false, DType::kBF16}}) {
    TestModelSpec spec;
    spec.architecture = c.arch;
    spec.tied = c.tied;
    spec.dtype = c.dtype;
    spec.rope_theta = 1000.0f;
    const std::string dir = WriteModel(spec);
    Result<TestWeights> w = LoadDir(dir);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const int vocab = w->w.dims.vocab;
    constexpr int kCtx = 256;
    // Two decode threads: the MatVecPool splits rows (tiny matrices still
    // span several 32-row chunks).
    Decoder dec(w->layout.config, w->layout.has_lm_head, kCtx, /*n_threads=*/2);
    // 150 tokens: with chunks of 100 the first chunk spans two 64-row
    // attention tiles and the second starts at position 100.
    std::vector<int32_t> ids;
    for (int i = 0; i < 150; ++i) ids.push_back((i * 37 + 5) % vocab);

    Result<std::vector<double>> ref = RunReferenceLogits(dir, ids, vocab);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();

    // All positions, prefill in chunks of 5 and of 100.
    double err_all = 0;
    for (int batch : {5, 100}) {
      KvCache kv(dec.dims().n_layers, kCtx, dec.dims().kv_dim);
      ForwardScratch s(dec.dims(), batch, kCtx, w->w.typed());
      std::vector<float> all(ids.size() * vocab);
      dec.Forward(w->w, kv, s, ids.data(), ids.size(), 0,
                  ForwardOutputs{.all_logits = all.data()});
      err_all = std::max(err_all, MaxRelativeError(all.data(), ref->data(), all.size()));
    }

    // Prefill 140, then decode one token at a time; compare each step's logits.
    double err_dec = 0;
    {
      KvCache kv2(dec.dims().n_layers, kCtx, dec.dims().kv_dim);
      ForwardScratch s(dec.dims(), 100, kCtx, w->w.typed());
      std::vector<float> last(vocab);
      dec.Forward(w->w, kv2, s, ids.data(), 140, 0, ForwardOutputs{.last_logits = last.data()});
      err_dec = std::max(err_dec,
                         MaxRelativeError(last.data(), ref->data() + size_t{139} * vocab, vocab));
      for (size_t i = 140; i < ids.size(); ++i) {
        dec.Forward(w->w, kv2, s, &ids[i], 1, i, ForwardOutputs{.last_logits = last.data()});
        err_dec = std::max(err_dec, MaxRelativeError(last.data(), ref->data() + i * vocab, vocab));
      }
    }
    std::printf("[ decoder  ] %s %s: rel err all-positions %.3g, decode steps %.3g\n", c.arch,
                c.dtype == DType::kBF16 ? "bf16" : "f32", err_all, err_dec);
    EXPECT_LE(err_all, 1e-4) << c.arch;
    EXPECT_LE(err_dec, 1e-4) << c.arch;
  }
}

// The three llama3 wavelength bands on hand-checked values: theta 10000,
// head_dim 16, so inv_freq_i = 10^(−i/2) and wavelen_i = 2π · 10^(i/2); with
// C = 32, low 1, high 4 the bands are wavelen < 8 (kept), 8..32 (blended),
// > 32 (divided by factor 8).
TEST(DecoderTest, RopeInverseFrequencies) {
  ModelConfig config;
  config.rope_theta = 10000.0f;
  std::vector<double> plain = RopeInverseFrequencies(config, 16);
  ASSERT_EQ(plain.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(plain[i], std::pow(10.0, -i / 2.0), 1e-15) << i;

  config.rope_scaling.type = RopeScalingType::kLinear;
  config.rope_scaling.factor = 4.0f;
  std::vector<double> linear = RopeInverseFrequencies(config, 16);
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(linear[i], plain[i] / 4.0) << i;

  config.rope_scaling = RopeScaling{RopeScalingType::kLlama3, 8.0f, 1.0f, 4.0f, 32};
  std::vector<double> llama3 = RopeInverseFrequencies(config, 16);
  EXPECT_DOUBLE_EQ(llama3[0], 1.0);  // wavelen 6.28 < 8: kept
  // wavelen 19.87: s = (32 / 19.87 − 1) / 3 = 0.20352, between the two.
  const double s = (32.0 / (2 * std::numbers::pi * std::sqrt(10.0)) - 1.0) / 3.0;
  EXPECT_NEAR(s, 0.20352, 1e-5);
  EXPECT_NEAR(llama3[1], (1 - s) * plain[1] / 8 + s * plain[1], 1e-15);
  EXPECT_GT(llama3[1], plain[1] / 8);
  EXPECT_LT(llama3[1], plain[1]);
  for (int i = 2; i < 8; ++i) EXPECT_DOUBLE_EQ(llama3[i], plain[i] / 8.0) << i;  // > 32
}

// rope_scaling "llama3" and "linear" against the numpy reference, on a model
// with positions well past original_max_position_embeddings: head_dim 32 and
// theta 10000 give wavelengths 2π · 10000^(i/16) ≈ 6.3, 11.2, 19.9, 35.3, …,
// so with C = 32 (high band < 8, blended 8..32, low band > 32) every band is
// populated. The scaled logits must also differ clearly from the unscaled
// model's, so the test cannot pass by ignoring rope_scaling.
TEST(DecoderTest, RopeScalingMatchesNumpyReference) {
  struct Case {
    const char* name;
    const char* rope_scaling;
  };
  const Case cases[] = {
      {"llama3", R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,)"
                 R"( "high_freq_factor": 4.0, "original_max_position_embeddings": 32})"},
      {"linear", R"({"type": "linear", "factor": 8.0})"},
  };
  TestModelSpec base;
  base.head_dim = 32;
  base.rope_theta = 10000.0f;
  base.seed = 7;
  constexpr int kCtx = 128;
  constexpr int kTokens = 110;
  const std::string plain_dir = WriteModel(base);
  std::vector<int32_t> ids;
  for (int i = 0; i < kTokens; ++i) ids.push_back((i * 53 + 11) % base.vocab);
  Result<std::vector<double>> plain_ref = RunReferenceLogits(plain_dir, ids, base.vocab);
  ASSERT_TRUE(plain_ref.ok()) << plain_ref.status().ToString();

  for (const Case& c : cases) {
    TestModelSpec spec = base;  // same seed and shapes: identical weights
    spec.rope_scaling_json = c.rope_scaling;
    const std::string dir = WriteModel(spec);
    Result<TestWeights> w = LoadDir(dir);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_NE(w->w.config.rope_scaling.type, RopeScalingType::kNone) << c.name;
    const int vocab = w->w.dims.vocab;
    Decoder dec(w->layout.config, w->layout.has_lm_head, kCtx, /*n_threads=*/2);
    Result<std::vector<double>> ref = RunReferenceLogits(dir, ids, vocab);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();

    // All positions, prefill in chunks of 7 and in one chunk.
    double err_all = 0;
    std::vector<float> all(ids.size() * vocab);
    for (int batch : {7, kTokens}) {
      KvCache kv(dec.dims().n_layers, kCtx, dec.dims().kv_dim);
      ForwardScratch s(dec.dims(), batch, kCtx, w->w.typed());
      dec.Forward(w->w, kv, s, ids.data(), ids.size(), 0,
                  ForwardOutputs{.all_logits = all.data()});
      err_all = std::max(err_all, MaxRelativeError(all.data(), ref->data(), all.size()));
    }
    // Prefill 100, then one-token decode steps up to position 109.
    double err_dec = 0;
    {
      KvCache kv(dec.dims().n_layers, kCtx, dec.dims().kv_dim);
      ForwardScratch s(dec.dims(), 32, kCtx, w->w.typed());
      std::vector<float> last(vocab);
      dec.Forward(w->w, kv, s, ids.data(), 100, 0, ForwardOutputs{.last_logits = last.data()});
      err_dec = MaxRelativeError(last.data(), ref->data() + size_t{99} * vocab, vocab);
      for (size_t i = 100; i < ids.size(); ++i) {
        dec.Forward(w->w, kv, s, &ids[i], 1, i, ForwardOutputs{.last_logits = last.data()});
        err_dec = std::max(err_dec, MaxRelativeError(last.data(), ref->data() + i * vocab, vocab));
      }
    }
    // How far scaling moves the logits (all positions; position 0 is
    // unaffected by RoPE, the rest are).
    const double vs_unscaled = MaxRelativeError(all.data(), plain_ref->data(), all.size());
    std::printf(
        "[ decoder  ] rope_scaling %s: rel err all-positions %.3g, decode steps %.3g; "
        "differs from unscaled by %.3g\n",
        c.name, err_all, err_dec, vs_unscaled);
    EXPECT_LE(err_all, 1e-4) << c.name;
    EXPECT_LE(err_dec, 1e-4) << c.name;
    EXPECT_GT(vs_unscaled, 1e-2) << c.name << ": scaled logits match the unscaled model";
  }
}

}  // namespace
}  // namespace arbiter::engine_internal

namespace arbiter::engine_internal {
namespace {

// ValidateModelWeights reports exactly what planning and filling would, from
// the headers alone.
TEST(ModelWeightsTest, ValidateMatchesLoadErrors) {
  TestModelSpec wrong;
  wrong.edit = [](auto& list) {
    for (auto& [name, shape] : list) {
      if (name == "model.layers.1.self_attn.k_proj.weight") shape = {64, 64};
    }
  };
  TestModelSpec good;
  for (const TestModelSpec* spec : {&wrong, &good}) {
    const std::string dir = WriteModel(*spec);
    auto config = LoadModelConfig(dir + "/config.json");
    ASSERT_TRUE(config.ok());
    auto st = SafetensorsModel::Open(dir);
    ASSERT_TRUE(st.ok());
    Status v = ValidateModelWeights(*config, *st, dir);
    Result<TestWeights> w = LoadTestWeights(dir);
    EXPECT_EQ(v, w.status());
  }
}

// The compute buffers: documented order and names, F32 specs of the fused
// shapes, sizes consistent with the views.
TEST(ComputeLayoutTest, BufferOrderNamesAndShapes) {
  TestModelSpec q3;
  q3.architecture = "Qwen3ForCausalLM";  // q/k norms, untied
  Result<TestWeights> w = LoadDir(WriteModel(q3));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ComputeLayout& l = w->layout;
  std::vector<std::string> names;
  for (const WeightSpec& b : l.buffers) {
    EXPECT_EQ(b.dtype, DType::kF32) << b.name;
    names.push_back(b.name);
  }
  std::vector<std::string> want = {"model.embed"};
  for (int i = 0; i < 2; ++i) {
    for (const char* m : {"attn_norm", "wqkv", "q_norm", "k_norm", "wo", "ffn_norm", "w_gate_up",
                          "w_down"}) {
      want.push_back("model.layers." + std::to_string(i) + "." + m);
    }
  }
  want.push_back("model.final_norm");
  want.push_back("model.lm_head");
  EXPECT_EQ(names, want);
  EXPECT_EQ(l.buffers[2].shape, (std::vector<int64_t>{128, 64}));      // wqkv [q + 2 kv, hidden]
  EXPECT_EQ(l.buffers[7].shape, (std::vector<int64_t>{2 * 96, 64}));   // w_gate_up
  EXPECT_EQ(l.buffers[8].shape, (std::vector<int64_t>{64, 96}));       // w_down
  EXPECT_EQ(l.bytes(), w->w.bytes());
  EXPECT_EQ(l.decode_bytes_per_token(), w->w.decode_bytes_per_token());
  EXPECT_EQ(l.layers[1].wqkv.n, 1);
  EXPECT_EQ(l.layers[1].wqkv.buffer[0], 10);
  EXPECT_EQ(l.lm_head.buffer[0], static_cast<int>(l.buffers.size()) - 1);

  TestModelSpec q2;
  q2.architecture = "Qwen2ForCausalLM";  // q/k/v bias, tied
  q2.tied = true;
  w = LoadDir(WriteModel(q2));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  names.clear();
  for (const WeightSpec& b : w->layout.buffers) names.push_back(b.name);
  ASSERT_EQ(names.size(), 1u + 2 * 7 + 1);  // 7 per layer: no q/k norms
  EXPECT_EQ(names[3], "model.layers.0.bqkv");
  EXPECT_EQ(w->layout.buffers[3].shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(names.back(), "model.final_norm");
  EXPECT_EQ(w->layout.lm_head.n, 0);
  EXPECT_TRUE(w->layout.has_lm_head);
  EXPECT_EQ(&w->w.output(), &w->w.embed);
  // Tied: the output projection is still streamed every decode step.
  EXPECT_EQ(w->layout.decode_bytes_per_token(), w->w.decode_bytes_per_token());
  EXPECT_GT(w->layout.decode_bytes_per_token(), size_t{4} * 128 * 64);
}

// The fill writes every element: buffers full of old bytes end up identical
// to freshly zeroed ones.
TEST(ComputeLayoutTest, FillOverwritesOldContents) {
  TestModelSpec spec;
  spec.architecture = "Qwen2ForCausalLM";
  spec.dtype = DType::kBF16;
  const std::string dir = WriteModel(spec);
  Result<TestWeights> clean = LoadDir(dir);
  ASSERT_TRUE(clean.ok()) << clean.status().ToString();
  Result<SafetensorsModel> st = SafetensorsModel::Open(dir);
  ASSERT_TRUE(st.ok());
  std::vector<AlignedFloats> dirty;
  std::vector<void*> arrays;
  for (size_t i = 0; i < clean->layout.buffers.size(); ++i) {
    dirty.emplace_back((clean->layout.buffer_bytes(i) + 3) / 4);
    std::memset(dirty.back().data(), 0xA5, dirty.back().size_bytes());
    arrays.push_back(dirty.back().data());
  }
  ASSERT_TRUE(FillComputeLayout(clean->layout, *st, dir, arrays).ok());
  for (size_t i = 0; i < dirty.size(); ++i) {
    EXPECT_EQ(std::memcmp(dirty[i].data(), clean->buffers[i].data(), dirty[i].size_bytes()), 0)
        << clean->layout.buffers[i].name;
  }
  // A mismatched array list is refused, not written.
  arrays.pop_back();
  EXPECT_EQ(FillComputeLayout(clean->layout, *st, dir, arrays).code(),
            StatusCode::kInvalidArgument);
}

// Note [Weights are read, not mapped]: a file truncated after it was opened
// (another process rewriting the model) fails the fill with an error naming
// the file — through the mapping, the read would have died of SIGBUS.
TEST(ComputeLayoutTest, AFileTruncatedDuringTheFillIsAnErrorNotACrash) {
  TestModelSpec spec;
  spec.dtype = DType::kBF16;
  const std::string dir = WriteModel(spec);
  Result<TestWeights> clean = LoadDir(dir);
  ASSERT_TRUE(clean.ok()) << clean.status().ToString();
  Result<SafetensorsModel> st = SafetensorsModel::Open(dir);
  ASSERT_TRUE(st.ok());
  const std::string file = st->files()[0];
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  std::vector<AlignedFloats> out;
  std::vector<void*> arrays;
  for (size_t i = 0; i < clean->layout.buffers.size(); ++i) {
    out.emplace_back((clean->layout.buffer_bytes(i) + 3) / 4);
    arrays.push_back(out.back().data());
  }
  const Status s = FillComputeLayout(clean->layout, *st, dir, arrays);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(file), std::string::npos) << s.message();
}

// The fill looks the tensors up again: a file rewritten with another shape
// since planning fails with the planning message.
TEST(ComputeLayoutTest, FillRechecksShapes) {
  TestModelSpec good;
  Result<TestWeights> w = LoadDir(WriteModel(good));
  ASSERT_TRUE(w.ok());
  TestModelSpec wrong;
  wrong.edit = [](auto& list) {
    for (auto& [name, shape] : list) {
      if (name == "model.layers.1.self_attn.k_proj.weight") shape = {64, 64};
    }
  };
  const std::string dir = WriteModel(wrong);
  Result<SafetensorsModel> st = SafetensorsModel::Open(dir);
  ASSERT_TRUE(st.ok());
  std::vector<void*> arrays;
  for (AlignedFloats& b : w->buffers) arrays.push_back(b.data());
  Status s = FillComputeLayout(w->layout, *st, dir, arrays);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "model.safetensors: tensor \"model.layers.1.self_attn.k_proj.weight\" has shape "
            "[64, 64], expected [32, 64]");
}

TEST(ForwardScratchTest, BytesForMatchesAllocation) {
  ModelDims d = DimsOf(ModelConfig{});
  d.hidden = 64;
  d.inter = 96;
  d.n_heads = 4;
  d.q_dim = 64;
  d.kv_dim = 32;
  d.qkv_dim = 128;
  for (auto [batch, ctx] : {std::pair{1, 2}, std::pair{16, 256}, std::pair{3, 7}}) {
    EXPECT_EQ(ForwardScratch::BytesFor(d, batch, ctx), ForwardScratch(d, batch, ctx).bytes());
    // Typed weights add the quantized activations (decode's and, for a
    // batch, prefill's [batch, max(hidden, q_dim, inter)]) and the panel.
    const ForwardScratch typed(d, batch, ctx, true);
    EXPECT_EQ(ForwardScratch::BytesFor(d, batch, ctx, true), typed.bytes());
    EXPECT_EQ(typed.xa.size() > 0, batch > 1);
    if (batch > 1) {
      // Room for GemmActivationBytes of the widest input (quant_gemm.h's bound).
      EXPECT_GE(typed.xa.size_bytes(), static_cast<size_t>(batch) * (96 * 11 / 8 + 64));
    }
    // A KV cache not in f32 adds the rows attention converts to f32.
    d.head_dim = 16;
    for (GgmlType kv : {GgmlType::kF16, GgmlType::kQ8_0}) {
      const ForwardScratch s(d, batch, ctx, true, kv);
      EXPECT_EQ(ForwardScratch::BytesFor(d, batch, ctx, true, kv), s.bytes());
      EXPECT_EQ(s.kvf.size(), std::max<size_t>(2 * ctx * 16, ForwardScratch::kDecodeKvRows * 32));
    }
  }
}

}  // namespace
}  // namespace arbiter::engine_internal
