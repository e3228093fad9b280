//! `strata-run bench --attention`: one layer's attention of one decode token, timed
//! alone at several context depths, dense and with QSA at several budgets.
//!
//! The cache is filled synthetically ([`Model::fill_context`]) to the deepest context
//! once; each depth then decodes at that position. A measurement is `reps` launches of
//! the layer's attention kernels captured as one graph and replayed, so host launch
//! overhead does not count.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use strata_compiler::plan::Op;
use strata_compiler::quant::random_floats;

use super::{Model, QsaKernels, qsa};
use crate::backend::{Arg, RunError};

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
        let (heads, kv_heads, head_dim, block) = (d.heads, d.kv_heads, d.head_dim_k, self.block);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let dense = self.kernels.get(&Op::Attention { heads, kv_heads, head_dim, scale, block, sparse: false })?;
        let merge = self.kernels.get(&Op::AttentionMerge { heads, head_dim })?;
        let sparse = self.kernels.get(&Op::Attention { heads, kv_heads, head_dim, scale, block, sparse: true })?;
        let score = self.kernels.get(&Op::QsaScore { heads, kv_heads, head_dim, block })?;
        let select = self.kernels.get(&Op::QsaSelect { kv_heads, block })?;
        self.fill_context(deepest, 7)?;
        let q = random_floats(&mut ChaCha8Rng::seed_from_u64(11), (heads * head_dim) as usize, 1.0);
        let q_bytes: Vec<u8> = q.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.backend.write(self.s.q, 0, &q_bytes)?;
        let layer = qsa::DENSE_LAYERS.min(self.layers.len() - 1);
        let cache = self.caches[self.slot][layer];
        let n_blocks = self.n_ctx.div_ceil(block);
        let mut out = Vec::new();
        for &context in contexts {
            let position = (context.max(1) - 1) as i32;
            self.backend.write(self.s.pos, 0, &position.to_le_bytes())?;
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
                self.backend.begin_capture()?;
                let queued = (0..reps).try_for_each(|_| {
                    self.attention(&dense, kernels.as_ref(), Arg::Buf(self.s.q, 0), cache, 1, n_blocks)?;
                    let s = &self.s;
                    self.backend.call(
                        &merge,
                        &[
                            ("partial", Arg::Buf(s.partial, 0)),
                            ("splits", Arg::Buf(s.splits, 0)),
                            ("out", Arg::Buf(s.attn, 0)),
                            ("tokens", Arg::U32(1)),
                        ],
                    )
                });
                let graph = self.backend.end_capture();
                queued?;
                let graph = graph?;
                self.backend.replay(graph)?;
                let start = self.backend.mark()?;
                self.backend.replay(graph)?;
                let end = self.backend.mark()?;
                let seconds = self.backend.seconds(start, end)? / reps as f64;
                out.push(AttentionTiming { context, budget, seconds });
            }
        }
        self.reset();
        Ok(out)
    }
}
