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
    for (u32 l = 0; l < 4; ++l) {
        const u32 nibble = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 0x0F;
        const u64 point = strata_iq1s_grid[b[4 * ib + l] | ((nibble & 7) << 8)];
        const float delta = (nibble & 8) ? -0.125f : 0.125f;
        const float dl = l < 2 ? dl0 : dl1;
        for (u32 j = 0; j < 8; ++j) w[8 * l + j] = dl * ((float)(i8)(u8)(point >> (8 * j)) + delta);
    }
}
// Σ_{i<32} w_i · q_i, where w_i are the 32 weights strata_dequant32_iq1_m(row, chunk, .) gives and
// q_i the chunk's int8 activations: q[k] packs q_{4k..4k+3} (byte 0 = lowest index), q 16-byte aligned,
// qsum = Σ q_i. Grid bytes are already i8 -1/0/1 (one strata_dot4 per 4 weights); each 8's ±1/8 delta
// is a strata_dot4 with ±1 bytes, so a 16-weight half sums (8 g ± 1) q for its 3-bit scale.
STRATA_DEVICE float strata_dot32_iq1_m(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const u64* STRATA_RESTRICT grid) {
    (void)qsum;
    const u8* b = row + 56u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u32 qs = *(const u32*)(b + 4 * ib);
    const u32 qh = *(const u16*)(b + 32 + 2 * ib);
    const u32 sc01 = *(const u32*)(b + 48), sc23 = *(const u32*)(b + 52);
    const u32 bits = ((sc01 >> 12) & 0x000F) | ((sc01 >> 24) & 0x00F0) | ((sc23 >> 4) & 0x0F00) | ((sc23 >> 16) & 0xF000);
    const u32 sw = ((ib & 4) ? sc23 : sc01) >> (8 * (ib & 2) + 6 * (ib & 1));
    const i32* qa = (const i32*)__builtin_assume_aligned(q, 16);
    i32 g0 = 0, g1 = 0, e0 = 0, e1 = 0;
    for (u32 l = 0; l < 4; ++l) {
        const u64 p = grid[((qs >> (8 * l)) & 255) | (((qh >> (4 * l)) & 7) << 8)];
        const i32 dw = ((i32)(qh << (28 - 4 * l)) >> 31) | 0x01010101;
        i32 g = l < 2 ? g0 : g1, e = l < 2 ? e0 : e1;
        g = strata_dot4((i32)(u32)p, qa[2 * l], g);
        g = strata_dot4((i32)(u32)(p >> 32), qa[2 * l + 1], g);
        e = strata_dot4(dw, qa[2 * l], e);
        e = strata_dot4(dw, qa[2 * l + 1], e);
        if (l < 2) { g0 = g; e0 = e; } else { g1 = g; e1 = e; }
    }
    const i32 sumi = (i32)(2 * (sw & 7) + 1) * (8 * g0 + e0) + (i32)(2 * ((sw >> 3) & 7) + 1) * (8 * g1 + e1);
    return strata_f16_to_f32((u16)bits) * 0.125f * (float)sumi;
}
