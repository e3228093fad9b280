// Q4_0 {d: f16, qs: [u8; 16]} per 32: y = (q - 8) * d; element j in the low nibble of
// byte j, element j + 16 in its high nibble.
STRATA_DEVICE void strata_dequant32_q4_0(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    const u8* b = row + 18u * chunk;
    const float d = strata_f16_at(b);
#pragma unroll
    for (u32 j = 0; j < 16; ++j) {
        w[j] = (float)((i32)(b[2 + j] & 0x0F) - 8) * d;
        w[j + 16] = (float)((i32)(b[2 + j] >> 4) - 8) * d;
    }
}
// Int8 decode: 18-byte blocks alternate 4-byte alignment, so qs comes as four words by
// aligned loads (strata_words2); low nibbles are weights 0..15, high nibbles 16..31, all
// 0..15 as stored: a = d, and the -8 enters through qsum, b = -8 d.
STRATA_DEVICE strata_w32 strata_decode32_q4_0(const u8* STRATA_RESTRICT row, u32 chunk, const void* STRATA_RESTRICT table) {
    const u8* b = row + 18u * chunk;
    u32 v[4];
    strata_words2(b + 2, ~chunk & 1, 0, 4, v);
    strata_w32 c;
#pragma unroll
    for (u32 k = 0; k < 4; ++k) {
        c.w[k] = (i32)(v[k] & 0x0F0F0F0Fu);
        c.w[k + 4] = (i32)((v[k] >> 4) & 0x0F0F0F0Fu);
    }
    const float d = strata_f16_to_f32(*(const u16*)b);
    c.s0 = c.s1 = 1;
    c.a = d;
    c.b = -8.0f * d;
    return c;
}
// Int8 decode with signed weights, b = 0: each byte q - 8 (120 + q carries into no other
// byte, and flipping bit 7 then subtracts 128). The int8 GEMM's, where the offset term
// costs a multiply-add for every output and chunk; the GEMV's offset is one per row.
STRATA_DEVICE strata_w32 strata_decode32_signed_q4_0(const u8* STRATA_RESTRICT row, u32 chunk, const void* STRATA_RESTRICT table) {
    strata_w32 c = strata_decode32_q4_0(row, chunk, table);
#pragma unroll
    for (u32 k = 0; k < 8; ++k) c.w[k] = (i32)(((u32)c.w[k] + 0x78787878u) ^ 0x80808080u);
    c.b = 0.0f;
    return c;
}
// Matrix-unit fragment (strata_frag8): bytes 4q .. 4q + 3 of qs hold weights 4q .. 4q + 3
// (low nibbles) and 16 + 4q .. (high nibbles), 0 .. 15 as stored with zero point 8.
// qs is 2-byte aligned in a 2-byte aligned row: two halfword loads.
STRATA_DEVICE strata_frag8 strata_frag8_q4_0(const u8* STRATA_RESTRICT row, u32 chunk, u32 q) {
    const u8* b = row + 18u * chunk;
    const u16* h = (const u16*)(b + 2u + 4u * q);
    const u32 x = (u32)h[0] | ((u32)h[1] << 16);
    strata_frag8 f;
    f.lo = x & 0x0F0F0F0Fu;
    f.hi = (x >> 4) & 0x0F0F0F0Fu;
    f.d = strata_f16_to_f32(*(const u16*)b);
    f.m = 0.0f;
    f.z = 8u;
    f.d2 = f.d;
    return f;
}
// Int8 dot: the decoded chunk's dot with the quants (strata_dot_w32).
STRATA_DEVICE float strata_dot32_q4_0(const u8* STRATA_RESTRICT row, u32 chunk, const i32* STRATA_RESTRICT q, i32 qsum, const void* STRATA_RESTRICT table) {
    return strata_dot_w32(strata_decode32_q4_0(row, chunk, table), q, qsum);
}
