//! The `attention_prefill` reference: each (token, head)'s causal softmax attention over
//! the cache, exactly (scores, weights and sums in f64).

use rayon::prelude::*;

use super::RunError;
use super::io::OpIo;
use strata_compiler::ops;

/// `out[t][h]` for the `tokens` tokens from position `pos` (a token past `n_ctx` leaves
/// its rows as they were).
pub(super) fn run(op: &ops::AttentionPrefill, io: &mut OpIo) -> Result<(), RunError> {
    let ops::AttentionPrefill { heads, kv_heads, head_dim, scale } = *op;
    let (heads, kv_heads, hd) = (heads as usize, kv_heads as usize, head_dim as usize);
    let (n_ctx, tokens) = (io.scalar("n_ctx") as usize, io.scalar("tokens") as usize);
    let pos = io.ints("pos", 1)[0] as usize;
    let (width, group) = (kv_heads * hd, heads / kv_heads.max(1));
    let q = io.floats("q", tokens * heads * hd);
    let most = (pos + tokens).min(n_ctx);
    let (kc, vc) = (io.halves("k_cache", most * width), io.halves("v_cache", most * width));
    let mut out = io.floats("out", tokens * heads * hd);
    out.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
        let (t, h) = (i / heads, i % heads);
        let (kvh, n_kv) = (h / group, pos + t + 1);
        if n_kv > n_ctx {
            return;
        }
        let q = &q[i * hd..][..hd];
        let scores: Vec<f64> = (0..n_kv)
            .map(|p| {
                let k = &kc[p * width + kvh * hd..][..hd];
                (0..hd).map(|d| f64::from(q[d]) * f64::from(k[d])).sum::<f64>() * f64::from(scale)
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = weights.iter().sum();
        for (d, o) in out.iter_mut().enumerate() {
            let v: f64 = weights.iter().enumerate().map(|(p, w)| w * f64::from(vc[p * width + kvh * hd + d])).sum();
            *o = (v / sum) as f32;
        }
    });
    io.output_floats("out", &out);
    Ok(())
}
