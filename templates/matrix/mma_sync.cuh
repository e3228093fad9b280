// ---- strata matrix unit: NVIDIA mma.sync (sm_80 on), f16 in, f32 accumulate ------
// One 16x16 tile, k = 16: two mma.sync.m16n8k16 (columns 0-7, then 8-15). Fragments
// (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4, q = lane % 4, the
// lower half of each f16x2 register holding the element of lower index:
//   A (row): {A[g][2q..2q+1], A[g+8][2q..2q+1], A[g][2q+8..2q+9], A[g+8][2q+8..2q+9]}
//   B (col): {B[2q..2q+1][g], B[2q+8..2q+9][g]}
//   C: c[0..1] = C[g][2q..2q+1], c[2..3] = C[g+8][2q..2q+1]
#define STRATA_MMA_ACC 8u

// acc += A·Bᵀ over k < 16 on the wave's 16x16 tile: A is 16 rows of 16 f16 at
// a[r * lda + k], B 16 columns of 16 f16 at b[n * ldb + k] (shared memory, lda and ldb
// even). Every lane of the wave calls it. The asm is not volatile: mma has no effect
// but its outputs, so fragments loaded for one tile are reused by the next.
STRATA_DEVICE void strata_mma16(float* acc, const u16* a, u32 lda, const u16* b, u32 ldb) {
    const u32 lane = strata_thread() % STRATA_WAVE, g = lane / 4u, q = lane % 4u;
    const u32 a0 = *(const u32*)(a + g * lda + 2u * q), a1 = *(const u32*)(a + (g + 8u) * lda + 2u * q);
    const u32 a2 = *(const u32*)(a + g * lda + 2u * q + 8u), a3 = *(const u32*)(a + (g + 8u) * lda + 2u * q + 8u);
#pragma unroll
    for (u32 h = 0; h < 2u; ++h) {
        const u16* bn = b + (8u * h + g) * ldb + 2u * q;
        const u32 b0 = *(const u32*)bn, b1 = *(const u32*)(bn + 8);
        float* c = acc + 4u * h;
        __asm__(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}
// c += A·B on one 16x8 tile, k = 16, operands already in registers as the fragments
// above (A: a[0..3], B: b0, b1). A C fragment pair of two adjacent 16x8 tiles, rounded
// to f16 pairs, is the A fragment of the next product over their 16 columns.
STRATA_DEVICE void strata_mma_f16_k16(float* c, const u32* a, u32 b0, u32 b1) {
    __asm__("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Four 8x8 f16 matrices from shared memory, transposed (ldmatrix .trans): lane l names
// row l % 8 of matrix l / 8 (16 bytes at `row`); r[m] of lane (g, q) then holds elements
// [2q][g] and [2q + 1][g] of matrix m, the B fragment of a row-major k x n operand.
STRATA_DEVICE void strata_ldmatrix_x4_trans(u32* r, const u16* row) {
    u64 at;
    __asm__("cvta.to.shared.u64 %0, %1;" : "=l"(at) : "l"(row));
    __asm__ volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"((u32)at)
                     : "memory");
}
// The tile row and column that acc[i] of `lane` holds.
STRATA_DEVICE u32 strata_mma_row(u32 lane, u32 i) { return lane / 4u + 8u * ((i / 2u) % 2u); }
STRATA_DEVICE u32 strata_mma_col(u32 lane, u32 i) { return 8u * (i / 4u) + 2u * (lane % 4u) + i % 2u; }
// Int8 (s8 x s8, s32 accumulate), one 16x8 tile: k = 32 (m16n8k32) or k = 16
// (m16n8k16). Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k32" / "m16n8k16",
// .s8), four consecutive k in a register, the lowest in its low byte:
//   A (row): {A[g][4q..4q+3], A[g+8][4q..4q+3], A[g][16+4q..], A[g+8][16+4q..]} (k16: the first two)
//   B (col): {B[4q..4q+3][g], B[16+4q..16+4q+3][g]} (k16: the first)
//   C: c[0..1] = C[g][2q..2q+1], c[2..3] = C[g+8][2q..2q+1]
STRATA_DEVICE void strata_mma_i8_k32(i32* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    __asm__("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
STRATA_DEVICE void strata_mma_i8_k16(i32* c, u32 a0, u32 a1, u32 b0) {
    __asm__("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a0), "r"(a1), "r"(b0));
}
// Int8 m16n8k32 whose sums come out as floats with no conversion instruction (int-to-float
// issues at a fraction of the multiply-add rate): the accumulators start at the bits of
// STRATA_I8_BIAS = 1.5 * 2^23, so each ends as the float STRATA_I8_BIAS + sum, exactly,
// while |sum| < 2^22 (a chunk's is at most 32 * 128 * 127). fma(c[i], d, -STRATA_I8_BIAS * d)
// is then sum * d rounded once, as d * (float)sum is (the bias times an f16 scale is exact).
#define STRATA_I8_BIAS 12582912.0f
// Each column's own start: s0 for column 2q, s1 for 2q + 1 (floats of integer value near
// STRATA_I8_BIAS, whose bits the integer sums add to). A start of STRATA_I8_BIAS - z · (the
// column's chunk sum) takes a zero point z out of the weights' bytes: Σ (b - z) x =
// Σ b x - z Σ x, exactly, while both stay within 2^22 of the bias.
STRATA_DEVICE void strata_mma_i8_started(float* c, float s0, float s1, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    const i32 t0 = __builtin_bit_cast(i32, s0), t1 = __builtin_bit_cast(i32, s1);
    i32 s[4] = {t0, t1, t0, t1};
    strata_mma_i8_k32(s, a0, a1, a2, a3, b0, b1);
#pragma unroll
    for (u32 i = 0; i < 4u; ++i) c[i] = __builtin_bit_cast(float, s[i]);
}
// Every column started at the bias.
STRATA_DEVICE void strata_mma_i8_biased(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    strata_mma_i8_started(c, STRATA_I8_BIAS, STRATA_I8_BIAS, a0, a1, a2, a3, b0, b1);
}
// The starts of a k16 product over weight bytes that keep a zero point z (0 < z < 128):
// each column's STRATA_I8_BIAS bits less z times the sum of its 16 inputs in b0, as the
// product of bytes -z with them (the same for rows g and g + 8).
STRATA_DEVICE void strata_mma_i8_k16_zero(i32* s, u32 z, u32 b0) {
    const u32 a = ((0u - z) & 0xFFu) * 0x01010101u;
#pragma unroll
    for (u32 i = 0; i < 4u; ++i) s[i] = 0x4B400000;
    strata_mma_i8_k16(s, a, a, b0);
}
// An m16n8k16 product from those starts, read as biased floats (strata_mma_i8_biased's).
STRATA_DEVICE void strata_mma_i8_k16_from(float* c, const i32* start, u32 a0, u32 a1, u32 b0) {
    i32 s[4] = {start[0], start[1], start[2], start[3]};
    strata_mma_i8_k16(s, a0, a1, b0);
#pragma unroll
    for (u32 i = 0; i < 4u; ++i) c[i] = __builtin_bit_cast(float, s[i]);
}
// strata_mma_i8_biased for m16n8k16 (one 16-element half of a chunk: |sum| <= 16 * 128 * 127).
STRATA_DEVICE void strata_mma_i8_k16_biased(float* c, u32 a0, u32 a1, u32 b0) {
    i32 s[4] = {0x4B400000, 0x4B400000, 0x4B400000, 0x4B400000};
    strata_mma_i8_k16(s, a0, a1, b0);
#pragma unroll
    for (u32 i = 0; i < 4u; ++i) c[i] = __builtin_bit_cast(float, s[i]);
}
