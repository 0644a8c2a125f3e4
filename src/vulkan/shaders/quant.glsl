// quant.glsl — the ggml block types weights.glsl does not read itself:
// Q4_0, Q4_1, Q5_0, Q5_1 (blocks of 32) and the K-quants Q4_K, Q5_K, Q6_K
// (super-blocks of 256), in the layouts of engine/internal/quant_internal.h
// (ggml's). One unit is 32 elements: a whole block, or for the K-quants one
// 32-element sub-block of a super-block (unit u is sub-block u % 8 of
// super-block u / 8).
//
// unit_dot(w, row, row_bytes, cols, u, x) = Σ_{i<32} W[row, 32u + i] · x[32u + i];
// it factors the block's scale (and min) out of the sum, so it differs from
// the sum of dequantized products only by float rounding.
// unit_values writes the dequantized values, computed as
// DequantizeRowReference does (same operations in the same order, `precise`
// so the compiler does not fuse them), through WSTORE(dst, c, v): by
// default dst.v[c] = v; a shader that stages values elsewhere (the
// cooperative-matrix GEMM's shared-memory tiles) defines WSTORE before
// including weights.glsl.
//
// Bytes are read as 32-bit words (u32_at): rows and blocks start at any even
// byte (Q4_0's blocks are 18 bytes, Q6_K's 210).

#define UNIT 32u
#if !defined(WSTORE)
#define WSTORE(dst_, c_, v_) dst_.v[c_] = (v_)
#endif

// The 32-bit little-endian value at byte `off` (any alignment): one or two
// word loads, never past the word holding byte off + 3.
uint u32_at(uint64_t base, uint64_t off) {
  const uint i = uint(off >> 2);
  const uint s = 8u * uint(off & 3u);
  const uint lo = Uints(base).v[i];
  return s == 0u ? lo : (lo >> s) | (Uints(base).v[i + 1u] << (32u - s));
}

#if defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
// Blocks of 32: f16 d (and f16 m for _1), for Q5 a u32 of fifth bits (bit j
// = element j), then qs[16]: element j is the low nibble of qs[j], element
// j + 16 the high nibble. Q4_0 x = d·(q − 8), Q5_0 x = d·(q − 16),
// Q4_1 / Q5_1 x = d·q + m.
#if defined(WTYPE_Q4_0)
#define BLOCK_BYTES 18u
#define QS_AT 2u
#elif defined(WTYPE_Q4_1)
#define BLOCK_BYTES 20u
#define QS_AT 4u
#elif defined(WTYPE_Q5_0)
#define BLOCK_BYTES 22u
#define QH_AT 2u
#define QS_AT 6u
#else
#define BLOCK_BYTES 24u
#define QH_AT 4u
#define QS_AT 8u
#endif
#if defined(WTYPE_Q4_0) || defined(WTYPE_Q5_0)
#define SYMMETRIC 1
#endif
#if defined(WTYPE_Q4_0)
#define QOFFSET 8
#elif defined(WTYPE_Q5_0)
#define QOFFSET 16
#else
#define QOFFSET 0
#endif

// The unsigned quants of elements 4k + i (lo) and 4k + 16 + i (hi), i < 4,
// from qs word k and the fifth bits `qh`.
void block_quants(uint qs, uint qh, uint k, uint i, out int lo, out int hi) {
  const uint b = (qs >> (8u * i)) & 0xFFu;
  lo = int(b & 0xFu);
  hi = int(b >> 4);
#if defined(QH_AT)
  lo |= int(((qh >> (4u * k + i)) & 1u) << 4);
  hi |= int(((qh >> (4u * k + i + 16u)) & 1u) << 4);
#endif
}

float unit_dot(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats x) {
  const uint64_t b = uint64_t(row) * row_bytes + uint64_t(u) * BLOCK_BYTES;
  const float d = half_at(w, b);
#if defined(QH_AT)
  const uint qh = u32_at(w, b + QH_AT);
#else
  const uint qh = 0u;
#endif
  const uint x0 = u * 32u;
  float qx = 0.0;
#if !defined(SYMMETRIC)
  float sx = 0.0;
#endif
  for (uint k = 0; k < 4u; ++k) {
    const uint qs = u32_at(w, b + QS_AT + 4u * k);
    for (uint i = 0; i < 4u; ++i) {
      int lo, hi;
      block_quants(qs, qh, k, i, lo, hi);
      const float xl = x.v[x0 + 4u * k + i], xh = x.v[x0 + 16u + 4u * k + i];
      qx += float(lo - QOFFSET) * xl + float(hi - QOFFSET) * xh;
#if !defined(SYMMETRIC)
      sx += xl + xh;
#endif
    }
  }
#if defined(SYMMETRIC)
  return d * qx;
#else
  return d * qx + half_at(w, b + 2u) * sx;
#endif
}

void unit_values(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats dst) {
  const uint64_t b = uint64_t(row) * row_bytes + uint64_t(u) * BLOCK_BYTES;
  const float d = half_at(w, b);
#if defined(QH_AT)
  const uint qh = u32_at(w, b + QH_AT);
#else
  const uint qh = 0u;
#endif
#if !defined(SYMMETRIC)
  const float m = half_at(w, b + 2u);
#endif
  const uint x0 = u * 32u;
  for (uint k = 0; k < 4u; ++k) {
    const uint qs = u32_at(w, b + QS_AT + 4u * k);
    for (uint i = 0; i < 4u; ++i) {
      int lo, hi;
      block_quants(qs, qh, k, i, lo, hi);
#if defined(SYMMETRIC)
      precise float vl = float(lo - QOFFSET) * d;
      precise float vh = float(hi - QOFFSET) * d;
#else
      precise float vl = float(lo) * d + m;
      precise float vh = float(hi) * d + m;
#endif
      WSTORE(dst, x0 + 4u * k + i, vl);
      WSTORE(dst, x0 + 16u + 4u * k + i, vh);
    }
  }
}

#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
// Super-blocks of 256: f16 d, f16 dmin, scales[12] (eight 6-bit scales sc
// and mins m, packed as get_scale_min_k4 reads them), Q5_K's qh[32], then
// qs[128]. Sub-block j (elements 32j + l) is nibble j & 1 of qs[32·(j/2) + l]
// (Q5_K: fifth bit = bit j of qh[l]); x = d·sc_j·q − dmin·m_j.
#if defined(WTYPE_Q4_K)
#define BLOCK_BYTES 144u
#define QS_AT 16u
#else
#define BLOCK_BYTES 176u
#define QH_AT 16u
#define QS_AT 48u
#endif

// Sub-block j's 6-bit scale and min from the 12 bytes at `s`.
void scale_min_k4(uint64_t w, uint64_t s, uint j, out uint sc, out uint m) {
  if (j < 4u) {
    sc = byte_at(w, s + j) & 63u;
    m = byte_at(w, s + j + 4u) & 63u;
  } else {
    const uint b = byte_at(w, s + j + 4u);
    sc = (b & 0xFu) | ((byte_at(w, s + j - 4u) >> 6) << 4);
    m = (b >> 4) | ((byte_at(w, s + j) >> 6) << 4);
  }
}

// The unsigned quant of element 4k + i of sub-block j from qs word k (and
// qh word k).
uint k4_quant(uint qs, uint qh, uint j, uint i) {
  uint q = (qs >> (8u * i + 4u * (j & 1u))) & 0xFu;
#if defined(QH_AT)
  q |= ((qh >> (8u * i + j)) & 1u) << 4;
#endif
  return q;
}

float unit_dot(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats x) {
  const uint j = u & 7u;
  const uint64_t b = uint64_t(row) * row_bytes + uint64_t(u >> 3) * BLOCK_BYTES;
  uint sc, m;
  scale_min_k4(w, b + 4u, j, sc, m);
  const float d = half_at(w, b) * float(sc), dm = half_at(w, b + 2u) * float(m);
  const uint64_t q = b + QS_AT + 32u * (j >> 1);
  const uint x0 = u * 32u;
  float qx = 0.0, sx = 0.0;
  for (uint k = 0; k < 8u; ++k) {
    const uint qs = u32_at(w, q + 4u * k);
#if defined(QH_AT)
    const uint qh = u32_at(w, b + QH_AT + 4u * k);
#else
    const uint qh = 0u;
#endif
    for (uint i = 0; i < 4u; ++i) {
      const float xv = x.v[x0 + 4u * k + i];
      qx += float(k4_quant(qs, qh, j, i)) * xv;
      sx += xv;
    }
  }
  return d * qx - dm * sx;
}

void unit_values(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats dst) {
  const uint j = u & 7u;
  const uint64_t b = uint64_t(row) * row_bytes + uint64_t(u >> 3) * BLOCK_BYTES;
  uint sc, m;
  scale_min_k4(w, b + 4u, j, sc, m);
  precise float d = half_at(w, b) * float(sc);
  precise float dm = half_at(w, b + 2u) * float(m);
  const uint64_t q = b + QS_AT + 32u * (j >> 1);
  const uint x0 = u * 32u;
  for (uint k = 0; k < 8u; ++k) {
    const uint qs = u32_at(w, q + 4u * k);
#if defined(QH_AT)
    const uint qh = u32_at(w, b + QH_AT + 4u * k);
#else
    const uint qh = 0u;
#endif
    for (uint i = 0; i < 4u; ++i) {
      precise float v = d * float(k4_quant(qs, qh, j, i)) - dm;
      WSTORE(dst, x0 + 4u * k + i, v);
    }
  }
}

#elif defined(WTYPE_Q6_K)
// Super-blocks of 256 (210 bytes): ql[128], qh[64], int8 scales[16], f16 d.
// Half h = j / 4 of sub-block j (elements 128h + 32k + l, k = j % 4, l < 32):
// the low 4 bits are nibble k / 2 of ql[64h + 32·(k & 1) + l], the high 2
// bits are bits 2k, 2k + 1 of qh[32h + l]; x = d·sc·(q − 32) with
// sc = scales[8h + 2k + l / 16].
#define BLOCK_BYTES 210u

float unit_dot(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats x) {
  const uint j = u & 7u, h = j >> 2, k = j & 3u;
  const uint64_t b = uint64_t(row) * row_bytes + uint64_t(u >> 3) * BLOCK_BYTES;
  const uint64_t ql = b + 64u * h + 32u * (k & 1u), qh = b + 128u + 32u * h;
  const uint nshift = 4u * (k >> 1), hshift = 2u * k;
  const uint x0 = u * 32u;
  float acc[2] = float[2](0.0, 0.0);
  for (uint c = 0; c < 8u; ++c) {
    const uint lw = u32_at(w, ql + 4u * c), hw = u32_at(w, qh + 4u * c);
    for (uint i = 0; i < 4u; ++i) {
      const int q = int(((lw >> (8u * i + nshift)) & 0xFu) |
                        (((hw >> (8u * i + hshift)) & 3u) << 4)) - 32;
      acc[c >> 2] += float(q) * x.v[x0 + 4u * c + i];
    }
  }
  const uint64_t s = b + 192u + 8u * h + 2u * k;
  const float d = half_at(w, b + 208u);
  return d * (float(i8_of(byte_at(w, s))) * acc[0] + float(i8_of(byte_at(w, s + 1u))) * acc[1]);
}

void unit_values(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats dst) {
  const uint j = u & 7u, h = j >> 2, k = j & 3u;
  const uint64_t b = uint64_t(row) * row_bytes + uint64_t(u >> 3) * BLOCK_BYTES;
  const uint64_t ql = b + 64u * h + 32u * (k & 1u), qh = b + 128u + 32u * h;
  const uint nshift = 4u * (k >> 1), hshift = 2u * k;
  const uint64_t s = b + 192u + 8u * h + 2u * k;
  const float d = half_at(w, b + 208u);
  precise float ds[2] = float[2](d * float(i8_of(byte_at(w, s))),
                                 d * float(i8_of(byte_at(w, s + 1u))));
  const uint x0 = u * 32u;
  for (uint c = 0; c < 8u; ++c) {
    const uint lw = u32_at(w, ql + 4u * c), hw = u32_at(w, qh + 4u * c);
    for (uint i = 0; i < 4u; ++i) {
      const int q = int(((lw >> (8u * i + nshift)) & 0xFu) |
                        (((hw >> (8u * i + hshift)) & 3u) << 4)) - 32;
      precise float v = ds[c >> 2] * float(q);
      WSTORE(dst, x0 + 4u * c + i, v);
    }
  }
}

#else
#error "quant.glsl: no WTYPE_* defined, or one it does not read"
#endif
