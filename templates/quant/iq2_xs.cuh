// IQ2_XS {d: f16, qs: [u16; 32], scales: [u8; 8]} per 256: each u16 is a 9-bit index
// into the 8-wide IQ2XS grid and a 7-bit sign index; a 4-bit scale per 16 elements.
STRATA_DEVICE void strata_dequant32_iq2_xs(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 74u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const float d = strata_f16_at(b);
    const u32 sc = b[66 + ib];
    const float db0 = d * (0.5f + (float)(sc & 0x0F)) * 0.25f;
    const float db1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    for (u32 l = 0; l < 4; ++l) {
        const u32 q = strata_ld16(b + 2 + 2 * (4 * ib + l));
        const u64 point = strata_iq2xs_grid[q & 511];
        const u32 signs = strata_ksigns(q >> 9);
        const float db = l < 2 ? db0 : db1;
        for (u32 j = 0; j < 8; ++j) {
            const float g = (float)(u8)(point >> (8 * j));
            w[8 * l + j] = db * g * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
    }
}
