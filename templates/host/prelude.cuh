// ---- strata prelude: host (clang, C++) --------------------------------------------
// Runs the vendor-neutral quant decoders on the CPU, one lane at a time, so tests check
// them against the CPU reference without a GPU. Threads, barriers and shuffles do not
// exist here: calling one traps.
#define STRATA_DEVICE static inline __attribute__((always_inline))
#define STRATA_TABLE static const
#define STRATA_RESTRICT __restrict__
// Whether any address loads at full speed (block decoders then skip their alignment
// shifts); a test defines it 0 to run the GPUs' aligned loads and shifts here.
#ifndef STRATA_UNALIGNED_LOADS
#define STRATA_UNALIGNED_LOADS 1
#endif
// A pointer the caller guarantees 16-byte aligned (float rows of whole chunks), so that
// copies from it become wide loads (the host's test buffers may be unaligned: no promise).
#define STRATA_ALIGNED16(p) (p)
#define STRATA_WAVE 1u

STRATA_DEVICE u32 strata_thread(void) { __builtin_trap(); }
STRATA_DEVICE u32 strata_block_x(void) { __builtin_trap(); }
STRATA_DEVICE u32 strata_block_y(void) { __builtin_trap(); }
STRATA_DEVICE u32 strata_block_z(void) { __builtin_trap(); }
STRATA_DEVICE void strata_barrier(void) { __builtin_trap(); }
STRATA_DEVICE float strata_shfl_xor(float, u32) { __builtin_trap(); }
STRATA_DEVICE i32 strata_shfl_xor_i32(i32, u32) { __builtin_trap(); }
STRATA_DEVICE float strata_f16_to_f32(u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
STRATA_DEVICE float strata_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
// c + the four signed byte products of a and b (dp4a, sdot4).
STRATA_DEVICE i32 strata_dot4(i32 a, i32 b, i32 c) {
    for (u32 k = 0; k < 32; k += 8) c += (i32)(i8)(a >> k) * (i32)(i8)(b >> k);
    return c;
}
STRATA_DEVICE u32 strata_atomic_add(i32* p, i32 v) { return (u32)__atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

// ---- host kernels: the call every generated host kernel takes -------------------------
// A launch's arguments in its record's order, and which part of the work this call does:
// the backend runs parts 0..parts on its workers, phase by phase (a barrier between).
struct strata_call {
    void* const* bufs;
    const u32* scalars;
    u32 part, parts, phase;
    u8* scratch;
};
// The first of `n` items that part `p` of `parts` takes, in whole multiples of `align`.
STRATA_DEVICE u32 strata_part_begin(u32 n, u32 p, u32 parts, u32 align) {
    const u64 units = (n + align - 1) / align;
    const u64 at = units * p / parts * align;
    return at < n ? (u32)at : n;
}
// Round half away from zero within the int range, without a libm call.
STRATA_DEVICE i32 strata_round_away(float v) {
    const i32 t = (i32)v;
    const float f = v - (float)t;
    return t + (f >= 0.5f ? 1 : 0) - (f <= -0.5f ? 1 : 0);
}
typedef i8 strata_i8x32 __attribute__((ext_vector_type(32)));
typedef i32 strata_i32x8 __attribute__((ext_vector_type(8)));
typedef float strata_f32x8 __attribute__((ext_vector_type(8)));
{{#if panel_rows}}
// A GEMM panel's vectors: one lane per weight row (STRATA_PANEL_ROWS rows, a register's
// worth of 32-bit lanes), four int8 weights of each row in the i8 form. (Absent where only
// the block decoders are built, without a target.)
#define STRATA_PANEL_ROWS {{panel_rows}}
typedef i32 strata_pi32 __attribute__((ext_vector_type(STRATA_PANEL_ROWS)));
typedef float strata_pf32 __attribute__((ext_vector_type(STRATA_PANEL_ROWS)));
typedef i8 strata_pi8 __attribute__((ext_vector_type(4 * STRATA_PANEL_ROWS)));
{{/if}}
STRATA_DEVICE strata_i8x32 strata_load_i8x32(const void* p) {
    strata_i8x32 v;
    __builtin_memcpy(&v, p, 32);
    return v;
}
STRATA_DEVICE strata_f32x8 strata_load_f32x8(const float* p) {
    strata_f32x8 v;
    __builtin_memcpy(&v, p, 32);
    return v;
}
// A decoded chunk's weight scales as lanes: s0 for the lanes of its first 16 products,
// s1 for the last 16 (see strata_dot32).
STRATA_DEVICE strata_f32x8 strata_halves(float s0, float s1) {
    return strata_f32x8{s0, s0, s0, s0, s1, s1, s1, s1};
}
// e^x to about 2 ulp for |x| < 87 (0 below -87), without a libm call: 2^(x log2 e) as an
// exponent and a degree-6 polynomial of the fraction.
STRATA_DEVICE float strata_host_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float t = x * 1.44269504f;
    const float n = __builtin_floorf(t);
    const float f = (t - n) * 0.69314718f;
    float p = 1.0f / 720.0f;
    p = p * f + 1.0f / 120.0f;
    p = p * f + 1.0f / 24.0f;
    p = p * f + 1.0f / 6.0f;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    return p * __builtin_bit_cast(float, (i32)(n + 127.0f) << 23);
}
// Int8 quants of 32 activations, their scale (max |x| / 127) and the sum of the quants,
// rounded half away from zero as the GPU's quantize_q8 rounds.
STRATA_DEVICE void strata_quantize32(const float* STRATA_RESTRICT x, i8* STRATA_RESTRICT q, float* STRATA_RESTRICT d) {
    float amax = 0.0f;
    for (u32 k = 0; k < 32u; ++k) amax = __builtin_fmaxf(amax, __builtin_fabsf(x[k]));
    const float s = amax / 127.0f, id = s != 0.0f ? 1.0f / s : 0.0f;
    i32 sum = 0;
    for (u32 k = 0; k < 32u; ++k) {
        const i32 v = strata_round_away(x[k] * id);
        q[k] = (i8)v;
        sum += v;
    }
    d[0] = s;
    d[1] = (float)sum;
}
// The sum of a vector's lanes.
STRATA_DEVICE float strata_hsum(strata_f32x8 v) {
    typedef float f32x4 __attribute__((ext_vector_type(4)));
    const f32x4 a = v.lo + v.hi;
    return (a.x + a.z) + (a.y + a.w);
}
// y = x · w / sqrt(mean(x²) + eps) for one row of n.
STRATA_DEVICE void strata_rmsnorm_row(const float* x, const float* w, float* y, u32 n, float eps) {
    float ss = 0.0f;
    for (u32 i = 0; i < n; ++i) ss += x[i] * x[i];
    const float scale = 1.0f / __builtin_sqrtf(ss / (float)n + eps);
    for (u32 i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}
STRATA_DEVICE u16 strata_f32_to_f16(float f) { return __builtin_bit_cast(u16, (_Float16)f); }
