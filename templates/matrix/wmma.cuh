// ---- strata matrix unit: AMD RDNA3 WMMA (gfx11, wave32), f16 in, f32 accumulate --
// One V_WMMA_F32_16X16X16_F16 per 16x16 tile (RDNA3 ISA, "Wave Matrix Multiply
// Accumulate"): lane l holds row l % 16 of A and column l % 16 of B, all 16 k as eight
// f16 pairs (lanes 16-31 repeat lanes 0-15); accumulator element i of lane l is
// C[2i + l / 16][l % 16]. `strata_wmma_f16` is the prelude's: the instruction on HIP,
// an exact emulation of it (same registers, warp shuffles) on CUDA.
#define STRATA_MMA_ACC 8u

// acc += A·Bᵀ over k < 16 on the wave's 16x16 tile: A is 16 rows of 16 f16 at
// a[r * lda + k], B 16 columns of 16 f16 at b[n * ldb + k] (shared memory, lda and ldb
// even). Every lane of the wave calls it.
STRATA_DEVICE void strata_mma16(float* acc, const u16* a, u32 lda, const u16* b, u32 ldb) {
    const u32 l = strata_thread() % 16u;
    const u32* ar = (const u32*)(a + l * lda);
    const u32* br = (const u32*)(b + l * ldb);
    u32 af[8], bf[8];
#pragma unroll
    for (u32 i = 0; i < 8u; ++i) af[i] = ar[i], bf[i] = br[i];
    strata_wmma_f16(acc, af, bf);
}
// The tile row and column that acc[i] of `lane` holds.
STRATA_DEVICE u32 strata_mma_row(u32 lane, u32 i) { return 2u * i + lane % 32u / 16u; }
STRATA_DEVICE u32 strata_mma_col(u32 lane, u32 i) { return lane % 16u; }
