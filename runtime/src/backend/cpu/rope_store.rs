//! The `rope_store` reference: rotary position embedding of a window's queries and keys,
//! the keys and values stored (as f16) into the caches at their positions, and the key
//! summary (per block of positions, each dimension's minimum and maximum) of every block
//! the window wrote into recomputed for QSA.

use half::f16;

use super::RunError;
use super::io::{OpIo, halves};
use strata_compiler::ops::{self, RopeStyle};

/// Rotates `q` (output) and `k` of `tokens` tokens, `seqs` sequences of `tokens / seqs`
/// each (sequence `s` from position `pos[s]`, in the pages of cache slot `slots[s]`),
/// writes `k` and `v` into their rows of `k_cache` and `v_cache` and refreshes the
/// summaries of the pages written into (`k_summary`, one a page). Positions from `n_ctx`
/// on are left alone, as is a sequence whose pages are not all in the pools.
pub(super) fn run(op: &ops::RopeStore, io: &mut OpIo) -> Result<(), RunError> {
    let ops::RopeStore { style, heads, kv_heads, head_dim, rope_dims, block } = *op;
    let (heads, kv, hd, rd) = (heads as usize, kv_heads as usize, head_dim as usize, rope_dims as usize);
    let (tokens, n_ctx) = (io.scalar("tokens") as usize, io.scalar("n_ctx") as usize);
    let (seqs, pos, slots) = io.sequences(tokens)?;
    let pages = io.pages(block);
    let table = io.floats("cos_sin", n_ctx * rd);
    let mut q = io.floats("q", tokens * heads * hd);
    let mut k = io.floats("k", tokens * kv * hd);
    let v = io.floats("v", tokens * kv * hd);
    let rotate = |h: &mut [f32], p: usize| {
        for i in 0..rd / 2 {
            let (c, s) = (table[p * rd + 2 * i], table[p * rd + 2 * i + 1]);
            let (a, b) = match style {
                RopeStyle::Normal => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + rd / 2),
            };
            let (x0, x1) = (h[a], h[b]);
            h[a] = x0 * c - x1 * s;
            h[b] = x0 * s + x1 * c;
        }
    };
    let (width, per) = (kv * hd, tokens / seqs);
    // Refused when either is unbound, whether or not a row was written.
    io.target("k_cache")?;
    io.target("k_summary")?;
    for seq in 0..seqs {
        let (pos0, slot) = (pos[seq].max(0) as usize, slots[seq].max(0) as usize);
        let end = (pos0 + per).min(n_ctx);
        if !pages.holds(slot, pos0..end.max(pos0)) {
            continue;
        }
        let row = |p: usize| pages.row(slot, p).unwrap_or_default();
        for p in pos0..end.max(pos0) {
            let t = seq * per + p - pos0;
            q[t * heads * hd..(t + 1) * heads * hd].chunks_exact_mut(hd).for_each(|h| rotate(h, p));
            k[t * width..(t + 1) * width].chunks_exact_mut(hd).for_each(|h| rotate(h, p));
            for (name, src) in [("k_cache", &k), ("v_cache", &v)] {
                let at = row(p);
                let cells = &mut io.target_mut(name)?[2 * at * width..2 * (at + 1) * width];
                for (out, x) in cells.chunks_exact_mut(2).zip(&src[t * width..(t + 1) * width]) {
                    out.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
                }
            }
        }
        // The key summary of every block the sequence wrote into, over its rows so far.
        if end <= pos0 {
            continue;
        }
        for blk in pos0 / pages.block..=(end - 1) / pages.block {
            let span = blk * pages.block..((blk + 1) * pages.block).min(end);
            let keys = halves(&io.target("k_cache")?[2 * row(span.start) * width..], span.len() * width);
            let page = pages.page(slot, blk).unwrap_or_default();
            let summary = io.target_mut("k_summary")?;
            for h in 0..kv {
                for d in 0..hd {
                    let column = keys.chunks_exact(width).map(|row| row[h * hd + d]);
                    let (lo, hi) =
                        column.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
                    for (which, value) in [(0, lo), (1, hi)] {
                        let at = 2 * (((page * kv + h) * hd + d) * 2 + which);
                        summary[at..at + 2].copy_from_slice(&f16::from_f32(value).to_le_bytes());
                    }
                }
            }
        }
    }
    io.output_floats("q", &q);
    Ok(())
}
