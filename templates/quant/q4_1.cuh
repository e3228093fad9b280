// Q4_1 {d: f16, m: f16, qs: [u8; 16]} per 32: y = q * d + m.
STRATA_DEVICE void strata_dequant32_q4_1(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 20u * chunk;
    const float d = strata_f16_at(b), m = strata_f16_at(b + 2);
#pragma unroll
    for (u32 j = 0; j < 16; ++j) {
        w[j] = (float)(b[4 + j] & 0x0F) * d + m;
        w[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}
// Int8 decode: 20-byte blocks keep d|m and qs 4-byte aligned (five u32 loads); low nibbles
// are weights 0..15, high nibbles 16..31: a = d, and the min enters through qsum, b = m.
STRATA_DEVICE strata_w32 strata_decode32_q4_1(const u8* STRATA_RESTRICT row, u32 chunk, const void* STRATA_RESTRICT table) {
    const u32* b = (const u32*)(row + 20u * chunk);
    const u32 dm = b[0];
    strata_w32 c;
#pragma unroll
    for (u32 k = 0; k < 4; ++k) {
        const u32 v = b[1 + k];
        c.w[k] = (i32)(v & 0x0F0F0F0Fu);
        c.w[k + 4] = (i32)((v >> 4) & 0x0F0F0F0Fu);
    }
    c.s0 = c.s1 = 1;
    c.a = strata_f16_to_f32((u16)dm);
    c.b = strata_f16_to_f32((u16)(dm >> 16));
    return c;
}
// Matrix-unit fragment (strata_frag8): word q of qs holds weights 4q .. 4q + 3 (low
// nibbles) and 16 + 4q .. (high nibbles), unsigned bytes below 16; the min is the offset.
STRATA_DEVICE strata_frag8 strata_frag8_q4_1(const u8* STRATA_RESTRICT row, u32 chunk, u32 q) {
    const u32* b = (const u32*)(row + 20u * chunk);
    const u32 dm = b[0], x = b[1 + q];
    strata_frag8 f;
    f.lo = x & 0x0F0F0F0Fu;
    f.hi = (x >> 4) & 0x0F0F0F0Fu;
    f.d = strata_f16_to_f32((u16)dm);
    f.m = strata_f16_to_f32((u16)(dm >> 16));
    f.z = 0u;
    f.d2 = f.d;
    return f;
}
// Int8 dot: the decoded chunk's dot with the quants (strata_dot_w32).
STRATA_DEVICE float strata_dot32_q4_1(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    return strata_dot_w32(strata_decode32_q4_1(row, chunk, table), q, qsum);
}
