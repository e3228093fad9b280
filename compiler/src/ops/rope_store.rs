//! `rope_store`: everything between the Q·K·V products and attention in one launch —
//! RoPE, the KV cache store and QSA's key summaries.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, launch, per, rows, scalar, untuned};
use crate::plan::rules::{MAX_CONTEXT, MAX_TOKENS};
use crate::plan::{Dim, Elem, KernelRecord, MAX_BATCH, Options};
use crate::target::Target;

/// Rotary embedding of a window's Q heads (in place) and K heads, and the rotated K
/// and V rows stored to the f16 caches: one launch for everything between the
/// projections and attention. A pass holds `seqs` sequences of `tokens / seqs` columns
/// each; sequence `s` stores at positions from `pos[s]` in the pages of cache slot
/// `slots[s]` (paged KV: the slot's row of the page table `pages`, `n_blocks` entries,
/// names the pool page of each `block`-position block; a layer's pool holds
/// `summary_rows` pages of `block` rows), so a batch of decode steps stores all its
/// sequences in one launch. Angles come from a host-computed (cos, sin)
/// table; positions and slots from device buffers, so a captured pass replays as is.
///
/// It also keeps QSA's key summaries: for every `block`-position KV block the window
/// writes into, the element-wise min and max over that block's keys so far (positions
/// `block·b` to the window's last), per KV head, recomputed whole from the cache. A
/// rewound position is therefore never in a summary once it is overwritten, and every
/// block before the current one is summarized exactly. Layout [page][KV head]
/// [dimension][min, max]: a block's summary is one contiguous read.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeStore {
    /// Pairing.
    pub style: RopeStyle,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Head length.
    pub head_dim: u32,
    /// Leading dimensions of each head that rotate.
    pub rope_dims: u32,
    /// KV positions per summary block.
    pub block: u32,
}

/// RoPE pairing: which two elements of a head rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama as converted to GGUF (q/k rows permuted).
    Normal,
    /// Halves (i, i + d/2): the GPT-NeoX layout of Qwen2/Qwen3.
    Neox,
}

impl KernelOp for RopeStore {
    fn kernel_name(&self) -> String {
        let RopeStore { style, heads, kv_heads, head_dim, rope_dims, block } = self;
        let style = if *style == RopeStyle::Neox { "neox" } else { "normal" };
        let partial = if rope_dims == head_dim { String::new() } else { format!("_r{rope_dims}") };
        format!("rope_store_{style}_{heads}x{kv_heads}x{head_dim}{partial}_b{block}")
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let RopeStore { heads, kv_heads, head_dim, rope_dims, .. } = *self;
        let threads = (head_dim / 2).next_multiple_of(target.device.wave_size).min(target.device.max_threads_per_block);
        let width = kv_heads * head_dim;
        untuned(
            // Blocks (j, y): Q head j of token y; or, for j past the Q heads, one KV
            // head's rows in the y-th KV block the window writes (so one block owns
            // each summary it recomputes).
            launch(target, [Dim::Fixed(heads + kv_heads), rows("tokens"), Dim::Fixed(1)], threads, 0),
            vec![
                buffer("q", Elem::F32, per("tokens", heads * head_dim), true),
                buffer("k", Elem::F32, per("tokens", width), false),
                buffer("v", Elem::F32, per("tokens", width), false),
                buffer("k_cache", Elem::F16, per("cache_rows", width), true),
                buffer("v_cache", Elem::F16, per("cache_rows", width), true),
                buffer("k_summary", Elem::F16, per("summary_rows", 2 * width), true),
                buffer("cos_sin", Elem::F32, per("n_ctx", rope_dims), false),
                buffer("pos", Elem::I32, per("seqs", 1), false),
                buffer("slots", Elem::I32, per("seqs", 1), false),
                buffer("pages", Elem::I32, per("table_entries", 1), false),
            ],
            vec![
                scalar("tokens", MAX_TOKENS),
                scalar("seqs", MAX_BATCH),
                scalar("n_ctx", MAX_CONTEXT),
                scalar("n_blocks", MAX_CONTEXT),
                scalar("cache_rows", u32::MAX),
                scalar("summary_rows", u32::MAX),
                scalar("table_entries", u32::MAX),
            ],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let RopeStore { heads, kv_heads, head_dim, rope_dims, block, .. } = *self;
        let threads = k.launch.threads;
        if threads < head_dim / 2 || rope_dims > head_dim || rope_dims % 2 != 0 || head_dim % 2 != 0 {
            c.fail(
                "element pairs per block",
                threads.to_string(),
                format!("heads of {head_dim} with {rope_dims} rotating, taken in pairs"),
            );
        }
        if c.grid_x() != u64::from(heads + kv_heads) || block == 0 {
            c.fail(
                "blocks along x",
                c.grid_x().to_string(),
                format!(
                    "one a query head and one a KV head ({heads} + {kv_heads}), over blocks of at least one position"
                ),
            );
        }
    }

    fn tolerance(&self) -> f64 {
        // f16 cache entries may round to the neighbouring value.
        1e-3
    }

    fn context(&self, _k: &KernelRecord, _target: &Target) -> Value {
        let RopeStore { style, heads, kv_heads, head_dim, rope_dims, block } = *self;
        let rope_half = rope_dims / 2;
        let (a, b, pairing) = match style {
            RopeStyle::Normal => ("2u * i".to_owned(), "2u * i + 1u".to_owned(), "adjacent elements (2i, 2i+1)"),
            RopeStyle::Neox => ("i".to_owned(), format!("i + {rope_half}u"), "halves (i, i + d/2)"),
        };
        json!({
            "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "half": head_dim / 2,
            "rope_dims": rope_dims, "rope_half": rope_half, "kv_width": kv_heads * head_dim,
            "pair_a": a, "pair_b": b, "pairing": pairing, "block": block,
        })
    }
}
