// ---- strata instruction-set prelude: aarch64 --------------------------------------------
// The only instruction-set-specific host code: the int8 dot of 32 weights with 32
// activations, and a GEMM panel's dot. x86_64.cuh gives the same names.
#include <arm_neon.h>

// The products of 32 signed weights w and 32 signed activations x, summed in fours:
// lane i holds products 4i..4i+3, so lanes 0-3 sum the first 16 and lanes 4-7 the last 16
// (SDOT on each 16-byte half).
STRATA_DEVICE strata_i32x8 strata_dot32(strata_i8x32 w, strata_i8x32 x) {
    int8x16_t w0, w1, x0, x1;
    __builtin_memcpy(&w0, &w, 16);
    __builtin_memcpy(&w1, (const i8*)&w + 16, 16);
    __builtin_memcpy(&x0, &x, 16);
    __builtin_memcpy(&x1, (const i8*)&x + 16, 16);
    const int32x4_t lo = vdotq_s32(vdupq_n_s32(0), w0, x0), hi = vdotq_s32(vdupq_n_s32(0), w1, x1);
    strata_i32x8 r;
    __builtin_memcpy(&r, &lo, 16);
    __builtin_memcpy((i32*)&r + 4, &hi, 16);
    return r;
}
// Weights in 0..127: SDOT takes them as they are.
STRATA_DEVICE strata_i32x8 strata_dot32u(strata_i8x32 w, strata_i8x32 x) { return strata_dot32(w, x); }

// A GEMM panel's dot: acc + in each row's lane the dot of its four weights in w with the
// column's four quants x (SDOT takes signed weights as they are: no bias).
#define STRATA_PANEL_BIAS 0
STRATA_DEVICE strata_pi32 strata_panel_dot(strata_pi32 acc, strata_pi8 w, i32 x) {
    return (strata_pi32)vdotq_s32((int32x4_t)acc, (int8x16_t)w, vreinterpretq_s8_s32(vdupq_n_s32(x)));
}
