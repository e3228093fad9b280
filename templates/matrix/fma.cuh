// ---- strata matrix unit: none (plain fused multiply-adds) -------------------------
// Targets without matrix instructions: lane l of the wave computes the 256 / wave
// elements C[r][n] of the 16x16 tile with r * 16 + n ≡ l (mod wave), k in order.
#define STRATA_MMA_ACC (256u / STRATA_WAVE)

// acc += A·Bᵀ over k < 16 on the wave's 16x16 tile: A is 16 rows of 16 f16 at
// a[r * lda + k], B 16 columns of 16 f16 at b[n * ldb + k] (shared memory). Every lane
// of the wave calls it.
STRATA_DEVICE void strata_mma16(float* acc, const u16* a, u32 lda, const u16* b, u32 ldb) {
    const u32 lane = strata_thread() % STRATA_WAVE;
#pragma unroll
    for (u32 i = 0; i < STRATA_MMA_ACC; ++i) {
        const u32 e = i * STRATA_WAVE + lane, r = e / 16u, n = e % 16u;
        float s = acc[i];
#pragma unroll
        for (u32 k = 0; k < 16u; ++k) s = strata_fma(strata_f16_to_f32(a[r * lda + k]), strata_f16_to_f32(b[n * ldb + k]), s);
        acc[i] = s;
    }
}
// The tile row and column that acc[i] of `lane` holds.
STRATA_DEVICE u32 strata_mma_row(u32 lane, u32 i) { return (i * STRATA_WAVE + lane) / 16u; }
STRATA_DEVICE u32 strata_mma_col(u32 lane, u32 i) { return (i * STRATA_WAVE + lane) % 16u; }
