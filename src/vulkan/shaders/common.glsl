// common.glsl — what every arbiter compute shader shares: buffer references
// (Note [Buffer device addresses] in arbiter/vulkan/vulkan_device.h) and
// workgroup reductions.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Uints { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Ints { int v[]; };

// The per-submission values the host writes before each submission (one
// slot's step buffer): the position of the first token; the token ids
// follow at byte 16 (Ints, one per row of the pass).
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Step {
  uint pos;
};

// Byte `off` of the memory at `base` (base 4-byte aligned).
uint byte_at(uint64_t base, uint64_t off) {
  return (Uints(base).v[uint(off >> 2)] >> (8u * uint(off & 3u))) & 0xFFu;
}
// The 16-bit little-endian value at byte `off` (off even).
uint u16_at(uint64_t base, uint64_t off) {
  return (Uints(base).v[uint(off >> 2)] >> (8u * uint(off & 3u))) & 0xFFFFu;
}
float half_at(uint64_t base, uint64_t off) { return unpackHalf2x16(u16_at(base, off)).x; }
int i8_of(uint b) { return int(b) - (int(b & 0x80u) << 1); }

// Sum of `v` over the workgroup (WG threads, a power of two); every thread
// gets the result. Uses `red` (shared, WG floats).
#define WORKGROUP_SUM(red, v, WG, out)                                   \
  {                                                                      \
    red[gl_LocalInvocationID.x] = v;                                     \
    barrier();                                                           \
    for (uint s_ = WG / 2; s_ > 0; s_ >>= 1) {                           \
      if (gl_LocalInvocationID.x < s_)                                   \
        red[gl_LocalInvocationID.x] += red[gl_LocalInvocationID.x + s_]; \
      barrier();                                                         \
    }                                                                    \
    out = red[0];                                                        \
    barrier();                                                           \
  }
#define WORKGROUP_MAX(red, v, WG, out)                                   \
  {                                                                      \
    red[gl_LocalInvocationID.x] = v;                                     \
    barrier();                                                           \
    for (uint s_ = WG / 2; s_ > 0; s_ >>= 1) {                           \
      if (gl_LocalInvocationID.x < s_)                                   \
        red[gl_LocalInvocationID.x] =                                    \
            max(red[gl_LocalInvocationID.x], red[gl_LocalInvocationID.x + s_]); \
      barrier();                                                         \
    }                                                                    \
    out = red[0];                                                        \
    barrier();                                                           \
  }
