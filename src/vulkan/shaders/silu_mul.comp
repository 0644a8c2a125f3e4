#version 450
// silu_mul.comp — per row i (workgroup y): out[i, j] = silu(gu[i, j]) ·
// gu[i, n + j]: the FFN's gate and up halves of one fused projection.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform P {
  uint64_t gu;   // [m, 2n] f32: per row gate then up
  uint64_t out_; // [m, n] f32
  uint n;
} p;

void main() {
  const uint j = gl_GlobalInvocationID.x;
  if (j >= p.n) return;
  const uint64_t i = gl_WorkGroupID.y;
  Floats gu = Floats(p.gu + i * p.n * 8u);
  const float g = gu.v[j];
  Floats(p.out_ + i * p.n * 4u).v[j] = g / (1.0 + exp(-g)) * gu.v[p.n + j];
}
