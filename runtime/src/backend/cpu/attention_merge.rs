//! The `attention_merge` reference: each (token, head)'s partial softmax states from
//! `attention` combined into its output (in f64), optionally quantized.

use strata_compiler::plan::Tuning;

use super::io::OpIo;
use super::{RunError, quantize_q8};
use strata_compiler::ops;

/// `out` for `tokens` tokens of `heads` heads of `head_dim`, from `partial` and
/// `splits`; a head with no weight is zero. With `q8`, `out` quantized as well.
pub(super) fn run(op: &ops::AttentionMerge, io: &mut OpIo) -> Result<(), RunError> {
    let ops::AttentionMerge { heads, head_dim, q8 } = *op;
    let Tuning::Attention(tuning) = &io.spec().tuning else {
        return Err(RunError::Other(format!("{}: no split rule", io.spec().name)));
    };
    let (heads, hd, tokens) = (heads as usize, head_dim as usize, io.scalar("tokens") as usize);
    let (splits, state) = (tuning.splits as usize, hd + 2);
    let partial = io.floats("partial", tokens * heads * splits * state);
    let used = io.ints("splits", tokens * heads);
    let mut out = vec![0f32; tokens * heads * hd];
    for (i, out) in out.chunks_exact_mut(hd).enumerate() {
        let n = (used[i].max(0) as usize).min(splits);
        let states: Vec<&[f32]> = partial[i * splits * state..].chunks_exact(state).take(n).collect();
        let big = states.iter().map(|st| f64::from(st[0])).fold(f64::NEG_INFINITY, f64::max);
        let factor: Vec<f64> = states.iter().map(|st| (f64::from(st[0]) - big).exp()).collect();
        let den: f64 = states.iter().zip(&factor).map(|(st, f)| f64::from(st[1]) * f).sum();
        for (d, o) in out.iter_mut().enumerate() {
            let num: f64 = states.iter().zip(&factor).map(|(st, f)| f64::from(st[2 + d]) * f).sum();
            *o = if den > 0.0 { (num / den) as f32 } else { 0.0 };
        }
    }
    if q8 {
        quantize_q8::output(&out, io);
    }
    io.output_floats("out", &out);
    Ok(())
}
