// weights.glsl — reading one weight type, chosen by the WTYPE_* define
// (ggml layouts, quant.h): a row is split into units of UNIT elements, and
// unit_dot(w, row, row_bytes, cols, u, x) is Σ over unit u of row `row` of
// w·x; unit_values writes the unit's values (embedding lookup). Types with
// single-element access also define WELEM and welem(w, row, row_bytes, cols,
// c), the value at column c of row `row` (the tiled GEMM's loads).
// REQUIRES: w 4-byte aligned; for block types cols % UNIT == 0.

#if defined(WTYPE_F32)
#define UNIT 4u
float wval(uint64_t w, uint64_t e) { return Floats(w).v[uint(e)]; }
#elif defined(WTYPE_F16)
#define UNIT 8u
float wval(uint64_t w, uint64_t e) { return half_at(w, e * 2u); }
#elif defined(WTYPE_BF16)
#define UNIT 8u
float wval(uint64_t w, uint64_t e) { return uintBitsToFloat(u16_at(w, e * 2u) << 16); }
#elif defined(WTYPE_Q8_0)
#define UNIT 32u
#define BLOCK_BYTES 34u
#else
#define UNIT 32u
#endif

#if defined(WTYPE_F32) || defined(WTYPE_F16) || defined(WTYPE_BF16)
#define WELEM 1
float welem(uint64_t w, uint row, uint row_bytes, uint cols, uint c) {
  return wval(w, uint64_t(row) * cols + c);
}
// Plain types: element e = row · cols + col of the tensor.
float unit_dot(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats x) {
  float acc = 0.0;
  const uint c0 = u * UNIT;
  const uint64_t e0 = uint64_t(row) * cols;
  for (uint i = 0; i < UNIT; ++i) {
    const uint c = c0 + i;
    if (c < cols) acc += wval(w, e0 + c) * x.v[c];
  }
  return acc;
}
void unit_values(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats dst) {
  const uint c0 = u * UNIT;
  const uint64_t e0 = uint64_t(row) * cols;
  for (uint i = 0; i < UNIT; ++i) {
    const uint c = c0 + i;
    if (c < cols) dst.v[c] = wval(w, e0 + c);
  }
}
#elif defined(WTYPE_Q8_0)
#define WELEM 1
float welem(uint64_t w, uint row, uint row_bytes, uint cols, uint c) {
  const uint64_t b = uint64_t(row) * row_bytes + uint64_t(c >> 5) * BLOCK_BYTES;
  return half_at(w, b) * float(i8_of(byte_at(w, b + 2u + (c & 31u))));
}
// block: f16 d, int8 qs[32]; value = d · q.
float unit_dot(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats x) {
  const uint64_t b = uint64_t(row) * row_bytes + uint64_t(u) * BLOCK_BYTES;
  const float d = half_at(w, b);
  float acc = 0.0;
  for (uint i = 0; i < 32u; ++i) acc += float(i8_of(byte_at(w, b + 2u + i))) * x.v[u * 32u + i];
  return d * acc;
}
void unit_values(uint64_t w, uint row, uint row_bytes, uint cols, uint u, Floats dst) {
  const uint64_t b = uint64_t(row) * row_bytes + uint64_t(u) * BLOCK_BYTES;
  const float d = half_at(w, b);
  for (uint i = 0; i < 32u; ++i) dst.v[u * 32u + i] = d * float(i8_of(byte_at(w, b + 2u + i)));
}
#else
#include "quant.glsl"
#endif
