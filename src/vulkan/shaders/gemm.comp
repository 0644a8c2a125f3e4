#version 450
// gemm.comp — Y[i, r] (+)= Σ_c X[i, c] · W[r, c] (+ bias[r]) for m rows of
// activations X and one row segment of a weight matrix W in the type WTYPE_*
// (weights.glsl): the prefill's projections, one dispatch for a chunk of
// tokens. Types with welem (WELEM) run a tiled GEMM: a workgroup computes a
// 32 (tokens) × 64 (weight rows) tile, staging 32-column slices of X and of
// W (dequantized to f32) in shared memory, each thread a 4 × 4 block. Other
// types run the same 32 × 64 tiles with a thread per weight row looping over
// the tile's tokens through unit_dot (correct for any block type of
// weights.glsl, without the reuse).
#include "common.glsl"
#include "weights.glsl"

layout(push_constant) uniform P {
  uint64_t w;       // the segment's row 0
  uint64_t x;       // [m, ldx] f32
  uint64_t y;       // [m, ldy] f32, at the segment's first column
  uint64_t bias;    // [rows] f32, or 0
  uint rows;
  uint cols;
  uint row_bytes;   // bytes per row of W
  uint accumulate;  // 1: Y += X·Wᵀ
  uint m;
  uint ldx;         // floats between rows of X
  uint ldy;         // floats between rows of Y
} p;

void store(uint i, uint r, float v) {
  if (i >= p.m || r >= p.rows) return;
  if (p.bias != 0ul) v += Floats(p.bias).v[r];
  Floats y = Floats(p.y + (uint64_t(i) * p.ldy) * 4u);
  y.v[r] = p.accumulate != 0u ? y.v[r] + v : v;
}

#if defined(WELEM)
#define BM 32u
#define BN 64u
#define BK 32u
layout(local_size_x = 128) in;
shared float xs[BK * BM];
shared float ws[BK * BN];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r0 = gl_WorkGroupID.x * BN;
  const uint i0 = gl_WorkGroupID.y * BM;
  const uint tx = tid % 16u;  // weight rows r0 + 4 tx + [0, 4)
  const uint ty = tid / 16u;  // tokens i0 + 4 ty + [0, 4)
  float acc[16];
  for (uint k = 0; k < 16u; ++k) acc[k] = 0.0;
  Floats x = Floats(p.x);
  for (uint c0 = 0; c0 < p.cols; c0 += BK) {
    for (uint e = tid; e < BN * BK; e += 128u) {
      const uint n = e / BK, kk = e % BK;
      const uint r = r0 + n, c = c0 + kk;
      ws[kk * BN + n] = (r < p.rows && c < p.cols) ? welem(p.w, r, p.row_bytes, p.cols, c) : 0.0;
    }
    for (uint e = tid; e < BM * BK; e += 128u) {
      const uint i = e / BK, kk = e % BK;
      const uint c = c0 + kk;
      xs[kk * BM + i] = (i0 + i < p.m && c < p.cols) ? x.v[(i0 + i) * p.ldx + c] : 0.0;
    }
    barrier();
    for (uint kk = 0; kk < BK; ++kk) {
      const vec4 a = vec4(xs[kk * BM + 4u * ty], xs[kk * BM + 4u * ty + 1u],
                          xs[kk * BM + 4u * ty + 2u], xs[kk * BM + 4u * ty + 3u]);
      const vec4 b = vec4(ws[kk * BN + 4u * tx], ws[kk * BN + 4u * tx + 1u],
                          ws[kk * BN + 4u * tx + 2u], ws[kk * BN + 4u * tx + 3u]);
      for (uint j = 0; j < 4u; ++j) {
        acc[j * 4u + 0u] += a[j] * b.x;
        acc[j * 4u + 1u] += a[j] * b.y;
        acc[j * 4u + 2u] += a[j] * b.z;
        acc[j * 4u + 3u] += a[j] * b.w;
      }
    }
    barrier();
  }
  for (uint j = 0; j < 4u; ++j) {
    for (uint k = 0; k < 4u; ++k) store(i0 + 4u * ty + j, r0 + 4u * tx + k, acc[j * 4u + k]);
  }
}
#else
layout(local_size_x = 64) in;

void main() {
  const uint r = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x;
  if (r >= p.rows) return;
  const uint units = (p.cols + UNIT - 1u) / UNIT;
  for (uint i = gl_WorkGroupID.y * 32u; i < min(p.m, gl_WorkGroupID.y * 32u + 32u); ++i) {
    Floats x = Floats(p.x + uint64_t(i) * p.ldx * 4u);
    float acc = 0.0;
    for (uint u = 0; u < units; ++u) acc += unit_dot(p.w, r, p.row_bytes, p.cols, u, x);
    store(i, r, acc);
  }
}
#endif
