#version 450
// rmsnorm.comp — out = x / sqrt(mean(x²) + eps) · weight, over n values.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform P {
  uint64_t x;
  uint64_t weight;
  uint64_t out_;
  uint n;
  float eps;
} p;

shared float red[256];

void main() {
  Floats x = Floats(p.x);
  float ss = 0.0;
  for (uint i = gl_LocalInvocationID.x; i < p.n; i += 256u) ss += x.v[i] * x.v[i];
  float total;
  WORKGROUP_SUM(red, ss, 256u, total);
  const float inv = 1.0 / sqrt(total / float(p.n) + p.eps);
  Floats w = Floats(p.weight);
  Floats o = Floats(p.out_);
  for (uint i = gl_LocalInvocationID.x; i < p.n; i += 256u) o.v[i] = x.v[i] * inv * w.v[i];
}
