//! The IQ formats: quants that index lattice grids (see `grids`), with sign bits
//! stored separately, plus the non-linear 4-bit IQ4 kinds.
//!
//! Sign fields: IQ2_XXS, IQ2_XS and IQ3_XXS store 7 sign bits per 8 elements and the
//! eighth is the parity of those seven (an even number of negatives), as ggml's
//! `ksigns_iq2xs` table encodes; IQ2_S and IQ3_S store all eight bits.

use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::{f16_at, u16_at, u32_at};

/// The non-linear 4-bit codebook of IQ4_NL and IQ4_XS.
pub const IQ4NL_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Offset added to every IQ1 grid value before scaling (`IQ1S_DELTA`).
pub const IQ1_DELTA: f32 = 0.125;

/// The eight sign bits encoded by a 7-bit sign index: the index itself plus a parity
/// bit, so the count of negative signs is even.
pub const fn ksigns(index: u32) -> u8 {
    let i = (index & 127) as u8;
    i | (((i.count_ones() & 1) as u8) << 7)
}

/// Element `j` of a grid point that packs one byte per element.
fn grid_byte(point: u64, j: usize) -> u8 {
    (point >> (8 * j)) as u8
}

/// ±1 for bit `j` of a sign byte (set means negative).
fn sign(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 { -1.0 } else { 1.0 }
}

/// Writes 8 elements `db * grid[j] * sign[j]` of an 8-wide grid point.
fn put8(y: &mut [f32], db: f32, point: u64, signs: u8) {
    for (j, o) in y[..8].iter_mut().enumerate() {
        *o = db * f32::from(grid_byte(point, j)) * sign(signs, j);
    }
}

/// `{ d: f16, qs: [u16; 32] }`: per 32 elements, 4 bytes of grid indices (8-wide points
/// of IQ2XXS_GRID) then a u32 of four 7-bit sign indices and a 4-bit scale in the top
/// bits: `db = d * (0.5 + s) * 0.25`.
pub(super) fn iq2_xxs(b: &[u8; 66], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let q = &b[2 + 8 * ib..10 + 8 * ib];
        let aux = u32_at(q, 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for l in 0..4 {
            let point = IQ2XXS_GRID[usize::from(q[l])];
            put8(&mut y[32 * ib + 8 * l..], db, point, ksigns(aux >> (7 * l)));
        }
    }
}

/// `{ d: f16, qs: [u16; 32], scales: [u8; 8] }`: each u16 is a 9-bit index into
/// IQ2XS_GRID and a 7-bit sign index; a 4-bit scale per 16 elements,
/// `db = d * (0.5 + s) * 0.25`.
pub(super) fn iq2_xs(b: &[u8; 74], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let s = b[66 + ib];
        let db = [s & 0x0F, s >> 4].map(|s| d * (0.5 + f32::from(s)) * 0.25);
        for l in 0..4 {
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            let point = IQ2XS_GRID[usize::from(q & 511)];
            put8(&mut y[32 * ib + 8 * l..], db[l / 2], point, ksigns(u32::from(q >> 9)));
        }
    }
}

/// `{ d: f16, qs: [u8; 32], signs: [u8; 32], qh: [u8; 8], scales: [u8; 8] }`: 10-bit
/// indices into IQ2S_GRID (8 low bits in `qs`, 2 high bits per index in `qh`), one full
/// sign byte per 8 elements, a 4-bit scale per 16 elements.
pub(super) fn iq2_s(b: &[u8; 82], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for ib in 0..8 {
        let s = scales[ib];
        let db = [s & 0x0F, s >> 4].map(|s| d * (0.5 + f32::from(s)) * 0.25);
        for l in 0..4 {
            let high = (usize::from(qh[ib]) << (8 - 2 * l)) & 0x300;
            let point = IQ2S_GRID[usize::from(qs[4 * ib + l]) | high];
            put8(&mut y[32 * ib + 8 * l..], db[l / 2], point, signs[4 * ib + l]);
        }
    }
}

/// `{ d: f16, qs: [u8; 64], scales_signs: [u32; 8] }`: per 32 elements, 8 indices of
/// 4-wide IQ3XXS_GRID points and a u32 of four 7-bit sign indices plus a 4-bit scale,
/// `db = d * (0.5 + s) * 0.5`.
pub(super) fn iq3_xxs(b: &[u8; 98], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let q = &b[2 + 8 * ib..10 + 8 * ib];
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = ksigns(aux >> (7 * l));
            let points = [IQ3XXS_GRID[usize::from(q[2 * l])], IQ3XXS_GRID[usize::from(q[2 * l + 1])]];
            let out = &mut y[32 * ib + 8 * l..32 * ib + 8 * l + 8];
            for (j, o) in out.iter_mut().enumerate() {
                let magnitude = grid_byte(u64::from(points[j / 4]), j % 4);
                *o = db * f32::from(magnitude) * sign(signs, j);
            }
        }
    }
}

/// `{ d: f16, qs: [u8; 64], qh: [u8; 8], signs: [u8; 32], scales: [u8; 4] }`: 9-bit
/// indices of 4-wide IQ3S_GRID points (the ninth bit in `qh`), full sign bytes, and a
/// 4-bit scale per 32 elements, `db = d * (1 + 2 * s)`.
pub(super) fn iq3_s(b: &[u8; 110], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    for ib in 0..8 {
        let s = (scales[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let db = d * f32::from(1 + 2 * s);
        for l in 0..4 {
            let q = &qs[8 * ib + 2 * l..];
            let h = usize::from(qh[ib]);
            let points = [
                IQ3S_GRID[usize::from(q[0]) | ((h << (8 - 2 * l)) & 256)],
                IQ3S_GRID[usize::from(q[1]) | ((h << (7 - 2 * l)) & 256)],
            ];
            let sg = signs[4 * ib + l];
            let out = &mut y[32 * ib + 8 * l..32 * ib + 8 * l + 8];
            for (j, o) in out.iter_mut().enumerate() {
                let magnitude = grid_byte(u64::from(points[j / 4]), j % 4);
                *o = db * f32::from(magnitude) * sign(sg, j);
            }
        }
    }
}

/// Writes 8 elements `dl * (grid[j] + delta)` of a ternary IQ1 grid point.
fn put8_ternary(y: &mut [f32], dl: f32, point: u64, delta: f32) {
    for (j, o) in y[..8].iter_mut().enumerate() {
        *o = dl * (f32::from(grid_byte(point, j) as i8) + delta);
    }
}

/// `{ d: f16, qs: [u8; 32], qh: [u16; 8] }`: per 32 elements, four 11-bit indices into
/// IQ1S_GRID (low 8 bits in `qs`, 3 high bits each in `qh`), a 3-bit scale
/// (`dl = d * (2 s + 1)`) and the sign of the delta in the top bit of `qh`.
pub(super) fn iq1_s(b: &[u8; 50], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
        for l in 0..4 {
            let index = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            put8_ternary(&mut y[32 * ib + 8 * l..], dl, IQ1S_GRID[index], delta);
        }
    }
}

/// The fp16 super-scale of IQ1_M, spread over the top nibbles of its four scale words.
fn iq1_m_scale(sc: [u16; 4]) -> f32 {
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    half::f16::from_bits(bits).to_f32()
}

/// `{ qs: [u8; 32], qh: [u8; 16], scales: [u8; 8] }`: per 8 elements an 11-bit index into
/// IQ1S_GRID (3 high bits and the delta sign in a nibble of `qh`); per 16 elements a
/// 3-bit scale in the scale words, whose top nibbles form the fp16 super-scale.
pub(super) fn iq1_m(b: &[u8; 56], y: &mut [f32; 256]) {
    let (qs, qh) = (&b[..32], &b[32..48]);
    let sc = [0, 1, 2, 3].map(|i| u16_at(b, 48 + 2 * i));
    let d = iq1_m_scale(sc);
    for ib in 0..8 {
        let word = sc[ib / 2];
        let shift = 6 * (ib % 2);
        let dl = [shift, shift + 3].map(|s| d * f32::from(2 * ((word >> s) & 7) + 1));
        for l in 0..4 {
            let nibble = usize::from(qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0x0F;
            let index = usize::from(qs[4 * ib + l]) | ((nibble & 7) << 8);
            let delta = if nibble & 8 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
            put8_ternary(&mut y[32 * ib + 8 * l..], dl[l / 2], IQ1S_GRID[index], delta);
        }
    }
}

/// `{ d: f16, qs: [u8; 16] }`: 4-bit indices into the IQ4 codebook, `y = d * v`.
pub(super) fn iq4_nl(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..].iter().enumerate() {
        y[j] = d * f32::from(IQ4NL_VALUES[usize::from(q & 0x0F)]);
        y[j + 16] = d * f32::from(IQ4NL_VALUES[usize::from(q >> 4)]);
    }
}

/// `{ d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128] }`: IQ4_NL codes with a
/// 6-bit scale per 32 elements (4 low bits in `scales_l`, 2 high in `scales_h`),
/// `y = d * (s - 32) * v`.
pub(super) fn iq4_xs(b: &[u8; 136], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2);
    let (scales_l, qs) = (&b[4..8], &b[8..]);
    for ib in 0..8 {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * f32::from((low | (high << 4)) as i8 - 32);
        for (j, &q) in qs[16 * ib..16 * ib + 16].iter().enumerate() {
            y[32 * ib + j] = dl * f32::from(IQ4NL_VALUES[usize::from(q & 0x0F)]);
            y[32 * ib + j + 16] = dl * f32::from(IQ4NL_VALUES[usize::from(q >> 4)]);
        }
    }
}
