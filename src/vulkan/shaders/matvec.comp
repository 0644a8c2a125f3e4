#version 450
// matvec.comp — y[r] (+)= Σ_c W[r, c] · x[c] (+ bias[r]) for one row segment
// of a weight matrix in the type WTYPE_* (weights.glsl). One workgroup per
// row; rows beyond 65535 use the y dimension of the dispatch (row =
// y · kRowsPerY + x).
#include "common.glsl"
#include "weights.glsl"

layout(local_size_x = 128) in;
layout(push_constant) uniform P {
  uint64_t w;      // the segment's row 0
  uint64_t x;      // [cols] f32
  uint64_t y;      // [rows] f32
  uint64_t bias;   // [rows] f32, or 0
  uint rows;
  uint cols;
  uint row_bytes;  // bytes per row (block types)
  uint accumulate; // 1: y += W·x
} p;

shared float red[128];

void main() {
  const uint row = gl_WorkGroupID.y * 32768u + gl_WorkGroupID.x;
  if (row >= p.rows) return;
  const uint units = (p.cols + UNIT - 1u) / UNIT;
  float acc = 0.0;
  Floats x = Floats(p.x);
  for (uint u = gl_LocalInvocationID.x; u < units; u += 128u) {
    acc += unit_dot(p.w, row, p.row_bytes, p.cols, u, x);
  }
  float sum;
  WORKGROUP_SUM(red, acc, 128u, sum);
  if (gl_LocalInvocationID.x == 0u) {
    if (p.bias != 0ul) sum += Floats(p.bias).v[row];
    Floats y = Floats(p.y);
    y.v[row] = p.accumulate != 0u ? y.v[row] + sum : sum;
  }
}
