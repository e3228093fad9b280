//! The `add_rmsnorm` reference: the residual sum, normalized, optionally quantized; in a
//! mixture-of-experts layer the second addend is the experts' weighted sum, in Gemma the
//! block's output normed.

use super::io::OpIo;
use super::moe_sum::moe_sum;
use super::rmsnorm::rmsnorm;
use super::{RunError, quantize_q8};
use strata_compiler::ops;

/// `sum = a + b` (or `a` + the `experts` weighted `parts`, or `a + rmsnorm(b) · wb`) and `y = rmsnorm(sum)`, for
/// `rows` rows of `n`; with `q8`, `y` quantized as well.
pub(super) fn run(op: &ops::AddRmsNorm, io: &mut OpIo) -> Result<(), RunError> {
    let ops::AddRmsNorm { n, eps, q8, experts, norm_b } = *op;
    let (n, rows, k) = (n as usize, io.scalar("rows") as usize, experts as usize);
    let a = io.floats("a", rows * n);
    let b = if k > 0 {
        moe_sum(&io.floats("parts", rows * k * n), &io.floats("weights", rows * k), n, k)
    } else if norm_b {
        rmsnorm(&io.floats("b", rows * n), &io.floats("wb", n), n, eps)
    } else {
        io.floats("b", rows * n)
    };
    let sum: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
    let y = rmsnorm(&sum, &io.floats("w", n), n, eps);
    if q8 {
        quantize_q8::output(&y, io);
    }
    io.output_floats("y", &y);
    io.output_floats("sum", &sum);
    Ok(())
}
