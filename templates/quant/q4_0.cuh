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
