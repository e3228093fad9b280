//! `strata-run bench --attention`: one layer's attention of one decode token, timed
//! alone at several context depths, dense and with QSA at several budgets.
//!
//! The cache is filled synthetically ([`Model::fill_context`]) to the deepest context
//! once; each depth then decodes at that position. A measurement is `reps` launches of
//! the layer's attention kernels captured as one graph and replayed, so host launch
//! overhead does not count.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use strata_compiler::plan::KernelRecord;
use strata_compiler::quant::random_floats;

use crate::backend::{Arg, RunError};

use crate::model::{Cache, Model, qsa};

/// One measurement.
#[derive(Clone, Debug)]
pub struct AttentionTiming {
    /// KV positions the token attends over.
    pub context: u32,
    /// QSA's budget in tokens; `None` for dense attention.
    pub budget: Option<u32>,
    /// Seconds per layer (attention up to and including the merge; with QSA, the
    /// score and selection kernels too).
    pub seconds: f64,
    /// Seconds of each kernel alone, by name (score, select, attention, merge).
    pub parts: Vec<(&'static str, f64)>,
}

impl Model {
    /// Times a decode token's attention in one layer (the first sparse one) at each of
    /// `contexts`, dense and at each of `budgets` (tokens).
    pub fn bench_attention(
        &mut self,
        contexts: &[u32],
        budgets: &[u32],
        reps: usize,
    ) -> Result<Vec<AttentionTiming>, RunError> {
        let deepest = contexts.iter().copied().max().unwrap_or(0);
        if deepest == 0 || deepest > self.n_ctx {
            return Err(RunError::Other(format!("contexts must be 1 to --ctx {}", self.n_ctx)));
        }
        let d = self.desc.clone();
        let (heads, head_dim, block) = (d.heads, d.head_dim_k, self.block);
        let dense = self.kernels.get(&self.ops.attention(false, None))?;
        let merge = self.kernels.get(&self.ops.merge(false))?;
        let sparse = self.kernels.get(&self.ops.attention(true, None))?;
        let score = self.kernels.get(&self.ops.qsa_score())?;
        let select = self.kernels.get(&self.ops.qsa_select())?;
        self.fill_context(deepest, 7)?;
        let q = random_floats(&mut ChaCha8Rng::seed_from_u64(11), (heads * head_dim) as usize, 1.0);
        let q_bytes: Vec<u8> = q.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.backend.write(self.s.q, 0, &q_bytes)?;
        let layer = qsa::DENSE_LAYERS.min(self.layers.len() - 1);
        let (cache, slot) = (self.caches[layer], self.slot);
        let n_blocks = self.n_ctx.div_ceil(block);
        let mut out = Vec::new();
        for &context in contexts {
            let position = (context.max(1) - 1) as i32;
            self.write_positions(&[(position as u32, slot)], 1)?;
            for budget in std::iter::once(None).chain(budgets.iter().map(|&b| Some(b))) {
                let kernels = match budget {
                    Some(tokens) => {
                        let blocks = qsa::QsaConfig { enabled: true, budget: tokens, block: None }
                            .blocks(block)
                            .map_err(RunError::Other)?;
                        Some(QsaKernels {
                            score: score.clone(),
                            select: select.clone(),
                            sparse: sparse.clone(),
                            budget: blocks,
                        })
                    }
                    None => None,
                };
                let q = Arg::Buf(self.s.q, 0);
                let seconds = self.time_replayed(reps, &mut |m| {
                    m.attention(&dense, kernels.as_ref(), q, cache, 1, n_blocks)?;
                    m.merge(&merge)
                })?;
                let mut parts = Vec::new();
                if let Some(k) = &kernels {
                    let (s, blocks) = (&self.s, Arg::U32(n_blocks));
                    let mut score = vec![
                        ("q", q),
                        ("k_summary", Arg::Buf(cache.summary, 0)),
                        ("scores", Arg::Buf(s.scores, 0)),
                        ("pos", Arg::Buf(s.pos, 0)),
                        ("tokens", Arg::U32(1)),
                    ];
                    score.extend(self.kv_args());
                    let select = [
                        ("scores", Arg::Buf(s.scores, 0)),
                        ("list", Arg::Buf(s.list, 0)),
                        ("count", Arg::Buf(s.count, 0)),
                        ("pos", Arg::Buf(s.pos, 0)),
                        ("tokens", Arg::U32(1)),
                        ("n_blocks", blocks),
                        ("budget", Arg::U32(k.budget)),
                    ];
                    parts.push(("score", self.time_replayed(reps, &mut |m| m.backend.call(&k.score, &score))?));
                    parts.push(("select", self.time_replayed(reps, &mut |m| m.backend.call(&k.select, &select))?));
                }
                let attention = if kernels.is_some() { &sparse } else { &dense };
                let s = &self.s;
                let mut args = vec![
                    ("q", q),
                    ("k_cache", Arg::Buf(cache.k, 0)),
                    ("v_cache", Arg::Buf(cache.v, 0)),
                    ("partial", Arg::Buf(s.partial, 0)),
                    ("splits", Arg::Buf(s.splits, 0)),
                    ("pos", Arg::Buf(s.pos, 0)),
                    ("tokens", Arg::U32(1)),
                    ("seqs", Arg::U32(1)),
                    ("n_ctx", Arg::U32(self.n_ctx)),
                ];
                args.extend(self.kv_args());
                if kernels.is_some() {
                    args.extend([("list", Arg::Buf(s.list, 0)), ("count", Arg::Buf(s.count, 0))]);
                }
                parts.push(("attention", self.time_replayed(reps, &mut |m| m.backend.call(attention, &args))?));
                parts.push(("merge", self.time_replayed(reps, &mut |m| m.merge(&merge))?));
                out.push(AttentionTiming { context, budget, seconds, parts });
            }
        }
        self.reset();
        Ok(out)
    }

    /// Seconds per repetition of what `queue` enqueues, captured `reps` times as one
    /// graph and replayed (after one warm-up replay).
    fn time_replayed(
        &mut self,
        reps: usize,
        queue: &mut dyn FnMut(&mut Model) -> Result<(), RunError>,
    ) -> Result<f64, RunError> {
        self.backend.begin_capture()?;
        let queued = (0..reps).try_for_each(|_| queue(self));
        let graph = self.backend.end_capture();
        queued?;
        let graph = graph?;
        self.backend.replay(graph)?;
        let start = self.backend.mark()?;
        self.backend.replay(graph)?;
        let end = self.backend.mark()?;
        Ok(self.backend.seconds(start, end)? / reps as f64)
    }

    /// The attention merge of one decode token into the attention output.
    fn merge(&mut self, merge: &KernelRecord) -> Result<(), RunError> {
        let s = &self.s;
        self.backend.call(
            merge,
            &[
                ("partial", Arg::Buf(s.partial, 0)),
                ("splits", Arg::Buf(s.splits, 0)),
                ("out", Arg::Buf(s.attn, 0)),
                ("tokens", Arg::U32(1)),
            ],
        )
    }
}

/// The kernels of a sparse attention pass and the budget in blocks.
struct QsaKernels {
    score: KernelRecord,
    select: KernelRecord,
    sparse: KernelRecord,
    budget: u32,
}

impl Model {
    /// One layer's attention up to its split partial states: dense, or, given QSA's
    /// (score, select, sparse attention) kernels and budget, over the selected blocks.
    fn attention(
        &mut self,
        dense: &KernelRecord,
        qsa: Option<&QsaKernels>,
        q: Arg,
        cache: Cache,
        t: u32,
        n_blocks: u32,
    ) -> Result<(), RunError> {
        let s = &self.s;
        let buf = |id| Arg::Buf(id, 0);
        let (pos, tokens) = (("pos", buf(s.pos)), ("tokens", Arg::U32(t)));
        let mut common = vec![
            ("q", q),
            ("k_cache", buf(cache.k)),
            ("v_cache", buf(cache.v)),
            ("partial", buf(s.partial)),
            ("splits", buf(s.splits)),
            pos,
            tokens,
            ("seqs", Arg::U32(1)),
            ("n_ctx", Arg::U32(self.n_ctx)),
        ];
        common.extend(self.kv_args());
        let Some(QsaKernels { score, select, sparse, budget }) = qsa else {
            return self.backend.call(dense, &common);
        };
        let (scores, list, count, blocks) = (
            ("scores", buf(s.scores)),
            ("list", buf(s.list)),
            ("count", buf(s.count)),
            ("n_blocks", Arg::U32(n_blocks)),
        );
        let mut score_args = vec![("q", q), ("k_summary", buf(cache.summary)), scores, pos, tokens];
        score_args.extend(self.kv_args());
        self.backend.call(score, &score_args)?;
        self.backend.call(select, &[scores, list, count, pos, tokens, blocks, ("budget", Arg::U32(*budget))])?;
        let mut args = common.to_vec();
        args.extend([list, count, blocks]);
        self.backend.call(sparse, &args)
    }
}
