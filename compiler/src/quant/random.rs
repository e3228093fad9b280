//! Random valid blocks of every supported type, for synthetic packs and kernel tests.
//!
//! Quant bits are uniformly random (every bit pattern is a valid code in every
//! supported format); only the fp16 scale fields need care: they are set to finite
//! values chosen so the dequantized weights have a realistic root-mean-square.

use rand::{Rng, RngExt};

use super::{GgmlType, QuantError};
use GgmlType as G;

/// Byte offsets of the fp16 scale fields in one block (IQ1_M keeps its scale in the
/// top nibbles of its scale words and is handled apart).
pub(super) fn scale_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        G::Q4_0
        | G::Q5_0
        | G::Q8_0
        | G::IQ2_XXS
        | G::IQ2_XS
        | G::IQ2_S
        | G::IQ3_XXS
        | G::IQ3_S
        | G::IQ1_S
        | G::IQ4_NL
        | G::IQ4_XS => &[0],
        G::Q4_1 | G::Q5_1 | G::Q4_K | G::Q5_K => &[0, 2],
        G::Q2_K => &[80, 82],
        G::Q3_K => &[108],
        G::Q6_K => &[208],
        _ => &[],
    }
}

/// Stores fp16 `bits` as the block's scale(s).
pub(super) fn set_scale(ty: GgmlType, block: &mut [u8], bits: u16) {
    if ty == G::IQ1_M {
        for i in 0..4 {
            let at = 48 + 2 * i;
            let word = u16::from_le_bytes([block[at], block[at + 1]]);
            let nibble = (bits >> (4 * i)) & 0x0F;
            block[at..at + 2].copy_from_slice(&((word & 0x0FFF) | (nibble << 12)).to_le_bytes());
        }
    } else {
        for &at in scale_fields(ty) {
            block[at..at + 2].copy_from_slice(&bits.to_le_bytes());
        }
    }
}

/// Root-mean-square of blocks whose scales are all 1.0: the factor by which the fp16
/// scales must shrink to reach a target magnitude (every format is linear in them).
fn unit_scale_rms(ty: GgmlType, rng: &mut impl Rng) -> Result<f32, QuantError> {
    const SAMPLE: usize = 32;
    let mut bytes = vec![0u8; SAMPLE * ty.block_bytes()];
    rng.fill_bytes(&mut bytes);
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        set_scale(ty, block, half::f16::ONE.to_bits());
    }
    let mut values = vec![0f32; SAMPLE * ty.block_len()];
    ty.dequantize(&bytes, &mut values)?;
    let mean_square = values.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / values.len() as f64;
    Ok(mean_square.sqrt() as f32)
}

/// Fills `out` with random valid blocks of `ty` whose values have roughly the given
/// root-mean-square; each block's scale is drawn within a factor of two of it.
///
/// `out.len()` must be a whole number of blocks. Plain number types get normally
/// distributed values (F16 and BF16 rounded to nearest).
pub fn random_blocks(ty: GgmlType, rng: &mut impl Rng, out: &mut [u8], rms: f32) -> Result<(), QuantError> {
    let size = ty.block_bytes();
    if !out.len().is_multiple_of(size) {
        return Err(QuantError::Length { ty, bytes: out.len(), values: 0 });
    }
    match ty {
        G::F32 => {
            for chunk in out.chunks_exact_mut(4) {
                chunk.copy_from_slice(&(normal(rng) * rms).to_le_bytes());
            }
        }
        G::F16 => {
            for chunk in out.chunks_exact_mut(2) {
                chunk.copy_from_slice(&half::f16::from_f32(normal(rng) * rms).to_le_bytes());
            }
        }
        G::BF16 => {
            for chunk in out.chunks_exact_mut(2) {
                chunk.copy_from_slice(&half::bf16::from_f32(normal(rng) * rms).to_le_bytes());
            }
        }
        _ if ty.is_supported() => {
            let unit = unit_scale_rms(ty, rng)?;
            rng.fill_bytes(out);
            for block in out.chunks_exact_mut(size) {
                let jitter = rng.random_range(0.5f32..2.0);
                let scale = half::f16::from_f32(rms / unit * jitter);
                set_scale(ty, block, scale.to_bits());
            }
        }
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}

/// `n` normally distributed f32 values with the given root-mean-square.
pub fn random_floats(rng: &mut impl Rng, n: usize, rms: f32) -> Vec<f32> {
    (0..n).map(|_| normal(rng) * rms).collect()
}

/// One standard normal sample (Box-Muller; statistical quality is not critical here).
fn normal(rng: &mut impl Rng) -> f32 {
    let u1: f32 = rng.random_range(f32::EPSILON..1.0);
    let u2: f32 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::SUPPORTED;
    use rand::SeedableRng;

    #[test]
    fn every_supported_type_reaches_its_rms_with_finite_values() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for ty in SUPPORTED {
            let blocks = 64 * 256 / ty.block_len();
            let mut bytes = vec![0u8; blocks * ty.block_bytes()];
            random_blocks(ty, &mut rng, &mut bytes, 0.02).expect("supported");
            let mut values = vec![0f32; blocks * ty.block_len()];
            ty.dequantize(&bytes, &mut values).expect("whole blocks");
            assert!(values.iter().all(|v| v.is_finite()), "{ty}");
            let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
            assert!((0.01..0.05).contains(&rms), "{ty}: rms {rms}");
        }
    }

    #[test]
    fn same_seed_same_blocks() {
        let draw = |seed| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut bytes = vec![0u8; 4 * 56];
            random_blocks(G::IQ1_M, &mut rng, &mut bytes, 0.02).expect("supported");
            bytes
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }
}
