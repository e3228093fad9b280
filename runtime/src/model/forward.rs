//! The forward pass of a window of tokens: [`Model::enqueue`] launches the steps the
//! model's [`Forward`](strata_compiler::forward::Forward) writes for the pass (the
//! description the plan compiled), binding each named buffer to the model's own:
//! scratch, weights, the slot's KV caches, the expert pools. Between a layer's routing
//! and its experts' products the host places the chosen experts (a cached placement
//! uploads what is missing). Nothing here synchronizes: the callers capture or run what
//! it queues.

use std::sync::Arc;

use strata_compiler::forward::{At, Buf, Compiled, FfnShape, LayerShape, Pass, Step, Value, Weight as Role};
use strata_compiler::ops::{ExpertInput, Op};
use strata_compiler::plan::{KernelRecord, Tuning};
use strata_compiler::quant::GgmlType;

pub use strata_compiler::forward::Logits;

use super::weights::{Ffn, Layer, Weight};
use super::{Model, qsa};
use crate::backend::{Arg, BufferId, RunError};
use crate::kernels::Kernels;

impl Compiled for Kernels {
    fn int8(&mut self, op: &Op) -> bool {
        self.get(op).is_ok_and(|k| matches!(k.tuning, Tuning::GemvMma(_) | Tuning::GemvQ8(_) | Tuning::GemmQ8(_)))
    }

    fn has(&mut self, op: &Op) -> bool {
        Kernels::has(self, op)
    }
}

impl Layer {
    /// The layer's products, as the steps of a pass name them; a mixture of experts
    /// needs its pools' types (gate·up, down).
    pub(super) fn shape(&self, experts: Option<(GgmlType, GgmlType)>) -> Option<LayerShape> {
        let ffn = match self.ffn {
            Ffn::Dense { gate, up, down, gate_up } => FfnShape::Dense {
                gate: gate.matrix(),
                up: up.matrix(),
                down: down.matrix(),
                gate_up: gate_up.map(|w| w.stacked(&[gate, up])),
            },
            Ffn::Experts { router } => {
                let (gate_up, down) = experts?;
                FfnShape::Experts { router: router.matrix(), gate_up, down }
            }
        };
        let (q, k, v, o) = (self.q.matrix(), self.k.matrix(), self.v.matrix(), self.o.matrix());
        let qkv = self.qkv.map(|w| w.stacked(&[self.q, self.k, self.v]));
        Some(LayerShape { q, k, v, o, qkv, ffn })
    }
}

impl Model {
    /// Queues the forward pass of `t` tokens whose ids are already in `ids`, of the
    /// sequences in `slots` (`t / slots.len()` columns each), whose first positions are
    /// in the `pos` buffer; with `sparse` (one sequence), layers past the first few
    /// attend to QSA's selected blocks.
    pub(super) fn enqueue(
        &mut self,
        ids: BufferId,
        t: u32,
        slots: &[usize],
        logits: Logits,
        sparse: bool,
    ) -> Result<(), RunError> {
        for step in self.steps_of(t, slots, logits, sparse)?.iter() {
            self.run_step(step, ids)?;
        }
        Ok(())
    }

    /// The steps of the pass of `t` tokens over `slots` with `logits` (made once and
    /// kept, but for several prompts' chunks, whose shapes are many and each rare).
    pub(super) fn steps_of(
        &mut self,
        t: u32,
        slots: &[usize],
        logits: Logits,
        sparse: bool,
    ) -> Result<Arc<[Step]>, RunError> {
        let seqs = u32::try_from(slots.len()).unwrap_or(0);
        if seqs == 0 || !t.is_multiple_of(seqs) || (sparse && seqs > 1) {
            return Err(RunError::Other(format!("a pass of {t} tokens cannot hold {seqs} sequences")));
        }
        let sparse_from = self.qsa.filter(|_| sparse).map(|_| qsa::DENSE_LAYERS as u32);
        let kept = seqs == 1 || t == seqs;
        Ok(match self.passes.get(&(t, seqs, logits, sparse_from)) {
            Some(steps) => steps.clone(),
            None => {
                let pass = Pass {
                    tokens: t,
                    seqs,
                    logits,
                    sparse_from,
                    layers: &self.shapes,
                    output: self.output.matrix(),
                    embedding: self.embed.ty,
                    gemm: t > self.window && self.chunk_gemm,
                };
                let steps: Arc<[Step]> = self.ops.steps(&pass, &mut self.kernels).into();
                if kept {
                    self.passes.insert((t, seqs, logits, sparse_from), steps.clone());
                }
                steps
            }
        })
    }

    /// The steps of the pass of `t` tokens of one sequence with `logits` (as
    /// [`Model::enqueue`] made them for a dense pass), if one was made.
    pub(super) fn pass_steps(&self, t: u32, logits: Logits) -> Option<Arc<[Step]>> {
        self.passes.get(&(t, 1, logits, None)).cloned()
    }

    /// Queues one step of a pass; a launch's kernel record is returned.
    pub(super) fn run_step(&mut self, step: &Step, ids: BufferId) -> Result<Option<KernelRecord>, RunError> {
        match step {
            Step::Launch { op, args, scalars } => {
                let spec = self.kernels.get(op)?;
                let mut named = Vec::with_capacity(args.len() + scalars.len());
                for (name, at) in args {
                    named.push((*name, self.bind(*at, ids)?));
                }
                for (name, value) in scalars {
                    named.push((*name, Arg::U32(self.value(*value))));
                }
                self.backend.call(&spec, &named)?;
                Ok(Some(spec))
            }
            Step::PlaceExperts(layer) => {
                let route = self.s.route;
                let Some(x) = self.experts.as_mut() else {
                    return Err(RunError::Other("experts were not loaded".into()));
                };
                x.prepare_layer(self.backend.as_mut(), *layer, route)?;
                Ok(None)
            }
        }
    }

    /// The model's buffer a step names (`ids`: the pass's token ids).
    pub(super) fn bind(&self, at: At, ids: BufferId) -> Result<Arg, RunError> {
        let s = &self.s;
        let missing =
            || RunError::Other(format!("the forward pass names {:?}, which this model does not have", at.buf));
        let (buf, base) = match at.buf {
            Buf::Ids => (ids, 0),
            Buf::Residual(i) => (s.x[usize::from(i & 1)], 0),
            Buf::Normed => (s.h, 0),
            Buf::Q => (s.q, 0),
            Buf::K => (s.k, 0),
            Buf::V => (s.v, 0),
            Buf::Qkv => (s.qkv, 0),
            Buf::QkNormed => (s.qkn, 0),
            Buf::AttnOut => (s.attn, 0),
            Buf::Proj => (s.proj, 0),
            Buf::PostNormed => (s.post, 0),
            Buf::Gate => (s.gate, 0),
            Buf::Up => (s.up, 0),
            Buf::GateUp => (s.gate_up, 0),
            Buf::Act => (s.act, 0),
            Buf::RouterLogits => (s.router, 0),
            Buf::Route => (s.route, 0),
            Buf::RouteWeights => (s.route_weights, 0),
            Buf::ExpertOffsets => (s.expert_offsets, 0),
            Buf::ExpertOrder => (s.expert_order, 0),
            Buf::ExpertGateUp => (s.expert_gate_up, 0),
            Buf::ExpertParts => (s.expert_parts, 0),
            Buf::Quants => (s.xq, 0),
            Buf::QuantScales => (s.xd, 0),
            Buf::GemmPartial => (s.gemm_part, 0),
            Buf::GemmFlags => (s.gemm_flags, 0),
            Buf::Partial => (s.partial, 0),
            Buf::Splits => (s.splits, 0),
            Buf::Scores => (s.scores, 0),
            Buf::List => (s.list, 0),
            Buf::Count => (s.count, 0),
            Buf::Pos => (s.pos, 0),
            Buf::Slots => (s.pos, super::SLOTS_AT),
            Buf::CosSin => (s.cos_sin, 0),
            Buf::CosSinLocal => (s.cos_sin_local, 0),
            Buf::Logits => (s.logits, 0),
            Buf::Pages => (self.pages.table, 0),
            Buf::KCaches(l) | Buf::VCaches(l) | Buf::KSummaries(l) => {
                let cache = self.caches.get(l as usize).ok_or_else(missing)?;
                let buf = match at.buf {
                    Buf::KCaches(_) => cache.k,
                    Buf::VCaches(_) => cache.v,
                    _ => cache.summary,
                };
                (buf, 0)
            }
            Buf::SlotOf(l) | Buf::Pool(l, _) => {
                let x = self.experts.as_ref().ok_or_else(missing)?;
                let count = self.desc.experts.map_or(0, |e| e.count);
                match at.buf {
                    Buf::SlotOf(_) => (x.slot_of, (l * count) as usize * 4),
                    Buf::Pool(_, ExpertInput::Token) => (x.gate_up.get(l as usize).ok_or_else(missing)?.buf, 0),
                    _ => (x.down.get(l as usize).ok_or_else(missing)?.buf, 0),
                }
            }
            Buf::Layer(l, role) => {
                let w = self.layers.get(l as usize).and_then(|ly| weight(ly, role)).ok_or_else(missing)?;
                (w.buf, w.offset)
            }
            Buf::Embedding => (self.embed.buf, self.embed.offset),
            Buf::OutputNorm => (self.output_norm.buf, self.output_norm.offset),
            Buf::Output => (self.output.buf, self.output.offset),
        };
        Ok(Arg::Buf(buf, base + at.offset as usize * 4))
    }

    /// Rows of a layer's KV cache pool: every page's positions (a u32: the budget check
    /// at load keeps the pool far below 2^32 rows).
    pub(crate) fn cache_rows(&self) -> u32 {
        self.pages.total.saturating_mul(self.block)
    }

    /// Pages of a layer's KV cache pool (its key summaries, one a page).
    pub(crate) fn summary_rows(&self) -> u32 {
        self.pages.total
    }

    /// Entries of the page table: every slot's row.
    pub(crate) fn table_entries(&self) -> u32 {
        u32::try_from(self.pos.len() * self.pages.row).unwrap_or(u32::MAX)
    }

    /// The paged KV arguments of every kernel that reads the caches (extra names are
    /// ignored where a kernel has no such argument): the slots and page table, and the
    /// pool's extents.
    pub(crate) fn kv_args(&self) -> [(&'static str, Arg); 6] {
        [
            ("slots", Arg::Buf(self.s.pos, super::SLOTS_AT)),
            ("pages", Arg::Buf(self.pages.table, 0)),
            ("n_blocks", Arg::U32(self.value(Value::Blocks))),
            ("cache_rows", Arg::U32(self.cache_rows())),
            ("summary_rows", Arg::U32(self.summary_rows())),
            ("table_entries", Arg::U32(self.table_entries())),
        ]
    }

    /// A scalar a step leaves to the runtime.
    pub(super) fn value(&self, v: Value) -> u32 {
        match v {
            Value::Count(n) => n,
            Value::Ctx => self.n_ctx,
            Value::Blocks => self.n_ctx.div_ceil(self.block),
            Value::Budget => self.qsa.unwrap_or(0),
            Value::Slots => self.experts.as_ref().map_or(0, |x| x.pool_slots),
            Value::CacheRows => self.cache_rows(),
            Value::SummaryRows => self.summary_rows(),
            Value::TableEntries => self.table_entries(),
        }
    }

    /// Queues the argmax of `rows` rows of logits into `next`.
    pub(super) fn enqueue_argmax(&mut self, rows: u32) -> Result<(), RunError> {
        let spec = self.kernels.get(&self.ops.argmax())?;
        self.backend.call(
            &spec,
            &[("x", Arg::Buf(self.s.logits, 0)), ("out", Arg::Buf(self.s.next, 0)), ("rows", Arg::U32(rows))],
        )
    }
}

/// A layer's weight by its role in the steps.
fn weight(ly: &Layer, role: Role) -> Option<Weight> {
    let qk = |i: usize| ly.qk_norm.map(|w| w[i]);
    match (role, ly.ffn) {
        (Role::AttnNorm, _) => Some(ly.attn_norm),
        (Role::Q, _) => Some(ly.q),
        (Role::K, _) => Some(ly.k),
        (Role::V, _) => Some(ly.v),
        (Role::Qkv, _) => ly.qkv,
        (Role::QBias, _) => ly.q_bias,
        (Role::KBias, _) => ly.k_bias,
        (Role::VBias, _) => ly.v_bias,
        (Role::QNorm, _) => qk(0),
        (Role::KNorm, _) => qk(1),
        (Role::QkNorm, _) => qk(2),
        (Role::O, _) => Some(ly.o),
        (Role::FfnNorm, _) => Some(ly.ffn_norm),
        (Role::PostAttnNorm, _) => ly.post_norms.map(|w| w[0]),
        (Role::PostFfnNorm, _) => ly.post_norms.map(|w| w[1]),
        (Role::Gate, Ffn::Dense { gate, .. }) => Some(gate),
        (Role::Up, Ffn::Dense { up, .. }) => Some(up),
        (Role::GateUp, Ffn::Dense { gate_up, .. }) => gate_up,
        (Role::Down, Ffn::Dense { down, .. }) => Some(down),
        (Role::Router, Ffn::Experts { router }) => Some(router),
        _ => None,
    }
}
