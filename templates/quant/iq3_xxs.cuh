// IQ3_XXS {d: f16, qs: [u8; 64], scales_signs: [u32; 8]} per 256: per 32 elements, 8
// indices of 4-wide IQ3XXS grid points and a u32 of four 7-bit sign indices plus a
// 4-bit scale: db = d * (0.5 + s) * 0.5.
STRATA_DEVICE void strata_dequant32_iq3_xxs(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 98u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u8* q = b + 2 + 8 * ib;
    const u32 aux = strata_ld32(b + 66 + 4 * ib);
    const float db = strata_f16_at(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
    for (u32 l = 0; l < 4; ++l) {
        const u32 signs = strata_ksigns(aux >> (7 * l));
        const u32 p0 = strata_iq3xxs_grid[q[2 * l]], p1 = strata_iq3xxs_grid[q[2 * l + 1]];
        for (u32 j = 0; j < 8; ++j) {
            const float g = (float)(u8)((j < 4 ? p0 : p1) >> (8 * (j & 3)));
            w[8 * l + j] = db * g * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
    }
}
