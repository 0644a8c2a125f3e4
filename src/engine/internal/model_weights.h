// engine/internal/model_weights.h — a Llama-family decoder's compute layout
// (the f32 buffers the forward pass reads) and views of those buffers.
//
// The engine never owns weight memory (docs/architecture.md "Weight tiers"):
// a WeightCache holds the buffers and hands the engine a WeightLease per
// request. This file describes what those buffers are and how they are made:
//   - PlanComputeLayout validates the checkpoint against the ModelConfig —
//     every tensor the architecture needs must be present with exactly the
//     expected shape, headers only — and plans the compute buffers
//     (`ComputeLayout::buffers`, WeightSpecs, dtype F32) and where each
//     safetensors tensor goes in them (buffer index, float offset).
//   - FillComputeLayout converts (F32/F16/BF16 → f32) every tensor into its
//     slice: the WeightFill of the model's WeightCache registration.
//   - BindModelWeights turns the buffers' addresses (a lease's tensors) into
//     a ModelWeights of non-owning views: cheap, once per request.
// Two fusions are made so decode issues fewer, larger matrix-vector products:
//   wqkv      = [q_proj; k_proj; v_proj]   rows concatenated (bias: bqkv)
//   w_gate_up = [gate_proj; up_proj]       rows concatenated
// (row-major [out, in] matrices concatenated along `out` are contiguous).
//
// Buffer order and names (Engine::WeightModelFor documents the same order):
//   model.embed                         [vocab, hidden]
//   per layer i, p = "model.layers.<i>.":
//     p attn_norm                       [hidden]
//     p wqkv                            [q_dim + 2 × kv_dim, hidden]
//     p bqkv                            [q_dim + 2 × kv_dim]   attention_bias only
//     p q_norm, p k_norm                [head_dim]             qk_norm only
//     p wo                              [hidden, q_dim]
//     p ffn_norm                        [hidden]
//     p w_gate_up                       [2 × intermediate, hidden]
//     p w_down                          [hidden, intermediate]
//   model.final_norm                    [hidden]
//   model.lm_head                       [vocab, hidden]        unless tied / headless
// (the order of the tensors in arbiter/formats/llama_tensors.h, one buffer
// per fused group, created at its first tensor).
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
// Thread safety: ComputeLayout and ModelWeights are immutable values;
// thread-safe reads. FillComputeLayout writes only `arrays`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"
#include "arbiter/weights/weight_files.h"

namespace arbiter::engine_internal {

// A read-only view of `size` floats owned elsewhere (a WeightLease's tensor).
class FloatView {
 public:
  FloatView() = default;
  FloatView(const float* data, size_t size) : data_(data), size_(size) {}
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  size_t size_bytes() const { return size_ * sizeof(float); }
  bool empty() const { return size_ == 0; }
  float operator[](size_t i) const { return data_[i]; }

 private:
  const float* data_ = nullptr;
  size_t size_ = 0;
};

struct LayerWeights {
  FloatView attn_norm;  // [hidden]
  FloatView wqkv;       // [q_dim + 2 × kv_dim, hidden]; rows q, then k, then v
  FloatView bqkv;       // [q_dim + 2 × kv_dim]; empty unless attention_bias
  FloatView q_norm;     // [head_dim]; empty unless qk_norm
  FloatView k_norm;     // [head_dim]; empty unless qk_norm
  FloatView wo;         // [hidden, q_dim]
  FloatView ffn_norm;   // [hidden]
  FloatView w_gate_up;  // [2 × intermediate, hidden]; rows gate, then up
  FloatView w_down;     // [hidden, intermediate]
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

// The weights one request computes from: views of the buffers of a
// ComputeLayout (BindModelWeights). Valid while those buffers are (the
// request's WeightLease).
struct ModelWeights {
  ModelConfig config;
  ModelDims dims;
  FloatView embed;       // [vocab, hidden]
  std::vector<LayerWeights> layers;
  FloatView final_norm;  // [hidden]
  FloatView lm_head;     // [vocab, hidden]; empty when tied or headless
  bool has_lm_head = false;  // false for a headless model without tied embeddings

  // The output projection [vocab, hidden] (embed when tied). REQUIRES: has_lm_head.
  const float* lm_head_data() const { return lm_head.empty() ? embed.data() : lm_head.data(); }
  // Bytes of all viewed buffers.
  size_t bytes() const;
  // Weight bytes a decode step streams from memory: every layer matrix, the
  // norms and the lm_head (one embedding row is negligible and not counted).
  size_t decode_bytes_per_token() const;
};

// Where one safetensors tensor goes: floats [offset, offset + numel) of
// buffer `buffer`.
struct ComputePart {
  std::string tensor;           // safetensors name
  std::vector<int64_t> shape;   // expected shape
  size_t buffer = 0;            // index into ComputeLayout::buffers
  size_t offset = 0;            // floats from the buffer start
};

// Buffer indices of one layer; -1 for an absent optional buffer.
struct LayerBuffers {
  int attn_norm = -1, wqkv = -1, bqkv = -1, q_norm = -1, k_norm = -1, wo = -1, ffn_norm = -1,
      w_gate_up = -1, w_down = -1;
};

// The planned compute layout of one checkpoint (see the file comment).
struct ComputeLayout {
  ModelConfig config;
  ModelDims dims;
  bool has_lm_head = false;
  std::vector<WeightSpec> buffers;  // dtype F32, in the order of the file comment
  std::vector<ComputePart> parts;   // llama_tensors.h order; together they cover
                                    // every element of every buffer exactly once
  int embed = -1;
  std::vector<LayerBuffers> layers;
  int final_norm = -1;
  int lm_head = -1;                 // -1 when tied or headless

  // Elements of buffer i.
  size_t buffer_floats(size_t i) const;
  // Σ buffer bytes (no alignment padding).
  size_t bytes() const;
  // As ModelWeights::decode_bytes_per_token, from the plan alone.
  size_t decode_bytes_per_token() const;
};

// Checks the checkpoint against `config` (headers only) and plans its layout.
// `model_dir` is used in messages.
// Errors: kNotFound naming a missing tensor and the files searched;
// kDataLoss `<file>: tensor "<name>" has shape [a, b], expected [c, d]`;
// kInvalidArgument for a config the forward pass cannot run (a non-positive
// dimension, odd head_dim, heads not divisible by KV heads).
Result<ComputeLayout> PlanComputeLayout(const ModelConfig& config, const SafetensorsModel& st,
                                        const std::string& model_dir);

// PlanComputeLayout's checks without keeping the plan. Errors as it.
Status ValidateModelWeights(const ModelConfig& config, const SafetensorsModel& st,
                            const std::string& model_dir);

// Converts every tensor of `st` into its slice of `arrays` (one per
// layout.buffers entry, each buffer_floats(i) floats, 4-byte aligned; their
// previous contents are irrelevant: every element is written). `st` is looked
// up again by name (the file may have changed since planning): presence and
// shape errors as PlanComputeLayout (model_dir in messages); kUnimplemented
// (from ConvertToF32, naming the tensor and file) for a dtype that cannot be
// converted; kInvalidArgument when `arrays` does not match the layout.
Status FillComputeLayout(const ComputeLayout& layout, const SafetensorsModel& st,
                         const std::string& model_dir, const std::vector<void*>& arrays);

// Views of `arrays` (one per layout.buffers entry, holding what
// FillComputeLayout wrote). Allocates only the layer vector.
// REQUIRES: arrays.size() == layout.buffers.size(), every entry non-null.
ModelWeights BindModelWeights(const ComputeLayout& layout, const std::vector<const void*>& arrays);

}  // namespace arbiter::engine_internal
