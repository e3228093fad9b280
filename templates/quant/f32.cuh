// F32: plain floats. A chunk is 128 bytes at a multiple of 128 from a row start, and rows
// of whole chunks start 16-byte aligned: eight wide loads.
STRATA_DEVICE void strata_dequant32_f32(const u8* STRATA_RESTRICT row, u32 chunk, float* w) {
    __builtin_memcpy(w, STRATA_ALIGNED16(row + 128u * chunk), 128);
}
