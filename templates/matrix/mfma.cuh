// ---- strata matrix unit: AMD CDNA MFMA (gfx90a, gfx942; wave64), f16 in, f32 acc --
// One V_MFMA_F32_16X16X16F16 per 16x16 tile (CDNA2/3 ISA, "Matrix Fused Multiply-Add";
// AMD Matrix Instruction Calculator): lane l holds A[l % 16][4 (l / 16) + j] and
// B[4 (l / 16) + j][l % 16] for j < 4 as two f16 pairs each; accumulator element j of
// lane l is C[4 (l / 16) + j][l % 16]. `strata_mfma_f16` is the HIP prelude's.
#define STRATA_MMA_ACC 4u

// acc += A·Bᵀ over k < 16 on the wave's 16x16 tile: A is 16 rows of 16 f16 at
// a[r * lda + k], B 16 columns of 16 f16 at b[n * ldb + k] (shared memory, lda and ldb
// even). Every lane of the wave calls it.
STRATA_DEVICE void strata_mma16(float* acc, const u16* a, u32 lda, const u16* b, u32 ldb) {
    const u32 lane = strata_thread() % STRATA_WAVE, l = lane % 16u, k = 4u * (lane / 16u);
    const u32* ar = (const u32*)(a + l * lda + k);
    const u32* br = (const u32*)(b + l * ldb + k);
    strata_mfma_f16(acc, ar[0], ar[1], br[0], br[1]);
}
// The tile row and column that acc[i] of `lane` holds.
STRATA_DEVICE u32 strata_mma_row(u32 lane, u32 i) { return 4u * (lane % 64u / 16u) + i; }
STRATA_DEVICE u32 strata_mma_col(u32 lane, u32 i) { return lane % 16u; }
