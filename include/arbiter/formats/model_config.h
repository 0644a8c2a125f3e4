// arbiter/formats/model_config.h — the description of a Llama-family
// decoder, from a Hugging Face config.json or from a GGUF file's metadata
// (ModelConfigFromGguf, at the end).
//
// Supported `architectures[0]`: LlamaForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM (and their headless *Model variants, for embedding
// models). Anything else is kUnimplemented naming the architecture.
//
// Fields and defaults (HF transformers semantics):
//   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
//   vocab_size                         required, > 0
//   num_key_value_heads                default num_attention_heads; must divide it
//   head_dim                           default hidden_size / num_attention_heads
//   rms_norm_eps                       default 1e-6
//   rope_theta                         default 10000
//   max_position_embeddings            default 2048
//   tie_word_embeddings                default false
//   attention_bias                     default true for Qwen2, false otherwise
//   bos_token_id / eos_token_id        int, list of ints, or null
//   rope_scaling                       default none; see below
//
// rope_scaling (transformers `rope_type`, older files spell it `type`;
// `rope_type` wins when both are present). Read from "rope_parameters" (the
// newer transformers spelling) when rope_scaling is absent or null.
//   null, absent, {"rope_type": "default"}   kNone: plain RoPE
//   {"rope_type": "linear", "factor": F}     kLinear: inv_freq / F
//   {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
//    "original_max_position_embeddings"}     kLlama3 (Llama 3.1+), all four
//                                            required; high > low
// Other types ("dynamic", "yarn", "longrope", "mrope", ...) are refused with
// kUnimplemented naming the type: running them as plain RoPE would silently
// give wrong logits.
//
// Errors: kDataLoss (malformed JSON, wrong type, out-of-range value) naming
// the file and the field (nested fields as "rope_scaling.factor");
// kUnimplemented for an unsupported architecture or rope_scaling type.
//
// Thread safety: plain values.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

enum class Architecture { kLlama, kQwen2, kQwen3 };

enum class RopeScalingType { kNone, kLinear, kLlama3 };

// How RoPE inverse frequencies inv_freq_i = theta^(−2i/head_dim) are adjusted
// (transformers' ROPE_INIT_FUNCTIONS; the engine applies it in
// engine/internal/forward.cc). Fields other than `type` are meaningful only
// for the types noted; every parsed value is positive and finite.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;                       // kLinear, kLlama3
  float low_freq_factor = 1.0f;              // kLlama3
  float high_freq_factor = 4.0f;             // kLlama3; > low_freq_factor
  int original_max_position_embeddings = 0;  // kLlama3, in positions
  // Per-dimension divisors of the inverse frequencies, [head_dim / 2], each
  // finite and > 0: inv_freq_i / freq_factors[i] after `type` is applied.
  // GGUF "rope_freqs.weight" (llama.cpp's converter bakes a Llama 3.1+
  // "llama3" rope_scaling into it); empty = none.
  std::vector<float> freq_factors;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string architecture_name;  // as in the file, e.g. "Qwen3ForCausalLM"
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  int vocab_size = 0;
  int max_position_embeddings = 2048;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;     // q/k/v projections carry a bias (Qwen2)
  bool qk_norm = false;            // per-head RMSNorm on q and k (Qwen3)
  std::vector<int> bos_token_ids;
  std::vector<int> eos_token_ids;
  std::string torch_dtype;         // informational
};

// Parses config.json text; `file` names it in errors.
Result<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& file);
// Reads and parses `path`.
Result<ModelConfig> LoadModelConfig(const std::string& path);

class GgufFile;
struct GgufTensorInfo;

// The ModelConfig of a GGUF file (arbiter/formats/gguf.h), from the metadata
// keys llama.cpp's converter writes (<a> is the value of
// general.architecture) and from which tensors the file holds:
//   general.architecture                 "llama" or "mistral" → kLlama
//                                        ("LlamaForCausalLM"), "qwen2" → kQwen2
//                                        ("Qwen2ForCausalLM"), "qwen3" → kQwen3
//                                        ("Qwen3ForCausalLM"); the ModelConfig
//                                        names config.json would carry
//   <a>.block_count                      num_hidden_layers        required
//   <a>.embedding_length                 hidden_size              required
//   <a>.feed_forward_length              intermediate_size        required
//   <a>.attention.head_count             num_attention_heads      required
//   <a>.attention.head_count_kv          num_key_value_heads      default head_count; divides it
//   <a>.attention.key_length             head_dim                 default embedding_length / head_count
//   <a>.attention.value_length           must equal head_dim when present
//   <a>.rope.dimension_count             must equal head_dim when present
//   <a>.context_length                   max_position_embeddings  required
//   <a>.attention.layer_norm_rms_epsilon rms_norm_eps             required
//   <a>.rope.freq_base                   rope_theta               default 10000
//   <a>.rope.scaling.type                "none" or absent → kNone; "linear" →
//                                        kLinear with <a>.rope.scaling.factor
//                                        (or the older <a>.rope.scale_linear)
//   tokenizer.ggml.tokens                vocab_size = its length; without it
//                                        <a>.vocab_size; one of them required
//   tokenizer.ggml.bos_token_id          bos_token_ids
//   tokenizer.ggml.{eos,eot,eom}_token_id  eos_token_ids, in that order, without
//                                        repeats (llama.cpp stops on all three)
//   tie_word_embeddings                  the file has no "output.weight"
//   attention_bias                       qwen2, or the file has "blk.0.attn_q.bias"
//   qk_norm                              qwen3
// torch_dtype stays empty. Integers may be stored in any integer type, the
// floats as f32 or f64.
// Errors: kDataLoss naming the file and the key for a missing required key,
// a value of the wrong type, or one out of range (counts 1..2^31 − 1, floats
// positive and finite, head_count_kv dividing head_count);
// kUnimplemented, naming the key and value, for another architecture, a
// value_length or rope.dimension_count other than head_dim (partial RoPE),
// or a rope scaling type other than none/linear (yarn, longrope, ...):
// running any of these as plain RoPE would give wrong logits.
// A "rope_freqs.weight" tensor (Llama 3.1+ per-dimension RoPE frequency
// factors) becomes rope_scaling.freq_factors; it must be F32 with head_dim / 2
// finite positive values (else kDataLoss naming the tensor). Its bytes come
// from `read_tensor`, or, when that is null, from the file gguf.name() names
// (as OpenGguf opened it; a GgufFile parsed from memory needs a reader).
using GgufTensorReader = std::function<Result<std::string>(const GgufTensorInfo&)>;
Result<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf,
                                        const GgufTensorReader& read_tensor = nullptr);

}  // namespace arbiter
