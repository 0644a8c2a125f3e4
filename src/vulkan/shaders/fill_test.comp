#version 450
// fill_test.comp — out[i] = i · scale + x[i]: the device tests' smallest
// kernel (a pipeline, push constants and buffer addresses end to end).
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform P {
  uint64_t x;
  uint64_t out_;
  uint n;
  float scale;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i < p.n) Floats(p.out_).v[i] = float(i) * p.scale + Floats(p.x).v[i];
}
