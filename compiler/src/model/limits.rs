//! The ranges a model's hyperparameters must lie in, and the checks that refuse a value
//! outside them with the key, the value and the range.
//!
//! The bounds are generous for real models but keep every product the runtime and the
//! kernels form from them (heads × head length, positions as i32, ...) far from
//! overflow, and refuse values no computation can use: a NaN epsilon would reach the
//! kernels as a `NaNf` literal, a zero context would be silently raised to 1.

use crate::pack::PackErrorKind;

/// Transformer blocks, at most.
pub const MAX_LAYERS: u32 = 4096;
/// Embedding width, FFN widths and vocabulary-independent row lengths, at most.
pub const MAX_WIDTH: u32 = 1 << 20;
/// Query (and KV) heads, at most.
pub const MAX_HEADS: u32 = 4096;
/// Key or value length of one head, at most.
pub const MAX_HEAD_DIM: u32 = 1024;
/// Experts per layer, at most.
pub const MAX_EXPERTS: u32 = 4096;
/// Training context, at most: positions travel to the kernels as `i32`.
pub const MAX_CONTEXT: u32 = i32::MAX as u32;
/// Largest RMSNorm epsilon accepted (real models use 1e-6 to 1e-5).
pub const MAX_RMS_EPS: f64 = 1.0;
/// Largest RoPE base accepted (real models use 1e4 to 1e8).
pub const MAX_ROPE_BASE: f64 = 1e12;

/// `v` if it lies in `lo..=hi`, else an error naming `key`, the value and the range.
pub fn int_in(key: &str, v: u32, lo: u32, hi: u32) -> Result<u32, PackErrorKind> {
    if (lo..=hi).contains(&v) {
        return Ok(v);
    }
    Err(PackErrorKind::key(key, format!("{v} is out of range (allowed: {lo} to {hi})")))
}

/// `v` as f32 if it is finite, above 0 and at most `max`, else an error naming `key`,
/// the value and the range.
pub fn positive_in(key: &str, v: f64, max: f64) -> Result<f32, PackErrorKind> {
    // The f32 is what kernels see: a value that only overflows or flushes to zero as
    // f32 is as unusable as one that is out of range as f64.
    let f = v as f32;
    if v.is_finite() && v > 0.0 && v <= max && f > 0.0 {
        return Ok(f);
    }
    Err(PackErrorKind::key(key, format!("{v} is out of range (allowed: a finite value above 0 and at most {max:e})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_outside_the_range_are_named() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -1e-5, 2.0, 1e-300] {
            let e = positive_in("k", bad, 1.0).expect_err("refused").to_string();
            assert!(e.starts_with("key k: ") && e.contains("allowed: a finite value above 0"), "{e}");
        }
        assert_eq!(positive_in("k", 1e-5, 1.0), Ok(1e-5));
        assert_eq!(
            int_in("k", 0, 1, 4).expect_err("refused").to_string(),
            "key k: 0 is out of range (allowed: 1 to 4)"
        );
    }
}
