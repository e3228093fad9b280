//! The forward pass of a window of tokens: [`Model::enqueue`] walks the layers and queues
//! every kernel call on the backend (embedding; per layer the attention norm, Q·K·V,
//! per-head norms, RoPE and the cache store, attention as split partial states and a
//! merge, the output projection, the FFN norm and the dense or mixture-of-experts FFN;
//! then the output norm and head), and the helpers it calls.
//!
//! The products of one input read it quantized once for int8-dot GEMVs: by the norm or
//! SiLU·mul that made it where a fused kernel exists, else by `quantize_q8`. Decode passes
//! past the QSA budget attend sparsely (score, select, attention over the list).
//! Nothing here synchronizes: the callers capture or run what it queues.

use strata_compiler::ops::{ExpertInput, Op};
use strata_compiler::plan::{KernelRecord, Tuning};

use super::kv::Cache;
use super::weights::{Ffn, Layer, Weight};
use super::{Model, experts, qsa};
use crate::backend::{Arg, Backend, BufferId, RunError};

/// Which logits a forward pass should leave in the logits buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk that is not the last).
    None,
    /// The last token's only.
    Last,
    /// Every token's of the window.
    All,
}

/// The kernels of a sparse attention pass and the budget in blocks.
pub(crate) struct QsaKernels {
    pub(crate) score: KernelRecord,
    pub(crate) select: KernelRecord,
    pub(crate) sparse: KernelRecord,
    pub(crate) budget: u32,
}

impl Model {
    /// Queues the forward pass of `t` tokens whose ids are already in `ids` and first
    /// position in the `pos` buffer; with `sparse`, layers past the first few attend to
    /// QSA's selected blocks.
    pub(super) fn enqueue(&mut self, ids: BufferId, t: u32, logits: Logits, sparse: bool) -> Result<(), RunError> {
        let d = self.desc.clone();
        let s = &self.s;
        let (x, h, attn, proj, pos) = (s.x, s.h, s.attn, s.proj, s.pos);
        let buf = |id| Arg::Buf(id, 0);
        let at = |id, floats: u32| Arg::Buf(id, floats as usize * 4);
        let (qd, kd) = (d.heads * d.head_dim_k, d.kv_heads * d.head_dim_k);

        let embed = self.kernels.get(&self.ops.embed(self.embed.ty))?;
        self.backend.call(
            &embed,
            &[("table", buf(self.embed.buf)), ("ids", buf(ids)), ("y", buf(x[0])), ("tokens", Arg::U32(t))],
        )?;
        let dense = self.kernels.get(&self.ops.attention(false))?;
        let qsa = match self.qsa.filter(|_| sparse) {
            Some(budget) => Some(QsaKernels {
                score: self.kernels.get(&self.ops.qsa_score())?,
                select: self.kernels.get(&self.ops.qsa_select())?,
                sparse: self.kernels.get(&self.ops.attention(true))?,
                budget,
            }),
            None => None,
        };
        let n_blocks = self.n_ctx.div_ceil(self.block);
        let rope_store = self.kernels.get(&self.ops.rope_store())?;
        let mut cur = 0;
        let norm = self.ops.norm();
        self.rmsnorm(&norm, buf(x[0]), self.layers[0].attn_norm, buf(h), t)?;
        // Whether h's int8 quants are in xq/xd already (made by the norm that wrote h).
        let mut h_q8 = false;
        for l in 0..self.layers.len() {
            let ly = self.layers[l];
            let cache = self.caches[self.slot][l];
            // Here h holds the attention norm of the residual stream x[cur].
            // Q, K, V: one stacked product when decoding, where the pack allows.
            let (q, k, v) = match ly.qkv {
                Some(qkv) if t == 1 => {
                    self.products(buf(h), 1, &[(qkv, buf(self.s.qkv))], h_q8)?;
                    (buf(self.s.qkv), at(self.s.qkv, qd), at(self.s.qkv, qd + kd))
                }
                _ => {
                    let (q, k, v) = (buf(self.s.q), buf(self.s.k), buf(self.s.v));
                    self.products(buf(h), t, &[(ly.q, q), (ly.k, k), (ly.v, v)], h_q8)?;
                    (q, k, v)
                }
            };
            let weights = [(ly.q_bias, q), (ly.k_bias, k), (ly.v_bias, v)];
            for (op, (bias, y)) in self.ops.biases().into_iter().flatten().zip(weights) {
                if let Some(bias) = bias {
                    self.add(&op, y, buf(bias.buf), y, t)?;
                }
            }
            // Per-head norms (qwen3) write Q then K into one buffer: in one launch where
            // the decode step's fused product left the Q and K heads side by side.
            let (q, k) = match (ly.qk_norm, self.ops.head_norm(), self.ops.qk_norm()) {
                (Some([qw, kw, both]), Some(head_norm), Some(fused)) => {
                    let (qn, kn) = (buf(self.s.qkn), at(self.s.qkn, t * qd));
                    if t == 1 && ly.qkv.is_some() && self.kernels.has(&fused) {
                        let spec = self.kernels.get(&fused)?;
                        let w = Arg::Buf(both.buf, both.offset);
                        self.backend
                            .call(&spec, &[("x", q), ("w", w), ("y", qn), ("rows", Arg::U32(d.heads + d.kv_heads))])?;
                    } else {
                        self.rmsnorm(&head_norm, q, qw, qn, t * d.heads)?;
                        self.rmsnorm(&head_norm, k, kw, kn, t * d.kv_heads)?;
                    }
                    (qn, kn)
                }
                _ => (q, k),
            };
            self.backend.call(
                &rope_store,
                &[
                    ("q", q),
                    ("k", k),
                    ("v", v),
                    ("k_cache", buf(cache.k)),
                    ("v_cache", buf(cache.v)),
                    ("k_summary", buf(cache.summary)),
                    ("cos_sin", buf(self.s.cos_sin)),
                    ("pos", buf(pos)),
                    ("tokens", Arg::U32(t)),
                    ("n_ctx", Arg::U32(self.n_ctx)),
                    ("n_blocks", Arg::U32(n_blocks)),
                ],
            )?;
            self.attention(&dense, qsa.as_ref().filter(|_| l >= qsa::DENSE_LAYERS), q, cache, t, n_blocks)?;
            // The merge quantizes its output where the output projection reads int8.
            let merge_q8 = self.fuse_q8(&self.ops.merge(true), &[ly.o], t)?;
            let merge = self.kernels.get(&self.ops.merge(merge_q8))?;
            let mut args = vec![("partial", buf(self.s.partial)), ("splits", buf(self.s.splits)), ("out", buf(attn))];
            if merge_q8 {
                args.extend([("xq", buf(self.s.xq)), ("xd", buf(self.s.xd))]);
            }
            args.push(("tokens", Arg::U32(t)));
            self.backend.call(&merge, &args)?;
            self.products(buf(attn), t, &[(ly.o, buf(proj))], merge_q8)?;
            h_q8 = self.add_rmsnorm(x[cur], Some(proj), ly.ffn_norm, x[1 - cur], h, t, &Self::ffn_inputs(&ly, t))?;
            cur = 1 - cur;
            // Where the FFN's output is: proj, or (experts) their parts and weights, which
            // the next norm sums itself.
            let out = match ly.ffn {
                Ffn::Dense { gate, up, down, gate_up } => {
                    self.dense_ffn(gate, up, down, gate_up, t, h_q8)?;
                    Some(proj)
                }
                Ffn::Experts { router } => {
                    self.expert_ffn(l as u32, router, t, h_q8)?;
                    None
                }
            };
            match self.layers.get(l + 1) {
                Some(next) => {
                    let next = *next;
                    let inputs = Self::attention_inputs(&next, t);
                    h_q8 = self.add_rmsnorm(x[cur], out, next.attn_norm, x[1 - cur], h, t, &inputs)?;
                }
                None => {
                    if out.is_none() {
                        self.moe_sum(t)?;
                    }
                    let residual = self.ops.residual_add();
                    self.add(&residual, buf(x[cur]), buf(proj), buf(x[1 - cur]), t)?;
                }
            }
            cur = 1 - cur;
        }
        let logits_buf = self.s.logits;
        let row = d.embd as usize * 4;
        match logits {
            Logits::None => Ok(()),
            Logits::Last => {
                let last = Arg::Buf(x[cur], (t as usize - 1) * row);
                self.rmsnorm(&norm, last, self.output_norm, buf(h), 1)?;
                self.gemv(self.output, buf(h), buf(logits_buf), 1)
            }
            Logits::All => {
                self.rmsnorm(&norm, buf(x[cur]), self.output_norm, buf(h), t)?;
                self.gemv(self.output, buf(h), buf(logits_buf), t)
            }
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

    fn gemv(&mut self, w: Weight, x: Arg, y: Arg, window: u32) -> Result<(), RunError> {
        self.products(x, window, &[(w, y)], false)
    }

    /// Whether the kernel `producer` should also quantize its output for `consumers`
    /// (`window` columns): where one of them takes the int8 path and the fused kernel
    /// exists.
    fn fuse_q8(&mut self, producer: &Op, consumers: &[Weight], window: u32) -> Result<bool, RunError> {
        if !self.kernels.has(producer) {
            return Ok(false);
        }
        for w in consumers {
            let spec = self.kernels.get(&self.ops.product(w.matrix(), window))?;
            if matches!(spec.tuning, Tuning::GemvQ8(_)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The products of one input `x` (`window` rows): where any takes the int8 path, `x`
    /// is quantized once for all of them, unless its producer did (`quantized`).
    fn products(&mut self, x: Arg, window: u32, products: &[(Weight, Arg)], quantized: bool) -> Result<(), RunError> {
        let specs = products
            .iter()
            .map(|(w, _)| self.kernels.get(&self.ops.product(w.matrix(), window)))
            .collect::<Result<Vec<_>, _>>()?;
        let (xq, xd) = (Arg::Buf(self.s.xq, 0), Arg::Buf(self.s.xd, 0));
        if let Some((w, _)) = products
            .iter()
            .zip(&specs)
            .find(|(_, s)| matches!(s.tuning, Tuning::GemvQ8(_)))
            .map(|p| p.0)
            .filter(|_| !quantized)
        {
            let quantize = self.kernels.get(&self.ops.quantize(w.cols))?;
            self.backend.call(&quantize, &[("x", x), ("xq", xq), ("xd", xd), ("rows", Arg::U32(window))])?;
        }
        for ((w, y), spec) in products.iter().zip(&specs) {
            let weights = ("w", Arg::Buf(w.buf, w.offset));
            match spec.tuning {
                Tuning::GemvQ8(_) => self.backend.call(spec, &[weights, ("xq", xq), ("xd", xd), ("y", *y)])?,
                _ => self.backend.call(spec, &[weights, ("x", x), ("y", *y)])?,
            }
        }
        Ok(())
    }

    fn rmsnorm(&mut self, norm: &Op, x: Arg, w: Weight, y: Arg, rows: u32) -> Result<(), RunError> {
        let spec = self.kernels.get(norm)?;
        self.backend.call(&spec, &[("x", x), ("w", Arg::Buf(w.buf, w.offset)), ("y", y), ("rows", Arg::U32(rows))])
    }

    /// `sum = a + b` (the new residual stream) and `y = rmsnorm(sum) · w`, over `rows` rows,
    /// for the products `next`; returns whether it also quantized `y` for them. `b` is a
    /// buffer, or with `None` the weighted sum of the experts' outputs in scratch.
    #[allow(clippy::too_many_arguments)]
    fn add_rmsnorm(
        &mut self,
        a: BufferId,
        b: Option<BufferId>,
        w: Weight,
        sum: BufferId,
        y: BufferId,
        rows: u32,
        next: &[Weight],
    ) -> Result<bool, RunError> {
        let experts = b.is_none() && self.desc.experts.is_some();
        let fused = self.ops.add_norm(true, experts);
        let q8 = if next.is_empty() { self.kernels.has(&fused) } else { self.fuse_q8(&fused, next, rows)? };
        let spec = self.kernels.get(&self.ops.add_norm(q8, experts))?;
        let buf = |id| Arg::Buf(id, 0);
        let mut args = vec![("a", buf(a)), ("w", buf(w.buf)), ("sum", buf(sum)), ("y", buf(y))];
        match b {
            Some(b) => args.push(("b", buf(b))),
            None => args.extend([("parts", buf(self.s.expert_parts)), ("weights", buf(self.s.route_weights))]),
        }
        if q8 {
            args.extend([("xq", buf(self.s.xq)), ("xd", buf(self.s.xd))]);
        }
        args.push(("rows", Arg::U32(rows)));
        self.backend.call(&spec, &args)?;
        Ok(q8)
    }

    /// One layer's attention up to its split partial states: dense, or, given QSA's
    /// (score, select, sparse attention) kernels and budget, over the selected blocks.
    pub(crate) fn attention(
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
        let common = [
            ("q", q),
            ("k_cache", buf(cache.k)),
            ("v_cache", buf(cache.v)),
            ("partial", buf(s.partial)),
            ("splits", buf(s.splits)),
            pos,
            tokens,
            ("n_ctx", Arg::U32(self.n_ctx)),
        ];
        let Some(QsaKernels { score, select, sparse, budget }) = qsa else {
            return self.backend.call(dense, &common);
        };
        let (scores, list, count, blocks) = (
            ("scores", buf(s.scores)),
            ("list", buf(s.list)),
            ("count", buf(s.count)),
            ("n_blocks", Arg::U32(n_blocks)),
        );
        self.backend.call(score, &[("q", q), ("k_summary", buf(cache.summary)), scores, pos, tokens, blocks])?;
        self.backend.call(select, &[scores, list, count, pos, tokens, blocks, ("budget", Arg::U32(*budget))])?;
        let mut args = common.to_vec();
        args.extend([list, count, blocks]);
        self.backend.call(sparse, &args)
    }

    /// The products that read a layer's attention norm, for a window of `t` tokens.
    fn attention_inputs(ly: &Layer, t: u32) -> Vec<Weight> {
        match ly.qkv {
            Some(qkv) if t == 1 => vec![qkv],
            _ => vec![ly.q, ly.k, ly.v],
        }
    }

    /// The products that read a layer's feed-forward norm, for a window of `t` tokens
    /// (none for experts, whose products always read int8 input).
    fn ffn_inputs(ly: &Layer, t: u32) -> Vec<Weight> {
        match ly.ffn {
            Ffn::Dense { gate_up: Some(gu), .. } if t == 1 => vec![gu],
            Ffn::Dense { gate, up, .. } => vec![gate, up],
            Ffn::Experts { .. } => vec![],
        }
    }

    /// The SiLU-gated FFN of `h` (quantized already where `h_q8`) into `proj`.
    fn dense_ffn(
        &mut self,
        gate: Weight,
        up: Weight,
        down: Weight,
        gate_up: Option<Weight>,
        t: u32,
        h_q8: bool,
    ) -> Result<(), RunError> {
        let (ffn, s) = (self.desc.ffn, &self.s);
        let (h, act, proj) = (Arg::Buf(s.h, 0), Arg::Buf(s.act, 0), Arg::Buf(s.proj, 0));
        let (gate, up) = match gate_up {
            Some(gu) if t == 1 => {
                let y = s.gate_up;
                self.products(h, 1, &[(gu, Arg::Buf(y, 0))], h_q8)?;
                (Arg::Buf(y, 0), Arg::Buf(y, ffn as usize * 4))
            }
            _ => {
                let (g, u) = (Arg::Buf(s.gate, 0), Arg::Buf(s.up, 0));
                self.products(h, t, &[(gate, g), (up, u)], h_q8)?;
                (g, u)
            }
        };
        let act_q8 = self.fuse_q8(&self.ops.silu_mul(true), &[down], t)?;
        let silu = self.kernels.get(&self.ops.silu_mul(act_q8))?;
        let mut args = vec![("gate", gate), ("up", up), ("y", act)];
        if act_q8 {
            args.extend([("xq", Arg::Buf(self.s.xq, 0)), ("xd", Arg::Buf(self.s.xd, 0))]);
        }
        args.push(("tokens", Arg::U32(t)));
        self.backend.call(&silu, &args)?;
        self.products(act, t, &[(down, proj)], act_q8)
    }

    /// Layer `layer`'s mixture of experts over `h` (quantized already where `h_q8`): router,
    /// routing (and, for a cached placement, the uploads it calls for), the chosen
    /// experts' gate·up, SiLU·mul and down, leaving each choice's output and weight in
    /// scratch for the next norm (or [`Model::moe_sum`]) to sum.
    fn expert_ffn(&mut self, layer: u32, router: Weight, t: u32, h_q8: bool) -> Result<(), RunError> {
        let Some(shape) = self.desc.experts else { return Ok(()) };
        let (embd, s) = (self.desc.embd, &self.s);
        let buf = |id| Arg::Buf(id, 0);
        let (h, logits, route, weights) = (buf(s.h), buf(s.router), buf(s.route), buf(s.route_weights));
        let (gate_up_out, act, parts, xq, xd) =
            (buf(s.expert_gate_up), buf(s.act), buf(s.expert_parts), buf(s.xq), buf(s.xd));
        let route_buf = s.route;
        // The router reads h as floats, so it does not disturb h's quants in xq/xd.
        self.products(h, t, &[(router, logits)], h_q8)?;
        let routing = self.kernels.get(&self.ops.route().ok_or(RunError::Other("no routing".into()))?)?;
        self.backend
            .call(&routing, &[("logits", logits), ("route", route), ("weights", weights), ("tokens", Arg::U32(t))])?;
        let Some(x) = self.experts.as_mut() else { return Err(RunError::Other("experts were not loaded".into())) };
        x.prepare_layer(self.backend.as_mut(), layer, route_buf)?;
        let l = layer as usize;
        let (gate_up, down, slot_of, slots) = (x.gate_up[l], x.down[l], x.slot_of, x.pool_slots);
        let row = Arg::Buf(slot_of, (layer * shape.count) as usize * 4);
        let product =
            |quant, input| self.ops.expert_product(quant, t, input).ok_or(RunError::Other("no experts".into()));
        let first = self.kernels.get(&product(gate_up.ty, ExpertInput::Token)?)?;
        let second = self.kernels.get(&product(down.ty, ExpertInput::Choice)?)?;
        let int8 = |spec: &KernelRecord| matches!(spec.tuning, Tuning::GemvQ8(_));
        // Each product reads its input quantized (int8 path) or as floats.
        let call = |b: &mut dyn Backend, spec: &KernelRecord, pool: experts::Pool, x, y| {
            let mut args = vec![("w", Arg::Buf(pool.buf, 0)), ("route", route), ("slot_of", row), ("y", y)];
            if int8(spec) {
                args.extend([("xq", xq), ("xd", xd)]);
            } else {
                args.push(("x", x));
            }
            args.push(("slots", Arg::U32(slots)));
            b.call(spec, &args)
        };
        if int8(&first) && !h_q8 {
            let quantize = self.kernels.get(&self.ops.quantize(embd))?;
            self.backend.call(&quantize, &[("x", h), ("xq", xq), ("xd", xd), ("rows", Arg::U32(t))])?;
        }
        call(self.backend.as_mut(), &first, gate_up, h, gate_up_out)?;
        let silu = self.kernels.get(&self.ops.silu_mul(int8(&second)))?;
        let mut args = vec![("gate_up", gate_up_out), ("y", act)];
        if int8(&second) {
            args.extend([("xq", xq), ("xd", xd)]);
        }
        args.push(("tokens", Arg::U32(t * shape.used)));
        self.backend.call(&silu, &args)?;
        call(self.backend.as_mut(), &second, down, act, parts)
    }

    /// `proj` = the experts' outputs weighted by the routing (the last layer's; others leave
    /// the sum to the next norm).
    fn moe_sum(&mut self, t: u32) -> Result<(), RunError> {
        let Some(sum) = self.ops.moe_sum() else { return Ok(()) };
        let s = &self.s;
        let buf = |id| Arg::Buf(id, 0);
        let args = [("parts", buf(s.expert_parts)), ("weights", buf(s.route_weights)), ("y", buf(s.proj))];
        let sum = self.kernels.get(&sum)?;
        self.backend.call(&sum, &[args[0], args[1], args[2], ("tokens", Arg::U32(t))])
    }

    fn add(&mut self, add: &Op, a: Arg, b: Arg, y: Arg, tokens: u32) -> Result<(), RunError> {
        let spec = self.kernels.get(add)?;
        self.backend.call(&spec, &[("a", a), ("b", b), ("y", y), ("tokens", Arg::U32(tokens))])
    }
}
