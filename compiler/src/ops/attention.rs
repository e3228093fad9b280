//! `attention`: decode attention of a window over the f16 KV cache, split over the KV
//! positions (flash decoding), dense or over QSA's selected blocks.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, c_float, fixed_len, launch, per, rows, scalar};
use crate::plan::rules::{self, MAX_CONTEXT, MAX_TOKENS, WAVES_PER_BLOCK};
use crate::plan::{AttentionTuning, Dim, Elem, KernelRecord, MAX_BATCH, MAX_WINDOW, Options, Tuning};
use crate::target::Target;

/// Attention of each token of a window, one query per head, over the f16 KV cache,
/// causal (grouped-query): a pass holds `seqs` sequences of `tokens / seqs` columns
/// each, sequence `s` at positions from `pos[s]` in the pages of cache slot `slots[s]`
/// (paged KV, as [`super::RopeStore`] stores them), so token `t` of sequence `s` sees its
/// positions up to `pos[s] + t`, and a batch of decode steps attends in one launch. Split
/// over the KV positions (flash decoding): block (KV head, token, split) writes each
/// query head's partial softmax state `[max, sum, acc[head_dim]]` for its share, and
/// [`super::AttentionMerge`] combines the shares.
///
/// The positions are taken `block` at a time: with `sparse`, the blocks QSA selected
/// for the (token, KV head) (`list`, `count`: see [`super::QsaSelect`]); otherwise every
/// block up to the token's. How many splits a token uses depends only on how many
/// blocks it reads (see [`crate::plan::AttentionTuning`]), so a token's result is the
/// same in any window, and selecting every block equals dense attention bit for bit.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attention {
    /// Query heads.
    pub heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Head length.
    pub head_dim: u32,
    /// Score scale (see [`crate::model::ModelDesc::attention_scale`]).
    pub scale: f32,
    /// KV positions per block.
    pub block: u32,
    /// Whether it reads QSA's selected blocks.
    pub sparse: bool,
    /// Positions a query sees, its own included: a local layer's sliding window (0:
    /// every earlier position). Blocks wholly before it are not read.
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub window: u32,
}

/// Grid z of attention: the splits a token reading all `n_blocks` of the table uses,
/// `min(splits, ceil(n_blocks / split_blocks))`, so every split a token uses has its block
/// (a token reads at most `n_blocks`).
fn splits_dim(t: &AttentionTuning) -> Dim {
    Dim::Runtime { arg: "n_blocks".into(), per_block: t.split_blocks, most: t.splits }
}

impl Attention {
    /// Shared bytes for `waves` waves of `wave` lanes: the group's queries; per wave a
    /// tile's weights and positions; per wave and head the softmax state merged at the
    /// end.
    fn shared_bytes(&self, waves: u32, wave: u32) -> u32 {
        let (group, head_dim) = (self.heads / self.kv_heads.max(1), self.head_dim);
        (group * head_dim + waves * (group + 1) * wave + waves * group * (2 + head_dim)) * 4
    }
}

impl KernelOp for Attention {
    fn kernel_name(&self) -> String {
        let Attention { heads, kv_heads, head_dim, block, sparse, window, .. } = self;
        let kind = if *sparse { "attention_sparse" } else { "attention" };
        let local = if *window > 0 { format!("_w{window}") } else { String::new() };
        format!("{kind}_{heads}x{kv_heads}x{head_dim}_b{block}{local}")
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let Attention { heads, kv_heads, head_dim, block, sparse, .. } = *self;
        let wave = target.device.wave_size;
        let t = rules::attention(block, target);
        // Fewer waves where a large group's states would not fit (16 query heads a KV
        // head, head 128, on a 48 KiB part).
        let mut waves = WAVES_PER_BLOCK;
        while waves > 1 && self.shared_bytes(waves, wave) > target.device.shared_bytes_per_block {
            waves /= 2;
        }
        let width = kv_heads * head_dim;
        let mut buffers = vec![
            buffer("q", Elem::F32, per("tokens", heads * head_dim), false),
            buffer("k_cache", Elem::F16, per("cache_rows", width), false),
            buffer("v_cache", Elem::F16, per("cache_rows", width), false),
        ];
        let scalars = vec![
            scalar("tokens", if sparse { MAX_WINDOW } else { MAX_TOKENS }),
            scalar("seqs", MAX_BATCH),
            scalar("n_ctx", MAX_CONTEXT),
            scalar("cache_rows", u32::MAX),
            scalar("n_blocks", MAX_CONTEXT),
            scalar("table_entries", u32::MAX),
        ];
        if sparse {
            buffers.push(buffer("list", Elem::I32, per("n_blocks", MAX_WINDOW * kv_heads), false));
            buffers.push(buffer("count", Elem::I32, fixed_len(MAX_WINDOW * kv_heads), false));
        }
        buffers.extend([
            buffer("partial", Elem::F32, per("tokens", heads * t.splits * (head_dim + 2)), true),
            buffer("splits", Elem::I32, per("tokens", heads), true),
            buffer("pos", Elem::I32, per("seqs", 1), false),
            buffer("slots", Elem::I32, per("seqs", 1), false),
            buffer("pages", Elem::I32, per("table_entries", 1), false),
        ]);
        Parts {
            // One block per (KV head, token of the window, split): the group's query
            // heads share every K and V row read. Only as many splits as a token reading
            // every block of the table uses (the context's, not the rule's most): at 1024
            // positions 8 on a wave of 32, not 64, so a batch's short contexts launch
            // thousands fewer idle blocks.
            launch: launch(
                target,
                [Dim::Fixed(kv_heads), rows("tokens"), splits_dim(&t)],
                waves * wave,
                self.shared_bytes(waves, wave),
            ),
            tuning: Tuning::Attention(t),
            buffers,
            scalars,
        }
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let Attention { heads, kv_heads, head_dim, block, sparse, window, .. } = *self;
        let l = &k.launch;
        super::rmsnorm::float_literal_check(c, "score scale", self.scale);
        if sparse && window > 0 {
            c.fail("sliding window", window.to_string(), "QSA's selection reads whole-context layers only".into());
        }
        if kv_heads == 0 || heads % kv_heads != 0 {
            c.fail("query heads per KV head", format!("{heads}/{kv_heads}"), "they must divide evenly".into());
        }
        if c.grid_x() != u64::from(kv_heads) {
            c.fail("blocks", c.grid_x().to_string(), format!("there is one block per KV head ({kv_heads})"));
        }
        // V rows are read 16 bytes a lane, a whole number of rows a wave.
        if !head_dim.is_multiple_of(8) || head_dim > 8 * l.wave_size || !l.wave_size.is_multiple_of(head_dim / 8) {
            c.fail(
                "head length",
                head_dim.to_string(),
                format!("a multiple of 8 whose eighth divides the wave of {}", l.wave_size),
            );
        }
        let Tuning::Attention(t) = &k.tuning else {
            c.tuning_missing("attention needs its split rule");
            return;
        };
        if l.grid[2] != splits_dim(t) || t.split_blocks == 0 || block == 0 {
            c.fail(
                "splits",
                format!("grid z {:?}, {} blocks a split, blocks of {block}", l.grid[2], t.split_blocks),
                format!(
                    "grid z must be the splits of a token reading all n_blocks, at most {}, each of at least one block",
                    t.splits
                ),
            );
        }
        c.shared(self.shared_bytes(l.waves, l.wave_size), "queries, tile weights and per-wave softmax states".into());
    }

    fn tolerance(&self) -> f64 {
        2e-4
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let Attention { heads, kv_heads, head_dim, scale, block, sparse, window } = *self;
        let Tuning::Attention(t) = &k.tuning else { return json!({}) };
        json!({
            "window": window, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "block": block, "sparse": sparse,
            "group": heads / kv_heads, "kv_width": kv_heads * head_dim,
            "scale": c_float(scale), "splits": t.splits, "split_blocks": t.split_blocks,
            "state": head_dim + 2, "max_window": MAX_WINDOW,
            "v_lanes": head_dim / 8, "v_rows": k.launch.wave_size / (head_dim / 8).max(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grid z holds a block for every split any token uses: a token reads at most the
    /// table's `n_blocks` (n_kv ≤ n_ctx and n_blocks = ceil(n_ctx / block)), and its
    /// splits never outnumber those of a token reading all of them. A short context
    /// launches few: at 1024 positions 8 on a wave of 32, not the rule's 64.
    #[test]
    fn the_grid_holds_every_split_a_token_uses() {
        for target in crate::target::known() {
            let t = rules::attention(16, &target);
            let z = splits_dim(&t);
            for n_blocks in (1..600).chain([4096, 8192]) {
                let blocks = z.blocks_for(n_blocks).expect("a runtime dimension");
                assert!(blocks <= t.splits, "{}: {n_blocks}", target.name);
                for chosen in 1..=n_blocks.min(600) {
                    assert!(t.shares(chosen).1 <= blocks, "{}: {chosen} of {n_blocks}", target.name);
                }
            }
            assert_eq!(z.blocks_for(1024 / 16), Some(64u32.div_ceil(t.split_blocks)), "{}", target.name);
            assert_eq!(z.blocks_for(131_072 / 16), Some(t.splits), "{}", target.name);
        }
    }
}
