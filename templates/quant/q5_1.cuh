// Q5_1 {d: f16, m: f16, qh: u32, qs: [u8; 16]} per 32: y = q * d + m.
STRATA_DEVICE void strata_dequant32_q5_1(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 24u * chunk;
    const float d = strata_f16_at(b), m = strata_f16_at(b + 2);
    const u32 qh = strata_ld32(b + 4);
#pragma unroll
    for (u32 j = 0; j < 16; ++j) {
        const u32 lo = (b[8 + j] & 0x0F) | (((qh >> j) & 1) << 4);
        const u32 hi = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        w[j] = (float)lo * d + m;
        w[j + 16] = (float)hi * d + m;
    }
}
