// IQ2_S {d: f16, qs: [u8; 32], signs: [u8; 32], qh: [u8; 8], scales: [u8; 8]} per 256:
// 10-bit indices into the 8-wide IQ2S grid (2 high bits per index in qh), one sign byte
// per 8 elements, a 4-bit scale per 16 elements.
STRATA_DEVICE void strata_dequant32_iq2_s(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 82u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const float d = strata_f16_at(b);
    const u32 sc = b[74 + ib];
    const float db0 = d * (0.5f + (float)(sc & 0x0F)) * 0.25f;
    const float db1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    const u32 qh = b[66 + ib];
#pragma unroll
    for (u32 l = 0; l < 4; ++l) {
        const u32 index = b[2 + 4 * ib + l] | ((qh << (8 - 2 * l)) & 0x300);
        const u64 point = strata_iq2s_grid[index];
        const u32 signs = b[34 + 4 * ib + l];
        const float db = l < 2 ? db0 : db1;
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const float g = (float)(u8)(point >> (8 * j));
            w[8 * l + j] = db * g * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
    }
}
