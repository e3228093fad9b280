//! The expert GEMV reference (`Op::ExpertGemv`): the GEMV of each expert in the window's
//! routing union, over the columns of the tokens that chose it, with the expert's matrix
//! found in the pool through `slot_of`.

use rayon::prelude::*;

use strata_compiler::ops::{self, ExpertInput, RouteLayout};

use super::RunError;
use super::io::{OpIo, dot};

/// `y[t·used + j]` = the product of the `j`-th chosen expert of token `t` with its
/// input column (the token's own, or the `j`-th of `used` per-choice columns); entries
/// that no pooled expert writes keep the values `y` had.
pub(super) fn run(op: &ops::ExpertGemv, io: &mut OpIo) -> Result<(), RunError> {
    let ops::ExpertGemv { quant, rows, cols, window, used, experts, input: which } = *op;
    let (rows, cols, window, used) = (rows as usize, cols as usize, window as usize, used as usize);
    let layout = RouteLayout::new(experts, used as u32);
    let route = io.ints("route", layout.len() as usize);
    let slot_of = io.ints("slot_of", experts as usize);
    let in_rows = if which == ExpertInput::Token { window } else { window * used };
    let x = io.activations(in_rows * cols);
    let row_bytes = quant.row_bytes(cols as u64).unwrap_or(0) as usize;
    let (w, slots) = (io.input("w"), io.scalar("slots") as usize);
    let mut y = io.floats("y", window * used * rows);
    for u in 0..(route[0].max(0) as usize).min(layout.union(window as u32) as usize) {
        let expert = route[1 + u];
        let Some(&slot) = usize::try_from(expert).ok().and_then(|e| slot_of.get(e)) else { continue };
        let Ok(slot) = usize::try_from(slot) else { continue };
        if slot >= slots {
            continue;
        }
        let matrix = &w[slot * rows * row_bytes..(slot + 1) * rows * row_bytes];
        let columns: Vec<(usize, usize)> = (0..window)
            .filter_map(|t| {
                let j = usize::try_from(route[layout.pick(u as u32, t as u32) as usize]).ok()?;
                let input = if which == ExpertInput::Token { t } else { t * used + j };
                Some((t * used + j, input))
            })
            .collect();
        let results: Vec<Vec<f32>> = (0..rows)
            .into_par_iter()
            .map(|r| {
                let mut wr = vec![0f32; cols];
                let _ = quant.dequantize(&matrix[r * row_bytes..(r + 1) * row_bytes], &mut wr);
                columns.iter().map(|&(_, i)| dot(&wr, &x[i * cols..(i + 1) * cols])).collect()
            })
            .collect();
        for (r, values) in results.iter().enumerate() {
            for (&(out, _), v) in columns.iter().zip(values) {
                y[out * rows + r] = *v;
            }
        }
    }
    io.output_floats("y", &y);
    Ok(())
}
