// engine/internal/model_weights.h — a Llama-family decoder's weights in f32.
//
// Loaded from a SafetensorsModel and validated against the ModelConfig: every
// tensor the architecture needs must be present with exactly the expected
// shape before any conversion starts. Weights are converted (F32/F16/BF16 →
// f32) into 64-byte-aligned contiguous buffers. Two fusions are made at load
// so decode issues fewer, larger sgemv calls:
//   wqkv      = [q_proj; k_proj; v_proj]   rows concatenated
//   w_gate_up = [gate_proj; up_proj]       rows concatenated
// (row-major [out, in] matrices concatenated along `out` are contiguous).
//
// Tensor names follow Hugging Face: "model.embed_tokens.weight",
// "model.layers.{i}.self_attn.{q,k,v,o}_proj.weight" (+ ".bias" for q/k/v when
// config.attention_bias), "model.layers.{i}.self_attn.{q,k}_norm.weight" (when
// config.qk_norm), "model.layers.{i}.mlp.{gate,up,down}_proj.weight",
// "model.layers.{i}.{input,post_attention}_layernorm.weight",
// "model.norm.weight", "lm_head.weight" (absent when tied). Headless
// checkpoints (architectures "*Model") omit the "model." prefix and may have
// no lm_head. Extra tensors (e.g. rotary inv_freq) are ignored.
//
// Thread safety: immutable after load; thread-safe reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"
#include "engine/internal/aligned_buffer.h"

namespace arbiter::engine_internal {

struct LayerWeights {
  AlignedFloats attn_norm;  // [hidden]
  AlignedFloats wqkv;       // [q_dim + 2 × kv_dim, hidden]; rows q, then k, then v
  AlignedFloats bqkv;       // [q_dim + 2 × kv_dim]; empty unless attention_bias
  AlignedFloats q_norm;     // [head_dim]; empty unless qk_norm
  AlignedFloats k_norm;     // [head_dim]; empty unless qk_norm
  AlignedFloats wo;         // [hidden, q_dim]
  AlignedFloats ffn_norm;   // [hidden]
  AlignedFloats w_gate_up;  // [2 × intermediate, hidden]; rows gate, then up
  AlignedFloats w_down;     // [hidden, intermediate]
};

// Derived sizes, all in elements.
struct ModelDims {
  int hidden = 0;
  int inter = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  int q_dim = 0;    // n_heads × head_dim
  int kv_dim = 0;   // n_kv_heads × head_dim
  int qkv_dim = 0;  // q_dim + 2 × kv_dim
};
ModelDims DimsOf(const ModelConfig& config);

struct ModelWeights {
  ModelConfig config;
  ModelDims dims;
  AlignedFloats embed;       // [vocab, hidden]
  std::vector<LayerWeights> layers;
  AlignedFloats final_norm;  // [hidden]
  AlignedFloats lm_head;     // [vocab, hidden]; empty when tied or headless
  bool has_lm_head = false;  // false for a headless model without tied embeddings

  // The output projection [vocab, hidden] (embed when tied). REQUIRES: has_lm_head.
  const float* lm_head_data() const { return lm_head.empty() ? embed.data() : lm_head.data(); }
  // Bytes held by all weight buffers.
  size_t bytes() const;
  // Weight bytes a decode step streams from memory: every layer matrix, the
  // norms and the lm_head (one embedding row is negligible and not counted).
  size_t decode_bytes_per_token() const;
};

// Checks that every tensor the config needs is present with exactly the
// expected shape, reading only the safetensors headers (no conversion, no
// allocation of weight buffers). Errors as LoadModelWeights' first four.
Status ValidateModelWeights(const ModelConfig& config, const SafetensorsModel& st,
                            const std::string& model_dir);

// Validates and converts. `model_dir` is used in messages.
// Errors: kNotFound naming a missing tensor and the files searched;
// kDataLoss `<file>: tensor "<name>" has shape [a, b], expected [c, d]`;
// kUnimplemented for a dtype that cannot be converted; kInvalidArgument for a
// config the forward pass cannot run (odd head_dim, heads not divisible by
// KV heads); kResourceExhausted when the buffers cannot be allocated.
Result<ModelWeights> LoadModelWeights(const ModelConfig& config, const SafetensorsModel& st,
                                      const std::string& model_dir);

}  // namespace arbiter::engine_internal
