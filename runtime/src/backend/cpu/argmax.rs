//! The `argmax` reference: greedy sampling's index of the largest logit per row; the
//! rule itself is [`argmax`].

use super::RunError;
use super::io::OpIo;
use strata_compiler::ops;

/// `out[r]` = [`argmax`] of row `r` of `rows` rows of `n` of `x`.
pub(super) fn run(op: &ops::Argmax, io: &mut OpIo) -> Result<(), RunError> {
    let ops::Argmax { n } = *op;
    let (n, rows) = (n as usize, io.scalar("rows") as usize);
    let x = io.floats("x", rows * n);
    let out: Vec<i32> = x.chunks_exact(n).map(|row| argmax(row) as i32).collect();
    io.output_ints("out", &out);
    Ok(())
}

/// Index of the largest value (the first on ties).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}
