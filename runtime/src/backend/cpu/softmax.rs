//! The `softmax` reference: a row-wise softmax in place (the sum in f64).

use super::RunError;
use super::io::OpIo;
use strata_compiler::ops;

/// `x = softmax(x)` for each of `rows` rows of `n`.
pub(super) fn run(op: &ops::Softmax, io: &mut OpIo) -> Result<(), RunError> {
    let ops::Softmax { n } = *op;
    let (n, rows) = (n as usize, io.scalar("rows") as usize);
    let mut x = io.floats("x", rows * n);
    for row in x.chunks_exact_mut(n) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
        for v in row.iter_mut() {
            *v = (f64::from(*v - max).exp() / total) as f32;
        }
    }
    io.output_floats("x", &x);
    Ok(())
}
