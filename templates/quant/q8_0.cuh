// Q8_0 {d: f16, qs: [i8; 32]} per 32: y = q * d.
STRATA_DEVICE void strata_dequant32_q8_0(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 34u * chunk;
    const float d = strata_f16_at(b);
    for (u32 j = 0; j < 32; ++j) w[j] = (float)(i8)b[2 + j] * d;
}
