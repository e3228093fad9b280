// Q4_1 {d: f16, m: f16, qs: [u8; 16]} per 32: y = q * d + m.
STRATA_DEVICE void strata_dequant32_q4_1(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 20u * chunk;
    const float d = strata_f16_at(b), m = strata_f16_at(b + 2);
    for (u32 j = 0; j < 16; ++j) {
        w[j] = (float)(b[4 + j] & 0x0F) * d + m;
        w[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}
