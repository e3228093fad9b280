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
