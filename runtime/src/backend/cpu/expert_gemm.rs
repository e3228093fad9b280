//! The grouped expert GEMM reference (`Op::ExpertGemm`): each expert's product with the
//! input rows of the choices grouped to it, its matrix found in the pool through
//! `slot_of`.

use strata_compiler::ops::{self, ExpertInput};

use super::RunError;
use super::gemv::product;
use super::io::OpIo;

/// `y[t·used + j]` = the product of the `j`-th chosen expert of token `t` with its
/// input row (the token's own, or the choice's), for the choices `offsets` and `order`
/// group by expert; rows no valid entry names keep the values `y` had.
pub(super) fn run(op: &ops::ExpertGemm, io: &mut OpIo) -> Result<(), RunError> {
    let ops::ExpertGemm { quant, rows, cols, used, experts, input } = *op;
    let (rows_n, cols_n, used, tokens) = (rows as usize, cols as usize, used as usize, io.scalar("tokens") as usize);
    let offsets = io.ints("offsets", experts as usize + 1);
    let order = io.ints("order", tokens * used);
    let slot_of = io.ints("slot_of", experts as usize);
    let in_rows = if input == ExpertInput::Token { tokens } else { tokens * used };
    let x = io.activations(in_rows * cols_n);
    let matrix = rows_n * quant.row_bytes(u64::from(cols)).unwrap_or(0) as usize;
    let (w, slots) = (io.input("w"), io.scalar("slots") as usize);
    let mut y = io.floats("y", tokens * used * rows_n);
    for e in 0..experts as usize {
        let Some(slot) = usize::try_from(slot_of[e]).ok().filter(|&s| s < slots) else { continue };
        let (lo, hi) = (offsets[e].max(0) as usize, (offsets[e + 1].max(0) as usize).min(order.len()));
        let choices: Vec<usize> = order[lo.min(hi)..hi]
            .iter()
            .filter_map(|&c| usize::try_from(c).ok().filter(|&c| c < tokens * used))
            .collect();
        if choices.is_empty() {
            continue;
        }
        let inputs: Vec<f32> = choices
            .iter()
            .flat_map(|&c| {
                let r = if input == ExpertInput::Token { c / used } else { c };
                x[r * cols_n..(r + 1) * cols_n].iter().copied()
            })
            .collect();
        let out = product(quant, rows, cols, &w[slot * matrix..(slot + 1) * matrix], &inputs, choices.len());
        for (i, &c) in choices.iter().enumerate() {
            y[c * rows_n..(c + 1) * rows_n].copy_from_slice(&out[i * rows_n..(i + 1) * rows_n]);
        }
    }
    io.output_floats("y", &y);
    Ok(())
}
