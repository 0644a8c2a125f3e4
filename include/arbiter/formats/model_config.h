// arbiter/formats/model_config.h — Hugging Face config.json for Llama-family
// decoders.
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
// Errors: kDataLoss (malformed JSON, wrong type, out-of-range value) naming
// the file and the field.
//
// Thread safety: plain values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

enum class Architecture { kLlama, kQwen2, kQwen3 };

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

}  // namespace arbiter
