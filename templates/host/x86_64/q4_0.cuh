// ---- Q4_0 eight blocks at a time (AVX-512 VNNI) -----------------------------------------
// The host GEMV's dot for Q4_0 where the target has 512-bit VNNI: 256 weights (eight
// 18-byte blocks) against T columns, two blocks to a vector. The chunk decoder
// (strata_decode32_q4_0) spends most of a chunk's instructions moving nibbles through
// 32-bit words and scaling one chunk's sums at a time; here
// - nibbles: each pair of blocks' 16 bytes picked by a 16-bit word permute into 128-bit
//   lanes n0, n0, n1, n1, the second of each shifted down 4, so the lanes hold weights
//   0-15, 16-31 of one block, then of the next, the order of the activations;
// - scales: the eight f16 scales picked out of the 144 bytes at once (all are 2-byte
//   aligned) and converted together;
// - the -8: the eight blocks' d dx times their quant sums in one fused multiply-add a
//   column, taken off once.
// The same weights as strata_decode32_q4_0, summed in another order.
template <u32 T>
STRATA_DEVICE void strata_sb_dot_q4_0(strata_sb_f32* acc, const u8* STRATA_RESTRICT b, const u8* STRATA_RESTRICT x,
                                      u32 x_stride, const float* STRATA_RESTRICT xd, u32 xd_stride,
                                      const void* STRATA_RESTRICT table) {
    (void)table;
    // Weights stream from memory: ask for the lines STRATA_STREAM_AHEAD bytes on now.
#pragma unroll
    for (u32 k = 0; k < 144; k += 64) __builtin_prefetch(b + STRATA_STREAM_AHEAD + k);
    // Three loads cover the 144 bytes (the last overlaps the second); 16-bit word
    // permutes pick each block's scale (word 9k) and nibbles (words 9k + 1 .. 9k + 8).
    const __m512i l0 = _mm512_loadu_si512(b), l1 = _mm512_loadu_si512(b + 64), l2 = _mm512_loadu_si512(b + 80);
    const __m256 d = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(
        l0, _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 63, 54, 45, 36, 27, 18, 9, 0), l1)));
    // Lanes 0-7 take block 2p's scale, lanes 8-15 block 2p + 1's.
    const __m512i pair_of = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    // Each pair's nibbles as 128-bit lanes n0, n0, n1, n1 (words of l0 and l1, or of l2 for
    // the last pair); the high-nibble lanes (16-bit words 8-15 and 24-31) shifted down.
    const __mmask32 high = 0xFF00FF00u;
    const __m512i nibble = _mm512_set1_epi8(15);
    const auto lanes = [](u32 n0, u32 n1) {
        return _mm512_set_epi16(n1 + 7, n1 + 6, n1 + 5, n1 + 4, n1 + 3, n1 + 2, n1 + 1, n1, n1 + 7, n1 + 6, n1 + 5, n1 + 4,
                                n1 + 3, n1 + 2, n1 + 1, n1, n0 + 7, n0 + 6, n0 + 5, n0 + 4, n0 + 3, n0 + 2, n0 + 1, n0, n0 + 7,
                                n0 + 6, n0 + 5, n0 + 4, n0 + 3, n0 + 2, n0 + 1, n0);
    };
    const __m512i q[4] = {
        _mm512_permutex2var_epi16(l0, lanes(1, 10), l1),
        _mm512_permutex2var_epi16(l0, lanes(19, 28), l1),
        _mm512_permutexvar_epi16(lanes(5, 14), l1),      // bytes 74.. and 92.. from byte 64
        _mm512_permutexvar_epi16(lanes(15, 24), l2),     // bytes 110.. and 128.. from byte 80
    };
    __m512i w[4];
#pragma unroll
    for (u32 p = 0; p < 4; ++p) w[p] = _mm512_and_si512(_mm512_mask_srli_epi16(q[p], high, q[p], 4), nibble);
    const __m512i dx_of = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i sum_of = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 15, 13, 11, 9, 7, 5, 3, 1);
#pragma unroll
    for (u32 t = 0; t < T; ++t) {
        // xd holds (dx, quant sum) a block.
        const __m512 xdv = _mm512_loadu_ps(xd + t * xd_stride);
        const __m256 dd = _mm256_mul_ps(d, _mm512_castps512_ps256(_mm512_permutexvar_ps(dx_of, xdv)));
        const __m256 sums = _mm512_castps512_ps256(_mm512_permutexvar_ps(sum_of, xdv));
        // -8 d dx times each block's quant sum, in lanes 0-7 (the others add 0).
        const __m512 ddv = _mm512_zextps256_ps512(dd);
        __m512 a = _mm512_fmadd_ps(_mm512_mul_ps(ddv, _mm512_set1_ps(-8.0f)), _mm512_zextps256_ps512(sums), acc[t]);
#pragma unroll
        for (u32 p = 0; p < 4; ++p) {
            const __m512i xv = _mm512_loadu_si512(x + t * x_stride + 64 * p);
            const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[p], xv);
            const __m512 scale = _mm512_permutexvar_ps(_mm512_add_epi32(pair_of, _mm512_set1_epi32(2 * p)), ddv);
            a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, a);
        }
        acc[t] = a;
    }
}
