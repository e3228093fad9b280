// Q4_K {d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]} per 256: eight 32-element
// sub-blocks with 6-bit scale and min (packed as in ggml's get_scale_min_k4); chunk s
// is nibble s % 2 of bytes 32 * (s / 2) .. +32: y = d * sc * q - dmin * m.
STRATA_DEVICE void strata_dequant32_q4_k(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 144u * (chunk >> 3);
    const u32 s = chunk & 7, shift = 4 * (s & 1);
    u32 sc, m;
    strata_scale_min_k4(b + 4, s, &sc, &m);
    const float d1 = strata_f16_at(b) * (float)sc, m1 = strata_f16_at(b + 2) * (float)m;
    const u8* q = b + 16 + 32 * (s >> 1);
#pragma unroll
    for (u32 l = 0; l < 32; ++l) w[l] = d1 * (float)((q[l] >> shift) & 0x0F) - m1;
}
// Int8 decode: 144-byte blocks are 16-byte aligned, so d|dmin|scales is one 16-byte load and
// the chunk's nibbles (bytes 16 + 32 * (s / 2) ..) two: eight words shifted by 4 * (s % 2);
// s0 = s1 = sc, a = d, and the min enters through qsum, b = -dmin * m (exact in f32).
STRATA_DEVICE strata_w32 strata_decode32_q4_k(const u8* STRATA_RESTRICT row, u32 chunk, const void* STRATA_RESTRICT table) {
    const u8* b = row + 144u * (chunk >> 3);
    const u32 s = chunk & 7, shift = 4 * (s & 1);
    u32 v[8];
    strata_ld8w(b + 16 + 32 * (s >> 1), v);
    const strata_u4 h = *(const strata_u4*)b;
    u32 sc, m;
    strata_scale_min_k4_w(h.y, h.z, h.w, s, &sc, &m);
    strata_w32 c;
#pragma unroll
    for (u32 k = 0; k < 8; ++k) c.w[k] = (i32)((v[k] >> shift) & 0x0F0F0F0Fu);
    c.s0 = c.s1 = (i32)sc;
    c.a = strata_f16_to_f32((u16)h.x);
    c.b = -strata_f16_to_f32((u16)(h.x >> 16)) * (float)m;
    return c;
}
// Matrix-unit fragment (strata_frag8): words q and 4 + q of the sub-block's 32 bytes,
// shifted to its nibble; d = d · sc, offset -dmin · m.
STRATA_DEVICE strata_frag8 strata_frag8_q4_k(const u8* STRATA_RESTRICT row, u32 chunk, u32 q) {
    const u8* b = row + 144u * (chunk >> 3);
    const u32 s = chunk & 7, shift = 4 * (s & 1);
    const u32* v = (const u32*)(b + 16 + 32 * (s >> 1));
    const u32* h = (const u32*)b;
    u32 sc, m;
    strata_scale_min_k4_w(h[1], h[2], h[3], s, &sc, &m);
    strata_frag8 f;
    f.lo = (v[q] >> shift) & 0x0F0F0F0Fu;
    f.hi = (v[4 + q] >> shift) & 0x0F0F0F0Fu;
    f.d = strata_f16_to_f32((u16)h[0]) * (float)sc;
    f.m = -strata_f16_to_f32((u16)(h[0] >> 16)) * (float)m;
    f.z = 0u;
    f.d2 = f.d;
    return f;
}
// Int8 dot: the decoded chunk's dot with the quants (strata_dot_w32).
STRATA_DEVICE float strata_dot32_q4_k(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    return strata_dot_w32(strata_decode32_q4_k(row, chunk, table), q, qsum);
}
