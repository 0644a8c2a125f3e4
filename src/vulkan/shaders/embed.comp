#version 450
// embed.comp — row i of out [m, cols] = row tokens[i] of the embedding table
// (type WTYPE_*, weights.glsl), as f32; workgroup (0, i). A token outside
// [0, rows) leaves its row as it was.
#include "common.glsl"
#include "weights.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform P {
  uint64_t w;       // the table's row 0
  uint64_t out_;    // [m, cols] f32
  uint64_t tokens;  // [m] int
  uint rows;
  uint cols;
  uint row_bytes;
} p;

void main() {
  const uint i = gl_WorkGroupID.y;
  const int token = Ints(p.tokens).v[i];
  if (token < 0 || uint(token) >= p.rows) return;
  const uint units = (p.cols + UNIT - 1u) / UNIT;
  Floats dst = Floats(p.out_ + uint64_t(i) * p.cols * 4u);
  for (uint u = gl_LocalInvocationID.x; u < units; u += 64u) {
    unit_values(p.w, uint(token), p.row_bytes, p.cols, u, dst);
  }
}
