// IQ3_S {d: f16, qs: [u8; 64], qh: [u8; 8], signs: [u8; 32], scales: [u8; 4]} per 256:
// 9-bit indices of 4-wide IQ3S grid points (ninth bit in qh), full sign bytes, a 4-bit
// scale per 32 elements: db = d * (1 + 2 s).
STRATA_DEVICE void strata_dequant32_iq3_s(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 110u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u32 s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    const float db = strata_f16_at(b) * (float)(1 + 2 * s);
    const u32 h = b[66 + ib];
#pragma unroll
    for (u32 l = 0; l < 4; ++l) {
        const u8* q = b + 2 + 8 * ib + 2 * l;
        const u32 p0 = strata_iq3s_grid[q[0] | ((h << (8 - 2 * l)) & 256)];
        const u32 p1 = strata_iq3s_grid[q[1] | ((h << (7 - 2 * l)) & 256)];
        const u32 signs = b[74 + 4 * ib + l];
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const float g = (float)(u8)((j < 4 ? p0 : p1) >> (8 * (j & 3)));
            w[8 * l + j] = db * g * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
    }
}
// The chunk's 32 weights as strata_w32: each 4-wide grid point (bytes 1..127) takes the
// chunk's 32 sign bits, one a byte (strata_iq_signs32); one scale per 32,
// s0 = s1 = 2 s + 1; a = d (db = d (2 s + 1)), b = 0.
STRATA_DEVICE strata_w32 strata_decode32_iq3_s(const u8* STRATA_RESTRICT row, u32 chunk, const u32* STRATA_RESTRICT grid) {
    const u8* b = row + 110u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u16* qs = (const u16*)(b + 2 + 8 * ib);
    const u32 h = b[66 + ib];
    const u16* sg = (const u16*)(b + 74 + 4 * ib);
    const u32 signs = (u32)sg[0] | ((u32)sg[1] << 16);
    strata_w32 c;
    for (u32 l = 0; l < 4; ++l) {
        const u32 v = qs[l];
        const u32 p0 = grid[(v & 255) | ((h << (8 - 2 * l)) & 256)];
        const u32 p1 = grid[(v >> 8) | ((h << (7 - 2 * l)) & 256)];
        c.w[2 * l] = (i32)p0;
        c.w[2 * l + 1] = (i32)p1;
    }
    strata_iq_signs32(c.w, signs);
    const u32 s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    c.s0 = c.s1 = (i32)(2 * s + 1);
    c.a = strata_f16_to_f32(*(const u16*)b);
    c.b = 0.0f;
    return c;
}
// Σ_{i<32} w_i · q_i, where w_i are the 32 weights strata_dequant32_iq3_s(row, chunk, .) gives and
// q_i the chunk's int8 activations: q[k] packs q_{4k..4k+3} (byte 0 = lowest index), q 16-byte aligned,
// qsum = Σ q_i: the decoded chunk's dot (strata_dot_w32).
STRATA_DEVICE float strata_dot32_iq3_s(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const u32* STRATA_RESTRICT grid) {
    return strata_dot_w32(strata_decode32_iq3_s(row, chunk, grid), q, qsum);
}
