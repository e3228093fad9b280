//! The `quantize_q8` reference: int8 quants of activations with per-chunk scales, the
//! input of the int8-dot GEMV; ops that can quantize their own output
//! (`add_rmsnorm`, `silu_mul`, `attention_merge`) store it through [`output`].

use super::RunError;
use super::io::{OpIo, f32_bytes};
use strata_compiler::ops;

/// Quantizes `rows` rows of `cols` of `x` into `xq` and `xd`.
pub(super) fn run(op: &ops::QuantizeQ8, io: &mut OpIo) -> Result<(), RunError> {
    let ops::QuantizeQ8 { cols } = *op;
    let (cols, rows) = (cols as usize, io.scalar("rows") as usize);
    let y = io.floats("x", rows * cols);
    output(&y, io);
    Ok(())
}

/// Stores `y` quantized as outputs `xq` (quants) and `xd` (scales and sums).
pub(super) fn output(y: &[f32], io: &mut OpIo) {
    let (xq, xd) = quantize_q8(y);
    io.output("xq", xq);
    io.output("xd", f32_bytes(&xd));
}

/// Int8 quants of `x` per 32-element chunk, and per chunk (scale, sum of quants), exactly
/// as the `quantize_q8` kernel makes them: scale = max |x| / 127, quant = round(x · (1 /
/// scale)) half away from zero, all zero where the scale is.
pub fn quantize_q8(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut xq = Vec::with_capacity(x.len());
    let mut xd = Vec::with_capacity(x.len() / 16);
    for chunk in x.chunks(32) {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for v in chunk {
            let q = (v * id).round() as i32;
            sum += q;
            xq.push(q as i8 as u8);
        }
        xd.extend([d, sum as f32]);
    }
    (xq, xd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_quants_round_half_away_from_zero_with_the_chunk_scale() {
        let mut x = vec![0f32; 64];
        x[0] = 1.27; // the chunk's scale is 0.01
        x[1] = -0.005; // -0.5 quants: away from zero
        x[2] = 0.635;
        let (q, d) = quantize_q8(&x);
        assert_eq!(&q[..3], &[127u8, (-1i8) as u8, 64]);
        assert!((d[0] - 0.01).abs() < 1e-9);
        assert_eq!(d[1], 190.0, "the sum of the chunk's quants");
        assert_eq!(&d[2..], &[0.0, 0.0], "an all-zero chunk has scale 0 and quants 0");
    }
}
