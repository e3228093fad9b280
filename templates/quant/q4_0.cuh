// Q4_0 {d: f16, qs: [u8; 16]} per 32: y = (q - 8) * d; element j in the low nibble of
// byte j, element j + 16 in its high nibble.
STRATA_DEVICE void strata_dequant32_q4_0(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 18u * chunk;
    const float d = strata_f16_at(b);
    for (u32 j = 0; j < 16; ++j) {
        w[j] = (float)((i32)(b[2 + j] & 0x0F) - 8) * d;
        w[j + 16] = (float)((i32)(b[2 + j] >> 4) - 8) * d;
    }
}
// Int8 dot: 18-byte blocks alternate 4-byte alignment, so qs comes as four words by
// aligned loads (strata_words2); low nibbles pair with q[0..3], high with q[4..7], -8 via qsum.
STRATA_DEVICE float strata_dot32_q4_0(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    const u8* b = row + 18u * chunk;
    u32 x[8], v[4];
    strata_ld8w(q, x);
    strata_words2(b + 2, ~chunk & 1, 0, 4, v);
    i32 s = 0;
#pragma unroll
    for (u32 k = 0; k < 4; ++k) {
        s = strata_dot4((i32)(v[k] & 0x0F0F0F0Fu), (i32)x[k], s);
        s = strata_dot4((i32)((v[k] >> 4) & 0x0F0F0F0Fu), (i32)x[k + 4], s);
    }
    return strata_f16_to_f32(*(const u16*)b) * (float)(s - 8 * qsum);
}
