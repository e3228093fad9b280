// Q2_K {scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16} per 256. Chunk s covers half
// s / 4, bit pair s % 4 of qs; each 16 elements have a 4-bit scale and 4-bit min:
// y = d * sc * q - dmin * m.
STRATA_DEVICE void strata_dequant32_q2_k(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 84u * (chunk >> 3);
    const u32 s = chunk & 7, half = s >> 2, shift = 2 * (s & 3);
    const float d = strata_f16_at(b + 80), dmin = strata_f16_at(b + 82);
#pragma unroll
    for (u32 part = 0; part < 2; ++part) {
        const u32 sc = b[8 * half + 2 * (s & 3) + part];
        const float dl = d * (float)(sc & 0x0F), ml = dmin * (float)(sc >> 4);
#pragma unroll
        for (u32 l = 0; l < 16; ++l) {
            const u32 q = (b[16 + 32 * half + 16 * part + l] >> shift) & 3;
            w[16 * part + l] = dl * (float)q - ml;
        }
    }
}
