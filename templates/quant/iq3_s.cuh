// IQ3_S {d: f16, qs: [u8; 64], qh: [u8; 8], signs: [u8; 32], scales: [u8; 4]} per 256:
// 9-bit indices of 4-wide IQ3S grid points (ninth bit in qh), full sign bytes, a 4-bit
// scale per 32 elements: db = d * (1 + 2 s).
STRATA_DEVICE void strata_dequant32_iq3_s(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 110u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u32 s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    const float db = strata_f16_at(b) * (float)(1 + 2 * s);
    const u32 h = b[66 + ib];
    for (u32 l = 0; l < 4; ++l) {
        const u8* q = b + 2 + 8 * ib + 2 * l;
        const u32 p0 = strata_iq3s_grid[q[0] | ((h << (8 - 2 * l)) & 256)];
        const u32 p1 = strata_iq3s_grid[q[1] | ((h << (7 - 2 * l)) & 256)];
        const u32 signs = b[74 + 4 * ib + l];
        for (u32 j = 0; j < 8; ++j) {
            const float g = (float)(u8)((j < 4 ? p0 : p1) >> (8 * (j & 3)));
            w[8 * l + j] = db * g * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
    }
}
