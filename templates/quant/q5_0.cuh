// Q5_0 {d: f16, qh: u32, qs: [u8; 16]} per 32: the fifth bit of element j is bit j of qh;
// y = (q - 16) * d.
STRATA_DEVICE void strata_dequant32_q5_0(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 22u * chunk;
    const float d = strata_f16_at(b);
    const u32 qh = strata_ld32(b + 2);
#pragma unroll
    for (u32 j = 0; j < 16; ++j) {
        const u32 lo = (b[6 + j] & 0x0F) | (((qh >> j) & 1) << 4);
        const u32 hi = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        w[j] = (float)((i32)lo - 16) * d;
        w[j + 16] = (float)((i32)hi - 16) * d;
    }
}
