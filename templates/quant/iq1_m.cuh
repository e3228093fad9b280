// IQ1_M {qs: [u8; 32], qh: [u8; 16], scales: [u8; 8]} per 256: per 8 elements an 11-bit
// index into the ternary IQ1S grid whose 3 high bits and delta sign sit in a nibble of
// qh; a 3-bit scale per 16 elements; the fp16 super-scale is spread over the top nibbles
// of the four scale words.
STRATA_DEVICE void strata_dequant32_iq1_m(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 56u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u32 s0 = strata_ld16(b + 48), s1 = strata_ld16(b + 50), s2 = strata_ld16(b + 52), s3 = strata_ld16(b + 54);
    const u32 bits = (s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000);
    const float d = strata_f16_to_f32((u16)bits);
    const u32 word = strata_ld16(b + 48 + 2 * (ib / 2)), shift = 6 * (ib % 2);
    const float dl0 = d * (float)(2 * ((word >> shift) & 7) + 1);
    const float dl1 = d * (float)(2 * ((word >> (shift + 3)) & 7) + 1);
#pragma unroll
    for (u32 l = 0; l < 4; ++l) {
        const u32 nibble = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 0x0F;
        const u64 point = strata_iq1s_grid[b[4 * ib + l] | ((nibble & 7) << 8)];
        const float delta = (nibble & 8) ? -0.125f : 0.125f;
        const float dl = l < 2 ? dl0 : dl1;
#pragma unroll
        for (u32 j = 0; j < 8; ++j) w[8 * l + j] = dl * ((float)(i8)(u8)(point >> (8 * j)) + delta);
    }
}
// The chunk's 32 weights as strata_w32, scaled by 8 so each is an integer: w_i = 8 g_i ± 1
// for grid byte g_i (-1, 0 or 1) and its 8's delta sign; the two 16-weight halves' 3-bit
// scales 2 s + 1 as s0 and s1; a = d / 8 (the fp16 super-scale), b = 0. Bytewise without
// carries: 8 g + 1 is a masked shift ^ 1, and 8 g - 1 = ~(-8 g) = 8 g ^ ~0xF0 where g != 0,
// else ~0: that is 8 g + 1 ^ ~f, f = 0xF1 where g != 0, else 1.
STRATA_DEVICE strata_w32 strata_decode32_iq1_m(const u8* STRATA_RESTRICT row, u32 chunk, const u64* STRATA_RESTRICT grid) {
    const u8* b = row + 56u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u32 qs = *(const u32*)(b + 4 * ib);
    const u32 qh = *(const u16*)(b + 32 + 2 * ib);
    const u32 sc01 = *(const u32*)(b + 48), sc23 = *(const u32*)(b + 52);
    const u32 bits = ((sc01 >> 12) & 0x000F) | ((sc01 >> 24) & 0x00F0) | ((sc23 >> 4) & 0x0F00) | ((sc23 >> 16) & 0xF000);
    const u32 sw = ((ib & 4) ? sc23 : sc01) >> (8 * (ib & 2) + 6 * (ib & 1));
    strata_w32 c;
    for (u32 l = 0; l < 4; ++l) {
        const u64 p = grid[((qs >> (8 * l)) & 255) | (((qh >> (4 * l)) & 7) << 8)];
        const u32 minus = 0u - ((qh >> (4 * l + 3)) & 1);
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
            const u32 g = (u32)(p >> (32 * h));
            const u32 x = ((g << 3) & 0xF8F8F8F8u) ^ 0x01010101u, f = (g & 0x01010101u) * 0xF0u + 0x01010101u;
            c.w[2 * l + h] = (i32)(x ^ (~f & minus));
        }
    }
    c.s0 = (i32)(2 * (sw & 7) + 1);
    c.s1 = (i32)(2 * ((sw >> 3) & 7) + 1);
    c.a = strata_f16_to_f32((u16)bits) * 0.125f;
    c.b = 0.0f;
    return c;
}
// Σ_{i<32} w_i · q_i, where w_i are the 32 weights strata_dequant32_iq1_m(row, chunk, .) gives and
// q_i the chunk's int8 activations: q[k] packs q_{4k..4k+3} (byte 0 = lowest index), q 16-byte aligned,
// qsum = Σ q_i: the decoded chunk's dot (strata_dot_w32).
STRATA_DEVICE float strata_dot32_iq1_m(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const u64* STRATA_RESTRICT grid) {
    return strata_dot_w32(strata_decode32_iq1_m(row, chunk, grid), q, qsum);
}
