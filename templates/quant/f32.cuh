// F32: plain floats.
STRATA_DEVICE void strata_dequant32_f32(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* p = row + 128u * chunk;
    for (u32 i = 0; i < 32; ++i) w[i] = __builtin_bit_cast(float, strata_ld32(p + 4 * i));
}
