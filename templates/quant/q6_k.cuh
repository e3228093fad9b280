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
// Matrix-unit fragment (strata_frag8): words q and 4 + q of the chunk's six-bit weights as
// stored (z = 32), each from its low-nibble and high-bit words (strata_words2, whose
// alignment the block's address says: blocks alternate it in a row and in a GEMV's
// slabs alike); d and d2 = d · sc of the chunk's two halves (exact in f32).
STRATA_DEVICE strata_frag8 strata_frag8_q6_k(const u8* STRATA_RESTRICT row, u32 chunk, u32 q) {
    const u8* b = row + 210u * (chunk >> 3);
    const u32 s = chunk & 7, half = s >> 2, k = s & 3, odd = (u32)(u64)b >> 1 & 1u;
    const u8* ql = b + 64 * half + 32 * (k & 1) + 4 * q;
    const u8* qh = b + 128 + 32 * half + 4 * q;
    // The high bits go to bits 4-5 of each byte: shifted right by 2k - 4 in the funnel
    // where k >= 2, else left by 4 - 2k after it.
    const u32 hs = k >= 2 ? 2 * k - 4 : 0, up = k >= 2 ? 0 : 4 - 2 * k;
    u32 l0, l1, h0, h1;
    strata_words2(ql, odd, 4 * (k >> 1), 1, &l0);
    strata_words2(ql + 16, odd, 4 * (k >> 1), 1, &l1);
    strata_words2(qh, odd, hs, 1, &h0);
    strata_words2(qh + 16, odd, hs, 1, &h1);
    const i8* sc = (const i8*)(b + 192 + 8 * half + 2 * k);
    const float d = strata_f16_to_f32(*(const u16*)(b + 208));
    strata_frag8 f;
    f.lo = (l0 & 0x0F0F0F0Fu) | ((h0 << up) & 0x30303030u);
    f.hi = (l1 & 0x0F0F0F0Fu) | ((h1 << up) & 0x30303030u);
    f.d = d * (float)sc[0];
    f.d2 = d * (float)sc[1];
    f.m = 0.0f;
    f.z = 32u;
    return f;
}
// Int8 dot: the decoded chunk's dot with the quants (strata_dot_w32).
STRATA_DEVICE float strata_dot32_q6_k(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    return strata_dot_w32(strata_decode32_q6_k(row, chunk, table), q, qsum);
}
