//! The `embed` reference: token embedding rows, dequantized from the table.

use super::RunError;
use super::io::{OpIo, floats};
use strata_compiler::ops;

/// `y[t]` = row `ids[t]` of `table`, times `scale`, for `tokens` tokens; a row for an id outside the
/// vocabulary keeps what `y` held.
pub(super) fn run(op: &ops::Embed, io: &mut OpIo) -> Result<(), RunError> {
    let ops::Embed { quant, cols, vocab, scale } = *op;
    let (cols, tokens) = (cols as usize, io.scalar("tokens") as usize);
    let row_bytes = quant.row_bytes(cols as u64).unwrap_or(0) as usize;
    let ids = io.ints("ids", tokens);
    let table = io.input("table");
    let mut y = floats(io.target("y")?, tokens * cols);
    for (t, &id) in ids.iter().enumerate() {
        let id = id as u32;
        if id < vocab {
            let row = &table[id as usize * row_bytes..(id as usize + 1) * row_bytes];
            let out = &mut y[t * cols..(t + 1) * cols];
            let _ = quant.dequantize(row, out);
            if scale != 1.0 {
                out.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }
    io.output_floats("y", &y);
    Ok(())
}
