// ---- strata prelude: CUDA (clang, no CUDA headers) -------------------------------
// Maps the few primitives the vendor-neutral kernel bodies use to NVVM builtins.
// Target {{target}} ({{arch}}), warp size {{wave_size}}.
#define STRATA_KERNEL(threads) extern "C" __attribute__((global)) __attribute__((launch_bounds(threads)))
// A kernel of which an SM must hold `blocks` blocks at once: registers within their share.
#define STRATA_KERNEL_BLOCKS(threads, blocks) \
    extern "C" __attribute__((global)) __attribute__((launch_bounds(threads, blocks)))
#define STRATA_DEVICE static __attribute__((device)) __attribute__((always_inline)) inline
#define STRATA_SHARED __attribute__((shared))
// Lookup tables live in global memory (read through L1), not in .const: the constant
// cache serializes a warp's lookups of different entries, which IQ grid lookups are.
#define STRATA_TABLE static __attribute__((device))
#define STRATA_RESTRICT __restrict__
// Whether any address loads at full speed (no: decoders load aligned words and shift).
#define STRATA_UNALIGNED_LOADS 0
// A pointer the caller guarantees 16-byte aligned (float rows of whole chunks), so that
// copies from it become wide loads.
#define STRATA_ALIGNED16(p) ((const u8*)__builtin_assume_aligned((p), 16))
#define STRATA_WAVE {{wave_size}}u

STRATA_DEVICE u32 strata_thread(void) { return __nvvm_read_ptx_sreg_tid_x(); }
STRATA_DEVICE u32 strata_block_x(void) { return __nvvm_read_ptx_sreg_ctaid_x(); }
STRATA_DEVICE u32 strata_block_y(void) { return __nvvm_read_ptx_sreg_ctaid_y(); }
STRATA_DEVICE u32 strata_block_z(void) { return __nvvm_read_ptx_sreg_ctaid_z(); }
// bar.sync 0: block-wide barrier with shared-memory ordering (CUDA's __syncthreads).
STRATA_DEVICE void strata_barrier(void) { __nvvm_barrier_sync(0); }
// bar.warp.sync: the wave's lanes meet, with shared-memory ordering among them.
STRATA_DEVICE void strata_wave_barrier(void) { __nvvm_bar_warp_sync(0xffffffffu); }
STRATA_DEVICE float strata_shfl_xor(float v, u32 mask) {
    return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, mask, 0x1f);
}
STRATA_DEVICE i32 strata_shfl_xor_i32(i32 v, u32 mask) {
    return __nvvm_shfl_sync_bfly_i32(0xffffffffu, v, mask, 0x1f);
}
STRATA_DEVICE float strata_f16_to_f32(u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
STRATA_DEVICE u16 strata_f32_to_f16(float f) { return __builtin_bit_cast(u16, (_Float16)f); }
STRATA_DEVICE float strata_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
// Approximate math: ex2.approx and rsqrt.approx (about 2 ulp).
STRATA_DEVICE float strata_exp(float x) { return __nvvm_ex2_approx_f(x * 1.4426950408889634f); }
STRATA_DEVICE float strata_rsqrt(float x) { return __nvvm_rsqrt_approx_f(x); }
// A kernel's dynamic shared memory: one array, sized at launch.
#define STRATA_DYNAMIC_SHARED(type, name) extern __attribute__((shared)) __attribute__((aligned(16))) type name[]
// Copies 16 bytes from global to shared memory (both 16-byte aligned) in the background,
// the first `bytes` of them read and the rest zeroed; strata_copy_commit closes a group
// of copies, and STRATA_COPY_WAIT(n) waits until at most n of this thread's groups are
// in flight. Other threads see the bytes after a barrier that follows the wait. (Without
// cp.async, as for a gfx1100 kernel run here, common.cuh's synchronous copy serves.)
{{#if cp_async}}
STRATA_DEVICE void strata_copy16_async(void* dst, const void* src, u32 bytes) {
    u64 to;
    __asm__("cvta.to.shared.u64 %0, %1;" : "=l"(to) : "l"(dst));
    __asm__ volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" : : "r"((u32)to), "l"(src), "r"(bytes) : "memory");
}
STRATA_DEVICE void strata_copy_commit(void) { __asm__ volatile("cp.async.commit_group;" : : : "memory"); }
#define STRATA_COPY_WAIT(n) __asm__ volatile("cp.async.wait_group %0;" : : "n"(n) : "memory")
#define STRATA_COPY_ASYNC 1
{{/if}}
// A scheduling fence: memory accesses may not move across it, and `v` must be final
// here. Placed after a group of loads and the arithmetic consuming them, it bounds how
// many loaded values are live at once (and so the registers of wide unrolled loops).
STRATA_DEVICE void strata_fence_value(float* v) { __asm__ volatile("" : "+f"(*v) : : "memory"); }
// c + the four signed byte products of a and b (dp4a.s32.s32, sm_61 on). Every NVIDIA
// target has it, so wave32 AMD kernels rendered here (sdot4 / sudot4 with both operands
// signed: the same sum) run their own int8 dot code unchanged.
STRATA_DEVICE i32 strata_dot4(i32 a, i32 b, i32 c) {
    i32 r;
    __asm__("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
// Called by every kernel before it touches what an earlier kernel wrote or reads; only
// immutable data (weights, grids) may be loaded before it. With griddepcontrol the host
// launches kernels as programmatic dependents: this waits until the kernel before has
// finished and its writes are visible, then lets the next kernel's blocks start to launch
// (they prefetch their weights while this one drains).
{{#if grid_dependency}}
STRATA_DEVICE void strata_await_inputs(void) {
    __asm__ volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
}
{{else}}
STRATA_DEVICE void strata_await_inputs(void) {}
{{/if}}
STRATA_DEVICE u32 strata_atomic_add(i32* p, i32 v) { return (u32)__atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
// Orders this thread's global reads and writes before and after it for the whole device
// (CUDA's __threadfence): a block's stores, this fence, a barrier and one thread's atomic
// publish them to a block that sees the atomic's count and then fences too.
STRATA_DEVICE void strata_fence_device(void) { __nvvm_membar_gl(); }
{{#if wmma}}
// RDNA3's V_WMMA_F32_16X16X16_F16 emulated exactly, for gfx11 kernels rendered here
// (cross-vendor execution): the same per-lane registers as the HIP prelude's
// instruction (templates/matrix/wmma.cuh). Lane l holds row l % 16 of A and column
// l % 16 of B as eight f16 pairs; it computes its accumulators C[2i + l / 16][l % 16]
// with A's row read from lane 2i + l / 16 by shuffles, k in ascending order.
STRATA_DEVICE void strata_wmma_f16(float* acc, const u32* a, const u32* b) {
    const u32 lane = strata_thread() % 32u;
#pragma unroll
    for (u32 i = 0; i < 8u; ++i) {
        const u32 src = 2u * i + lane / 16u;
        float s = acc[i];
#pragma unroll
        for (u32 w = 0; w < 8u; ++w) {
            const u32 aw = (u32)__nvvm_shfl_sync_idx_i32(0xffffffffu, (i32)a[w], src, 0x1f);
            s = strata_fma(strata_f16_to_f32((u16)aw), strata_f16_to_f32((u16)b[w]), s);
            s = strata_fma(strata_f16_to_f32((u16)(aw >> 16)), strata_f16_to_f32((u16)(b[w] >> 16)), s);
        }
        acc[i] = s;
    }
}
{{/if}}
