// engine/internal/quant_gemm.h — prefill's integer matrix product on weights
// in the type they are stored in: Y [nt, rows] = X [nt, n] · Wᵀ, W [rows, n]
// of a quantized type (quant.h's layout), X's nt rows quantized once into the
// weight type's activation type (ActivationType: Q8_0, Q8_1 or Q8_K).
//
// Usage (one projection of a chunk; forward.cc Decoder::Project):
//   buf: GemmActivationBytes(type, n, nt) bytes
//   PrepareGemmActivations(type, x, n, 0, nt, nt, buf);    // any split of [0, nt)
//   GemmRows(type, w, n, buf, nt, r0, r1, y, ldy, false);  // any split of rows
// Both steps may be split across threads (disjoint token ranges, then
// disjoint row ranges); every token must be prepared before any GemmRows.
//
// Each output is Σ over blocks of d_w·d_x·Σ q_w·q_x in integers — the same
// sums DotRows computes for decode (Note [Activation quantization] in
// quant.cc), so prefill and decode round x the same way; the paths differ
// only in the order and grouping of the float operations. The AVX2 path computes tiles of rows ×
// tokens (quant_gemm_avx2.cc: each unpacked weight block is used for several
// tokens); the scalar path and the types without an AVX2 tile kernel run
// DotRows token by token over small groups of rows.
//
// Thread safety: pure functions over their arguments; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "arbiter/formats/ggml_type.h"

namespace arbiter::engine_internal {

// Whether the active kernel path has a tiled integer kernel for `type`
// (else GemmRows still works, through DotRows per token).
bool HasGemmTileKernel(GgmlType type);

// Bytes of nt prepared activation rows of n elements for weights of `type`:
// nt rows of ActivationType(type) (GgmlRowBytes(ActivationType(type), n)
// each, back to back), then (32-byte aligned) per block b and token t:
//   Q8_0/Q8_1: f32 d_x [nt, nb], then f32 sums [nt, nb] (Q8_0: d_x·Σq_x;
//              Q8_1: its s), nb = n / 32 (a tile loads 8 blocks' scales of
//              a token at once);
//   Q8_K:      f32 d_x [nb, nt], then i16 sums of 32 [nt, nb, 8] (bsums
//              added in pairs), nb = n / 256 (a tile loads its tokens'
//              scales of a super-block at once).
// At most nt × (n × 11 / 8 + 64) bytes.
// REQUIRES: ActivationType(type) is Q8_0, Q8_1 or Q8_K; n a multiple of
// its block size.
size_t GemmActivationBytes(GgmlType type, int64_t n, int nt);

// Prepares tokens [t0, t1) of x [nt, n] (row-major f32) into `out`, laid out
// as GemmActivationBytes says for all nt tokens; the quantized rows are
// exactly PrepareActivation(type, x_t, n, …)'s bytes.
// REQUIRES: 0 ≤ t0 ≤ t1 ≤ nt; `out` holds GemmActivationBytes(type, n, nt).
void PrepareGemmActivations(GgmlType type, const float* x, int64_t n, int t0, int t1, int nt,
                            void* out);

// y[t·ldy + (r − r0)] = dot(row r of W, x_t) (or += when `accumulate`) for
// t < nt, r in [r0, r1). W as DotRows takes it (rows of n elements of `type`,
// stride GgmlRowBytes(type, n)); xa as PrepareGemmActivations wrote it for
// all nt tokens. A call should cover a few dozen rows or more: the weights
// of its rows are reused from cache for every group of tokens.
// REQUIRES: ActivationType(type) is Q8_0, Q8_1 or Q8_K; y does not overlap
// W or xa; ldy ≥ r1 − r0.
void GemmRows(GgmlType type, const void* w, int64_t n, const void* xa, int nt, int64_t r0,
              int64_t r1, float* y, int64_t ldy, bool accumulate);

}  // namespace arbiter::engine_internal
