#version 450
// attention.comp — causal attention of m query rows over the f16 K/V cache,
// flash style (an online softmax over tiles of 128 positions, no score
// matrix): workgroup (s, h, i) is query row i (position step.pos + i, so it
// sees positions [0, step.pos + i]) of q head h (grouped-query: kv head =
// h / (n_heads / n_kv_heads)), restricted to split s of n_split equal parts
// of those positions. With n_split = 1 it writes out[i, h] directly;
// otherwise its partial (running max, sum of exponentials, unnormalized
// output) goes to `part` and attn_reduce.comp combines the splits — decode
// splits the context so that a few heads still fill the device.
#include "common.glsl"

layout(local_size_x = 128) in;
layout(push_constant) uniform P {
  uint64_t q;        // [m, q_dim + 2 kv_dim] f32 (the qkv buffer; q first)
  uint64_t kcache;   // this layer's K rows, f16 [n_ctx, kv_dim]
  uint64_t vcache;
  uint64_t part;     // [m, n_heads, n_split, head_dim + 2] f32 (n_split > 1)
  uint64_t out_;     // [m, q_dim] f32
  uint64_t step;     // Step: pos of row 0
  uint n_heads;
  uint n_kv_heads;
  uint head_dim;
  uint n_split;
  float scale;       // 1 / sqrt(head_dim)
} p;

shared float red[128];
shared float qs[512];
shared float ps[128];

void main() {
  const uint s = gl_WorkGroupID.x;
  const uint h = gl_WorkGroupID.y;
  const uint row = gl_WorkGroupID.z;
  const uint tid = gl_LocalInvocationID.x;
  const uint hd = p.head_dim;
  const uint kv_dim = p.n_kv_heads * hd;
  const uint q_dim = p.n_heads * hd;
  const uint n = Step(p.step).pos + row + 1u;
  const uint kvh = h / (p.n_heads / p.n_kv_heads);
  const uint chunk = (n + p.n_split - 1u) / p.n_split;
  const uint t0 = min(n, s * chunk);
  const uint t1 = min(n, t0 + chunk);

  Floats q = Floats(p.q + uint64_t(row) * (q_dim + 2u * kv_dim) * 4u);
  for (uint i = tid; i < hd; i += 128u) qs[i] = q.v[h * hd + i] * p.scale;
  barrier();
  Uints kc = Uints(p.kcache);
  const uint head_word = (kvh * hd) / 2u;
  float m = -1.0e30;
  float l = 0.0;
  float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
  for (uint tb = t0; tb < t1; tb += 128u) {
    const uint t = tb + tid;
    float sc = -1.0e30;
    if (t < t1) {
      const uint w0 = (t * kv_dim) / 2u + head_word;
      sc = 0.0;
      for (uint d = 0; d < hd; d += 2u) {
        const vec2 k = unpackHalf2x16(kc.v[w0 + d / 2u]);
        sc += qs[d] * k.x + qs[d + 1u] * k.y;
      }
    }
    float mt;
    WORKGROUP_MAX(red, sc, 128u, mt);
    const float nm = max(m, mt);
    const float e = t < t1 ? exp(sc - nm) : 0.0;
    ps[tid] = e;
    float lt;
    WORKGROUP_SUM(red, e, 128u, lt);  // its barriers publish ps
    const float corr = exp(m - nm);
    l = l * corr + lt;
    m = nm;
    const uint nt = min(128u, t1 - tb);
    for (uint k = 0; k < 4u; ++k) {
      const uint d = tid + 128u * k;
      if (d >= hd) break;
      float a = acc[k] * corr;
      for (uint j = 0; j < nt; ++j) {
        a += ps[j] * half_at(p.vcache, (uint64_t(tb + j) * kv_dim + kvh * hd + d) * 2u);
      }
      acc[k] = a;
    }
    barrier();  // ps is rewritten by the next tile
  }
  if (p.n_split == 1u) {
    Floats o = Floats(p.out_ + (uint64_t(row) * q_dim + h * hd) * 4u);
    const float inv = 1.0 / l;
    for (uint k = 0; k < 4u; ++k) {
      const uint d = tid + 128u * k;
      if (d < hd) o.v[d] = acc[k] * inv;
    }
    return;
  }
  Floats part = Floats(p.part + ((uint64_t(row) * p.n_heads + h) * p.n_split + s) * (hd + 2u) * 4u);
  if (tid == 0u) {
    part.v[0] = m;
    part.v[1] = l;
  }
  for (uint k = 0; k < 4u; ++k) {
    const uint d = tid + 128u * k;
    if (d < hd) part.v[2u + d] = acc[k];
  }
}
