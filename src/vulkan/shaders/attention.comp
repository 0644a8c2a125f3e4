#version 450
// attention.comp — one query row's attention for q head h (workgroup h) over
// the f16 K/V rows [0, pos] of its KV head (grouped-query: kv head = h /
// (n_heads / n_kv_heads)): scores q·k / sqrt(head_dim) into `scores`, a
// softmax, then out[h] = Σ_t p_t · v_t.
#include "common.glsl"

layout(local_size_x = 128) in;
layout(push_constant) uniform P {
  uint64_t q;        // [n_heads · head_dim] f32 (the qkv buffer's q part)
  uint64_t kcache;   // this layer's K rows, f16 [n_ctx, kv_dim]
  uint64_t vcache;
  uint64_t scores;   // [n_heads, n_ctx] f32 scratch
  uint64_t out_;     // [n_heads · head_dim] f32
  uint64_t step;     // Step: pos
  uint n_heads;
  uint n_kv_heads;
  uint head_dim;
  uint n_ctx;
  float scale;       // 1 / sqrt(head_dim)
} p;

shared float red[128];
shared float qs[512];

void main() {
  const uint h = gl_WorkGroupID.x;
  const uint tid = gl_LocalInvocationID.x;
  const uint hd = p.head_dim;
  const uint n = Step(p.step).pos + 1u;
  const uint kvh = h / (p.n_heads / p.n_kv_heads);
  const uint kv_dim = p.n_kv_heads * hd;
  Floats q = Floats(p.q);
  for (uint i = tid; i < hd; i += 128u) qs[i] = q.v[h * hd + i];
  barrier();
  Floats scores = Floats(p.scores);
  const uint srow = h * p.n_ctx;
  float m = -1.0e30;
  for (uint t = tid; t < n; t += 128u) {
    const uint64_t kb = (uint64_t(t) * kv_dim + kvh * hd) * 2u;
    float s = 0.0;
    for (uint d = 0; d < hd; d += 2u) {
      const vec2 k = unpackHalf2x16(Uints(p.kcache).v[uint((kb >> 2) + d / 2u)]);
      s += qs[d] * k.x + qs[d + 1u] * k.y;
    }
    s *= p.scale;
    scores.v[srow + t] = s;
    m = max(m, s);
  }
  float mx;
  WORKGROUP_MAX(red, m, 128u, mx);
  float sum = 0.0;
  for (uint t = tid; t < n; t += 128u) {
    const float e = exp(scores.v[srow + t] - mx);
    scores.v[srow + t] = e;
    sum += e;
  }
  float total;
  WORKGROUP_SUM(red, sum, 128u, total);
  memoryBarrierBuffer();
  barrier();
  const float inv = 1.0 / total;
  Uints vc = Uints(p.vcache);
  for (uint d = tid; d < hd; d += 128u) {
    float acc = 0.0;
    for (uint t = 0; t < n; ++t) {
      acc += scores.v[srow + t] * half_at(p.vcache, (uint64_t(t) * kv_dim + kvh * hd + d) * 2u);
    }
    Floats(p.out_).v[h * hd + d] = acc * inv;
  }
}
