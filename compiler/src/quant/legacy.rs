//! The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.
//!
//! Layout (ggml-common.h): an fp16 scale `d` (and an fp16 offset `m` for the `_1`
//! kinds), then the quants. 4-bit quants pack element `j` in the low nibble of byte
//! `j` and element `j + 16` in its high nibble; the `Q5` kinds keep the fifth bit of
//! element `j` in bit `j` of a little-endian u32 `qh`.

use super::{f16_at, u32_at};

/// `{ d: f16, qs: [u8; 16] }`: `y = (q - 8) * d`.
pub(super) fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..].iter().enumerate() {
        y[j] = f32::from((q & 0x0F) as i8 - 8) * d;
        y[j + 16] = f32::from((q >> 4) as i8 - 8) * d;
    }
}

/// `{ d: f16, m: f16, qs: [u8; 16] }`: `y = q * d + m`.
pub(super) fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..].iter().enumerate() {
        y[j] = f32::from(q & 0x0F) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// The two 5-bit quants of byte `j`: elements `j` and `j + 16`.
fn five_bit_pair(qs: &[u8], qh: u32, j: usize) -> (u8, u8) {
    let hi0 = ((qh >> j) & 1) as u8;
    let hi1 = ((qh >> (j + 16)) & 1) as u8;
    ((qs[j] & 0x0F) | (hi0 << 4), (qs[j] >> 4) | (hi1 << 4))
}

/// `{ d: f16, qh: u32, qs: [u8; 16] }`: `y = (q - 16) * d`.
pub(super) fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let (d, qh) = (f16_at(b, 0), u32_at(b, 2));
    for j in 0..16 {
        let (q0, q1) = five_bit_pair(&b[6..], qh, j);
        y[j] = f32::from(q0 as i8 - 16) * d;
        y[j + 16] = f32::from(q1 as i8 - 16) * d;
    }
}

/// `{ d: f16, m: f16, qh: u32, qs: [u8; 16] }`: `y = q * d + m`.
pub(super) fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let (d, m, qh) = (f16_at(b, 0), f16_at(b, 2), u32_at(b, 4));
    for j in 0..16 {
        let (q0, q1) = five_bit_pair(&b[8..], qh, j);
        y[j] = f32::from(q0) * d + m;
        y[j + 16] = f32::from(q1) * d + m;
    }
}

/// `{ d: f16, qs: [i8; 32] }`: `y = q * d`.
pub(super) fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..]) {
        *o = f32::from(q as i8) * d;
    }
}
