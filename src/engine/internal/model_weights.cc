// engine/internal/model_weights.cc — validation and f32 conversion of a
// decoder's safetensors weights.
//
// Load runs in two passes. Pass 1 builds the list of (tensor, expected shape,
// destination, destination offset) for the whole model and checks presence
// and shape of every entry, so a bad checkpoint fails before any large
// allocation. Pass 2 allocates each destination buffer once and converts each
// tensor straight into its slice (fused matrices get their parts at row
// offsets).
#include "engine/internal/model_weights.h"

#include <filesystem>

#include <new>
#include <string>

namespace arbiter::engine_internal {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}


// One tensor to copy into (a slice of) a destination buffer.
struct Part {
  std::string name;
  std::vector<int64_t> shape;
  AlignedFloats* dest = nullptr;
  size_t dest_offset = 0;  // floats
  size_t dest_size = 0;    // floats of the whole destination buffer
  const TensorInfo* info = nullptr;
};

}  // namespace

ModelDims DimsOf(const ModelConfig& c) {
  ModelDims d;
  d.hidden = c.hidden_size;
  d.inter = c.intermediate_size;
  d.n_layers = c.num_hidden_layers;
  d.n_heads = c.num_attention_heads;
  d.n_kv_heads = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  d.head_dim = c.head_dim > 0 ? c.head_dim
                              : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads
                                                           : 0);
  d.vocab = c.vocab_size;
  d.q_dim = d.n_heads * d.head_dim;
  d.kv_dim = d.n_kv_heads * d.head_dim;
  d.qkv_dim = d.q_dim + 2 * d.kv_dim;
  return d;
}

size_t ModelWeights::bytes() const {
  size_t total = embed.size_bytes() + final_norm.size_bytes() + lm_head.size_bytes();
  for (const LayerWeights& l : layers) {
    total += l.attn_norm.size_bytes() + l.wqkv.size_bytes() + l.bqkv.size_bytes() +
             l.q_norm.size_bytes() + l.k_norm.size_bytes() + l.wo.size_bytes() +
             l.ffn_norm.size_bytes() + l.w_gate_up.size_bytes() + l.w_down.size_bytes();
  }
  return total;
}

size_t ModelWeights::decode_bytes_per_token() const {
  size_t total = final_norm.size_bytes();
  if (has_lm_head) total += size_t{4} * dims.vocab * dims.hidden;
  for (const LayerWeights& l : layers) {
    total += l.attn_norm.size_bytes() + l.wqkv.size_bytes() + l.bqkv.size_bytes() +
             l.q_norm.size_bytes() + l.k_norm.size_bytes() + l.wo.size_bytes() +
             l.ffn_norm.size_bytes() + l.w_gate_up.size_bytes() + l.w_down.size_bytes();
  }
  return total;
}

namespace {

// Sets w's config and dims and lists every tensor the architecture needs with
// its expected shape and destination; checks presence and shapes against the
// safetensors headers. Allocates no weight buffer.
Result<std::vector<Part>> PlanAndCheck(const ModelConfig& config, const SafetensorsModel& st,
                                       const std::string& model_dir, ModelWeights* out) {
  ModelWeights& w = *out;
  w.config = config;
  w.dims = DimsOf(config);
  const ModelDims& d = w.dims;
  if (d.hidden <= 0 || d.inter <= 0 || d.n_layers <= 0 || d.n_heads <= 0 || d.n_kv_heads <= 0 ||
      d.head_dim <= 0 || d.vocab <= 0) {
    return InvalidArgumentError(model_dir + ": config has a non-positive dimension");
  }
  if (d.head_dim % 2 != 0) {
    return InvalidArgumentError(model_dir + ": head_dim " + std::to_string(d.head_dim) +
                                " is odd; RoPE needs an even head_dim");
  }
  if (d.n_heads % d.n_kv_heads != 0) {
    return InvalidArgumentError(model_dir + ": num_attention_heads " + std::to_string(d.n_heads) +
                                " is not a multiple of num_key_value_heads " +
                                std::to_string(d.n_kv_heads));
  }

  // Headless checkpoints ("Qwen3Model") store "embed_tokens.weight" without
  // the "model." prefix.
  std::string prefix = "model.";
  if (st.Find("model.embed_tokens.weight") == nullptr && st.Find("embed_tokens.weight") != nullptr) {
    prefix.clear();
  }
  const bool causal_lm = config.architecture_name.find("ForCausalLM") != std::string::npos ||
                         config.architecture_name.empty();

  const int64_t H = d.hidden, I = d.inter, V = d.vocab, Q = d.q_dim, KV = d.kv_dim,
                QKV = d.qkv_dim, HD = d.head_dim;
  std::vector<Part> parts;
  auto add = [&parts](std::string name, std::vector<int64_t> shape, AlignedFloats* dest,
                      size_t offset, size_t dest_size) {
    parts.push_back(Part{std::move(name), std::move(shape), dest, offset, dest_size, nullptr});
  };

  w.layers.resize(d.n_layers);
  add(prefix + "embed_tokens.weight", {V, H}, &w.embed, 0, V * H);
  for (int i = 0; i < d.n_layers; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = prefix + "layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {H}, &l.attn_norm, 0, H);
    add(p + "self_attn.q_proj.weight", {Q, H}, &l.wqkv, 0, QKV * H);
    add(p + "self_attn.k_proj.weight", {KV, H}, &l.wqkv, Q * H, QKV * H);
    add(p + "self_attn.v_proj.weight", {KV, H}, &l.wqkv, (Q + KV) * H, QKV * H);
    if (config.attention_bias) {
      add(p + "self_attn.q_proj.bias", {Q}, &l.bqkv, 0, QKV);
      add(p + "self_attn.k_proj.bias", {KV}, &l.bqkv, Q, QKV);
      add(p + "self_attn.v_proj.bias", {KV}, &l.bqkv, Q + KV, QKV);
    }
    if (config.qk_norm) {
      add(p + "self_attn.q_norm.weight", {HD}, &l.q_norm, 0, HD);
      add(p + "self_attn.k_norm.weight", {HD}, &l.k_norm, 0, HD);
    }
    add(p + "self_attn.o_proj.weight", {H, Q}, &l.wo, 0, H * Q);
    add(p + "post_attention_layernorm.weight", {H}, &l.ffn_norm, 0, H);
    add(p + "mlp.gate_proj.weight", {I, H}, &l.w_gate_up, 0, 2 * I * H);
    add(p + "mlp.up_proj.weight", {I, H}, &l.w_gate_up, I * H, 2 * I * H);
    add(p + "mlp.down_proj.weight", {H, I}, &l.w_down, 0, H * I);
  }
  add(prefix + "norm.weight", {H}, &w.final_norm, 0, H);
  if (config.tie_word_embeddings) {
    w.has_lm_head = true;  // shares embed
  } else if (causal_lm || st.Find("lm_head.weight") != nullptr) {
    add("lm_head.weight", {V, H}, &w.lm_head, 0, V * H);
    w.has_lm_head = true;
  }

  // Presence and shapes.
  for (Part& part : parts) {
    part.info = st.Find(part.name);
    if (part.info == nullptr) {
      std::string files;
      for (const std::string& f : st.files()) {
        if (!files.empty()) files += ", ";
        files += std::filesystem::path(f).filename().string();
      }
      return NotFoundError(model_dir + ": tensor \"" + part.name + "\" not found in " + files +
                           " (required by " + config.architecture_name + " with " +
                           std::to_string(d.n_layers) + " layers)");
    }
    if (part.info->shape != part.shape) {
      return DataLossError(std::filesystem::path(part.info->file).filename().string() + ": tensor \"" + part.name +
                           "\" has shape " + ShapeString(part.info->shape) + ", expected " +
                           ShapeString(part.shape));
    }
  }

  return parts;
}

}  // namespace

Status ValidateModelWeights(const ModelConfig& config, const SafetensorsModel& st,
                            const std::string& model_dir) {
  ModelWeights w;
  return PlanAndCheck(config, st, model_dir, &w).status();
}

Result<ModelWeights> LoadModelWeights(const ModelConfig& config, const SafetensorsModel& st,
                                      const std::string& model_dir) {
  ModelWeights w;
  ARBITER_ASSIGN_OR_RETURN(std::vector<Part> parts, PlanAndCheck(config, st, model_dir, &w));
  // Allocate and convert.
  try {
    for (Part& part : parts) {
      if (part.dest->size() != part.dest_size) part.dest->Resize(part.dest_size);
      ARBITER_RETURN_IF_ERROR(ConvertToF32(*part.info, part.dest->data() + part.dest_offset));
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(model_dir + ": out of memory converting weights to f32");
  }
  return w;
}

}  // namespace arbiter::engine_internal
