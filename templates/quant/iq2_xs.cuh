// IQ2_XS {d: f16, qs: [u16; 32], scales: [u8; 8]} per 256: each u16 is a 9-bit index
// into the 8-wide IQ2XS grid and a 7-bit sign index; a 4-bit scale per 16 elements.
STRATA_DEVICE void strata_dequant32_iq2_xs(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 74u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const float d = strata_f16_at(b);
    const u32 sc = b[66 + ib];
    const float db0 = d * (0.5f + (float)(sc & 0x0F)) * 0.25f;
    const float db1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
#pragma unroll
    for (u32 l = 0; l < 4; ++l) {
        const u32 q = strata_ld16(b + 2 + 2 * (4 * ib + l));
        const u64 point = strata_iq2xs_grid[q & 511];
        const u32 signs = strata_ksigns(q >> 9);
        const float db = l < 2 ? db0 : db1;
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const float g = (float)(u8)(point >> (8 * j));
            w[8 * l + j] = db * g * ((signs >> j) & 1 ? -1.0f : 1.0f);
        }
    }
}
// The chunk's 32 weights as strata_w32: grid bytes (1..127) take their signs
// (strata_iq_signs32); the two 16-weight halves' 4-bit scales 2 s + 1 as s0 and s1;
// a = d / 8 (db = d (2 s + 1) / 8), b = 0.
STRATA_DEVICE strata_w32 strata_decode32_iq2_xs(const u8* STRATA_RESTRICT row, u32 chunk, const u64* STRATA_RESTRICT grid) {
    const u8* b = row + 74u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u16* qs = (const u16*)(b + 2 + 8 * ib);
    strata_w32 c;
    u32 index = 0;
    for (u32 l = 0; l < 4; ++l) {
        const u32 v = qs[l];
        const u64 p = grid[v & 511];
        index |= (v >> 9) << (7 * l);
        c.w[2 * l] = (i32)(u32)p;
        c.w[2 * l + 1] = (i32)(u32)(p >> 32);
    }
    strata_iq_signs32(c.w, strata_ksigns4(index));
    const u32 sc = b[66 + ib];
    c.s0 = (i32)(2 * (sc & 15) + 1);
    c.s1 = (i32)(2 * (sc >> 4) + 1);
    c.a = strata_f16_to_f32(*(const u16*)b) * 0.125f;
    c.b = 0.0f;
    return c;
}
// Σ_{i<32} w_i · q_i, where w_i are the 32 weights strata_dequant32_iq2_xs(row, chunk, .) gives and
// q_i the chunk's int8 activations: q[k] packs q_{4k..4k+3} (byte 0 = lowest index), q 16-byte aligned,
// qsum = Σ q_i: the decoded chunk's dot (strata_dot_w32).
STRATA_DEVICE float strata_dot32_iq2_xs(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const u64* STRATA_RESTRICT grid) {
    return strata_dot_w32(strata_decode32_iq2_xs(row, chunk, grid), q, qsum);
}
