// ---- strata common: vendor-neutral helpers over the prelude's primitives ---------
#define STRATA_CHECKED {{#if checked}}1{{else}}0{{/if}}

// Four floats, loaded and stored as one 16-byte access.
typedef float strata_f4 __attribute__((ext_vector_type(4)));
// Sixteen and eight bytes as words: the units of wide coalesced loads.
typedef u32 strata_u4 __attribute__((ext_vector_type(4)));
typedef u32 strata_u2 __attribute__((ext_vector_type(2)));

// Copies 16 bytes from global to shared memory (both 16-byte aligned), the first `bytes`
// of them read and the rest zeroed, as a load and a store, where the prelude has no
// asynchronous copy (STRATA_COPY_ASYNC): committing and waiting are then nothing. Other
// threads see the bytes after a barrier.
#ifndef STRATA_COPY_ASYNC
STRATA_DEVICE void strata_copy16_async(void* dst, const void* src, u32 bytes) {
    typedef u32 words __attribute__((ext_vector_type(4)));
    words v = {0u, 0u, 0u, 0u};
    if (bytes >= 16u) {
        v = *(const words*)src;
    } else {
#pragma unroll
        for (u32 i = 0; i < 16u; ++i) {
            if (i < bytes) v[i / 4u] |= (u32)((const u8*)src)[i] << (8u * (i % 4u));
        }
    }
    *(words*)dst = v;
}
STRATA_DEVICE void strata_copy_commit(void) {}
#define STRATA_COPY_WAIT(n) ((void)(n))
#endif

// Where a product's output (column t of `columns`, row `row` of `rows`) lands. Matrices
// stacked in one product (the second from row s1, the third from s2; 0: none) each keep
// their outputs [t][own rows], one matrix after another, as if each were made alone.
STRATA_DEVICE u64 strata_out_at(u32 t, u32 row, u32 columns, u32 rows, u32 s1, u32 s2) {
    const u32 start = s2 != 0u && row >= s2 ? s2 : s1 != 0u && row >= s1 ? s1 : 0u;
    const u32 end = s1 != 0u && row < s1 ? s1 : s2 != 0u && row < s2 ? s2 : rows;
    return (u64)start * columns + (u64)t * (end - start) + (row - start);
}

// Sum over the wave (butterfly: every lane ends with the total, in the same order).
STRATA_DEVICE float strata_wave_sum(float v) {
    for (u32 m = STRATA_WAVE / 2; m > 0; m >>= 1) v += strata_shfl_xor(v, m);
    return v;
}
STRATA_DEVICE float strata_wave_max(float v) {
    for (u32 m = STRATA_WAVE / 2; m > 0; m >>= 1) v = __builtin_fmaxf(v, strata_shfl_xor(v, m));
    return v;
}

// Quantizes v to int8 as quantize_q8 does, one element a lane, where each aligned group
// of 32 lanes holds one 32-element chunk (its element j in lane j % 32; every lane of
// the group active): the lane's quant goes to xq[at]; the chunk's first lane writes
// (scale, sum of quants) to xd[at / 16 ..]; lanes with `store` false write nothing.
// For kernels that make a GEMV's input.
STRATA_DEVICE void strata_quantize_chunk(float v, u8* STRATA_RESTRICT xq, float* STRATA_RESTRICT xd, u64 at, bool store) {
    float amax = __builtin_fabsf(v);
    for (u32 m = 16; m > 0; m >>= 1) amax = __builtin_fmaxf(amax, strata_shfl_xor(amax, m));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const i32 q = (i32)__builtin_roundf(v * id);
    i32 sum = q;
    for (u32 m = 16; m > 0; m >>= 1) sum += strata_shfl_xor_i32(sum, m);
    if (!store) return;
    xq[at] = (u8)(q & 0xFF);
    if (at % 32u == 0) {
        xd[at / 16u] = d;
        xd[at / 16u + 1u] = (float)sum;
    }
}

// An order-preserving key of a score: a larger float has a larger key (-0 counts as +0).
STRATA_DEVICE u32 strata_score_key(float s) {
    const u32 bits = __builtin_bit_cast(u32, s + 0.0f);
    return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// The sum of v over the threads before `tid` of a block of n, through scan[2n] in shared
// memory (a Hillis-Steele scan, ping-ponging its halves); every thread of the block calls it.
STRATA_DEVICE u32 strata_block_exclusive_sum(u32 v, u32* scan, u32 tid, u32 n) {
    u32 src = 0;
    scan[tid] = v;
    strata_barrier();
    for (u32 off = 1; off < n; off <<= 1) {
        const u32 dst = src ^ n;
        scan[dst + tid] = scan[src + tid] + (tid >= off ? scan[src + tid - off] : 0u);
        src = dst;
        strata_barrier();
    }
    const u32 before = scan[src + tid] - v;
    strata_barrier();
    return before;
}

// Little-endian loads from byte addresses of any alignment.
STRATA_DEVICE u32 strata_ld16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
STRATA_DEVICE u32 strata_ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
STRATA_DEVICE float strata_f16_at(const u8* p) { return strata_f16_to_f32((u16)strata_ld16(p)); }

// Paged KV caches: a sequence's positions are stored a block of `page` positions a pool page; the row of the
// page table `pages` of its cache slot (n_pages entries) names the page of each block, and a position's row in
// the pool is its page times `page` plus its place in the block.
STRATA_DEVICE u32 strata_kv_page(const i32* pages, u32 slot, u32 n_pages, u32 block) {
    return (u32)pages[(u64)slot * n_pages + block];
}
STRATA_DEVICE u64 strata_kv_row(const i32* pages, u32 slot, u32 n_pages, u32 p, u32 page) {
    return (u64)strata_kv_page(pages, slot, n_pages, p / page) * page + p % page;
}

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

// The sign bytes of four IQ2/IQ3 groups from their 7-bit sign indices side by side in
// bits 0-27 of s: byte k holds group k's seven signs and, as bit 7, their parity (the
// ksigns table's even count of negatives), all four at once.
STRATA_DEVICE u32 strata_ksigns4(u32 s) {
    const u32 t = (s & 0x7Fu) | ((s << 1) & 0x7F00u) | ((s << 2) & 0x7F0000u) | ((s << 3) & 0x7F000000u);
    u32 p = t ^ (t >> 4); // bit 0 of each byte ends as the parity of the byte's bits 0-6
    p ^= p >> 2;
    p ^= p >> 1;
    return t | ((p & 0x01010101u) << 7);
}

// ---- int8 dot helpers (for strata_decode32_<type> in quant/) ----
// The four bytes of g, byte k negated where bit k of s (bits 0-3) is set: the nibble's
// four shifted copies never overlap, so the multiply spreads bit k to byte k; then
// ~g + 1 per byte, which never carries since IQ2/IQ3 grid bytes lie in 1..127.
STRATA_DEVICE i32 strata_iq_sign4(u32 g, u32 s) {
    const u32 b = ((s & 15u) * 0x00204081u) & 0x01010101u;
    return (i32)((g ^ (b * 0xFFu)) + b);
}
// The 32 bytes of w (grid bytes, 1..127) with byte i negated where bit i of signs is set:
// four bytes at a time unless the prelude has a whole-vector way (STRATA_SIGNS32).
#ifndef STRATA_SIGNS32
STRATA_DEVICE void strata_iq_signs32(i32* w, u32 signs) {
#pragma unroll
    for (u32 k = 0; k < 8; ++k) w[k] = strata_iq_sign4((u32)w[k], signs >> (4 * k));
}
#endif

// The eight words at p (16-byte aligned) by two 16-byte loads.
STRATA_DEVICE void strata_ld8w(const void* STRATA_RESTRICT p, u32* v) {
    const strata_u4 a = ((const strata_u4*)p)[0], b = ((const strata_u4*)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
// Bits sh .. sh + 31 of the 64-bit lo | hi << 32 (sh < 32): a funnel shift (one
// SHF.R.U64 after ptxas on sm_90, one v_lshrrev_b64 or v_alignbit on AMD).
STRATA_DEVICE u32 strata_funnel(u32 lo, u32 hi, u32 sh) { return (u32)((((u64)hi << 32) | lo) >> sh); }
// v[i] = the little-endian word at p + 4i shifted right by rs (< 16; its top rs bits are
// unspecified), i < n, for p 2-byte aligned with odd = 1 when p % 4 == 2, else 0: n
// aligned u32 loads from p - 2 * odd and a u16 load at p + 4n - 2, then funnel shifts.
// Reads only p - 2 * odd .. p + 4n, so within any 4-byte aligned run that holds p .. p + 4n.
STRATA_DEVICE void strata_words2(const u8* STRATA_RESTRICT p, u32 odd, u32 rs, u32 n, u32* v) {
#if STRATA_UNALIGNED_LOADS
    // A CPU loads any address at full speed: the words as they lie.
    for (u32 i = 0; i < n; ++i) {
        u32 w;
        __builtin_memcpy(&w, p + 4 * i, 4);
        v[i] = w >> rs;
    }
#else
    const u32* a = (const u32*)(p - 2 * odd);
    const u32 sh = 16 * odd + rs;
    u32 lo = a[0];
#pragma unroll
    for (u32 i = 0; i < n; ++i) {
        const u32 hi = i + 1 < n ? a[i + 1] : (u32)*(const u16*)(p + 4 * n - 2);
        v[i] = strata_funnel(lo, hi, sh);
        lo = hi;
    }
#endif
}
// strata_scale_min_k4 without branches, from the 12 scale bytes as three words: all
// four pairs of the chosen half are assembled bytewise, then byte j % 4 is taken.
STRATA_DEVICE void strata_scale_min_k4_w(u32 s0, u32 s1, u32 s2, u32 j, u32* s, u32* m) {
    const u32 sh = 8 * (j & 3);
    const u32 hs = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
    const u32 hm = ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
    *s = (((j & 4) ? hs : s0) >> sh) & 0x3F;
    *m = (((j & 4) ? hm : s1) >> sh) & 0x3F;
}
// 32 weights of one chunk decoded once for any number of input columns: integer weights
// four to an i32, word k holding weights 4k .. 4k + 3 as signed bytes (strata_dot4's
// operands, signed on every target: unsigned values below 128, nibbles among them, read
// the same), and the chunk's dot with int8 quants q (sum of quants qsum) is
//   a * (float)(s0 * Σ_{i<16} w_i q_i + s1 * Σ_{i>=16} w_i q_i) + b * (float)qsum.
// strata_decode32_<type> in quant/ makes one; the integer sums are exact (|w| <= 127,
// |q| <= 127, |s| <= 128: under 2^26).
struct strata_w32 {
    i32 w[8];
    i32 s0, s1;
    float a, b;
};
// A lane's share of a chunk as an int8 matrix-unit operand (the A fragment of mma.sync
// m16n8k32 row-major, lane q of a quad): lo = weights 4q .. 4q + 3, hi = weights
// 16 + 4q .. 16 + 4q + 3, signed bytes as stored (0 .. 127 where z > 0); weight =
// d · (byte - z) + m in the first 16-element half, d2 · (byte - z) + m in the second
// (d2 = d but where ops::gemm::q8_decoder_terms says the halves have scales of their
// own), m = 0 where it says the type has no offset (the GEMV then reads none), z the
// type's zero point (rules::fragment_zero; a constant, so code for z = 0 drops its
// terms). strata_frag8_<type> in quant/ makes one, for the types of rules::MMA_FRAGMENTS.
struct strata_frag8 {
    u32 lo, hi;
    float d, m;
    u32 z;
    float d2;
};
// The fragment with its zero point taken out of the bytes (each byte b - z, which for
// b + 128 - z below 256 carries into no other byte; flipping bit 7 then subtracts 128).
STRATA_DEVICE strata_frag8 strata_frag8_signed(strata_frag8 f) {
    if (f.z != 0u) {
        const u32 up = (128u - f.z) * 0x01010101u;
        f.lo = (f.lo + up) ^ 0x80808080u;
        f.hi = (f.hi + up) ^ 0x80808080u;
        f.z = 0u;
    }
    return f;
}
// The dot of a decoded chunk with one column's quants q (16-byte aligned) summing to qsum.
STRATA_DEVICE float strata_dot_w32(const strata_w32& c, const i32* STRATA_RESTRICT q, i32 qsum) {
    u32 x[8];
    strata_ld8w(q, x);
    i32 lo = 0, hi = 0;
#pragma unroll
    for (u32 k = 0; k < 4; ++k) {
        lo = strata_dot4(c.w[k], (i32)x[k], lo);
        hi = strata_dot4(c.w[k + 4], (i32)x[k + 4], hi);
    }
    const float v = c.a * (float)(c.s0 * lo + c.s1 * hi);
    // A decoder's constant b = 0 drops the term (and the caller's load of qsum) once inlined.
    if (__builtin_constant_p(c.b) && c.b == 0.0f) return v;
    return v + c.b * (float)qsum;
}
