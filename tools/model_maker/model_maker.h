// tools/model_maker/model_maker.h — `arbiter make-model`: deterministic demo
// and test models in Hugging Face layout.
//
// Writes <out_dir>/{config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json, generation_config.json}. The tokenizer is a
// byte-level BPE trained (≥ 2000 merges) on a text corpus every Debian
// machine has (/usr/share/common-licenses); the weights are random and
// untrained but deterministic from `seed` (same seed → identical files), so
// outputs are real computation but not meaningful language.
//
// Presets (ModelPresetNames()):
//   tiny        Llama, GQA, f32, a few MB — unit and end-to-end tests
//   tiny-qwen2  Qwen2 with q/k/v bias — numerical reference tests
//   tiny-qwen3  Qwen3 with q/k norm — numerical reference tests
//   demo-chat   Qwen3-style: hidden 768, 8 layers, 12 heads / 4 KV heads,
//               head_dim 64, intermediate 2048, tied embeddings, vocab ≈ 4000,
//               bf16 (~53M parameters)
//   demo-embed  a small embedding model (served with capability embedding)
//
// Errors: kNotFound for an unknown preset (message lists the presets);
// file errors name the path. Files are written atomically; a failed run
// leaves no partial file under a final name.
//
// Thread safety: thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

std::vector<std::string> ModelPresetNames();
// One-line description of a preset; empty when unknown.
std::string ModelPresetDescription(std::string_view preset);
// True for presets meant to be served as embedding models.
bool ModelPresetIsEmbedding(std::string_view preset);

// Progress: stage name ("tokenizer", "weights", "write") and fraction [0, 1].
using MakeModelProgress = std::function<void(std::string_view stage, double fraction)>;

Status MakeModel(std::string_view preset, const std::string& out_dir, uint64_t seed,
                 const MakeModelProgress& progress = nullptr);

}  // namespace arbiter
