// IQ4_NL {d: f16, qs: [u8; 16]} per 32: 4-bit indices into the non-linear codebook.
STRATA_DEVICE void strata_dequant32_iq4_nl(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 18u * chunk;
    const float d = strata_f16_at(b);
#pragma unroll
    for (u32 j = 0; j < 16; ++j) {
        w[j] = d * (float)strata_iq4nl_values[b[2 + j] & 0x0F];
        w[j + 16] = d * (float)strata_iq4nl_values[b[2 + j] >> 4];
    }
}
