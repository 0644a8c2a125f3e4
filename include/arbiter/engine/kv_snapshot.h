// arbiter/engine/kv_snapshot.h — one slot's KV prefix state, in memory: the
// unit the engine saves from and restores into a slot (Engine::SaveSlot /
// RestoreSlot), the host prompt cache holds, and the disk tier serializes
// (arbiter/kv/kv_file.h). Implements the "per-slot KV state (serializable)"
// of ARCHITECTURE.md's engine layer, for the KV precache issue (points 4, 5).
//
// Thread safety: a plain value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace arbiter {

// One sequence's KV prefix: `tokens` and, for positions [0, n_tokens), the
// K and V rows of every layer.
struct KvSnapshot {
  std::string model_hash;       // 16 chars (ModelHash) once owned by a KvStore; the engine leaves it empty
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;          // n_kv_heads × head_dim
  std::vector<int32_t> tokens;  // [n_tokens]
  // [n_layers, 2, n_tokens, kv_dim] f32: layer l's K rows at
  // (2l)·n_tokens·kv_dim, its V rows at (2l + 1)·n_tokens·kv_dim.
  std::vector<float> kv;

  size_t n_tokens() const { return tokens.size(); }
  // Bytes held in memory (tokens + K/V), what the prompt cache charges.
  uint64_t MemoryBytes() const {
    return tokens.size() * sizeof(int32_t) + kv.size() * sizeof(float);
  }
};

}  // namespace arbiter
