// ---- IQ2_XS a whole super-block at a time (AVX-512 VNNI) --------------------------------
// The host GEMV's dot for IQ2_XS where the target has 512-bit VNNI: one super-block's 256
// weights against T columns, two chunks (64 weights) to a vector, instead of decoding
// chunk by chunk into 32 lanes (strata_decode32_iq2_xs), which spends most of its
// instructions assembling the four grid entries and their signs a lane at a time.
// - grid entries: eight at a time, 8 bytes each, by scalar loads (a gather, VPGATHERQQ,
//   made the whole dot 35% slower on Zen 4);
// - signs: the 32 entries' sign bytes (seven stored bits and their parity) at once, then
//   moved onto the activations, since grid bytes are positive and VPDPBUSD multiplies
//   unsigned weights by signed activations;
// - scales: each 16 weights' 2 s + 1 multiplies their integer sums; d / 8 times the
//   column's chunk scale dx multiplies the float ones.
// The same weights as strata_decode32_iq2_xs, summed in another order.

// The grid entries of eight 16-bit codes q (index: the low 9 bits). The empty asm
// statements keep clang from turning the scalar loads back into a gather, and the index
// arithmetic into vector extractions.
STRATA_DEVICE __m512i strata_iq2_xs_grid8(const u8* STRATA_RESTRICT q, const u64* STRATA_RESTRICT grid) {
    u64 word[2];
    __builtin_memcpy(word, q, 16);
    __asm__("" : "+r"(word[0]), "+r"(word[1]));
    __m128i l[4];
#pragma unroll
    for (u32 k = 0; k < 4; ++k) {
        const u64 v = word[k / 2] >> (32 * (k % 2));
        l[k] = _mm_cvtsi64_si128((long long)grid[v & 511]);
        __asm__("" : "+v"(l[k]));
        l[k] = _mm_insert_epi64(l[k], (long long)grid[(v >> 16) & 511], 1);
    }
    const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(l[0]), l[1], 1);
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(l[2]), l[3], 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
template <u32 T>
STRATA_DEVICE void strata_sb_dot_iq2_xs(strata_sb_f32* acc, const u8* STRATA_RESTRICT b, const u8* STRATA_RESTRICT x,
                                        u32 x_stride, const float* STRATA_RESTRICT xd, u32 xd_stride,
                                        const u64* STRATA_RESTRICT grid) {
    const float d = _cvtsh_ss(*(const u16*)b) * 0.125f;
    const __m512i q = _mm512_loadu_si512(b + 2);
    const __m512i s7 = _mm512_srli_epi16(q, 9);
    __m512i parity = _mm512_xor_si512(s7, _mm512_srli_epi16(s7, 4));
    parity = _mm512_xor_si512(parity, _mm512_srli_epi16(parity, 2));
    parity = _mm512_and_si512(_mm512_xor_si512(parity, _mm512_srli_epi16(parity, 1)), _mm512_set1_epi16(1));
    u64 signs[4]; // 64 sign bits a pair of chunks, bit i for weight i
    _mm256_storeu_si256((__m256i*)signs, _mm512_cvtepi16_epi8(_mm512_or_si512(s7, _mm512_slli_epi16(parity, 7))));
    u64 packed;
    __builtin_memcpy(&packed, b + 66, 8);
    const __m128i sc = _mm_cvtsi64_si128((long long)packed), low = _mm_set1_epi8(15);
    const __m128i halves = _mm_unpacklo_epi8(_mm_and_si128(sc, low), _mm_and_si128(_mm_srli_epi16(sc, 4), low));
    const __m512i scales = _mm512_or_si512(_mm512_slli_epi32(_mm512_cvtepu8_epi32(halves), 1), _mm512_set1_epi32(1));
    // Lane i of a pair's sums covers weights 4i..4i+3: half i / 4 of the pair; chunk i / 8.
    const __m512i half_of = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i chunk_of = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 dx[T];
#pragma unroll
    for (u32 t = 0; t < T; ++t) dx[t] = _mm512_mul_ps(_mm512_loadu_ps(xd + t * xd_stride), _mm512_set1_ps(d));
#pragma unroll
    for (u32 p = 0; p < 4; ++p) {
        const __m512i w = strata_iq2_xs_grid8(b + 2 + 16 * p, grid);
        const __m512i s = _mm512_permutexvar_epi32(_mm512_add_epi32(half_of, _mm512_set1_epi32(4 * p)), scales);
        const __m512i at = _mm512_add_epi32(chunk_of, _mm512_set1_epi32(4 * p)); // dx of chunk 2p + i / 8 (xd: dx, sum)
#pragma unroll
        for (u32 t = 0; t < T; ++t) {
            const __m512i xv = _mm512_loadu_si512(x + t * x_stride + 64 * p);
            const __m512i sx = _mm512_mask_sub_epi8(xv, (__mmask64)signs[p], _mm512_setzero_si512(), xv);
            const __m512i sums = _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, sx), s);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_permutexvar_ps(at, dx[t]), acc[t]);
        }
    }
}
