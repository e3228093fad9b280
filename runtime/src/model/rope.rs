//! The rotary-embedding table: (cos, sin) for every position and rotated pair, computed
//! once on the host so every backend rotates by exactly the same angles.

use crate::backend::RunError;

/// `n_ctx × rope_dims` f32 values as little-endian bytes: for position `p` and pair `i`,
/// `cos(p·θᵢ), sin(p·θᵢ)` with `θᵢ = base^(−2i/rope_dims)`.
/// A table that cannot be allocated is an error naming its size, not an abort.
pub fn table(n_ctx: u32, rope_dims: u32, base: f32) -> Result<Vec<u8>, RunError> {
    let pairs = rope_dims / 2;
    let len = (n_ctx as usize).saturating_mul(rope_dims as usize).saturating_mul(4);
    let mut out = Vec::new();
    out.try_reserve_exact(len).map_err(|_| {
        RunError::Other(format!(
            "the RoPE table of {n_ctx} positions × {rope_dims} dims ({len} bytes) cannot be allocated"
        ))
    })?;
    for p in 0..n_ctx {
        for i in 0..pairs {
            let theta = f64::from(p) * f64::from(base).powf(-2.0 * f64::from(i) / f64::from(rope_dims));
            out.extend_from_slice(&(theta.cos() as f32).to_le_bytes());
            out.extend_from_slice(&(theta.sin() as f32).to_le_bytes());
        }
    }
    Ok(out)
}
