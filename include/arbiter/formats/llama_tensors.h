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
// GGUF files (PlanLlamaTensorsGguf) hold the same tensors, in the same order
// here, under llama.cpp's names:
//   token_embd.weight                 embed_tokens.weight
//   blk.<i>.attn_norm.weight          input_layernorm.weight
//   blk.<i>.attn_{q,k,v}.weight       self_attn.{q,k,v}_proj.weight
//   blk.<i>.attn_{q,k,v}.bias         self_attn.{q,k,v}_proj.bias
//   blk.<i>.attn_{q,k}_norm.weight    self_attn.{q,k}_norm.weight
//   blk.<i>.attn_output.weight        self_attn.o_proj.weight
//   blk.<i>.ffn_norm.weight           post_attention_layernorm.weight
//   blk.<i>.ffn_{gate,up,down}.weight mlp.{gate,up,down}_proj.weight
//   output_norm.weight                norm.weight
//   output.weight                     lm_head.weight (absent when tied)
// The plan's shapes stay the row-major [out, in] shapes above; a GGUF
// tensor's dims are those reversed (GgufTensorInfo::RowMajorShape).
//
// Note [GGUF q/k row order]: llama.cpp's converter stores the q and k
// projections of "llama"-architecture files (and their biases) with the rows
// of each head permuted, because llama.cpp applies RoPE to adjacent pairs
// (x[2i], x[2i+1]) while Hugging Face checkpoints rotate the two halves of a
// head (x[i], x[i + head_dim/2]). Within each head of head_dim rows, GGUF row
// 2i + s holds HF row s·head_dim/2 + i (s ∈ {0, 1}). The engine, which
// rotates halves, must undo it (GgufRowToHfRow) for files where
// GgufQkRowsPermuted() holds; qwen2 and qwen3 files are stored unpermuted.
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

// The same list under GGUF names (see above). lm_head ("output.weight") is
// listed unless config.tie_word_embeddings; has_lm_head is always true.
LlamaTensorPlan PlanLlamaTensorsGguf(const ModelConfig& config);

// Note [GGUF q/k row order]: whether a GGUF file of `config`'s architecture
// stores its q/k projection rows permuted (true for kLlama).
bool GgufQkRowsPermuted(const ModelConfig& config);

// Note [GGUF q/k row order]: the Hugging Face row index of row `gguf_row` of
// a permuted q or k projection (or bias) of `n_heads` heads of `head_dim`
// rows each (for k: the KV heads). A bijection on [0, n_heads × head_dim);
// -1 when gguf_row is outside that range or head_dim is not a positive even
// number.
int64_t GgufRowToHfRow(int64_t gguf_row, int64_t n_heads, int64_t head_dim);

}  // namespace arbiter
