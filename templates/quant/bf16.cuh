// BF16: the top half of an f32.
STRATA_DEVICE void strata_dequant32_bf16(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* p = row + 64u * chunk;
    for (u32 i = 0; i < 32; ++i) w[i] = __builtin_bit_cast(float, strata_ld16(p + 2 * i) << 16);
}
