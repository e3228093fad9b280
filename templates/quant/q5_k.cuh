// Q5_K {d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]} per 256: Q4_K
// plus a fifth bit, bit s of qh[l] for element l of sub-block s.
STRATA_DEVICE void strata_dequant32_q5_k(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 176u * (chunk >> 3);
    const u32 s = chunk & 7, shift = 4 * (s & 1);
    u32 sc, m;
    strata_scale_min_k4(b + 4, s, &sc, &m);
    const float d1 = strata_f16_at(b) * (float)sc, m1 = strata_f16_at(b + 2) * (float)m;
    const u8* qh = b + 16;
    const u8* q = b + 48 + 32 * (s >> 1);
#pragma unroll
    for (u32 l = 0; l < 32; ++l) {
        const u32 v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> s) & 1) << 4);
        w[l] = d1 * (float)v - m1;
    }
}
