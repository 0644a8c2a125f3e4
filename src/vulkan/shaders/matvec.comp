#version 450
// matvec.comp — y[r] (+)= Σ_c W[r, c] · x[c] (+ bias[r]) for one row segment
// of a weight matrix in the type WTYPE_* (weights.glsl): decode's
// projections, bound by reading W once. A workgroup of 128 threads computes
// NR rows: every thread strides over the columns keeping NR partial sums, so
// each x value it loads serves NR rows; the sums are reduced within each
// subgroup (subgroupAdd: its size is the device's — 32 on NVIDIA, 8 on
// lavapipe — never assumed) and then across subgroups in shared memory.
// f32/f16/bf16 rows read 16 bytes per load when the host says the rows and
// x are 16-byte aligned (vec4 = 1); otherwise, and for block types, units
// through unit_dot. Workgroup (x, y) computes rows (y · 32768 + x) · NR + [0,
// NR).
// Fusions (vec4 rows only): mode 1 reads x as the RMSNorm of the residual x
// with weight `norm` (each workgroup sums x² itself: x is one row, cheap
// next to its weight rows), mode 2 reads x as silu(gate) · up of the FFN's
// [gate | up] row at x (cols each) — each saves a dispatch and a barrier.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "weights.glsl"

#define WG 128u
#define NR 4u
layout(local_size_x = 128) in;
layout(push_constant) uniform P {
  uint64_t w;      // the segment's row 0
  uint64_t x;      // [cols] f32
  uint64_t y;      // [rows] f32
  uint64_t bias;   // [rows] f32, or 0
  uint64_t norm;   // mode 1: [cols] f32 RMSNorm weight
  uint rows;
  uint cols;
  uint row_bytes;  // bytes per row
  uint accumulate; // 1: y += W·x
  uint vec4_;      // 1: w, row_bytes and x are 16-byte aligned (plain types)
  uint mode;       // 0: x; 1: rmsnorm(x) · norm; 2: silu(x[0, cols)) · x[cols, 2 cols)
  float eps;       // mode 1
} p;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer U4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer F4 { vec4 v[]; };

shared float red[(NR + 1u) * WG];

// x's 4 values at vec4 index j under the mode (mode 1 without the 1/rms).
vec4 xload(uint j) {
  const vec4 v = F4(p.x).v[j];
  if (p.mode == 1u) return v * F4(p.norm).v[j];
  if (p.mode == 2u) return v / (1.0 + exp(-v)) * F4(p.x + uint64_t(p.cols) * 4u).v[j];
  return v;
}

void main() {
  const uint row0 = (gl_WorkGroupID.y * 32768u + gl_WorkGroupID.x) * NR;
  if (row0 >= p.rows) return;
  const uint tid = gl_LocalInvocationID.x;
  const uint nr = min(NR, p.rows - row0);
  float acc[NR];
  for (uint r = 0; r < NR; ++r) acc[r] = 0.0;
  bool done = false;
#if defined(WTYPE_F16) || defined(WTYPE_BF16) || defined(WTYPE_F32)
  if (p.vec4_ != 0u) {
#if defined(WTYPE_F32)
    const uint per = 4u;  // elements per 16-byte load
#else
    const uint per = 8u;
#endif
    const uint loads = p.cols / per;  // per row
    for (uint i = tid; i < loads; i += WG) {
#if defined(WTYPE_F32)
      const vec4 xa = xload(i);
#else
      const vec4 xa = xload(2u * i), xb = xload(2u * i + 1u);
#endif
      for (uint r = 0; r < NR; ++r) {
        if (r >= nr) break;
        const uvec4 q = U4(p.w + uint64_t(row0 + r) * p.row_bytes).v[i];
#if defined(WTYPE_F32)
        acc[r] += dot(uintBitsToFloat(q), xa);
#elif defined(WTYPE_F16)
        acc[r] += dot(vec4(unpackHalf2x16(q.x), unpackHalf2x16(q.y)), xa) +
                  dot(vec4(unpackHalf2x16(q.z), unpackHalf2x16(q.w)), xb);
#else
        const vec4 a = uintBitsToFloat(uvec4(q.x << 16, q.x & 0xFFFF0000u, q.y << 16,
                                             q.y & 0xFFFF0000u));
        const vec4 b = uintBitsToFloat(uvec4(q.z << 16, q.z & 0xFFFF0000u, q.w << 16,
                                             q.w & 0xFFFF0000u));
        acc[r] += dot(a, xa) + dot(b, xb);
#endif
      }
    }
    done = true;
  }
#endif
  if (!done) {
    const uint units = (p.cols + UNIT - 1u) / UNIT;
    Floats x = Floats(p.x);
    for (uint u = tid; u < units; u += WG) {
      for (uint r = 0; r < NR; ++r) {
        if (r < nr) acc[r] += unit_dot(p.w, row0 + r, p.row_bytes, p.cols, u, x);
      }
    }
  }
  // Mode 1's Σ x² rides along as reduction NR.
  float ss = 0.0;
  if (p.mode == 1u) {
    for (uint j = tid; j < p.cols / 4u; j += WG) {
      const vec4 v = F4(p.x).v[j];
      ss += dot(v, v);
    }
    ss = subgroupAdd(ss);
  }
  for (uint r = 0; r < NR; ++r) acc[r] = subgroupAdd(acc[r]);
  if (subgroupElect()) {
    for (uint r = 0; r < NR; ++r) red[r * WG + gl_SubgroupID] = acc[r];
    red[NR * WG + gl_SubgroupID] = ss;
  }
  barrier();
  if (tid < nr) {
    float sum = 0.0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) sum += red[tid * WG + s];
    if (p.mode == 1u) {
      float total = 0.0;
      for (uint s = 0; s < gl_NumSubgroups; ++s) total += red[NR * WG + s];
      sum *= 1.0 / sqrt(total / float(p.cols) + p.eps);
    }
    const uint row = row0 + tid;
    if (p.bias != 0ul) sum += Floats(p.bias).v[row];
    Floats y = Floats(p.y);
    y.v[row] = p.accumulate != 0u ? y.v[row] + sum : sum;
  }
}
