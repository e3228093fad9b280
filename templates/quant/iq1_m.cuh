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
