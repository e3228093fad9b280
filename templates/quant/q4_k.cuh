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
