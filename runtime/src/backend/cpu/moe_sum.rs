//! The `moe_sum` reference: each token's experts' outputs, weighted and summed (after
//! the last layer; inside one, `add_rmsnorm` sums them through [`moe_sum`]).

use super::RunError;
use super::io::OpIo;
use strata_compiler::ops;

/// `y` = [`moe_sum`] of `tokens` tokens' `used` parts of `n`.
pub(super) fn run(op: &ops::MoeSum, io: &mut OpIo) -> Result<(), RunError> {
    let ops::MoeSum { n, used } = *op;
    let (n, k, tokens) = (n as usize, used as usize, io.scalar("tokens") as usize);
    let (parts, weights) = (io.floats("parts", tokens * k * n), io.floats("weights", tokens * k));
    io.output_floats("y", &moe_sum(&parts, &weights, n, k));
    Ok(())
}

/// Rows of `n`: `Σ_j weights[t][j] · parts[t·k + j]`, in ascending `j` (fused multiply-adds
/// from zero, as the kernels sum).
pub(super) fn moe_sum(parts: &[f32], weights: &[f32], n: usize, k: usize) -> Vec<f32> {
    (0..weights.len() / k.max(1) * n)
        .map(|i| {
            let (t, c) = (i / n, i % n);
            (0..k).fold(0f32, |acc, j| weights[t * k + j].mul_add(parts[(t * k + j) * n + c], acc))
        })
        .collect()
}
