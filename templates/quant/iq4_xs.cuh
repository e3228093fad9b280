// IQ4_XS {d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]} per 256: IQ4_NL codes
// with a 6-bit scale per 32 elements: y = d * (s - 32) * v.
STRATA_DEVICE void strata_dequant32_iq4_xs(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 136u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u32 lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    const u32 hi = (strata_ld16(b + 2) >> (2 * ib)) & 3;
    const float dl = strata_f16_at(b) * (float)((i32)(lo | (hi << 4)) - 32);
    const u8* q = b + 8 + 16 * ib;
#pragma unroll
    for (u32 j = 0; j < 16; ++j) {
        w[j] = dl * (float)strata_iq4nl_values[q[j] & 0x0F];
        w[j + 16] = dl * (float)strata_iq4nl_values[q[j] >> 4];
    }
}
