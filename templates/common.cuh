// ---- strata common: vendor-neutral helpers over the prelude's primitives ---------
#define STRATA_CHECKED {{#if checked}}1{{else}}0{{/if}}

// Four floats, loaded and stored as one 16-byte access.
typedef float strata_f4 __attribute__((ext_vector_type(4)));

// Sum over the wave (butterfly: every lane ends with the total, in the same order).
STRATA_DEVICE float strata_wave_sum(float v) {
    for (u32 m = STRATA_WAVE / 2; m > 0; m >>= 1) v += strata_shfl_xor(v, m);
    return v;
}
STRATA_DEVICE float strata_wave_max(float v) {
    for (u32 m = STRATA_WAVE / 2; m > 0; m >>= 1) v = __builtin_fmaxf(v, strata_shfl_xor(v, m));
    return v;
}

// Little-endian loads from byte addresses of any alignment.
STRATA_DEVICE u32 strata_ld16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
STRATA_DEVICE u32 strata_ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
STRATA_DEVICE float strata_f16_at(const u8* p) { return strata_f16_to_f32((u16)strata_ld16(p)); }

#if STRATA_CHECKED
// --checked: every global access is tested first; the first violation is recorded as
// [count, kernel, buffer, index low, index high, block x, block y, thread] and the
// access is skipped instead of faulting.
#define STRATA_ERR_PARAM , i32* STRATA_RESTRICT strata_err
STRATA_DEVICE bool strata_check(i32* err, u32 kernel, u32 buffer, u64 index, u64 extent) {
    if (index < extent) return true;
    if (strata_atomic_add(err, 1) == 0) {
        err[1] = (i32)kernel;
        err[2] = (i32)buffer;
        err[3] = (i32)(u32)index;
        err[4] = (i32)(u32)(index >> 32);
        err[5] = (i32)strata_block_x();
        err[6] = (i32)strata_block_y();
        err[7] = (i32)strata_thread();
    }
    return false;
}
#define STRATA_CHECK(kernel, buffer, index, extent) strata_check(strata_err, kernel, buffer, (u64)(index), (u64)(extent))
#define STRATA_GUARD(kernel, buffer, index, extent) STRATA_CHECK(kernel, buffer, index, extent)
#else
#define STRATA_ERR_PARAM
// Accesses the plan proves in bounds are not tested outside --checked builds ...
#define STRATA_CHECK(kernel, buffer, index, extent) true
// ... but ones that depend on runtime arguments (positions, token ids) always are.
#define STRATA_GUARD(kernel, buffer, index, extent) ((u64)(index) < (u64)(extent))
#endif

// The (scale, min) pair j of Q4_K / Q5_K from their 12 packed bytes: pairs 0-3 in the
// low six bits of bytes 0-3 and 4-7; pairs 4-7 from the nibbles of bytes 8-11 plus the
// top two bits of bytes 0-7.
STRATA_DEVICE void strata_scale_min_k4(const u8* sc, u32 j, u32* s, u32* m) {
    if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

// The eight sign bits of a 7-bit IQ sign index: the index plus a parity bit.
STRATA_DEVICE u32 strata_ksigns(u32 i) {
    i &= 127;
    return i | ((u32)(__builtin_popcount(i) & 1) << 7);
}
