// Q3_K {hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16} per 256: 2 low bits in
// qs, the third in hmask (clear means minus 4), 6-bit signed scales packed in 12 bytes:
// y = d * (sc - 32) * q.
STRATA_DEVICE void strata_dequant32_q3_k(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 110u * (chunk >> 3);
    const u32 s = chunk & 7, half = s >> 2, j = s & 3, shift = 2 * j;
    const u32 bit = 1u << (4 * half + j);
    const float d = strata_f16_at(b + 108);
#pragma unroll
    for (u32 part = 0; part < 2; ++part) {
        const u32 is = 8 * half + 2 * j + part;
        const u32 lo = (b[96 + is % 8] >> (4 * (is / 8))) & 0x0F;
        const u32 hi = (b[104 + is % 4] >> (2 * (is / 4))) & 3;
        const float dl = d * (float)((i32)(lo | (hi << 4)) - 32);
#pragma unroll
        for (u32 l = 0; l < 16; ++l) {
            const u32 i = 16 * part + l;
            const i32 q = (i32)((b[32 + 32 * half + i] >> shift) & 3) - ((b[i] & bit) ? 0 : 4);
            w[i] = dl * (float)q;
        }
    }
}
