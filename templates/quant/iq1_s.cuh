// IQ1_S {d: f16, qs: [u8; 32], qh: [u16; 8]} per 256: per 32 elements four 11-bit
// indices into the ternary IQ1S grid, a 3-bit scale (dl = d * (2 s + 1)) and the sign of
// the delta (0.125) in the top bit of qh.
STRATA_DEVICE void strata_dequant32_iq1_s(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 50u * (chunk >> 3);
    const u32 ib = chunk & 7;
    const u32 qh = strata_ld16(b + 34 + 2 * ib);
    const float dl = strata_f16_at(b) * (float)(2 * ((qh >> 12) & 7) + 1);
    const float delta = (qh & 0x8000) ? -0.125f : 0.125f;
#pragma unroll
    for (u32 l = 0; l < 4; ++l) {
        const u64 point = strata_iq1s_grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
#pragma unroll
        for (u32 j = 0; j < 8; ++j) w[8 * l + j] = dl * ((float)(i8)(u8)(point >> (8 * j)) + delta);
    }
}
