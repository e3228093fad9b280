//! The `rmsnorm` reference, and the row norm [`rmsnorm`] that `add_rmsnorm` shares.

use super::RunError;
use super::io::OpIo;
use strata_compiler::ops;

/// Normalizes `rows` rows of `n` of `x` into `y`; with `qk = [q, k]`, each period of
/// `q + k` rows takes its first `q` rows with the first `n` weights (the query norm) and
/// the rest with the second (the key norm).
pub(super) fn run(op: &ops::RmsNorm, io: &mut OpIo) -> Result<(), RunError> {
    let ops::RmsNorm { n, eps, qk } = *op;
    let (n, rows) = (n as usize, io.scalar("rows") as usize);
    let (x, w) = (io.floats("x", rows * n), io.floats("w", if qk.is_some() { 2 * n } else { n }));
    let y = match qk {
        None => rmsnorm(&x, &w, n, eps),
        // Each row with its own weights: the query norm, then the key norm.
        Some([q, k]) => x
            .chunks_exact(n)
            .enumerate()
            .flat_map(|(r, row)| {
                let (period, queries) = ((q + k) as usize, q as usize);
                let half = if r % period < queries { 0 } else { n };
                rmsnorm(row, &w[half..half + n], n, eps)
            })
            .collect(),
    };
    io.output_floats("y", &y);
    Ok(())
}

/// `x · w / sqrt(mean(x²) + eps)` for each row of `n` (the mean in f64).
pub(super) fn rmsnorm(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (row, out) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let mean = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n as f64;
        let scale = (1.0 / (mean + f64::from(eps)).sqrt()) as f32;
        for i in 0..n {
            out[i] = row[i] * scale * w[i];
        }
    }
    y
}
