// Q6_K {ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16} per 256: 4 low bits in
// ql, 2 high bits in qh, signed 8-bit scale per 16: y = d * sc * (q - 32). Chunk s is
// quarter s % 4 of half s / 4.
STRATA_DEVICE void strata_dequant32_q6_k(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 210u * (chunk >> 3);
    const u32 s = chunk & 7, half = s >> 2, k = s & 3;
    const float d = strata_f16_at(b + 208);
    const u8* ql = b + 64 * half + 32 * (k & 1);
    const u8* qh = b + 128 + 32 * half;
    const u32 nib = 4 * (k >> 1);
#pragma unroll
    for (u32 l = 0; l < 32; ++l) {
        const u32 q = ((ql[l] >> nib) & 0x0F) | (((qh[l] >> (2 * k)) & 3) << 4);
        const float sc = (float)(i8)b[192 + 8 * half + l / 16 + 2 * k];
        w[l] = d * sc * (float)((i32)q - 32);
    }
}
// Int8 decode: 210-byte blocks alternate 4-byte alignment, so ql and qh come as words by
// aligned loads and funnel shifts that also apply the nibble / 2-bit shift; each 6-bit
// byte u becomes u - 32 (bit 5 flipped, bits 6-7 set where it was clear: no carries), so
// the weights are signed and the two 16-element scales are s0 and s1: a = d, b = 0.
STRATA_DEVICE strata_w32 strata_decode32_q6_k(const u8* STRATA_RESTRICT row, u32 chunk, const void* STRATA_RESTRICT table) {
    const u8* b = row + 210u * (chunk >> 3);
    const u32 s = chunk & 7, half = s >> 2, k = s & 3, odd = (chunk >> 3) & 1;
    u32 lo[8], hi[8];
    strata_words2(b + 64 * half + 32 * (k & 1), odd, 4 * (k >> 1), 8, lo);
    strata_words2(b + 128 + 32 * half, odd, 2 * k, 8, hi);
    strata_w32 c;
#pragma unroll
    for (u32 i = 0; i < 8; ++i) {
        const u32 u = (lo[i] & 0x0F0F0F0Fu) | ((hi[i] << 4) & 0x30303030u);
        c.w[i] = (i32)((u ^ 0x20202020u) | ((~u & 0x20202020u) * 6u));
    }
    const u32 scw = *(const u16*)(b + 192 + 8 * half + 2 * k);
    c.s0 = (i8)(u8)scw;
    c.s1 = (i8)(u8)(scw >> 8);
    c.a = strata_f16_to_f32(*(const u16*)(b + 208));
    c.b = 0.0f;
    return c;
}
// Int8 dot: the decoded chunk's dot with the quants (strata_dot_w32).
STRATA_DEVICE float strata_dot32_q6_k(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    return strata_dot_w32(strata_decode32_q6_k(row, chunk, table), q, qsum);
}
