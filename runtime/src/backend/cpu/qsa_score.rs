//! The `qsa_score` reference: QSA's bound on every block's attention scores, from the
//! key summary, for every query of the window. [`qsa_bound`] sums in the kernel's f32
//! order, so the self-test compares the two bit for bit.

use strata_compiler::plan::{MAX_WINDOW, rules};

use super::RunError;
use super::io::{OpIo, floats};
use strata_compiler::ops;

/// Writes `scores` for `tokens` tokens from position `pos` of the sequence in cache slot
/// `slots[0]`: per (token, KV head, block) the largest bound over the head group's
/// queries, from the summary on the block's page (all zeros where the page is not in the
/// pool); the first and the newest block score +∞, blocks past the newest -∞.
pub(super) fn run(op: &ops::QsaScore, io: &mut OpIo) -> Result<(), RunError> {
    let ops::QsaScore { heads, kv_heads, head_dim, block } = *op;
    let (heads, kv_heads, hd, block) = (heads as usize, kv_heads as usize, head_dim as usize, block as usize);
    let (tokens, n_blocks) = (io.scalar("tokens") as usize, io.scalar("n_blocks") as usize);
    let pos = io.ints("pos", 1)[0] as usize;
    let group = heads / kv_heads;
    let q = io.floats("q", tokens * heads * hd);
    let (pages, slot) = (io.pages(block as u32), io.ints("slots", 1).first().map_or(0, |&s| s.max(0) as usize));
    let summary = io.halves("k_summary", io.scalar("summary_rows") as usize * kv_heads * 2 * hd);
    let mut scores = floats(io.target("scores")?, MAX_WINDOW as usize * kv_heads * n_blocks);
    for t in 0..tokens {
        let newest = (pos + t) / block;
        for kvh in 0..kv_heads {
            for b in 0..n_blocks {
                let page = pages.page(slot, b);
                let column = |which: usize| -> Vec<f32> {
                    let at = |d| page.and_then(|p| summary.get(((p * kv_heads + kvh) * hd + d) * 2 + which));
                    (0..hd).map(|d| at(d).copied().unwrap_or(0.0)).collect()
                };
                scores[(t * kv_heads + kvh) * n_blocks + b] = if b == 0 || b == newest {
                    f32::INFINITY
                } else if b > newest {
                    f32::NEG_INFINITY
                } else {
                    let (lo, hi) = (column(0), column(1));
                    (0..group)
                        .map(|g| qsa_bound(&q[(t * heads + kvh * group + g) * hd..][..hd], &lo, &hi))
                        .fold(f32::NEG_INFINITY, f32::max)
                };
            }
        }
    }
    io.output_floats("scores", &scores);
    Ok(())
}

/// QSA's bound on `q · k` for every key `k` of a block whose element-wise minimum and
/// maximum are `lo` and `hi`: `Σ_i max(q_i·lo_i, q_i·hi_i)`, summed in f32 as the
/// `qsa_score` kernel sums it: [`rules::qsa_score_lanes`] consecutive runs of the
/// dimensions each in order, then a butterfly over the runs (xor lanes/2 down to 1).
pub fn qsa_bound(q: &[f32], lo: &[f32], hi: &[f32]) -> f32 {
    let lanes = rules::qsa_score_lanes(q.len() as u32) as usize;
    let mut sums: Vec<f32> = (0..lanes)
        .map(|c| {
            let run = c * q.len() / lanes..(c + 1) * q.len() / lanes;
            q[run.clone()]
                .iter()
                .zip(&lo[run.clone()])
                .zip(&hi[run])
                .fold(0f32, |s, ((&x, &lo), &hi)| s + (x * lo).max(x * hi))
        })
        .collect();
    let mut m = lanes / 2;
    while m > 0 {
        sums = (0..lanes).map(|c| sums[c] + sums[c ^ m]).collect();
        m /= 2;
    }
    sums[0]
}

#[cfg(test)]
mod tests {
    use half::f16;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// QSA's block bound is at least every `q · k` of the block (up to the f32
        /// rounding of its own sum), whatever the keys and query.
        #[test]
        fn the_block_bound_bounds_every_score(
            keys in proptest::collection::vec(proptest::collection::vec(-8.0f32..8.0, 64), 1..17),
            q in proptest::collection::vec(-4.0f32..4.0, 64),
        ) {
            let keys: Vec<Vec<f32>> = keys.iter().map(|k| k.iter().map(|&x| f16::from_f32(x).to_f32()).collect()).collect();
            let lo: Vec<f32> = (0..64).map(|d| keys.iter().map(|k| k[d]).fold(f32::INFINITY, f32::min)).collect();
            let hi: Vec<f32> = (0..64).map(|d| keys.iter().map(|k| k[d]).fold(f32::NEG_INFINITY, f32::max)).collect();
            let bound = f64::from(qsa_bound(&q, &lo, &hi));
            let slack: f64 = q.iter().zip(&lo).zip(&hi).map(|((&x, &l), &h)| f64::from(x.abs() * l.abs().max(h.abs()))).sum::<f64>() * 1e-6;
            for k in &keys {
                let dot: f64 = q.iter().zip(k).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
                prop_assert!(dot <= bound + slack, "q·k = {dot} above the bound {bound}");
            }
        }
    }
}
