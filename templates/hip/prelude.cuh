// ---- strata prelude: HIP (clang, no ROCm headers) --------------------------------
// Maps the few primitives the vendor-neutral kernel bodies use to AMDGPU builtins.
// Target {{target}} ({{arch}}), wave size {{wave_size}}.
#define STRATA_KERNEL(threads) extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(1, threads)))
// Blocks a CU must hold at once: the CUDA prelude's launch bounds; nothing here yet (no
// AMD kernel asks for more than one).
#define STRATA_KERNEL_BLOCKS(threads, blocks) STRATA_KERNEL(threads)
#define STRATA_DEVICE static __attribute__((device)) __attribute__((always_inline)) inline
#define STRATA_SHARED __attribute__((shared))
#define STRATA_TABLE static __attribute__((device)) const
#define STRATA_RESTRICT __restrict__
// Whether any address loads at full speed (no: decoders load aligned words and shift).
#define STRATA_UNALIGNED_LOADS 0
// A pointer the caller guarantees 16-byte aligned (float rows of whole chunks), so that
// copies from it become wide loads.
#define STRATA_ALIGNED16(p) ((const u8*)__builtin_assume_aligned((p), 16))
#define STRATA_WAVE {{wave_size}}u

STRATA_DEVICE u32 strata_thread(void) { return __builtin_amdgcn_workitem_id_x(); }
STRATA_DEVICE u32 strata_block_x(void) { return __builtin_amdgcn_workgroup_id_x(); }
STRATA_DEVICE u32 strata_block_y(void) { return __builtin_amdgcn_workgroup_id_y(); }
STRATA_DEVICE u32 strata_block_z(void) { return __builtin_amdgcn_workgroup_id_z(); }
// s_barrier between a work-group release and acquire fence (HIP's __syncthreads).
STRATA_DEVICE void strata_barrier(void) {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// The wave's lanes meet (they run in lockstep; the fences order LDS among them).
STRATA_DEVICE void strata_wave_barrier(void) {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
STRATA_DEVICE u32 strata_lane(void) { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }
// ds_bpermute reads lane (index / 4) of the wave: the butterfly of CUDA's shfl.bfly.
STRATA_DEVICE i32 strata_shfl_xor_i32(i32 v, u32 mask) {
    return __builtin_amdgcn_ds_bpermute((i32)((strata_lane() ^ mask) << 2), v);
}
STRATA_DEVICE float strata_shfl_xor(float v, u32 mask) {
    return __builtin_bit_cast(float, strata_shfl_xor_i32(__builtin_bit_cast(i32, v), mask));
}
STRATA_DEVICE float strata_f16_to_f32(u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
STRATA_DEVICE u16 strata_f32_to_f16(float f) { return __builtin_bit_cast(u16, (_Float16)f); }
STRATA_DEVICE float strata_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
// Approximate math: v_exp_f32 and v_rsq_f32 (about 1 ulp).
STRATA_DEVICE float strata_exp(float x) { return __builtin_amdgcn_exp2f(x * 1.4426950408889634f); }
STRATA_DEVICE float strata_rsqrt(float x) { return __builtin_amdgcn_rsqf(x); }
// A kernel's dynamic shared memory: one array, sized at launch.
#define STRATA_DYNAMIC_SHARED(type, name) extern __attribute__((shared)) __attribute__((aligned(16))) type name[]
// gfx9-gfx11 have no asynchronous copy to LDS: common.cuh's synchronous
// strata_copy16_async serves.
// A scheduling fence: memory accesses may not move across it, and `v` must be final
// here. Placed after a group of loads and the arithmetic consuming them, it bounds how
// many loaded values are live at once (and so the registers of wide unrolled loops).
STRATA_DEVICE void strata_fence_value(float* v) { __asm__ volatile("" : "+v"(*v) : : "memory"); }
// c + the four signed byte products of a and b: V_DOT4_I32_IU8 with both operands signed
// on gfx11 (no V_DOT4_I32_I8 there), V_DOT4_I32_I8 elsewhere; plain code on a target with
// neither (the plan then never picks the int8 dot path).
STRATA_DEVICE i32 strata_dot4(i32 a, i32 b, i32 c) {
{{#if sudot4}}
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
{{else if sdot4}}
    return __builtin_amdgcn_sdot4(a, b, c, false);
{{else}}
    for (u32 k = 0; k < 32; k += 8) c += (i32)(i8)(a >> k) * (i32)(i8)(b >> k);
    return c;
{{/if}}
}
// Kernels run in stream order on AMD (no programmatic dependent launch): nothing to wait for.
STRATA_DEVICE void strata_await_inputs(void) {}
STRATA_DEVICE u32 strata_atomic_add(i32* p, i32 v) { return (u32)__atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
// Orders this thread's global reads and writes before and after it for the whole device
// (CUDA's __threadfence): a block's stores, this fence, a barrier and one thread's atomic
// publish them to a block that sees the atomic's count and then fences too.
STRATA_DEVICE void strata_fence_device(void) { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }
{{#if wmma}}
// acc[0..7] += A·B on RDNA3's matrix unit (V_WMMA_F32_16X16X16_F16, wave32): a and b are
// the lane's 16 f16 of A's row and B's column as pairs (templates/matrix/wmma.cuh).
typedef _Float16 strata_h16 __attribute__((ext_vector_type(16)));
typedef float strata_f8 __attribute__((ext_vector_type(8)));
typedef u32 strata_u8w __attribute__((ext_vector_type(8)));
STRATA_DEVICE void strata_wmma_f16(float* acc, const u32* a, const u32* b) {
    const strata_u8w va = {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]};
    const strata_u8w vb = {b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]};
    strata_f8 c = {acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]};
    c = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(__builtin_bit_cast(strata_h16, va), __builtin_bit_cast(strata_h16, vb), c);
    for (u32 i = 0; i < 8u; ++i) acc[i] = c[i];
}
{{/if}}
{{#if mfma}}
// acc[0..3] += A·B on CDNA's matrix unit (V_MFMA_F32_16X16X16F16, wave64): (a0, a1) and
// (b0, b1) are the lane's four f16 of A and of B as pairs (templates/matrix/mfma.cuh).
typedef _Float16 strata_h4 __attribute__((ext_vector_type(4)));
typedef float strata_mfma_f4 __attribute__((ext_vector_type(4)));
typedef u32 strata_u2w __attribute__((ext_vector_type(2)));
STRATA_DEVICE void strata_mfma_f16(float* acc, u32 a0, u32 a1, u32 b0, u32 b1) {
    const strata_u2w va = {a0, a1}, vb = {b0, b1};
    strata_mfma_f4 c = {acc[0], acc[1], acc[2], acc[3]};
    c = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(strata_h4, va), __builtin_bit_cast(strata_h4, vb), c, 0, 0, 0);
    for (u32 i = 0; i < 4u; ++i) acc[i] = c[i];
}
{{/if}}
