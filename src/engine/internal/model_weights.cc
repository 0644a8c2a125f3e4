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

#include "arbiter/formats/llama_tensors.h"

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

  // Which tensors, in which order, with which shapes: the one list shared
  // with the weight runtime (arbiter/formats/llama_tensors.h). Here each is
  // routed to its (fused) destination buffer.
  const LlamaTensorPlan plan = PlanLlamaTensors(config, st);
  const size_t H = d.hidden, I = d.inter, V = d.vocab, Q = d.q_dim, KV = d.kv_dim,
               QKV = d.qkv_dim, HD = d.head_dim;
  std::vector<Part> parts;
  parts.reserve(plan.tensors.size());
  w.layers.resize(d.n_layers);
  for (const LlamaTensor& t : plan.tensors) {
    Part part{t.name, t.shape, nullptr, 0, 0, nullptr};
    LayerWeights* l = t.layer >= 0 ? &w.layers[t.layer] : nullptr;
    auto route = [&part](AlignedFloats* dest, size_t offset, size_t dest_size) {
      part.dest = dest;
      part.dest_offset = offset;
      part.dest_size = dest_size;
    };
    switch (t.role) {
      case LlamaTensorRole::kEmbed: route(&w.embed, 0, V * H); break;
      case LlamaTensorRole::kAttnNorm: route(&l->attn_norm, 0, H); break;
      case LlamaTensorRole::kQProj: route(&l->wqkv, 0, QKV * H); break;
      case LlamaTensorRole::kKProj: route(&l->wqkv, Q * H, QKV * H); break;
      case LlamaTensorRole::kVProj: route(&l->wqkv, (Q + KV) * H, QKV * H); break;
      case LlamaTensorRole::kQBias: route(&l->bqkv, 0, QKV); break;
      case LlamaTensorRole::kKBias: route(&l->bqkv, Q, QKV); break;
      case LlamaTensorRole::kVBias: route(&l->bqkv, Q + KV, QKV); break;
      case LlamaTensorRole::kQNorm: route(&l->q_norm, 0, HD); break;
      case LlamaTensorRole::kKNorm: route(&l->k_norm, 0, HD); break;
      case LlamaTensorRole::kOProj: route(&l->wo, 0, H * Q); break;
      case LlamaTensorRole::kFfnNorm: route(&l->ffn_norm, 0, H); break;
      case LlamaTensorRole::kGateProj: route(&l->w_gate_up, 0, 2 * I * H); break;
      case LlamaTensorRole::kUpProj: route(&l->w_gate_up, I * H, 2 * I * H); break;
      case LlamaTensorRole::kDownProj: route(&l->w_down, 0, H * I); break;
      case LlamaTensorRole::kFinalNorm: route(&w.final_norm, 0, H); break;
      case LlamaTensorRole::kLmHead: route(&w.lm_head, 0, V * H); break;
    }
    parts.push_back(std::move(part));
  }
  w.has_lm_head = plan.has_lm_head;

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
