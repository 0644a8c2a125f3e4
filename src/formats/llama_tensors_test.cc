// PlanLlamaTensors / PlanLlamaTensorsGguf: order, shapes, optional tensors,
// prefix and lm_head rules; the GGUF q/k row permutation.
#include "arbiter/formats/llama_tensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

namespace arbiter {
namespace {

namespace fs = std::filesystem;

ModelConfig TinyConfig() {
  ModelConfig c;
  c.architecture_name = "LlamaForCausalLM";
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.vocab_size = 16;
  return c;
}

// A model file holding one 1-element tensor per name.
SafetensorsModel ModelWith(const std::vector<std::string>& names) {
  std::string tmpl = (fs::temp_directory_path() / "arbiter_llama_tensors_XXXXXX").string();
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  static const float kOne = 1.0f;
  std::vector<TensorToWrite> tensors;
  for (const std::string& n : names) {
    tensors.push_back({n, DType::kF32, {1}, std::string_view(reinterpret_cast<const char*>(&kOne), 4)});
  }
  const std::string path = tmpl + "/model.safetensors";
  EXPECT_TRUE(WriteSafetensors(path, tensors).ok());
  Result<SafetensorsModel> m = SafetensorsModel::Open(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  fs::remove_all(tmpl);  // the mapping stays valid
  return std::move(m).value();
}

std::vector<std::string> Names(const LlamaTensorPlan& plan) {
  std::vector<std::string> names;
  for (const LlamaTensor& t : plan.tensors) names.push_back(t.name);
  return names;
}

TEST(LlamaTensorsTest, LlamaOrderAndShapes) {
  const LlamaTensorPlan plan = PlanLlamaTensors(TinyConfig(), ModelWith({"model.embed_tokens.weight"}));
  const std::vector<std::string> names = Names(plan);
  ASSERT_EQ(names.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_EQ(names[1], "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(names[2], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(names[9], "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(names[10], "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(names[names.size() - 2], "model.norm.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  EXPECT_TRUE(plan.has_lm_head);
  EXPECT_EQ(plan.tensors[0].shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(plan.tensors[2].shape, (std::vector<int64_t>{8, 8}));   // q: [2 × 4, 8]
  EXPECT_EQ(plan.tensors[3].shape, (std::vector<int64_t>{4, 8}));   // k: [1 × 4, 8]
  EXPECT_EQ(plan.tensors[9].shape, (std::vector<int64_t>{8, 12}));  // down
  EXPECT_EQ(plan.tensors[9].layer, 0);
  EXPECT_EQ(plan.tensors.back().role, LlamaTensorRole::kLmHead);
}

TEST(LlamaTensorsTest, BiasAndQkNormAreListedWhenConfigured) {
  ModelConfig c = TinyConfig();
  c.attention_bias = true;
  c.qk_norm = true;
  c.num_hidden_layers = 1;
  const std::vector<std::string> names = Names(PlanLlamaTensors(c, ModelWith({"x"})));
  const std::vector<std::string> want = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.q_proj.bias",
      "model.layers.0.self_attn.k_proj.bias",
      "model.layers.0.self_attn.v_proj.bias",
      "model.layers.0.self_attn.q_norm.weight",
      "model.layers.0.self_attn.k_norm.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
      "model.norm.weight",
      "lm_head.weight",
  };
  EXPECT_EQ(names, want);
}

TEST(LlamaTensorsTest, TiedEmbeddingsHaveNoLmHeadTensor) {
  ModelConfig c = TinyConfig();
  c.tie_word_embeddings = true;
  const LlamaTensorPlan plan = PlanLlamaTensors(c, ModelWith({"x"}));
  EXPECT_TRUE(plan.has_lm_head);
  EXPECT_EQ(plan.tensors.back().name, "model.norm.weight");
}

TEST(LlamaTensorsTest, HeadlessCheckpointDropsPrefixAndOptionalLmHead) {
  ModelConfig c = TinyConfig();
  c.architecture_name = "Qwen3Model";
  LlamaTensorPlan plan = PlanLlamaTensors(c, ModelWith({"embed_tokens.weight"}));
  EXPECT_EQ(plan.tensors.front().name, "embed_tokens.weight");
  EXPECT_EQ(plan.tensors.back().name, "norm.weight");
  EXPECT_FALSE(plan.has_lm_head);
  plan = PlanLlamaTensors(c, ModelWith({"embed_tokens.weight", "lm_head.weight"}));
  EXPECT_EQ(plan.tensors.back().name, "lm_head.weight");
  EXPECT_TRUE(plan.has_lm_head);
}

TEST(LlamaTensorsTest, GgufPlanHasTheSameOrderAndShapesUnderGgufNames) {
  ModelConfig c = TinyConfig();
  c.attention_bias = true;
  c.qk_norm = true;
  c.num_hidden_layers = 1;
  const LlamaTensorPlan gguf = PlanLlamaTensorsGguf(c);
  const std::vector<std::string> want = {
      "token_embd.weight",
      "blk.0.attn_norm.weight",
      "blk.0.attn_q.weight",
      "blk.0.attn_k.weight",
      "blk.0.attn_v.weight",
      "blk.0.attn_q.bias",
      "blk.0.attn_k.bias",
      "blk.0.attn_v.bias",
      "blk.0.attn_q_norm.weight",
      "blk.0.attn_k_norm.weight",
      "blk.0.attn_output.weight",
      "blk.0.ffn_norm.weight",
      "blk.0.ffn_gate.weight",
      "blk.0.ffn_up.weight",
      "blk.0.ffn_down.weight",
      "output_norm.weight",
      "output.weight",
  };
  EXPECT_EQ(Names(gguf), want);
  EXPECT_TRUE(gguf.has_lm_head);
  // Same roles, layers and (row-major) shapes as the Hugging Face plan.
  const LlamaTensorPlan hf = PlanLlamaTensors(c, ModelWith({"x"}));
  ASSERT_EQ(gguf.tensors.size(), hf.tensors.size());
  for (size_t i = 0; i < hf.tensors.size(); ++i) {
    EXPECT_EQ(gguf.tensors[i].role, hf.tensors[i].role) << i;
    EXPECT_EQ(gguf.tensors[i].layer, hf.tensors[i].layer) << i;
    EXPECT_EQ(gguf.tensors[i].shape, hf.tensors[i].shape) << i;
  }
  EXPECT_EQ(gguf.tensors[2].shape, (std::vector<int64_t>{8, 8}));    // q [out, in]
  EXPECT_EQ(gguf.tensors[14].shape, (std::vector<int64_t>{8, 12}));  // ffn_down
}

TEST(LlamaTensorsTest, GgufPlanWithTiedEmbeddingsHasNoOutputWeight) {
  ModelConfig c = TinyConfig();
  c.tie_word_embeddings = true;
  const LlamaTensorPlan plan = PlanLlamaTensorsGguf(c);
  EXPECT_TRUE(plan.has_lm_head);
  EXPECT_EQ(plan.tensors.back().name, "output_norm.weight");
  EXPECT_EQ(plan.tensors.size(), 1u + 2 * 9 + 1);
  EXPECT_EQ(plan.tensors[10].name, "blk.1.attn_norm.weight");
}

TEST(LlamaTensorsTest, OnlyLlamaGgufFilesArePermuted) {
  ModelConfig c = TinyConfig();
  EXPECT_TRUE(GgufQkRowsPermuted(c));
  c.arch = Architecture::kQwen2;
  EXPECT_FALSE(GgufQkRowsPermuted(c));
  c.arch = Architecture::kQwen3;
  EXPECT_FALSE(GgufQkRowsPermuted(c));
}

// The converter's permutation, written independently: HF rows viewed as
// [n_heads, 2, head_dim/2] are stored as [n_heads, head_dim/2, 2].
std::vector<int64_t> ConverterPermutation(int64_t n_heads, int64_t head_dim) {
  std::vector<int64_t> gguf_to_hf(n_heads * head_dim);
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t hf = (h * 2 + s) * half + i;      // index in [h, s, i]
        const int64_t gguf = (h * half + i) * 2 + s;    // index in [h, i, s]
        gguf_to_hf[gguf] = hf;
      }
    }
  }
  return gguf_to_hf;
}

TEST(LlamaTensorsTest, GgufRowToHfRowUndoesTheConverterPermutation) {
  for (auto [n_heads, head_dim] : {std::pair<int64_t, int64_t>{1, 2}, {2, 4}, {4, 8}, {3, 64},
                                   {8, 128}}) {
    SCOPED_TRACE(std::to_string(n_heads) + " heads of " + std::to_string(head_dim));
    const std::vector<int64_t> want = ConverterPermutation(n_heads, head_dim);
    std::vector<bool> seen(want.size(), false);
    for (int64_t g = 0; g < n_heads * head_dim; ++g) {
      const int64_t hf = GgufRowToHfRow(g, n_heads, head_dim);
      ASSERT_EQ(hf, want[g]) << "gguf row " << g;
      ASSERT_FALSE(seen[hf]);
      seen[hf] = true;
    }
  }
  // Head 0 of 8 rows: GGUF rows 0..7 come from HF rows 0 4 1 5 2 6 3 7.
  std::vector<int64_t> head0;
  for (int64_t g = 0; g < 8; ++g) head0.push_back(GgufRowToHfRow(g, 1, 8));
  EXPECT_EQ(head0, (std::vector<int64_t>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(GgufRowToHfRow(8, 1, 8), -1);
  EXPECT_EQ(GgufRowToHfRow(-1, 1, 8), -1);
  EXPECT_EQ(GgufRowToHfRow(0, 1, 7), -1);
  EXPECT_EQ(GgufRowToHfRow(0, 0, 8), -1);
}

}  // namespace
}  // namespace arbiter
