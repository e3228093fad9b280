// IQ2_XXS {d: f16, qs: [u16; 32]} per 256: per 32 elements, 4 bytes of indices into the
// 8-wide IQ2XXS grid and a u32 of four 7-bit sign indices plus a 4-bit scale on top:
// db = d * (0.5 + s) * 0.25.
STRATA_DEVICE void strata_dequant32_iq2_xxs(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 66u * (chunk >> 3);
    const u8* q = b + 2 + 8 * (chunk & 7);
    const u32 aux = strata_ld32(q + 4);
    const float db = strata_f16_at(b) * (0.5f + (float)(aux >> 28)) * 0.25f;
#pragma unroll
    for (u32 l = 0; l < 4; ++l) {
        const u64 point = strata_iq2xxs_grid[q[l]];
        const u32 signs = strata_ksigns(aux >> (7 * l));
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const float g = (float)(u8)(point >> (8 * j));
            w[8 * l + j] = db * g * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
    }
}
