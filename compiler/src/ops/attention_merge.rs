//! `attention_merge`: attention's split partial states combined into each head's
//! output, optionally quantized for the int8 output projection.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, launch, per, rows, scalar};
use crate::plan::rules::{ATTENTION_SPLITS, MAX_TOKENS};
use crate::plan::{AttentionTuning, Dim, Elem, KernelRecord, Options, Tuning};
use crate::target::Target;

/// Combines [`super::Attention`]'s split partial states into each (token, head)'s
/// output: `Σ_s acc_s·e^(m_s−M) / Σ_s l_s·e^(m_s−M)` over the splits the token used.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionMerge {
    /// Query heads.
    pub heads: u32,
    /// Head length.
    pub head_dim: u32,
    /// Also writes the output quantized to int8, for the int8-dot output projection.
    #[serde(default)]
    pub q8: bool,
}

impl KernelOp for AttentionMerge {
    fn kernel_name(&self) -> String {
        let AttentionMerge { heads, head_dim, q8 } = self;
        format!("attention_merge{}_{heads}x{head_dim}", if *q8 { "_q8" } else { "" })
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let AttentionMerge { heads, head_dim, q8 } = *self;
        let threads = head_dim.next_multiple_of(target.device.wave_size).min(target.device.max_threads_per_block);
        let splits = ATTENTION_SPLITS;
        let mut buffers = vec![
            buffer("partial", Elem::F32, per("tokens", heads * splits * (head_dim + 2)), false),
            buffer("splits", Elem::I32, per("tokens", heads), false),
            buffer("out", Elem::F32, per("tokens", heads * head_dim), true),
        ];
        if q8 {
            buffers.push(buffer("xq", Elem::U8, per("tokens", heads * head_dim), true));
            buffers.push(buffer("xd", Elem::F32, per("tokens", heads * head_dim / 16), true));
        }
        Parts {
            launch: launch(target, [Dim::Fixed(heads), rows("tokens"), Dim::Fixed(1)], threads, 0),
            tuning: Tuning::Attention(AttentionTuning { splits, split_blocks: 0 }),
            buffers,
            scalars: vec![scalar("tokens", MAX_TOKENS)],
        }
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let AttentionMerge { heads, head_dim, q8 } = *self;
        if k.launch.threads < head_dim {
            c.fail("threads", k.launch.threads.to_string(), format!("one a dimension of {head_dim}"));
        }
        if c.grid_x() != u64::from(heads) {
            c.fail("blocks", c.grid_x().to_string(), format!("there is one block per query head ({heads})"));
        }
        if q8 && head_dim % 32 != 0 {
            c.fail("head length", head_dim.to_string(), "its int8 quants are whole 32-element chunks".into());
        }
        if !matches!(k.tuning, Tuning::Attention(AttentionTuning { splits: ATTENTION_SPLITS, .. })) {
            c.fail("splits", format!("{:?}", k.tuning), format!("attention's {ATTENTION_SPLITS} splits"));
        }
    }

    fn tolerance(&self) -> f64 {
        2e-4
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let AttentionMerge { heads, head_dim, q8 } = *self;
        let Tuning::Attention(t) = &k.tuning else { return json!({}) };
        json!({ "heads": heads, "head_dim": head_dim, "splits": t.splits, "state": head_dim + 2, "q8": q8 })
    }
}
