// Q4_1 {d: f16, m: f16, qs: [u8; 16]} per 32: y = q * d + m.
STRATA_DEVICE void strata_dequant32_q4_1(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 20u * chunk;
    const float d = strata_f16_at(b), m = strata_f16_at(b + 2);
    for (u32 j = 0; j < 16; ++j) {
        w[j] = (float)(b[4 + j] & 0x0F) * d + m;
        w[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}
// Int8 dot: 20-byte blocks keep d|m and qs 4-byte aligned (five u32 loads); low nibbles
// pair with q[0..3], high with q[4..7]; the min enters as m * qsum.
STRATA_DEVICE float strata_dot32_q4_1(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    const u32* b = (const u32*)(row + 20u * chunk);
    u32 x[8];
    strata_ld8w(q, x);
    const u32 dm = b[0];
    i32 s = 0;
#pragma unroll
    for (u32 k = 0; k < 4; ++k) {
        const u32 v = b[1 + k];
        s = strata_dot4((i32)(v & 0x0F0F0F0Fu), (i32)x[k], s);
        s = strata_dot4((i32)((v >> 4) & 0x0F0F0F0Fu), (i32)x[k + 4], s);
    }
    return strata_f16_to_f32((u16)dm) * (float)s + strata_f16_to_f32((u16)(dm >> 16)) * (float)qsum;
}
