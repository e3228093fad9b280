//! `attention_prefill`: causal attention of a prompt chunk over the f16 KV cache (the
//! cached prefix and the chunk itself, which `rope_store` wrote first): flash attention,
//! tiles of queries against tiles of keys on the target's matrix unit, online softmax.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, c_float, fixed_len, launch, per, scalar, untuned};
use crate::plan::rules::{MAX_CONTEXT, MAX_TOKENS, WAVES_PER_BLOCK};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// `out[t][h] = softmax(q[t][h] · K[0..=pos[0]+t]ᵀ · scale) · V` for each token `t` of a
/// chunk at `pos[0]` and query head `h` (grouped-query: head `h` reads KV head
/// `h / (heads / kv_heads)`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionPrefill {
    /// Query heads.
    pub heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Head length.
    pub head_dim: u32,
    /// Score scale, 1/sqrt(head_dim).
    pub scale: f32,
}

impl KernelOp for AttentionPrefill {
    fn kernel_name(&self) -> String {
        let AttentionPrefill { heads, kv_heads, head_dim, .. } = self;
        format!("attention_prefill_{heads}x{kv_heads}x{head_dim}")
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let AttentionPrefill { heads, kv_heads, head_dim, .. } = *self;
        let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
        let grid = [Dim::Fixed(heads), Dim::Runtime { arg: "tokens".into(), per_block: 64 }, Dim::Fixed(1)];
        untuned(
            launch(target, grid, WAVES_PER_BLOCK * target.device.wave_size, 0),
            vec![
                buffer("q", Elem::F32, per("tokens", q_width), false),
                buffer("k_cache", Elem::F16, per("n_ctx", kv_width), false),
                buffer("v_cache", Elem::F16, per("n_ctx", kv_width), false),
                buffer("out", Elem::F32, per("tokens", q_width), true),
                buffer("pos", Elem::I32, fixed_len(1u32), false),
            ],
            vec![scalar("tokens", MAX_TOKENS), scalar("n_ctx", MAX_CONTEXT)],
        )
    }

    fn check(&self, _k: &KernelRecord, c: &mut Checker) {
        let AttentionPrefill { heads, kv_heads, .. } = *self;
        if kv_heads == 0 || heads % kv_heads != 0 {
            c.fail("query heads per KV head", format!("{heads}/{kv_heads}"), "they must divide evenly".into());
        }
        c.extents.push(("pos", 1));
    }

    fn tolerance(&self) -> f64 {
        2e-3
    }

    fn context(&self, _k: &KernelRecord, _target: &Target) -> Value {
        let AttentionPrefill { heads, kv_heads, head_dim, scale } = *self;
        json!({
            "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "group": heads / kv_heads.max(1),
            "kv_width": kv_heads * head_dim, "scale": c_float(scale),
        })
    }

    fn uses_matrix_unit(&self) -> bool {
        true
    }
}
