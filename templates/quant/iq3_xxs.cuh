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
// Σ_{i<32} w_i · q_i, where w_i are the 32 weights strata_dequant32_iq3_xxs(row, chunk, .) gives and
// q_i the chunk's int8 activations: q[k] packs q_{4k..4k+3} (byte 0 = lowest index), q 16-byte aligned,
// qsum = Σ q_i. Each 4-wide grid point (bytes 1..127) is one strata_dot4 after its four signs are
// applied per byte (strata_iq_sign4); one scale per 32: db = d (2 s + 1) / 4.
STRATA_DEVICE float strata_dot32_iq3_xxs(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const u32* STRATA_RESTRICT grid) {
    (void)qsum;
    const u8* b = row + 98u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u16* qs = (const u16*)(b + 2 + 8 * ib);
    const u16* ss = (const u16*)(b + 66 + 4 * ib);
    const u32 aux = (u32)ss[0] | ((u32)ss[1] << 16);
    const i32* qa = (const i32*)__builtin_assume_aligned(q, 16);
    i32 acc = 0;
    for (u32 l = 0; l < 4; ++l) {
        const u32 v = qs[l];
        const u32 s = strata_ksigns(aux >> (7 * l));
        acc = strata_dot4(strata_iq_sign4(grid[v & 255], s), qa[2 * l], acc);
        acc = strata_dot4(strata_iq_sign4(grid[v >> 8], s >> 4), qa[2 * l + 1], acc);
    }
    return strata_f16_to_f32(*(const u16*)b) * 0.25f * (float)((i32)(2 * (aux >> 28) + 1) * acc);
}
