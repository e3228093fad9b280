//! The `add` reference: element-wise sum, optionally with a row broadcast.

use super::RunError;
use super::io::OpIo;
use strata_compiler::ops;

/// `y = a + b` for `tokens` rows of `n`; with `broadcast`, `b` is one row added to each.
pub(super) fn run(op: &ops::Add, io: &mut OpIo) -> Result<(), RunError> {
    let ops::Add { n, broadcast } = *op;
    let (n, tokens) = (n as usize, io.scalar("tokens") as usize);
    let a = io.floats("a", n * tokens);
    let b = io.floats("b", if broadcast { n } else { n * tokens });
    let y: Vec<f32> = (0..n * tokens).map(|i| a[i] + b[if broadcast { i % n } else { i }]).collect();
    io.output_floats("y", &y);
    Ok(())
}
