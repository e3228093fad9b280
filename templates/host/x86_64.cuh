// ---- strata instruction-set prelude: x86_64 ---------------------------------------------
// The instruction-set-specific host code: the int8 dot of 32 weights with 32
// activations, and a GEMM panel's dot. aarch64.cuh gives the same names. (A type whose
// GEMV dots whole super-blocks on this instruction set has its file in x86_64/.)
#include <immintrin.h>

// How far ahead a GEMV that streams its weights asks for them (software prefetch): the
// hardware prefetchers stop at each 4 KiB page, and one Zen 4 core streams a Q4_0 matrix
// at 1.35-1.4 ns a block without the hint, 1.0-1.07 with it 3 KiB ahead
// (scripts/bench-host-kernel.sh, docs/PERFORMANCE.md).
#define STRATA_STREAM_AHEAD 3072

// The products of 32 signed weights w and 32 signed activations x, summed in fours:
// lane i holds products 4i..4i+3, so lanes 0-3 sum the first 16 and lanes 4-7 the last 16.
// AVX-512 VNNI and AVX-VNNI: unsigned |w| times x with w's sign (VPDPBUSD multiplies
// unsigned by signed); AVX2: the same through VPMADDUBSW (pairs never saturate: |w| <= 128,
// |x| <= 127) and VPMADDWD.
STRATA_DEVICE strata_i32x8 strata_dot32(strata_i8x32 w, strata_i8x32 x) {
    const __m256i wv = (__m256i)w, xv = (__m256i)x;
    const __m256i u = _mm256_abs_epi8(wv);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    const __m256i sx = _mm256_mask_sub_epi8(xv, _mm256_movepi8_mask(wv), _mm256_setzero_si256(), xv);
    return (strata_i32x8)_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, sx);
#elif defined(__AVXVNNI__)
    return (strata_i32x8)_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, _mm256_sign_epi8(xv, wv));
#else
    const __m256i sx = _mm256_sign_epi8(xv, wv);
    return (strata_i32x8)_mm256_madd_epi16(_mm256_maddubs_epi16(u, sx), _mm256_set1_epi16(1));
#endif
}
// IQ grid bytes take their signs in one masked subtraction (common.cuh's
// strata_iq_signs32 otherwise spreads each nibble of signs with a multiply).
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define STRATA_SIGNS32 1
STRATA_DEVICE void strata_iq_signs32(i32* w, u32 signs) {
    __m256i v;
    __builtin_memcpy(&v, w, 32);
    v = _mm256_mask_sub_epi8(v, (__mmask32)signs, _mm256_setzero_si256(), v);
    __builtin_memcpy(w, &v, 32);
}
#endif
// The same for weights known to lie in 0..127 (4- and 5-bit quants as stored): no sign to
// move.
STRATA_DEVICE strata_i32x8 strata_dot32u(strata_i8x32 w, strata_i8x32 x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return (strata_i32x8)_mm256_dpbusd_epi32(_mm256_setzero_si256(), (__m256i)w, (__m256i)x);
#elif defined(__AVXVNNI__)
    return (strata_i32x8)_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), (__m256i)w, (__m256i)x);
#else
    return (strata_i32x8)_mm256_madd_epi16(_mm256_maddubs_epi16((__m256i)w, (__m256i)x), _mm256_set1_epi16(1));
#endif
}

// A GEMM panel's dot: acc + in each row's lane the dot of its four weights in w with the
// column's four quants x. STRATA_PANEL_BIAS is what a signed weight is stored plus: VPDPBUSD
// takes unsigned weights (one instruction a dot; the caller takes back 128 times the
// quants' sum; AVX-VNNI's 256-bit form the same); AVX2 moves the signs onto x instead and
// stores weights as they are.
#if STRATA_PANEL_ROWS == 16 && defined(__AVX512VNNI__)
#define STRATA_PANEL_BIAS 128
STRATA_DEVICE strata_pi32 strata_panel_dot(strata_pi32 acc, strata_pi8 w, i32 x) {
    return (strata_pi32)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)w, _mm512_set1_epi32(x));
}
// The sums of a whole-super-block dot (x86_64/<type>.cuh; host::superblock_dot says which
// types have one): 16 lanes, added up once a row.
typedef __m512 strata_sb_f32;
STRATA_DEVICE float strata_sb_sum(strata_sb_f32 a) {
    return _mm512_reduce_add_ps(a);
}
#elif STRATA_PANEL_ROWS == 8 && defined(__AVXVNNI__)
#define STRATA_PANEL_BIAS 128
STRATA_DEVICE strata_pi32 strata_panel_dot(strata_pi32 acc, strata_pi8 w, i32 x) {
    return (strata_pi32)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)w, _mm256_set1_epi32(x));
}
#elif STRATA_PANEL_ROWS == 8
#define STRATA_PANEL_BIAS 0
STRATA_DEVICE strata_pi32 strata_panel_dot(strata_pi32 acc, strata_pi8 w, i32 x) {
    const __m256i wv = (__m256i)w, sx = _mm256_sign_epi8(_mm256_set1_epi32(x), wv);
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), sx), _mm256_set1_epi16(1));
    return acc + (strata_pi32)p;
}
#else
#error "no panel dot for this register width and instruction set"
#endif
