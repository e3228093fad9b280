//! Non-finite values in a tensor's bytes, found without decoding it: every element of
//! a float tensor, the fp16 scale(s) of every block of a quantized one. A NaN or an
//! infinity there reaches the logits of every token (and greedy argmax then answers
//! token 0), so the runtime scans at load; reading a few bytes a block keeps the scan a
//! small part of the load.

use super::GgmlType;
use super::random::scale_fields;
use GgmlType as G;

/// The first non-finite value of a tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NonFinite {
    /// Index of the element (float types) or of the block (quantized types).
    pub index: u64,
    /// Whether `index` counts blocks, whose scale is the non-finite value.
    pub in_scale: bool,
    /// The value.
    pub value: f32,
}

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.in_scale {
            true => write!(f, "the scale of block {} is {}", self.index, self.value),
            false => write!(f, "element {} is {}", self.index, self.value),
        }
    }
}

/// The first non-finite element or block scale of `data` (whole blocks of `ty`), or
/// `None`. Types with no fp16 scale field (or none this reader knows) have nothing to
/// find.
pub fn first_non_finite(ty: GgmlType, data: &[u8]) -> Option<NonFinite> {
    let half = |bits: u16| half::f16::from_bits(bits).to_f32();
    let elements = |size: usize, bad: &dyn Fn(&[u8]) -> Option<f32>| {
        data.chunks_exact(size)
            .enumerate()
            .find_map(|(i, c)| bad(c).map(|value| NonFinite { index: i as u64, in_scale: false, value }))
    };
    // Float tensors are read whole: eight bytes at a time first, element by element
    // only where something was found.
    let clean = |lane: u64, exponent: u64| {
        let (m, ones, high) = match lane {
            16 => (exponent * 0x0001_0001_0001_0001, 0x0001_0001_0001_0001u64, 0x8000_8000_8000_8000u64),
            _ => (exponent * 0x0000_0001_0000_0001, 0x0000_0001_0000_0001, 0x8000_0000_8000_0000),
        };
        let (words, tail) = data.split_at(data.len() / 8 * 8);
        // A lane whose exponent bits are all set leaves a zero lane in `(w & m) ^ m`,
        // which the borrow trick finds (never missing one).
        words.chunks_exact(8).all(|c| {
            let y = (u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) & m) ^ m;
            y.wrapping_sub(ones) & !y & high == 0
        }) && tail.is_empty()
    };
    match ty {
        G::F32 if clean(32, 0x7F80_0000) => None,
        G::F16 if clean(16, 0x7C00) => None,
        G::BF16 if clean(16, 0x7F80) => None,
        G::F32 => elements(4, &|c| {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            (!v.is_finite()).then_some(v)
        }),
        // Exponent bits all set: infinity or NaN.
        G::F16 => elements(2, &|c| {
            let bits = u16::from_le_bytes([c[0], c[1]]);
            (bits & 0x7C00 == 0x7C00).then(|| half(bits))
        }),
        G::BF16 => elements(2, &|c| {
            let bits = u16::from_le_bytes([c[0], c[1]]);
            (bits & 0x7F80 == 0x7F80).then(|| f32::from_bits(u32::from(bits) << 16))
        }),
        _ => {
            let size = ty.block_bytes();
            let fields = scale_fields(ty);
            if size == 0 || (fields.is_empty() && ty != G::IQ1_M) {
                return None;
            }
            data.chunks_exact(size).enumerate().find_map(|(i, block)| {
                let bad = |bits: u16| (bits & 0x7C00 == 0x7C00).then(|| half(bits));
                let value = match ty {
                    // IQ1_M's fp16 scale is the top nibbles of its four scale words.
                    G::IQ1_M => bad((0..4).fold(0u16, |acc, w| {
                        let at = 48 + 2 * w;
                        acc | ((u16::from_le_bytes([block[at], block[at + 1]]) >> 12) << (4 * w))
                    })),
                    _ => fields.iter().find_map(|&at| bad(u16::from_le_bytes([block[at], block[at + 1]]))),
                };
                value.map(|value| NonFinite { index: i as u64, in_scale: true, value })
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{SUPPORTED, random_blocks};
    use rand::SeedableRng;

    /// Random valid blocks have finite scales; a NaN or infinity written into any scale
    /// field of any supported type is found in its block, and its dequantized values
    /// are indeed not finite (so the reader's fields are the real ones).
    #[test]
    fn every_types_scales_are_found() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for ty in SUPPORTED {
            let blocks = 4;
            let mut data = vec![0u8; ty.block_bytes() * blocks];
            random_blocks(ty, &mut rng, &mut data, 0.02).expect("valid");
            assert_eq!(first_non_finite(ty, &data), None, "{ty}");
            for bits in [0x7E00u16, 0x7C00, 0xFC00] {
                let mut bad = data.clone();
                let block = &mut bad[2 * ty.block_bytes()..3 * ty.block_bytes()];
                match ty {
                    G::F16 => block[..2].copy_from_slice(&bits.to_le_bytes()),
                    G::F32 => block[..4].copy_from_slice(&f32::from(half::f16::from_bits(bits)).to_le_bytes()),
                    G::BF16 => block[..2].copy_from_slice(
                        &half::bf16::from_f32(half::f16::from_bits(bits).into()).to_bits().to_le_bytes(),
                    ),
                    _ => super::super::random::set_scale(ty, block, bits),
                }
                let found = first_non_finite(ty, &bad).unwrap_or_else(|| panic!("{ty} {bits:#x}: not found"));
                // Block 2, or element 2 of a float type (one element a block).
                assert_eq!(found.index, 2, "{ty}");
                let mut out = vec![0f32; ty.block_len() * blocks];
                ty.dequantize(&bad, &mut out).expect("whole blocks");
                assert!(out.iter().any(|v| !v.is_finite()), "{ty}: the planted value does not reach the weights");
            }
        }
    }
}
