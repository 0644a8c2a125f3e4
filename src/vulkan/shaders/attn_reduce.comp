#version 450
// attn_reduce.comp — combines attention.comp's n_split partials of query row
// i (workgroup y) and head h (workgroup x): out[i, h] = Σ_s e^(m_s − M) o_s /
// Σ_s e^(m_s − M) l_s with M = max_s m_s (an empty split has l_s = 0).
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform P {
  uint64_t part;  // [m, n_heads, n_split, head_dim + 2] f32
  uint64_t out_;  // [m, q_dim] f32
  uint n_heads;
  uint head_dim;
  uint n_split;
} p;

void main() {
  const uint h = gl_WorkGroupID.x;
  const uint row = gl_WorkGroupID.y;
  const uint hd = p.head_dim;
  const uint stride = hd + 2u;
  Floats part = Floats(p.part + (uint64_t(row) * p.n_heads + h) * p.n_split * stride * 4u);
  float mx = -1.0e30;
  for (uint s = 0; s < p.n_split; ++s) mx = max(mx, part.v[s * stride]);
  float l = 0.0;
  for (uint s = 0; s < p.n_split; ++s) l += exp(part.v[s * stride] - mx) * part.v[s * stride + 1u];
  const float inv = 1.0 / l;
  Floats o = Floats(p.out_ + (uint64_t(row) * p.n_heads * hd + h * hd) * 4u);
  for (uint d = gl_LocalInvocationID.x; d < hd; d += 64u) {
    float a = 0.0;
    for (uint s = 0; s < p.n_split; ++s) {
      a += exp(part.v[s * stride] - mx) * part.v[s * stride + 2u + d];
    }
    o.v[d] = a * inv;
  }
}
