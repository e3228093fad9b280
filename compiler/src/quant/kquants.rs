//! The K formats: 256-element super-blocks of 16 or 32-element sub-blocks whose
//! scales (and minimums) are themselves quantized against fp16 super-scales.
//!
//! Layouts follow ggml-common.h; quants of one 128-element half are interleaved so
//! that byte `l` of a 32-byte group carries element `l` of several sub-blocks, one bit
//! field each.

use super::f16_at;

/// Unpacks the eight 6-bit (scale, min) pairs of Q4_K and Q5_K from their 12 bytes:
/// pairs 0-3 sit in the low six bits of bytes 0-3 (scales) and 4-7 (mins); pairs 4-7
/// take their low four bits from the nibbles of bytes 8-11 and their top two bits
/// from the top of bytes 0-7.
pub(super) fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// `{ scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }`: sixteen 16-element
/// sub-blocks with a 4-bit scale (low nibble) and 4-bit min (high nibble) each;
/// 2-bit quants, `y = d * sc * q - dmin * m`.
pub(super) fn q2_k(b: &[u8; 84], y: &mut [f32; 256]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    let mut sub = 0;
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let sc = scales[sub];
                let dl = d * f32::from(sc & 0x0F);
                let ml = dmin * f32::from(sc >> 4);
                let base = 128 * half + 32 * (shift / 2) + 16 * part;
                for l in 0..16 {
                    let v = (q[16 * part + l] >> shift) & 3;
                    y[base + l] = dl * f32::from(v) - ml;
                }
                sub += 1;
            }
        }
    }
}

/// The sixteen signed 6-bit scales of Q3_K: low nibbles from bytes 0-7 (two per byte),
/// top two bits from bytes 8-11 (four per byte), biased by 32.
fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = (s[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// `{ hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }`: sixteen 16-element
/// sub-blocks, 2 low bits in `qs` and the third bit in `hmask` (a clear bit subtracts 4),
/// `y = d * (sc - 32) * q`.
pub(super) fn q3_k(b: &[u8; 110], y: &mut [f32; 256]) {
    let (hmask, qs) = (&b[..32], &b[32..96]);
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    let mut sub = 0;
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for shift in [0usize, 2, 4, 6] {
            let bit = 1u8 << (4 * half + shift / 2);
            for part in 0..2 {
                let dl = d * f32::from(scales[sub]);
                let base = 128 * half + 32 * (shift / 2) + 16 * part;
                for l in 0..16 {
                    let i = 16 * part + l;
                    let low = ((q[i] >> shift) & 3) as i8;
                    let v = low - if hmask[i] & bit != 0 { 0 } else { 4 };
                    y[base + l] = dl * f32::from(v);
                }
                sub += 1;
            }
        }
    }
}

/// `{ d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }`: eight 32-element
/// sub-blocks with 6-bit scale and min; 4-bit quants, 64 elements per 32 bytes (low
/// nibbles first), `y = d * sc * q - dmin * m`.
pub(super) fn q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..]);
    for chunk in 0..4 {
        let q = &qs[32 * chunk..32 * chunk + 32];
        for (nib, shift) in [(0, 0), (1, 4)] {
            let (sc, m) = scale_min_k4(scales, 2 * chunk + nib);
            let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
            for l in 0..32 {
                y[64 * chunk + 32 * nib + l] = d1 * f32::from((q[l] >> shift) & 0x0F) - m1;
            }
        }
    }
}

/// `{ d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }`: Q4_K plus a
/// fifth bit per element, bit `sub` of `qh[l]` for element `l` of sub-block `sub`.
pub(super) fn q5_k(b: &[u8; 176], y: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..]);
    for chunk in 0..4 {
        let q = &qs[32 * chunk..32 * chunk + 32];
        for (nib, shift) in [(0, 0), (1, 4)] {
            let sub = 2 * chunk + nib;
            let (sc, m) = scale_min_k4(scales, sub);
            let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
            for l in 0..32 {
                let v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> sub) & 1) << 4);
                y[64 * chunk + 32 * nib + l] = d1 * f32::from(v) - m1;
            }
        }
    }
}

/// `{ ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }`: sixteen 16-element
/// sub-blocks with signed 8-bit scales; 6-bit quants (4 low bits in `ql`, 2 high bits in
/// `qh`), `y = d * sc * (q - 32)`.
pub(super) fn q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for half in 0..2 {
        let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
        let sc = &sc[8 * half..];
        for l in 0..32 {
            let is = l / 16;
            let quad = [
                (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, q) in quad.into_iter().enumerate() {
                let scale = f32::from(sc[is + 2 * k] as i8);
                y[128 * half + 32 * k + l] = d * scale * f32::from(q as i8 - 32);
            }
        }
    }
}
