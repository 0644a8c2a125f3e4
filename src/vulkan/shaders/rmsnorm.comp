#version 450
// rmsnorm.comp — per row (workgroup i): out[i] = x[i] / sqrt(mean(x[i]²) +
// eps) · weight, rows of n values.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform P {
  uint64_t x;       // [m, n] f32
  uint64_t weight;  // [n] f32
  uint64_t out_;    // [m, n] f32
  uint n;
  float eps;
} p;

shared float red[256];

void main() {
  const uint64_t row = uint64_t(gl_WorkGroupID.x) * p.n * 4u;
  Floats x = Floats(p.x + row);
  float ss = 0.0;
  for (uint i = gl_LocalInvocationID.x; i < p.n; i += 256u) ss += x.v[i] * x.v[i];
  float total;
  WORKGROUP_SUM(red, ss, 256u, total);
  const float inv = 1.0 / sqrt(total / float(p.n) + p.eps);
  Floats w = Floats(p.weight);
  Floats o = Floats(p.out_ + row);
  for (uint i = gl_LocalInvocationID.x; i < p.n; i += 256u) o.v[i] = x.v[i] * inv * w.v[i];
}
