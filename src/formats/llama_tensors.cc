// formats/llama_tensors.cc — the Llama-family tensor list (see the header).
#include "arbiter/formats/llama_tensors.h"

#include <utility>

namespace arbiter {

LlamaTensorPlan PlanLlamaTensors(const ModelConfig& config, const SafetensorsModel& st) {
  const int64_t heads = config.num_attention_heads;
  const int64_t kv_heads = config.num_key_value_heads > 0 ? config.num_key_value_heads : heads;
  const int64_t head_dim =
      config.head_dim > 0 ? config.head_dim : (heads > 0 ? config.hidden_size / heads : 0);
  const int64_t H = config.hidden_size, I = config.intermediate_size, V = config.vocab_size;
  const int64_t Q = heads * head_dim, KV = kv_heads * head_dim;

  // Headless checkpoints ("Qwen3Model") store "embed_tokens.weight" without
  // the "model." prefix.
  std::string prefix = "model.";
  if (st.Find("model.embed_tokens.weight") == nullptr &&
      st.Find("embed_tokens.weight") != nullptr) {
    prefix.clear();
  }
  const bool causal_lm = config.architecture_name.find("ForCausalLM") != std::string::npos ||
                         config.architecture_name.empty();

  LlamaTensorPlan plan;
  auto add = [&plan](std::string name, std::vector<int64_t> shape, LlamaTensorRole role,
                     int layer) {
    plan.tensors.push_back(LlamaTensor{std::move(name), std::move(shape), role, layer});
  };
  using R = LlamaTensorRole;
  add(prefix + "embed_tokens.weight", {V, H}, R::kEmbed, -1);
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = prefix + "layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {H}, R::kAttnNorm, i);
    add(p + "self_attn.q_proj.weight", {Q, H}, R::kQProj, i);
    add(p + "self_attn.k_proj.weight", {KV, H}, R::kKProj, i);
    add(p + "self_attn.v_proj.weight", {KV, H}, R::kVProj, i);
    if (config.attention_bias) {
      add(p + "self_attn.q_proj.bias", {Q}, R::kQBias, i);
      add(p + "self_attn.k_proj.bias", {KV}, R::kKBias, i);
      add(p + "self_attn.v_proj.bias", {KV}, R::kVBias, i);
    }
    if (config.qk_norm) {
      add(p + "self_attn.q_norm.weight", {head_dim}, R::kQNorm, i);
      add(p + "self_attn.k_norm.weight", {head_dim}, R::kKNorm, i);
    }
    add(p + "self_attn.o_proj.weight", {H, Q}, R::kOProj, i);
    add(p + "post_attention_layernorm.weight", {H}, R::kFfnNorm, i);
    add(p + "mlp.gate_proj.weight", {I, H}, R::kGateProj, i);
    add(p + "mlp.up_proj.weight", {I, H}, R::kUpProj, i);
    add(p + "mlp.down_proj.weight", {H, I}, R::kDownProj, i);
  }
  add(prefix + "norm.weight", {H}, R::kFinalNorm, -1);
  if (config.tie_word_embeddings) {
    plan.has_lm_head = true;  // shares embed_tokens
  } else if (causal_lm || st.Find("lm_head.weight") != nullptr) {
    add("lm_head.weight", {V, H}, R::kLmHead, -1);
    plan.has_lm_head = true;
  }
  return plan;
}

}  // namespace arbiter
