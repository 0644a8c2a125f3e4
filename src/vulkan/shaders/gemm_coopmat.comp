#version 450
// gemm_coopmat.comp — gemm.comp's product, Y[i, r] (+)= Σ_c X[i, c] · W[r, c]
// (+ bias[r]), on cooperative matrices (GL_NV_cooperative_matrix): f16
// inputs, f32 accumulation. Same push constants and results as gemm.comp
// (up to the inputs' rounding to f16; Note [Cooperative-matrix GEMM] in
// src/vulkan/coopmat_gemm.h), for every weight type of weights.glsl.
//
// CM_M × CM_N × CM_K (defines) is the shape of one multiply-add, one the
// device lists (D = A·B + C, A [CM_M, CM_K] f16, B [CM_K, CM_N] f16, C and D
// f32, subgroup scope). A workgroup of 128 invocations — four subgroups of
// 32 — computes a 64 (tokens) × 64 (weight rows) tile of Y: subgroup s the
// 32 × 32 quarter (s / 2, s % 2), as (32 / CM_M) × (32 / CM_N) accumulators.
// Each step over K stages a 64 × 32 slice of X (rounded to f16) and of W
// (dequantized as gemm.comp does: welem for types that have it, unit_values
// of quant.glsl for the block types, one 32-column unit per weight row) in
// shared memory, rows padded to 40 halves so that every cooperative load
// starts on, and strides by, a multiple of 16 bytes. The accumulators go
// through shared memory to the bounds-checked store (bias, accumulate).
// A: the X slice, row-major [64 tokens][40]; B = the W slice read
// column-major ([64 rows][40]: element (k, n) at n · 40 + k).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

#define BM 64u
#define BN 64u
#define BK 32u
#define LDS 40u  // halves per staged row (BK + 8: 80 bytes)
#define LDO 68u  // floats per row of the output staging (BN + 4: 272 bytes)

shared float16_t xs[BM * LDS];
shared float16_t ws[BN * LDS];
shared float os[BM * LDO];

// unit_values (quant.glsl) writes a block type's 32 values of one unit into
// row g_n of the W slice (columns relative to g_c0).
uint g_n = 0u;
uint g_c0 = 0u;
#define WSTORE(dst_, c_, v_) ws[g_n * LDS + ((c_) - g_c0)] = float16_t(v_)

#include "common.glsl"
#include "weights.glsl"

layout(local_size_x = 128) in;

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

#define TM (32u / CM_M)  // accumulator rows per subgroup
#define TN (32u / CM_N)  // accumulator columns per subgroup

void store(uint i, uint r, float v) {
  if (i >= p.m || r >= p.rows) return;
  if (p.bias != 0ul) v += Floats(p.bias).v[r];
  Floats y = Floats(p.y + (uint64_t(i) * p.ldy) * 4u);
  y.v[r] = p.accumulate != 0u ? y.v[r] + v : v;
}

// Stages W[r0 + n, c0 + k] for n < BN, k < BK in ws[n * LDS + k] (0 outside W).
void stage_w(uint tid, uint r0, uint c0, bool full) {
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
      const uint k0 = n * LDS + part * per;
#if defined(WTYPE_F32)
      const vec4 a = uintBitsToFloat(q);
      for (uint j = 0; j < 4u; ++j) ws[k0 + j] = float16_t(a[j]);
#else
      for (uint j = 0; j < 4u; ++j) {
#if defined(WTYPE_F16)
        const vec2 h = unpackHalf2x16(q[j]);
#else
        const vec2 h = uintBitsToFloat(uvec2(q[j] << 16, q[j] & 0xFFFF0000u));
#endif
        ws[k0 + 2u * j] = float16_t(h.x);
        ws[k0 + 2u * j + 1u] = float16_t(h.y);
      }
#endif
    }
    wdone = true;
  }
#endif
  if (!wdone) {
#if defined(WELEM)
    for (uint e = tid; e < BN * BK; e += 128u) {
      const uint n = e / BK, kk = e % BK;
      const uint r = r0 + n, c = c0 + kk;
      ws[n * LDS + kk] =
          float16_t((r < p.rows && c < p.cols) ? welem(p.w, r, p.row_bytes, p.cols, c) : 0.0);
    }
#else
    // Block types: cols % 32 == 0 and c0 % 32 == 0, so the slice is unit
    // c0 / 32 of each row.
    if (tid < BN) {
      g_n = tid;
      g_c0 = c0;
      const uint r = r0 + tid;
      if (r < p.rows) {
        unit_values(p.w, r, p.row_bytes, p.cols, c0 / UNIT, Floats(0ul));
      } else {
        for (uint kk = 0; kk < BK; ++kk) ws[tid * LDS + kk] = float16_t(0.0);
      }
    }
#endif
  }
}

// Stages X[i0 + i, c0 + k] for i < BM, k < BK in xs[i * LDS + k] (0 outside X).
void stage_x(uint tid, uint i0, uint c0, bool full) {
  if (p.xvec != 0u && full) {
    for (uint e = tid; e < BM * (BK / 4u); e += 128u) {
      const uint i = e / (BK / 4u), part = e % (BK / 4u);
      vec4 a = vec4(0.0);
      if (i0 + i < p.m) a = F4(p.x + uint64_t(i0 + i) * p.ldx * 4u).v[c0 / 4u + part];
      for (uint j = 0; j < 4u; ++j) xs[i * LDS + part * 4u + j] = float16_t(a[j]);
    }
  } else {
    Floats x = Floats(p.x);
    for (uint e = tid; e < BM * BK; e += 128u) {
      const uint i = e / BK, kk = e % BK;
      const uint c = c0 + kk;
      xs[i * LDS + kk] =
          float16_t((i0 + i < p.m && c < p.cols) ? x.v[(i0 + i) * p.ldx + c] : 0.0);
    }
  }
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r0 = gl_WorkGroupID.x * BN;
  const uint i0 = gl_WorkGroupID.y * BM;
  const uint sg = gl_SubgroupID;
  const uint wi = (sg / 2u) * 32u;  // the subgroup's first token row in the tile
  const uint wr = (sg % 2u) * 32u;  // its first weight row in the tile
  fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N> acc[TM * TN];
  [[unroll]] for (uint t = 0; t < TM * TN; ++t) {
    acc[t] = fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N>(0.0);
  }
  for (uint c0 = 0; c0 < p.cols; c0 += BK) {
    const bool full = c0 + BK <= p.cols;
    stage_w(tid, r0, c0, full);
    stage_x(tid, i0, c0, full);
    barrier();
    [[unroll]] for (uint k = 0; k < BK; k += CM_K) {
      fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_K> a[TM];
      [[unroll]] for (uint tm = 0; tm < TM; ++tm) {
        coopMatLoadNV(a[tm], xs, (wi + tm * CM_M) * LDS + k, LDS, false);
      }
      [[unroll]] for (uint tn = 0; tn < TN; ++tn) {
        fcoopmatNV<16, gl_ScopeSubgroup, CM_K, CM_N> b;
        coopMatLoadNV(b, ws, (wr + tn * CM_N) * LDS + k, LDS, true);
        [[unroll]] for (uint tm = 0; tm < TM; ++tm) {
          acc[tm * TN + tn] = coopMatMulAddNV(a[tm], b, acc[tm * TN + tn]);
        }
      }
    }
    barrier();
  }
  [[unroll]] for (uint tm = 0; tm < TM; ++tm) {
    [[unroll]] for (uint tn = 0; tn < TN; ++tn) {
      coopMatStoreNV(acc[tm * TN + tn], os, (wi + tm * CM_M) * LDO + wr + tn * CM_N, LDO, false);
    }
  }
  barrier();
  for (uint e = tid; e < BM * BN; e += 128u) {
    const uint i = e / BN, n = e % BN;
    store(i0 + i, r0 + n, os[i * LDO + n]);
  }
}
