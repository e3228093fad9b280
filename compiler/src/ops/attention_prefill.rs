//! `attention_prefill`: causal attention of a prompt chunk over the f16 KV cache (the
//! cached prefix and the chunk itself, which `rope_store` wrote first): flash attention,
//! tiles of queries against tiles of keys on the target's matrix unit, online softmax.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, c_float, launch, launch_dynamic, per, scalar};
use crate::plan::rules::{self, MAX_CONTEXT, MAX_TOKENS};
use crate::plan::{AttentionPrefillTuning, Dim, Elem, KernelRecord, MAX_BATCH, Options, Tuning};
use crate::target::Target;

/// Largest head length: a wave keeps its 16 rows' output accumulators (16 × head_dim
/// floats) in registers, which 128 still leaves room for without spills.
pub const MAX_HEAD_DIM: u32 = 128;

/// `out[t][h] = softmax(q[t][h] · K[0..=pos[s]+i]ᵀ · scale) · V` for each token `t`, the
/// `i`-th of sequence `s`, and query head `h` (grouped-query: head `h` reads KV head
/// `h / (heads / kv_heads)`): a pass holds `seqs` prompt chunks of `tokens / seqs` columns
/// each (several requests' prompts read in one pass), sequence `s`'s keys and values
/// read from the pages of cache slot `slots[s]` (paged KV, as [`super::RopeStore`]
/// stores them).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionPrefill {
    /// Query heads.
    pub heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Head length.
    pub head_dim: u32,
    /// Score scale (see [`crate::model::ModelDesc::attention_scale`]).
    pub scale: f32,
    /// Positions a query sees, its own included (a local layer's sliding window; 0:
    /// every earlier position).
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub window: u32,
    /// KV positions a cache page (the KV block of [`super::RopeStore`]).
    pub page: u32,
}

impl AttentionPrefill {
    /// Query heads sharing one KV head.
    pub fn group(&self) -> u32 {
        self.heads / self.kv_heads.max(1)
    }

    /// Shared bytes of a tuning: the query tile (f16), the key tile (f16 rows), the value
    /// tile (f16, transposed), each wave's scores (f32, then its f16 weights in place) and
    /// each row's softmax rescale factor; with `stages`, the query tile and `stages` key
    /// and value tiles, all f16 rows (the scores stay in registers).
    pub fn shared_bytes(&self, t: &AttentionPrefillTuning) -> u64 {
        let (d, n, pad, rows) =
            (u64::from(self.head_dim), u64::from(t.key_tile), u64::from(t.pad), 16 * u64::from(t.waves));
        if t.stages > 0 {
            return 2 * (d + pad) * (rows + 2 * u64::from(t.stages) * n);
        }
        2 * (rows * (d + pad) + n * (d + pad) + d * (n + pad)) + 4 * rows * (n + 4) + 4 * rows
    }
}

impl KernelOp for AttentionPrefill {
    fn kernel_name(&self) -> String {
        let AttentionPrefill { heads, kv_heads, head_dim, window, page, .. } = self;
        let local = if *window > 0 { format!("_w{window}") } else { String::new() };
        format!("attention_prefill_{heads}x{kv_heads}x{head_dim}{local}_p{page}")
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let AttentionPrefill { heads, kv_heads, head_dim, .. } = *self;
        let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
        let t = rules::attention_prefill(self, target);
        // One block per (KV head, tile of a sequence's tokens, sequence): the group's query
        // heads share every K and V tile staged. y covers one sequence holding every token.
        let grid = [Dim::Fixed(kv_heads), super::blocks_of("tokens", t.block_tokens), super::blocks_of("seqs", 1)];
        let shared = u32::try_from(self.shared_bytes(&t)).unwrap_or(u32::MAX);
        let threads = t.waves * target.device.wave_size;
        Parts {
            launch: match t.stages {
                0 => launch(target, grid, threads, shared),
                _ => launch_dynamic(target, grid, threads, shared),
            },
            tuning: Tuning::AttentionPrefill(t),
            buffers: vec![
                buffer("q", Elem::F32, per("tokens", q_width), false),
                buffer("k_cache", Elem::F16, per("cache_rows", kv_width), false),
                buffer("v_cache", Elem::F16, per("cache_rows", kv_width), false),
                buffer("out", Elem::F32, per("tokens", q_width), true),
                buffer("pos", Elem::I32, per("seqs", 1), false),
                buffer("slots", Elem::I32, per("seqs", 1), false),
                buffer("pages", Elem::I32, per("table_entries", 1), false),
            ],
            scalars: vec![
                scalar("tokens", MAX_TOKENS),
                scalar("seqs", MAX_BATCH),
                scalar("n_ctx", MAX_CONTEXT),
                scalar("n_blocks", MAX_CONTEXT),
                scalar("cache_rows", u32::MAX),
                scalar("table_entries", u32::MAX),
            ],
        }
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let AttentionPrefill { heads, kv_heads, head_dim, page, .. } = *self;
        let l = &k.launch;
        if page == 0 {
            c.fail("positions a KV page", "0".into(), "at least one".into());
        }
        super::rmsnorm::float_literal_check(c, "score scale", self.scale);
        if kv_heads == 0 || heads % kv_heads != 0 {
            c.fail("query heads per KV head", format!("{heads}/{kv_heads}"), "they must divide evenly".into());
        }
        // Scores and outputs are whole 16-wide tiles of the matrix unit over the head.
        if !head_dim.is_multiple_of(16) || !(16..=MAX_HEAD_DIM).contains(&head_dim) {
            c.fail(
                "head length",
                head_dim.to_string(),
                format!("a multiple of 16 from 16 to {MAX_HEAD_DIM} (the matrix unit's tiles, the registers of a wave's outputs)"),
            );
        }
        if c.grid_x() != u64::from(kv_heads) {
            c.fail("blocks", c.grid_x().to_string(), format!("there is one block per KV head ({kv_heads})"));
        }
        let Tuning::AttentionPrefill(t) = &k.tuning else {
            c.tuning_missing("prefill attention needs its tiles");
            return;
        };
        if l.waves != t.waves || l.threads != t.waves * l.wave_size {
            c.fail(
                "waves per block",
                format!("{} ({} threads)", l.waves, l.threads),
                format!("the tiles are for {} waves of {}", t.waves, l.wave_size),
            );
        }
        let rows = 16 * t.waves;
        let group = self.group();
        if t.block_tokens == 0 || u64::from(t.block_tokens) * u64::from(group) > u64::from(rows) {
            c.fail(
                "query rows per block",
                format!("{} tokens of {group} heads", t.block_tokens),
                format!("a block holds 1 to {rows} rows (16 a wave), at least one token's heads"),
            );
        }
        let tiles = super::blocks_of("tokens", t.block_tokens);
        if l.grid[1] != tiles || l.grid[2] != super::blocks_of("seqs", 1) {
            c.fail(
                "grid",
                format!("y {:?}, z {:?}", l.grid[1], l.grid[2]),
                format!("y covers the tokens {} a block, z the sequences", t.block_tokens),
            );
        }
        // A row's scores are reduced by wave / 16 lanes, each over a contiguous run of
        // the tile read four floats at a time.
        let lanes = l.wave_size / 16;
        if !l.wave_size.is_multiple_of(16)
            || lanes == 0
            || !t.key_tile.is_multiple_of(16)
            || !t.key_tile.is_multiple_of(4 * lanes)
        {
            c.fail(
                "key tile",
                format!("{} positions, waves of {}", t.key_tile, l.wave_size),
                "a multiple of 16 and of 4 floats for each of a row's wave / 16 lanes".into(),
            );
        }
        if t.pad == 0 || !t.pad.is_multiple_of(8) {
            c.fail("row padding", t.pad.to_string(), "a nonzero multiple of 8 f16 (16-byte aligned rows)".into());
        }
        let needed = u32::try_from(self.shared_bytes(t)).unwrap_or(u32::MAX);
        if t.stages == 0 {
            c.shared(needed, "query, key and value tiles, scores and rescale factors".into());
        } else {
            c.shared(needed, format!("the query tile and {} key and value tiles (dynamic)", t.stages));
            if !l.dynamic_shared || t.stages < 2 || !t.key_tile.is_multiple_of(16) {
                c.fail(
                    "the staged key tiles",
                    format!("{} stages of {} (dynamic: {})", t.stages, t.key_tile, l.dynamic_shared),
                    "two stages at least of whole 16-key tiles, in dynamic shared memory".into(),
                );
            }
        }
    }

    fn tolerance(&self) -> f64 {
        // Queries, keys, values and weights in f16 (11-bit significands), f32 sums.
        2e-3
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let AttentionPrefill { heads, kv_heads, head_dim, scale, window, page } = *self;
        let Tuning::AttentionPrefill(t) = &k.tuning else { return json!({}) };
        let lanes = (k.launch.wave_size / 16).max(1);
        json!({
            "window": window, "page": page,
            "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "group": self.group(),
            "kv_width": kv_heads * head_dim, "scale": c_float(scale),
            "rows": 16 * t.waves, "block_tokens": t.block_tokens, "used_rows": t.block_tokens * self.group(),
            "key_tile": t.key_tile, "key_tiles16": t.key_tile / 16, "dim_tiles16": head_dim / 16,
            "ldq": head_dim + t.pad, "ldv": t.key_tile + t.pad, "lds": t.key_tile + 4,
            "row_lanes": lanes, "segment": t.key_tile / lanes,
            "k_chunks": head_dim / 8, "q_chunks": head_dim / 4, "v_pairs": t.key_tile / 2,
            "stages": t.stages, "key_tiles8": t.key_tile / 8, "dim_tiles8": head_dim / 8,
        })
    }

    fn template(&self, k: &KernelRecord) -> Option<&'static str> {
        matches!(&k.tuning, Tuning::AttentionPrefill(t) if t.stages > 0).then_some("attention_prefill_mma")
    }

    fn uses_matrix_unit(&self, _k: &KernelRecord) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Options, Plan};

    fn errors(op: AttentionPrefill, target: &str) -> Vec<String> {
        let target = Target::load(target).expect("known");
        let k = rules::kernel_with(op.into(), &target, &Options::default());
        let plan = Plan { target: target.name.clone(), options: Options::default(), kernels: vec![k] };
        crate::check::check(&plan, &target).iter().map(ToString::to_string).collect()
    }

    /// The test models' shapes fit every target's shared memory, the widest key tile that
    /// fits chosen; shapes the kernel cannot run fail the static check, naming what.
    #[test]
    fn shapes_fit_or_fail_by_name() {
        let op =
            |heads, kv_heads, head_dim| AttentionPrefill { heads, kv_heads, head_dim, scale: 0.1, window: 0, page: 16 };
        for target in ["sm_80", "sm_90", "gfx1030", "gfx1100", "gfx90a"] {
            for (h, kv, d) in [(9, 3, 64), (32, 8, 128), (32, 4, 128), (16, 8, 128), (4, 2, 64)] {
                assert_eq!(errors(op(h, kv, d), target), Vec::<String>::new(), "{target} {h}/{kv}x{d}");
            }
        }
        // mma.sync targets keep the scores in registers (two stages of 64-key tiles in
        // dynamic shared memory); the portable kernel takes the widest tile that fits.
        let (sm_90, gfx1100) = (Target::load("sm_90").expect("known"), Target::load("gfx1100").expect("known"));
        for shape in [op(9, 3, 64), op(32, 8, 128)] {
            let t = rules::attention_prefill(&shape, &sm_90);
            assert_eq!((t.key_tile, t.stages), (64, 2), "{shape:?}");
        }
        assert_eq!(rules::attention_prefill(&op(9, 3, 64), &gfx1100).key_tile, 64);
        assert_eq!(rules::attention_prefill(&op(32, 8, 128), &gfx1100).key_tile, 32);
        let e = errors(op(32, 8, 72), "sm_90").join("\n");
        assert!(e.contains("head length is 72") && e.contains("a multiple of 16 from 16 to 128"), "{e}");
        let e = errors(op(32, 8, 256), "sm_90").join("\n");
        assert!(e.contains("head length is 256"), "{e}");
        let e = errors(op(128, 1, 64), "sm_90").join("\n");
        assert!(e.contains("query rows per block is 1 tokens of 128 heads"), "{e}");
        let e = errors(op(12, 8, 64), "sm_90").join("\n");
        assert!(e.contains("query heads per KV head is 12/8"), "{e}");
    }
}
