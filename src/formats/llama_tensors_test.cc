// PlanLlamaTensors: order, shapes, optional tensors, prefix and lm_head rules.
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

}  // namespace
}  // namespace arbiter
