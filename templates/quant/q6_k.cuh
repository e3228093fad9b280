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
    for (u32 l = 0; l < 32; ++l) {
        const u32 q = ((ql[l] >> nib) & 0x0F) | (((qh[l] >> (2 * k)) & 3) << 4);
        const float sc = (float)(i8)b[192 + 8 * half + l / 16 + 2 * k];
        w[l] = d * sc * (float)((i32)q - 32);
    }
}
// Int8 dot: 210-byte blocks alternate 4-byte alignment, so ql and qh come as words by
// aligned loads and funnel shifts that also apply the nibble / 2-bit shift; the -32 per
// 16-element scale group uses that group's Σq (dot4 with 0x01010101; the second is qsum - first).
STRATA_DEVICE float strata_dot32_q6_k(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    const u8* b = row + 210u * (chunk >> 3);
    const u32 s = chunk & 7, half = s >> 2, k = s & 3, odd = (chunk >> 3) & 1;
    u32 x[8], lo[8], hi[8];
    strata_ld8w(q, x);
    strata_words2(b + 64 * half + 32 * (k & 1), odd, 4 * (k >> 1), 8, lo);
    strata_words2(b + 128 + 32 * half, odd, 2 * k, 8, hi);
    i32 s0 = 0, s1 = 0, n0 = 0;
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        s0 = strata_dot4((i32)((lo[i] & 0x0F0F0F0Fu) | ((hi[i] << 4) & 0x30303030u)), (i32)x[i], s0);
        n0 = strata_dot4(0x01010101, (i32)x[i], n0);
    }
#pragma unroll
    for (u32 i = 4; i < 8; ++i) s1 = strata_dot4((i32)((lo[i] & 0x0F0F0F0Fu) | ((hi[i] << 4) & 0x30303030u)), (i32)x[i], s1);
    const u32 scw = *(const u16*)(b + 192 + 8 * half + 2 * k);
    const i32 sc0 = (i8)(u8)scw, sc1 = (i8)(u8)(scw >> 8);
    return strata_f16_to_f32(*(const u16*)(b + 208)) * (float)(sc0 * (s0 - 32 * n0) + sc1 * (s1 - 32 * (qsum - n0)));
}
