#version 450
// gemm.comp — Y[i, r] (+)= Σ_c X[i, c] · W[r, c] (+ bias[r]) for m rows of
// activations X and one row segment of a weight matrix W in the type WTYPE_*
// (weights.glsl): the prefill's projections, one dispatch for a chunk of
// tokens. Types with welem (WELEM) run a tiled GEMM: a workgroup computes a
// 32 (tokens) × 64 (weight rows) tile, staging 32-column slices of X and of
// W (dequantized to f32) in shared memory, each thread a 4 × 4 block. Other
// types run the same 32 × 64 tiles with a thread per weight row looping over
// the tile's tokens through unit_dot (correct for any block type of
// weights.glsl, without the reuse). Full 32-column slices of aligned
// f32/f16/bf16 rows and of aligned X load 16 bytes at a time.
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
  uint wvec;        // 1: w and row_bytes are 16-byte aligned (f32/f16/bf16: 16-byte loads)
  uint xvec;        // 1: x and ldx · 4 are 16-byte aligned
} p;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer U4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer F4 { vec4 v[]; };

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
    const bool full = c0 + BK <= p.cols;
    bool wdone = false;
#if defined(WTYPE_F32) || defined(WTYPE_F16) || defined(WTYPE_BF16)
    if (p.wvec != 0u && full) {
#if defined(WTYPE_F32)
      const uint per = 4u;
#else
      const uint per = 8u;
#endif
      const uint parts = BK / per;  // 16-byte loads per row of the slice
      for (uint e = tid; e < BN * parts; e += 128u) {
        const uint n = e / parts, part = e % parts;
        const uint r = r0 + n;
        uvec4 q = uvec4(0u);
        if (r < p.rows) q = U4(p.w + uint64_t(r) * p.row_bytes).v[c0 / per + part];
        const uint k0 = part * per;
#if defined(WTYPE_F32)
        const vec4 a = uintBitsToFloat(q);
        for (uint j = 0; j < 4u; ++j) ws[(k0 + j) * BN + n] = a[j];
#else
        for (uint j = 0; j < 4u; ++j) {
#if defined(WTYPE_F16)
          const vec2 h = unpackHalf2x16(q[j]);
#else
          const vec2 h = uintBitsToFloat(uvec2(q[j] << 16, q[j] & 0xFFFF0000u));
#endif
          ws[(k0 + 2u * j) * BN + n] = h.x;
          ws[(k0 + 2u * j + 1u) * BN + n] = h.y;
        }
#endif
      }
      wdone = true;
    }
#endif
    if (!wdone) {
      for (uint e = tid; e < BN * BK; e += 128u) {
        const uint n = e / BK, kk = e % BK;
        const uint r = r0 + n, c = c0 + kk;
        ws[kk * BN + n] = (r < p.rows && c < p.cols) ? welem(p.w, r, p.row_bytes, p.cols, c) : 0.0;
      }
    }
    if (p.xvec != 0u && full) {
      for (uint e = tid; e < BM * (BK / 4u); e += 128u) {
        const uint i = e / (BK / 4u), part = e % (BK / 4u);
        vec4 a = vec4(0.0);
        if (i0 + i < p.m) a = F4(p.x + uint64_t(i0 + i) * p.ldx * 4u).v[c0 / 4u + part];
        for (uint j = 0; j < 4u; ++j) xs[(part * 4u + j) * BM + i] = a[j];
      }
    } else {
      for (uint e = tid; e < BM * BK; e += 128u) {
        const uint i = e / BK, kk = e % BK;
        const uint c = c0 + kk;
        xs[kk * BM + i] = (i0 + i < p.m && c < p.cols) ? x.v[(i0 + i) * p.ldx + c] : 0.0;
      }
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
