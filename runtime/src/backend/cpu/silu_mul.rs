//! The `silu_mul` reference: the gated activation (SiLU or tanh GELU) of a feed-forward layer, from separate
//! gate and up rows or from paired (gate·up) rows as an expert product writes them.

use super::io::OpIo;
use super::{RunError, quantize_q8};
use strata_compiler::ops;

/// `y = act(gate) · up` for `tokens` rows of `n`; with `q8`, `y` quantized as well.
pub(super) fn run(op: &ops::SiluMul, io: &mut OpIo) -> Result<(), RunError> {
    let ops::SiluMul { n, q8, paired, act } = *op;
    let (n, tokens) = (n as usize, io.scalar("tokens") as usize);
    let len = n * tokens;
    let (g, u) = if paired {
        let rows = io.floats("gate_up", 2 * len);
        let half =
            |i: usize| -> Vec<f32> { rows.chunks_exact(2 * n).flat_map(|r| r[i * n..(i + 1) * n].to_vec()).collect() };
        (half(0), half(1))
    } else {
        (io.floats("gate", len), io.floats("up", len))
    };
    let y: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| act.apply(g) * u).collect();
    if q8 {
        quantize_q8::output(&y, io);
    }
    io.output_floats("y", &y);
    Ok(())
}
