// IQ3_XXS {d: f16, qs: [u8; 64], scales_signs: [u32; 8]} per 256: per 32 elements, 8
// indices of 4-wide IQ3XXS grid points and a u32 of four 7-bit sign indices plus a
// 4-bit scale: db = d * (0.5 + s) * 0.5.
STRATA_DEVICE void strata_dequant32_iq3_xxs(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 98u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u8* q = b + 2 + 8 * ib;
    const u32 aux = strata_ld32(b + 66 + 4 * ib);
    const float db = strata_f16_at(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
#pragma unroll
    for (u32 l = 0; l < 4; ++l) {
        const u32 signs = strata_ksigns(aux >> (7 * l));
        const u32 p0 = strata_iq3xxs_grid[q[2 * l]], p1 = strata_iq3xxs_grid[q[2 * l + 1]];
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const float g = (float)(u8)((j < 4 ? p0 : p1) >> (8 * (j & 3)));
            w[8 * l + j] = db * g * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
    }
}
// The chunk's 32 weights as strata_w32: each 4-wide grid point (bytes 1..127) takes its four
// signs (strata_iq_signs32); one scale per 32, s0 = s1 = 2 s + 1; a = d / 4
// (db = d (2 s + 1) / 4), b = 0.
STRATA_DEVICE strata_w32 strata_decode32_iq3_xxs(const u8* STRATA_RESTRICT row, u32 chunk, const u32* STRATA_RESTRICT grid) {
    const u8* b = row + 98u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u16* qs = (const u16*)(b + 2 + 8 * ib);
    const u16* ss = (const u16*)(b + 66 + 4 * ib);
    const u32 aux = (u32)ss[0] | ((u32)ss[1] << 16);
    strata_w32 c;
    for (u32 l = 0; l < 4; ++l) {
        const u32 v = qs[l];
        c.w[2 * l] = (i32)grid[v & 255];
        c.w[2 * l + 1] = (i32)grid[v >> 8];
    }
    strata_iq_signs32(c.w, strata_ksigns4(aux));
    c.s0 = c.s1 = (i32)(2 * (aux >> 28) + 1);
    c.a = strata_f16_to_f32(*(const u16*)b) * 0.25f;
    c.b = 0.0f;
    return c;
}
// Σ_{i<32} w_i · q_i, where w_i are the 32 weights strata_dequant32_iq3_xxs(row, chunk, .) gives and
// q_i the chunk's int8 activations: q[k] packs q_{4k..4k+3} (byte 0 = lowest index), q 16-byte aligned,
// qsum = Σ q_i: the decoded chunk's dot (strata_dot_w32).
STRATA_DEVICE float strata_dot32_iq3_xxs(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const u32* STRATA_RESTRICT grid) {
    return strata_dot_w32(strata_decode32_iq3_xxs(row, chunk, grid), q, qsum);
}
