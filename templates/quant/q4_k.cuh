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
    for (u32 l = 0; l < 32; ++l) w[l] = d1 * (float)((q[l] >> shift) & 0x0F) - m1;
}
// Int8 dot: 144-byte blocks are 16-byte aligned, so d|dmin|scales is one 16-byte load and
// the chunk's nibbles (bytes 16 + 32 * (s / 2) ..) two: eight words shifted by 4 * (s % 2);
// the min enters as m * qsum.
STRATA_DEVICE float strata_dot32_q4_k(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    const u8* b = row + 144u * (chunk >> 3);
    const u32 s = chunk & 7, shift = 4 * (s & 1);
    u32 x[8], v[8];
    strata_ld8w(q, x);
    strata_ld8w(b + 16 + 32 * (s >> 1), v);
    const strata_u4 h = *(const strata_u4*)b;
    u32 sc, m;
    strata_scale_min_k4_w(h.y, h.z, h.w, s, &sc, &m);
    i32 acc = 0;
#pragma unroll
    for (u32 k = 0; k < 8; ++k) acc = strata_dot4((i32)((v[k] >> shift) & 0x0F0F0F0Fu), (i32)x[k], acc);
    return strata_f16_to_f32((u16)h.x) * (float)((i32)sc * acc) - strata_f16_to_f32((u16)(h.x >> 16)) * (float)((i32)m * qsum);
}
