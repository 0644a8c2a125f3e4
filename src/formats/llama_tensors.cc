// formats/llama_tensors.cc — the Llama-family tensor list (see the header).
#include "arbiter/formats/llama_tensors.h"

#include <utility>

namespace arbiter {

namespace {

enum class LmHead { kTied, kListed, kNone };

// The one order (llama_tensors.h): every tensor `config` needs, named by
// `name(role, layer)`.
template <typename NameFn>
LlamaTensorPlan PlanInOrder(const ModelConfig& config, LmHead lm_head, const NameFn& name) {
  const int64_t heads = config.num_attention_heads;
  const int64_t kv_heads = config.num_key_value_heads > 0 ? config.num_key_value_heads : heads;
  const int64_t head_dim =
      config.head_dim > 0 ? config.head_dim : (heads > 0 ? config.hidden_size / heads : 0);
  const int64_t H = config.hidden_size, I = config.intermediate_size, V = config.vocab_size;
  const int64_t Q = heads * head_dim, KV = kv_heads * head_dim;

  LlamaTensorPlan plan;
  using R = LlamaTensorRole;
  auto add = [&](R role, int layer, std::vector<int64_t> shape) {
    plan.tensors.push_back(LlamaTensor{name(role, layer), std::move(shape), role, layer});
  };
  add(R::kEmbed, -1, {V, H});
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    add(R::kAttnNorm, i, {H});
    add(R::kQProj, i, {Q, H});
    add(R::kKProj, i, {KV, H});
    add(R::kVProj, i, {KV, H});
    if (config.attention_bias) {
      add(R::kQBias, i, {Q});
      add(R::kKBias, i, {KV});
      add(R::kVBias, i, {KV});
    }
    if (config.qk_norm) {
      add(R::kQNorm, i, {head_dim});
      add(R::kKNorm, i, {head_dim});
    }
    add(R::kOProj, i, {H, Q});
    add(R::kFfnNorm, i, {H});
    add(R::kGateProj, i, {I, H});
    add(R::kUpProj, i, {I, H});
    add(R::kDownProj, i, {H, I});
  }
  add(R::kFinalNorm, -1, {H});
  if (lm_head == LmHead::kListed) add(R::kLmHead, -1, {V, H});
  plan.has_lm_head = lm_head != LmHead::kNone;
  return plan;
}

// Hugging Face names, under `prefix` ("model." or "").
std::string HfName(const std::string& prefix, LlamaTensorRole role, int layer) {
  using R = LlamaTensorRole;
  const std::string p = prefix + "layers." + std::to_string(layer) + ".";
  switch (role) {
    case R::kEmbed: return prefix + "embed_tokens.weight";
    case R::kAttnNorm: return p + "input_layernorm.weight";
    case R::kQProj: return p + "self_attn.q_proj.weight";
    case R::kKProj: return p + "self_attn.k_proj.weight";
    case R::kVProj: return p + "self_attn.v_proj.weight";
    case R::kQBias: return p + "self_attn.q_proj.bias";
    case R::kKBias: return p + "self_attn.k_proj.bias";
    case R::kVBias: return p + "self_attn.v_proj.bias";
    case R::kQNorm: return p + "self_attn.q_norm.weight";
    case R::kKNorm: return p + "self_attn.k_norm.weight";
    case R::kOProj: return p + "self_attn.o_proj.weight";
    case R::kFfnNorm: return p + "post_attention_layernorm.weight";
    case R::kGateProj: return p + "mlp.gate_proj.weight";
    case R::kUpProj: return p + "mlp.up_proj.weight";
    case R::kDownProj: return p + "mlp.down_proj.weight";
    case R::kFinalNorm: return prefix + "norm.weight";
    case R::kLmHead: return "lm_head.weight";
  }
  return "";
}

// llama.cpp's GGUF names.
std::string GgufName(LlamaTensorRole role, int layer) {
  using R = LlamaTensorRole;
  const std::string p = "blk." + std::to_string(layer) + ".";
  switch (role) {
    case R::kEmbed: return "token_embd.weight";
    case R::kAttnNorm: return p + "attn_norm.weight";
    case R::kQProj: return p + "attn_q.weight";
    case R::kKProj: return p + "attn_k.weight";
    case R::kVProj: return p + "attn_v.weight";
    case R::kQBias: return p + "attn_q.bias";
    case R::kKBias: return p + "attn_k.bias";
    case R::kVBias: return p + "attn_v.bias";
    case R::kQNorm: return p + "attn_q_norm.weight";
    case R::kKNorm: return p + "attn_k_norm.weight";
    case R::kOProj: return p + "attn_output.weight";
    case R::kFfnNorm: return p + "ffn_norm.weight";
    case R::kGateProj: return p + "ffn_gate.weight";
    case R::kUpProj: return p + "ffn_up.weight";
    case R::kDownProj: return p + "ffn_down.weight";
    case R::kFinalNorm: return "output_norm.weight";
    case R::kLmHead: return "output.weight";
  }
  return "";
}

}  // namespace

LlamaTensorPlan PlanLlamaTensors(const ModelConfig& config, const SafetensorsModel& st) {
  // Headless checkpoints ("Qwen3Model") store "embed_tokens.weight" without
  // the "model." prefix.
  std::string prefix = "model.";
  if (st.Find("model.embed_tokens.weight") == nullptr &&
      st.Find("embed_tokens.weight") != nullptr) {
    prefix.clear();
  }
  const bool causal_lm = config.architecture_name.find("ForCausalLM") != std::string::npos ||
                         config.architecture_name.empty();
  LmHead lm_head = LmHead::kNone;
  if (config.tie_word_embeddings) {
    lm_head = LmHead::kTied;  // shares embed_tokens
  } else if (causal_lm || st.Find("lm_head.weight") != nullptr) {
    lm_head = LmHead::kListed;
  }
  return PlanInOrder(config, lm_head, [&prefix](LlamaTensorRole role, int layer) {
    return HfName(prefix, role, layer);
  });
}

LlamaTensorPlan PlanLlamaTensorsGguf(const ModelConfig& config) {
  return PlanInOrder(config, config.tie_word_embeddings ? LmHead::kTied : LmHead::kListed,
                     GgufName);
}

bool GgufQkRowsPermuted(const ModelConfig& config) { return config.arch == Architecture::kLlama; }

int64_t GgufRowToHfRow(int64_t gguf_row, int64_t n_heads, int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0 || n_heads <= 0 || gguf_row < 0 ||
      gguf_row / head_dim >= n_heads) {
    return -1;
  }
  const int64_t head = gguf_row / head_dim;
  const int64_t r = gguf_row % head_dim;  // = 2i + s
  return head * head_dim + (r % 2) * (head_dim / 2) + r / 2;
}

}  // namespace arbiter
