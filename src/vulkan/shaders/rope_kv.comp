#version 450
// rope_kv.comp — q/k/v of m tokens after the qkv projection: per token i
// (workgroup y, position step.pos + i) and head (workgroup x = h), q heads
// [0, n_heads) and k heads [n_heads, n_heads + n_kv_heads) get the
// optional per-head RMSNorm (Qwen3's q_norm / k_norm) and RoPE in HF's
// rotate_half layout (dimension i pairs with i + half, cos/sin from the host's double-precision tables); k heads and v heads
// [n_heads + n_kv_heads, n_heads + 2 n_kv_heads) are then written as f16 to
// that position's row of the layer's K and V caches. q is rotated in place.
#include "common.glsl"

layout(local_size_x = 128) in;
layout(push_constant) uniform P {
  uint64_t qkv;      // [m, q_dim + 2 kv_dim] f32
  uint64_t q_norm;   // [head_dim] f32, or 0
  uint64_t k_norm;   // [head_dim] f32, or 0
  uint64_t rope;     // [n_ctx, half] cos, then [n_ctx, half] sin
  uint64_t kcache;   // this layer's K rows, f16 [n_ctx, kv_dim]
  uint64_t vcache;   // this layer's V rows
  uint64_t step;     // Step: pos of row 0
  uint n_heads;
  uint n_kv_heads;
  uint head_dim;
  uint n_ctx;
  float eps;
} p;

shared float red[128];
shared float vals[512];

void main() {
  const uint h = gl_WorkGroupID.x;
  const uint tid = gl_LocalInvocationID.x;
  const uint hd = p.head_dim;
  const uint half_ = hd / 2u;
  const uint pos = Step(p.step).pos + gl_WorkGroupID.y;
  const uint kv_dim = p.n_kv_heads * hd;
  const uint q_dim = p.n_heads * hd;
  Floats qkv = Floats(p.qkv + uint64_t(gl_WorkGroupID.y) * (q_dim + 2u * kv_dim) * 4u);
  const bool is_q = h < p.n_heads;
  const bool is_k = !is_q && h < p.n_heads + p.n_kv_heads;
  uint base;
  if (is_q) base = h * hd;
  else if (is_k) base = q_dim + (h - p.n_heads) * hd;
  else base = q_dim + kv_dim + (h - p.n_heads - p.n_kv_heads) * hd;

  for (uint i = tid; i < hd; i += 128u) vals[i] = qkv.v[base + i];
  barrier();
  const uint64_t norm = is_q ? p.q_norm : (is_k ? p.k_norm : 0ul);
  if (norm != 0ul) {
    float ss = 0.0;
    for (uint i = tid; i < hd; i += 128u) ss += vals[i] * vals[i];
    float total;
    WORKGROUP_SUM(red, ss, 128u, total);
    const float inv = 1.0 / sqrt(total / float(hd) + p.eps);
    Floats w = Floats(norm);
    for (uint i = tid; i < hd; i += 128u) vals[i] = vals[i] * inv * w.v[i];
    barrier();
  }
  if (is_q || is_k) {
    Floats rope = Floats(p.rope);
    for (uint i = tid; i < half_; i += 128u) {
      const float c = rope.v[pos * half_ + i];
      const float s = rope.v[p.n_ctx * half_ + pos * half_ + i];
      const float x0 = vals[i], x1 = vals[i + half_];
      vals[i] = x0 * c - x1 * s;
      vals[i + half_] = x1 * c + x0 * s;
    }
    barrier();
  }
  if (is_q) {
    for (uint i = tid; i < hd; i += 128u) qkv.v[base + i] = vals[i];
    return;
  }
  // K or V row `pos`: pairs of halves per 32-bit word (head_dim is even).
  const uint head = is_k ? h - p.n_heads : h - p.n_heads - p.n_kv_heads;
  Uints cache = Uints(is_k ? p.kcache : p.vcache);
  const uint word0 = (pos * kv_dim + head * hd) / 2u;
  for (uint j = tid; j < half_; j += 128u) {
    cache.v[word0 + j] = packHalf2x16(vec2(vals[2u * j], vals[2u * j + 1u]));
  }
}
