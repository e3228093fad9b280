// Q8_0 {d: f16, qs: [i8; 32]} per 32: y = q * d.
STRATA_DEVICE void strata_dequant32_q8_0(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 34u * chunk;
    const float d = strata_f16_at(b);
#pragma unroll
    for (u32 j = 0; j < 32; ++j) w[j] = (float)(i8)b[2 + j] * d;
}
// Int8 decode: qs already holds packed int8 words; 34-byte blocks alternate 4-byte
// alignment, so they come by aligned loads and funnel shifts (strata_words2): a = d, b = 0.
STRATA_DEVICE strata_w32 strata_decode32_q8_0(const u8* STRATA_RESTRICT row, u32 chunk, const void* STRATA_RESTRICT table) {
    const u8* b = row + 34u * chunk;
    u32 v[8];
    strata_words2(b + 2, ~chunk & 1, 0, 8, v);
    strata_w32 c;
#pragma unroll
    for (u32 k = 0; k < 8; ++k) c.w[k] = (i32)v[k];
    c.s0 = c.s1 = 1;
    c.a = strata_f16_to_f32(*(const u16*)b);
    c.b = 0.0f;
    return c;
}
// Matrix-unit fragment (strata_frag8): words q and 4 + q of qs, which is 2-byte aligned in
// a 2-byte aligned row: halfword loads.
STRATA_DEVICE strata_frag8 strata_frag8_q8_0(const u8* STRATA_RESTRICT row, u32 chunk, u32 q) {
    const u8* b = row + 34u * chunk;
    const u16* h = (const u16*)(b + 2u + 4u * q);
    strata_frag8 f;
    f.lo = (u32)h[0] | ((u32)h[1] << 16);
    f.hi = (u32)h[8] | ((u32)h[9] << 16);
    f.d = strata_f16_to_f32(*(const u16*)b);
    f.m = 0.0f;
    f.z = 0u;
    f.d2 = f.d;
    return f;
}
// Int8 dot: the decoded chunk's dot with the quants (strata_dot_w32).
STRATA_DEVICE float strata_dot32_q8_0(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    return strata_dot_w32(strata_decode32_q8_0(row, chunk, table), q, qsum);
}
