// F16: IEEE half floats.
STRATA_DEVICE void strata_dequant32_f16(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* p = row + 64u * chunk;
    for (u32 i = 0; i < 32; ++i) w[i] = strata_f16_at(p + 2 * i);
}
