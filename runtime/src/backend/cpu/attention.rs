//! The `attention` reference: for each (token, head), the partial softmax states of its
//! shares of key blocks (dense, over a local layer's sliding window, or QSA's selected
//! list), split exactly as the kernel splits them, for `attention_merge` to combine.
//! Scores and sums in f64.

use rayon::prelude::*;
use strata_compiler::plan::{MAX_WINDOW, Tuning};

use super::RunError;
use super::io::{OpIo, floats};
use strata_compiler::ops;

/// Writes `partial` (per share: max score, sum of weights, weighted values) and `splits`
/// (the shares used) for `tokens` tokens, `seqs` sequences of `tokens / seqs` each
/// (sequence `s` from position `pos[s]` in the pages of cache slot `slots[s]`); a token
/// past `n_ctx`, or of a sequence whose pages are not all in the pools, leaves its states
/// as they were and uses none.
pub(super) fn run(op: &ops::Attention, io: &mut OpIo) -> Result<(), RunError> {
    let ops::Attention { heads, kv_heads, head_dim, scale, block, sparse, window } = *op;
    let Tuning::Attention(tuning) = &io.spec().tuning else {
        return Err(RunError::Other(format!("{}: no split rule", io.spec().name)));
    };
    let (heads, kv_heads, hd, block) = (heads as usize, kv_heads as usize, head_dim as usize, block as usize);
    let (n_ctx, tokens, n_blocks) =
        (io.scalar("n_ctx") as usize, io.scalar("tokens") as usize, io.scalar("n_blocks") as usize);
    let (seqs, pos, slots) = io.sequences(tokens)?;
    let (width, group, splits, state) = (kv_heads * hd, heads / kv_heads, tuning.splits as usize, hd + 2);
    let per = tokens / seqs;
    let q = io.floats("q", tokens * heads * hd);
    // Each sequence's keys and values up to its last position, gathered from its pages
    // (none where a page is missing).
    let pages = io.pages(block as u32);
    let caches: Vec<_> = (0..seqs)
        .map(|seq| {
            let (slot, most) = (slots[seq].max(0) as usize, (pos[seq].max(0) as usize + per).min(n_ctx));
            let gather = |name| pages.gather(io.input(name), slot, most, width);
            Some((gather("k_cache")?, gather("v_cache")?))
        })
        .collect();
    let (list, count) = if sparse {
        (io.ints("list", MAX_WINDOW as usize * kv_heads * n_blocks), io.ints("count", MAX_WINDOW as usize * kv_heads))
    } else {
        (Vec::new(), Vec::new())
    };
    let mut partial = floats(io.target("partial")?, tokens * heads * splits * state);
    let mut used = vec![0i32; tokens * heads];
    // One (token, head) a task: its shares exactly as the kernel splits them.
    partial.par_chunks_mut(splits * state).zip(used.par_iter_mut()).enumerate().for_each(|(i, (out, used))| {
        let (t, h) = (i / heads, i % heads);
        let (kvh, seq) = (h / group, t / per);
        let n_kv = pos[seq].max(0) as usize + t % per + 1;
        let Some((kc, vc)) = caches[seq].as_ref().filter(|_| n_kv <= n_ctx) else { return };
        let first = if window > 0 { n_kv.saturating_sub(window as usize) } else { 0 };
        let blocks: Vec<usize> = if sparse {
            let row = (t * kv_heads + kvh) * n_blocks;
            list[row..row + count[t * kv_heads + kvh].max(0) as usize].iter().map(|&b| b as usize).collect()
        } else {
            // A local layer reads from the block holding its window's first position.
            ((first / block)..(n_kv - 1) / block + 1).collect()
        };
        let (per, shares) = tuning.shares(blocks.len() as u32);
        *used = shares as i32;
        let q = &q[i * hd..][..hd];
        for (s, share) in blocks.chunks(per as usize).enumerate().take(shares as usize) {
            let positions: Vec<usize> =
                share.iter().flat_map(|&b| b * block..(b + 1) * block).filter(|&p| p < n_kv && p >= first).collect();
            let scores: Vec<f64> = positions
                .iter()
                .map(|&p| {
                    let k = &kc[p * width + kvh * hd..][..hd];
                    (0..hd).map(|d| f64::from(q[d] * scale) * f64::from(k[d])).sum()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let st = &mut out[s * state..(s + 1) * state];
            st[0] = max as f32;
            st[1] = weights.iter().sum::<f64>() as f32;
            for d in 0..hd {
                let v: f64 =
                    positions.iter().zip(&weights).map(|(&p, w)| w * f64::from(vc[p * width + kvh * hd + d])).sum();
                st[2 + d] = v as f32;
            }
        }
    });
    io.output_floats("partial", &partial);
    io.output_ints("splits", &used);
    Ok(())
}
