//! Plain number types: F32, F16 and BF16 stored one element at a time.

/// Copies little-endian f32 values.
pub(super) fn f32s(bytes: &[u8], out: &mut [f32]) {
    let (words, _) = bytes.as_chunks::<4>();
    for (w, o) in words.iter().zip(out) {
        *o = f32::from_le_bytes(*w);
    }
}

/// Widens IEEE half floats (exact for every value, subnormals included).
pub(super) fn f16s(bytes: &[u8], out: &mut [f32]) {
    let (halves, _) = bytes.as_chunks::<2>();
    for (h, o) in halves.iter().zip(out) {
        *o = half::f16::from_le_bytes(*h).to_f32();
    }
}

/// Widens bfloat16: the value is the top half of an f32.
pub(super) fn bf16s(bytes: &[u8], out: &mut [f32]) {
    let (halves, _) = bytes.as_chunks::<2>();
    for (h, o) in halves.iter().zip(out) {
        *o = f32::from_bits(u32::from(u16::from_le_bytes(*h)) << 16);
    }
}
