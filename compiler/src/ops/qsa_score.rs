//! `qsa_score`: QSA's (Quest's) upper bound on each KV block's attention scores, from
//! the key summaries `rope_store` keeps.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, fixed_len, launch, per, scalar, untuned};
use crate::plan::rules::{self, MAX_CONTEXT, QSA_SCORE_BLOCKS_PER_GROUP, QSA_SCORE_THREADS};
use crate::plan::{Dim, Elem, KernelRecord, MAX_WINDOW, Options};
use crate::target::Target;

/// QSA's block scores (Quest): for each token `t` of a window, KV head and KV block
/// `b`, the largest over the group's query heads of the bound
/// `U = Σ_i max(q_i·min_i, q_i·max_i)` on any `q·k` of the block, from the key
/// summaries [`super::RopeStore`] keeps, in f32 in the order
/// [`rules::qsa_score_lanes`] fixes for every target. The first block and the token's
/// newest block score +∞ (always kept), blocks past it −∞. A block's summary is read
/// once for every query of the window, from its page (the window is one sequence's, in
/// cache slot `slots[0]`: paged as [`super::RopeStore`] stores it).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QsaScore {
    /// Query heads.
    pub heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Head length.
    pub head_dim: u32,
    /// KV positions per block.
    pub block: u32,
}

impl QsaScore {
    /// Queries a block stages in shared memory: a tile of the window's tokens, each
    /// with the group's heads.
    fn tile_queries(&self) -> u32 {
        rules::qsa_tokens_per_tile(self.heads, self.kv_heads) * (self.heads / self.kv_heads.max(1))
    }
}

impl KernelOp for QsaScore {
    fn kernel_name(&self) -> String {
        let QsaScore { heads, kv_heads, head_dim, block } = self;
        format!("qsa_score_{heads}x{kv_heads}x{head_dim}_b{block}")
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let QsaScore { heads, kv_heads, head_dim, .. } = *self;
        let threads = QSA_SCORE_THREADS.max(target.device.wave_size);
        let per_block = threads / rules::qsa_score_lanes(head_dim) * QSA_SCORE_BLOCKS_PER_GROUP;
        untuned(
            // Lane groups of a few KV blocks each, a block row per KV head.
            launch(
                target,
                [super::blocks_of("n_blocks", per_block), Dim::Fixed(kv_heads), Dim::Fixed(1)],
                threads,
                self.tile_queries() * head_dim * 4,
            ),
            vec![
                buffer("q", Elem::F32, per("tokens", heads * head_dim), false),
                buffer("k_summary", Elem::F16, per("summary_rows", 2 * kv_heads * head_dim), false),
                buffer("scores", Elem::F32, per("n_blocks", MAX_WINDOW * kv_heads), true),
                buffer("pos", Elem::I32, fixed_len(1u32), false),
                buffer("slots", Elem::I32, fixed_len(1u32), false),
                buffer("pages", Elem::I32, per("table_entries", 1), false),
            ],
            vec![
                scalar("tokens", MAX_WINDOW),
                scalar("n_blocks", MAX_CONTEXT),
                scalar("summary_rows", u32::MAX),
                scalar("table_entries", u32::MAX),
            ],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let QsaScore { heads, kv_heads, head_dim, .. } = *self;
        let l = &k.launch;
        if kv_heads == 0 || heads % kv_heads != 0 {
            c.fail("query heads per KV head", format!("{heads}/{kv_heads}"), "they must divide evenly".into());
        }
        let lanes = rules::qsa_score_lanes(head_dim);
        if !lanes.is_power_of_two() || !head_dim.is_multiple_of(4 * lanes) || !l.threads.is_multiple_of(lanes) {
            c.fail(
                "head length",
                head_dim.to_string(),
                format!("{lanes} lanes a KV block, 4 dimensions or a multiple of 4 each, within {} threads", l.threads),
            );
        }
        let queries = self.tile_queries();
        c.shared(queries * head_dim * 4, format!("a tile of {queries} queries of {head_dim}"));
        c.extents.push(("pos", 1));
    }

    fn tolerance(&self) -> f64 {
        // The same float operations as the CPU reference, in the same order: bit for bit.
        0.0
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let QsaScore { heads, kv_heads, head_dim, block } = *self;
        let l = &k.launch;
        let group = heads / kv_heads;
        let tile = rules::qsa_tokens_per_tile(heads, kv_heads);
        let (lanes, per_group) = (rules::qsa_score_lanes(head_dim), QSA_SCORE_BLOCKS_PER_GROUP);
        json!({
            "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "block": block, "group": group,
            "tile_tokens": tile, "tile_queries": tile * group, "max_window": MAX_WINDOW,
            "lanes": lanes, "dims": head_dim / lanes, "chunks": head_dim / lanes / 4,
            "groups": l.threads / lanes, "per_group": per_group, "per_cta": l.threads / lanes * per_group,
        })
    }
}
