#version 450
// embed.comp — out[0, cols) = row `step.token` of the embedding table (type
// WTYPE_*, weights.glsl), as f32.
#include "common.glsl"
#include "weights.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform P {
  uint64_t w;      // the table's row 0
  uint64_t out_;   // [cols] f32
  uint64_t step;   // Step: the token
  uint rows;
  uint cols;
  uint row_bytes;
} p;

void main() {
  const int token = Step(p.step).token;
  if (token < 0 || uint(token) >= p.rows) return;
  const uint units = (p.cols + UNIT - 1u) / UNIT;
  for (uint u = gl_LocalInvocationID.x; u < units; u += 64u) {
    unit_values(p.w, uint(token), p.row_bytes, p.cols, u, Floats(p.out_));
  }
}
