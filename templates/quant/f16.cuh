// F16: IEEE half floats (a chunk is 64 bytes, 16-byte aligned as F32's).
STRATA_DEVICE void strata_dequant32_f16(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    u16 h[32];
    __builtin_memcpy(h, STRATA_ALIGNED16(row + 64u * chunk), 64);
#pragma unroll
    for (u32 i = 0; i < 32; ++i) w[i] = strata_f16_to_f32(h[i]);
}
