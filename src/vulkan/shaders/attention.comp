#version 450
// attention.comp — causal attention of m query rows over the f16 K/V cache,
// flash style (an online softmax over tiles of 128 positions, no score
// matrix): workgroup (s, h, i) is query row i (position step.pos + i, so it
// sees positions [0, step.pos + i]) of q head h (grouped-query: kv head =
// h / (n_heads / n_kv_heads)), restricted to split s of n_split equal parts
// of those positions. With n_split = 1 it writes out[i, h] directly;
// otherwise its partial (running max, sum of exponentials, unnormalized
// output) goes to `part`, and the last of the n_split workgroups of (h, i)
// to finish (an atomic count per (i, h) in `count`, which it resets to 0)
// combines them: out = Σ_s e^(m_s − M) o_s / Σ_s e^(m_s − M) l_s, M =
// max_s m_s (an empty split has l_s = 0) — decode splits the context so
// that a few heads still fill the device, without a reduce dispatch.
#include "common.glsl"

// The partials and counts as the workgroups of one (i, h) share them.
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Shared {
  float v[];
};
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counts {
  uint v[];
};
layout(buffer_reference, std430, buffer_reference_align = 16) buffer K4 { uvec4 v[]; };

layout(local_size_x = 128) in;
layout(push_constant) uniform P {
  uint64_t q;        // [m, q_dim + 2 kv_dim] f32 (the qkv buffer; q first)
  uint64_t kcache;   // this layer's K rows, f16 [n_ctx, kv_dim]
  uint64_t vcache;
  uint64_t part;     // [m, n_heads, n_split, head_dim + 2] f32 (n_split > 1)
  uint64_t count;    // [m, n_heads] uint, zero between passes (n_split > 1)
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
shared bool last;

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
  // K rows and heads start on 16 bytes when head_dim is a multiple of 8
  // (the cache itself is 256-byte aligned per layer: n_ctx rows of kv_dim).
  const bool vec_k = (hd & 7u) == 0u && (p.kcache & 15ul) == 0ul;
  float m = -1.0e30;
  float l = 0.0;
  float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
  for (uint tb = t0; tb < t1; tb += 128u) {
    const uint t = tb + tid;
    float sc = -1.0e30;
    if (t < t1) {
      const uint w0 = (t * kv_dim) / 2u + head_word;
      sc = 0.0;
      if (vec_k) {  // 16-byte loads: 8 halves each
        K4 k4 = K4(p.kcache);
        for (uint d = 0; d < hd; d += 8u) {
          const uvec4 q = k4.v[(w0 + d / 2u) / 4u];
          const vec2 a = unpackHalf2x16(q.x), b = unpackHalf2x16(q.y);
          const vec2 c = unpackHalf2x16(q.z), e = unpackHalf2x16(q.w);
          sc += qs[d] * a.x + qs[d + 1u] * a.y + qs[d + 2u] * b.x + qs[d + 3u] * b.y +
                qs[d + 4u] * c.x + qs[d + 5u] * c.y + qs[d + 6u] * e.x + qs[d + 7u] * e.y;
        }
      } else {
        for (uint d = 0; d < hd; d += 2u) {
          const vec2 k = unpackHalf2x16(kc.v[w0 + d / 2u]);
          sc += qs[d] * k.x + qs[d + 1u] * k.y;
        }
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
  const uint stride = hd + 2u;
  const uint64_t head_part = p.part + (uint64_t(row) * p.n_heads + h) * p.n_split * stride * 4u;
  Shared part = Shared(head_part + uint64_t(s) * stride * 4u);
  if (tid == 0u) {
    part.v[0] = m;
    part.v[1] = l;
  }
  for (uint k = 0; k < 4u; ++k) {
    const uint d = tid + 128u * k;
    if (d < hd) part.v[2u + d] = acc[k];
  }
  // Publish the partial, then count it; the last to count combines.
  memoryBarrierBuffer();
  barrier();
  if (tid == 0u) {
    Counts count = Counts(p.count);
    last = atomicAdd(count.v[row * p.n_heads + h], 1u) == p.n_split - 1u;
    if (last) count.v[row * p.n_heads + h] = 0u;
  }
  barrier();
  if (!last) return;
  memoryBarrierBuffer();
  Shared all = Shared(head_part);
  float mx = -1.0e30;
  for (uint j = 0; j < p.n_split; ++j) mx = max(mx, all.v[j * stride]);
  float total = 0.0;
  for (uint j = 0; j < p.n_split; ++j) total += exp(all.v[j * stride] - mx) * all.v[j * stride + 1u];
  const float inv = 1.0 / total;
  Floats o = Floats(p.out_ + (uint64_t(row) * q_dim + h * hd) * 4u);
  for (uint d = tid; d < hd; d += 128u) {
    float a = 0.0;
    for (uint j = 0; j < p.n_split; ++j) {
      a += exp(all.v[j * stride] - mx) * all.v[j * stride + 2u + d];
    }
    o.v[d] = a * inv;
  }
}
