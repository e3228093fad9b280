// ---- strata prelude: host (clang, C++) --------------------------------------------
// Runs the vendor-neutral quant decoders on the CPU, one lane at a time, so tests check
// them against the CPU reference without a GPU. Threads, barriers and shuffles do not
// exist here: calling one traps.
#define STRATA_DEVICE static inline __attribute__((always_inline))
#define STRATA_TABLE static const
#define STRATA_RESTRICT __restrict__
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
