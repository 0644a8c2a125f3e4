#version 450
// silu_mul.comp — out[i] = silu(gu[i]) · gu[n + i]: the FFN's gate and up
// halves of one fused projection.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform P {
  uint64_t gu;   // [2n] f32: gate then up
  uint64_t out_; // [n] f32
  uint n;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= p.n) return;
  Floats gu = Floats(p.gu);
  const float g = gu.v[i];
  Floats(p.out_).v[i] = g / (1.0 + exp(-g)) * gu.v[p.n + i];
}
