// fuzz/model_config_checks.h — the invariants model_config.h promises of
// every ModelConfig a reader accepts (ParseModelConfig, ModelConfigFromGguf),
// checked by the fuzz targets of both readers; a violation traps.
#pragma once

#include "arbiter/formats/model_config.h"

inline void CheckModelConfigInvariants(const arbiter::ModelConfig& c) {
  if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_hidden_layers <= 0 ||
      c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 || c.head_dim <= 0 ||
      c.vocab_size <= 0 || c.max_position_embeddings <= 0) {
    __builtin_trap();
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) __builtin_trap();
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0)) __builtin_trap();
  const arbiter::RopeScaling& rs = c.rope_scaling;
  if (rs.type != arbiter::RopeScalingType::kNone && !(rs.factor > 0)) __builtin_trap();
  if (rs.type == arbiter::RopeScalingType::kLlama3 &&
      (!(rs.low_freq_factor > 0) || !(rs.high_freq_factor > rs.low_freq_factor) ||
       rs.original_max_position_embeddings <= 0)) {
    __builtin_trap();
  }
  for (int id : c.bos_token_ids) {
    if (id < 0) __builtin_trap();
  }
  for (int id : c.eos_token_ids) {
    if (id < 0) __builtin_trap();
  }
}
