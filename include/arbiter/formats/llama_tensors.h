// arbiter/formats/llama_tensors.h — the tensors a Llama-family decoder needs,
// in the engine's order, with their expected shapes.
//
// The one list of "which tensors, which shapes, which order" for the
// architectures ModelConfig accepts (Llama, Qwen2, Qwen3). The engine's
// weight loader (engine/internal/model_weights.cc) validates and converts
// exactly these tensors, and the weight runtime
// (arbiter/weights/weight_files.h, WeightOrder) uses the same order as the
// model's argument order when a file carries no "argument_order" metadata
// (docs/architecture.md "Weight tiers"). Keep it the single source: do not
// copy the list elsewhere.
//
// Order (Hugging Face names):
//   <p>embed_tokens.weight                           [vocab, hidden]
//   for each layer i, with q = <p>layers.<i>.:
//     q input_layernorm.weight                       [hidden]
//     q self_attn.{q,k,v}_proj.weight                [q_dim|kv_dim, hidden]
//     q self_attn.{q,k,v}_proj.bias                  [q_dim|kv_dim]   attention_bias only
//     q self_attn.{q,k}_norm.weight                  [head_dim]       qk_norm only
//     q self_attn.o_proj.weight                      [hidden, q_dim]
//     q post_attention_layernorm.weight              [hidden]
//     q mlp.{gate,up}_proj.weight                    [intermediate, hidden]
//     q mlp.down_proj.weight                         [hidden, intermediate]
//   <p>norm.weight                                   [hidden]
//   lm_head.weight                                   [vocab, hidden]  see below
// <p> is "model." except for headless checkpoints ("*Model" architectures)
// that store "embed_tokens.weight" without it. lm_head.weight is listed
// unless the embeddings are tied; a headless checkpoint lists it only when
// the file has one. Extra tensors in a file (rotary inv_freq, ...) are not
// listed.
//
// Thread safety: pure function over immutable inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"

namespace arbiter {

// What a tensor is for; lets the engine route it to its (fused) buffer.
enum class LlamaTensorRole {
  kEmbed,
  kAttnNorm,
  kQProj,
  kKProj,
  kVProj,
  kQBias,
  kKBias,
  kVBias,
  kQNorm,
  kKNorm,
  kOProj,
  kFfnNorm,
  kGateProj,
  kUpProj,
  kDownProj,
  kFinalNorm,
  kLmHead,
};

struct LlamaTensor {
  std::string name;
  std::vector<int64_t> shape;  // expected, row-major
  LlamaTensorRole role = LlamaTensorRole::kEmbed;
  int layer = -1;              // layer index; -1 for embed, final norm, lm_head
};

struct LlamaTensorPlan {
  std::vector<LlamaTensor> tensors;  // in the order above
  // The model can produce logits: an lm_head is listed or the embeddings are
  // tied (the output projection then reuses embed_tokens).
  bool has_lm_head = false;
};

// Lists the tensors `config` needs. `st` is consulted only for the two
// checkpoint-dependent choices (the "model." prefix and a headless model's
// optional lm_head); presence and shapes are NOT checked here — callers do
// that with their own messages. Dimensions use the ModelConfig defaults
// (num_key_value_heads 0 → num_attention_heads, head_dim 0 →
// hidden_size / num_attention_heads); a non-positive dimension yields
// non-positive shape entries, which the engine refuses before calling.
LlamaTensorPlan PlanLlamaTensors(const ModelConfig& config, const SafetensorsModel& st);

}  // namespace arbiter
