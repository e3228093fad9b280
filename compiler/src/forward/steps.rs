//! The forward pass of one window as data: every launch in order, with its op and the
//! buffers and scalars it is bound to, named by what they hold ([`Buf`], [`Value`]). The
//! runtime resolves the names to its buffers and launches the steps as they come; the
//! fusions (stacked products in the decode step, producers that quantize their output
//! for int8 products, qwen3's one-launch head norms) are decided here, from what was
//! compiled ([`Compiled`]).

use super::{Forward, Matrix};
use crate::ops::{ExpertInput, Op};
use crate::quant::GgmlType;

/// A buffer of the forward pass, by what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The window's token ids.
    Ids,
    /// The residual stream (two, taking turns).
    Residual(u8),
    /// The normed hidden state: the next products' input.
    Normed,
    /// Queries, keys and values (separate products).
    Q,
    /// Keys.
    K,
    /// Values.
    V,
    /// Q, K and V of the decode step's stacked product, side by side.
    Qkv,
    /// Per-head normed queries, then keys.
    QkNormed,
    /// Attention's merged output.
    AttnOut,
    /// A projection's output on its way back to the residual stream.
    Proj,
    /// That output RMS-normed (Gemma's norms after attention and the FFN).
    PostNormed,
    /// The FFN's gate.
    Gate,
    /// The FFN's up.
    Up,
    /// Gate and up of the decode step's stacked product.
    GateUp,
    /// SiLU(gate) · up.
    Act,
    /// The router's logits.
    RouterLogits,
    /// The window's routing ([`crate::ops::RouteLayout`]).
    Route,
    /// Each choice's routing weight.
    RouteWeights,
    /// A prompt chunk's choices grouped by expert: each expert's first position in
    /// [`Buf::ExpertOrder`] ([`crate::ops::MoeGroup`]).
    ExpertOffsets,
    /// The chunk's choices `t·used + j`, grouped by expert.
    ExpertOrder,
    /// Each choice's gate·up.
    ExpertGateUp,
    /// Each choice's expert output.
    ExpertParts,
    /// A product input's int8 quants.
    Quants,
    /// Their per-chunk (scale, sum).
    QuantScales,
    /// A stream-K GEMM's partial tiles (its workspace).
    GemmPartial,
    /// A stream-K GEMM's arrival counts (its workspace, zero between launches).
    GemmFlags,
    /// Attention's split partial states.
    Partial,
    /// Attention's splits per (token, head).
    Splits,
    /// QSA's block scores.
    Scores,
    /// QSA's selected blocks.
    List,
    /// QSA's selected block counts.
    Count,
    /// Each sequence's first position in the pass, one a sequence.
    Pos,
    /// Each sequence's cache slot in the layers' pools, one a sequence.
    Slots,
    /// The RoPE table.
    CosSin,
    /// The RoPE table of the sliding-window layers (their own base, never scaled).
    CosSinLocal,
    /// The logits.
    Logits,
    /// The KV page table: each slot's row names the pool page of each of its blocks.
    Pages,
    /// A layer's key cache pool (pages of every slot), which kernels find a sequence's
    /// rows in through [`Buf::Slots`] and [`Buf::Pages`].
    KCaches(u32),
    /// A layer's value cache pool.
    VCaches(u32),
    /// A layer's key block summaries, one a page.
    KSummaries(u32),
    /// A layer's row of the expert-to-slot map.
    SlotOf(u32),
    /// A layer's expert pool: stacked gate·up (read by the token's row) or down.
    Pool(u32, ExpertInput),
    /// A layer's weight.
    Layer(u32, Weight),
    /// The token embedding table.
    Embedding,
    /// The output norm.
    OutputNorm,
    /// The output projection.
    Output,
}

/// A weight of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Weight {
    /// The attention norm.
    AttnNorm,
    /// Projections.
    Q,
    /// Key projection.
    K,
    /// Value projection.
    V,
    /// Q, K and V stacked.
    Qkv,
    /// Biases (Qwen2).
    QBias,
    /// Key bias.
    KBias,
    /// Value bias.
    VBias,
    /// Per-head norms (Qwen3): query, key, and both side by side.
    QNorm,
    /// Key head norm.
    KNorm,
    /// Both head norms.
    QkNorm,
    /// Attention output projection.
    O,
    /// The norm of attention's output (Gemma).
    PostAttnNorm,
    /// The norm of the FFN's output (Gemma).
    PostFfnNorm,
    /// The FFN norm.
    FfnNorm,
    /// FFN gate.
    Gate,
    /// FFN up.
    Up,
    /// Gate and up stacked.
    GateUp,
    /// FFN down.
    Down,
    /// The experts' router.
    Router,
}

/// A buffer from an element (4 bytes) on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    /// The buffer.
    pub buf: Buf,
    /// Elements of 4 bytes before the argument's first.
    pub offset: u32,
}

/// A scalar argument: known when the steps are made, or the runtime's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// This value.
    Count(u32),
    /// The KV cache's positions.
    Ctx,
    /// The KV cache's blocks.
    Blocks,
    /// QSA's budget in blocks.
    Budget,
    /// The expert pools' slots.
    Slots,
    /// Rows of a layer's KV cache pool: positions of every page.
    CacheRows,
    /// Pages of a layer's pool (its key summaries, one a page).
    SummaryRows,
    /// Entries of the page table: blocks of every slot.
    TableEntries,
}

/// One step of a pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Launch `op`'s kernel with these arguments (by name, in any order).
    Launch {
        /// The op.
        op: Op,
        /// Buffer arguments.
        args: Vec<(&'static str, At)>,
        /// Scalar arguments.
        scalars: Vec<(&'static str, Value)>,
    },
    /// The host places the experts a layer's routing chose (a cached placement uploads
    /// the missing ones) before their products run.
    PlaceExperts(u32),
}

/// Which logits a pass leaves in [`Buf::Logits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Logits {
    /// None (a prefill chunk that is not the last).
    None,
    /// The last token's only.
    Last,
    /// Every token's of the window.
    All,
}

/// The products of one layer, by their matrices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerShape {
    /// Q, K, V and output projections.
    pub q: Matrix,
    /// Keys.
    pub k: Matrix,
    /// Values.
    pub v: Matrix,
    /// Attention output.
    pub o: Matrix,
    /// Q, K and V stacked for the decode step, where the pack allows.
    pub qkv: Option<Matrix>,
    /// The feed-forward network.
    pub ffn: FfnShape,
}

/// A layer's feed-forward products.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FfnShape {
    /// SiLU-gated.
    Dense {
        /// Gate.
        gate: Matrix,
        /// Up.
        up: Matrix,
        /// Down.
        down: Matrix,
        /// Gate and up stacked for the decode step, where the pack allows.
        gate_up: Option<Matrix>,
    },
    /// A mixture of experts.
    Experts {
        /// The router.
        router: Matrix,
        /// Type of the stacked gate·up pool.
        gate_up: GgmlType,
        /// Type of the down pool.
        down: GgmlType,
    },
}

/// What the steps ask of the compiled kernels.
pub trait Compiled {
    /// Whether `op`'s kernel takes the int8-dot path.
    fn int8(&mut self, op: &Op) -> bool;
    /// Whether `op`'s kernel was compiled.
    fn has(&mut self, op: &Op) -> bool;
}

/// One pass to describe.
#[derive(Clone, Copy, Debug)]
pub struct Pass<'a> {
    /// Tokens in the window.
    pub tokens: u32,
    /// Sequences in the window: each takes `tokens / seqs` consecutive columns at its
    /// own next positions in its own KV caches; 1 for a prompt chunk or a verify window.
    /// A batch of decode steps (one column each) splits its attention; prompt chunks of
    /// several sequences on the matrix units take the prefill attention. Either attends
    /// densely.
    pub seqs: u32,
    /// Which logits it leaves.
    pub logits: Logits,
    /// The first layer that attends to QSA's selected blocks (none: all dense).
    pub sparse_from: Option<u32>,
    /// The layers' products.
    pub layers: &'a [LayerShape],
    /// The output projection.
    pub output: Matrix,
    /// The embedding table's type.
    pub embedding: GgmlType,
    /// A prompt chunk on the matrix units: its products of more than one column are
    /// GEMMs and its attention is the prefill kernel's; otherwise GEMV windows and
    /// split decode attention.
    pub gemm: bool,
}

fn at(buf: Buf) -> At {
    At { buf, offset: 0 }
}

/// A stream-K GEMM's workspace arguments.
const PARTIAL: (&str, At) = ("part", At { buf: Buf::GemmPartial, offset: 0 });
const FLAGS: (&str, At) = ("flags", At { buf: Buf::GemmFlags, offset: 0 });

/// The steps being written, with the kernels they ask about.
struct Walk<'f, 'k> {
    f: &'f Forward,
    k: &'k mut dyn Compiled,
    steps: Vec<Step>,
    gemm: bool,
    /// A batch of decode steps on the matrix units: its products take the batch's
    /// GEMVs where they were compiled.
    batch: bool,
}

impl Walk<'_, '_> {
    fn launch(&mut self, op: Op, args: &[(&'static str, At)], scalars: &[(&'static str, Value)]) {
        self.steps.push(Step::Launch { op, args: args.to_vec(), scalars: scalars.to_vec() });
    }

    /// The product of `window` columns with `m`: in a pass on the matrix units, a
    /// batch's GEMV where one takes them, else a GEMM.
    fn product(&mut self, m: Matrix, window: u32) -> Op {
        if !(self.gemm && window > 1) {
            return self.f.product(m, window);
        }
        let batch = self.f.batch_product(m);
        let fits = window <= crate::plan::rules::BATCH_GEMV_COLUMNS;
        // A batch's GEMV is only ever planned on the matrix unit (int8).
        if self.batch && fits && self.k.has(&batch) && self.k.int8(&batch) { batch } else { self.f.gemm(m) }
    }

    /// `m`, stacked matrices, where a pass of `window` columns multiplies them in one
    /// product; else `None`, and each is multiplied alone (a GEMM lays its output out
    /// as one matrix's).
    fn stacked(&mut self, m: Option<Matrix>, window: u32) -> Option<Matrix> {
        let op = self.product(m?, window);
        (!matches!(op, Op::Gemm(_)) && self.k.has(&op)).then_some(m?)
    }

    /// The products that read a layer's attention norm, for a window of `t` tokens.
    fn attention_inputs(&mut self, ly: &LayerShape, t: u32) -> Vec<Matrix> {
        match self.stacked(ly.qkv, t) {
            Some(qkv) => vec![qkv],
            None => vec![ly.q, ly.k, ly.v],
        }
    }

    /// The products that read a layer's feed-forward norm, for a window of `t` tokens
    /// (none for experts, whose products always read int8 input).
    fn ffn_inputs(&mut self, ly: &LayerShape, t: u32) -> Vec<Matrix> {
        match ly.ffn {
            FfnShape::Dense { gate, up, gate_up, .. } => match self.stacked(gate_up, t) {
                Some(gu) => vec![gu],
                None => vec![gate, up],
            },
            FfnShape::Experts { .. } => vec![],
        }
    }

    fn int8(&mut self, m: Matrix, window: u32) -> bool {
        let op = self.product(m, window);
        self.k.int8(&op)
    }

    /// Whether `producer` should also quantize its output for the products of
    /// `consumers`: where one of them takes the int8 path and the fused kernel exists.
    fn fuse_q8(&mut self, producer: &Op, consumers: &[Matrix], window: u32) -> bool {
        self.k.has(producer) && consumers.iter().any(|m| self.int8(*m, window))
    }

    /// The products of one input `x` (`window` rows): where any takes the int8 path, `x`
    /// is quantized once for all of them, unless its producer did (`quantized`).
    fn products(&mut self, x: At, window: u32, products: &[(At, Matrix, At)], quantized: bool) {
        let int8: Vec<bool> = products.iter().map(|(_, m, _)| self.int8(*m, window)).collect();
        let (xq, xd) = (at(Buf::Quants), at(Buf::QuantScales));
        if let Some((_, m, _)) = products.iter().zip(&int8).find(|(_, q)| **q).map(|p| p.0)
            && !quantized
        {
            let quantize = self.f.quantize(m.cols);
            self.launch(quantize, &[("x", x), ("xq", xq), ("xd", xd)], &[("rows", Value::Count(window))]);
        }
        for ((w, m, y), int8) in products.iter().zip(int8) {
            let op = self.product(*m, window);
            match (int8, &op) {
                // Stream-K kernels use the workspace; the others have no such buffers.
                (true, Op::Gemm(_)) => self.launch(
                    op,
                    &[("w", *w), ("xq", xq), ("xd", xd), ("y", *y), PARTIAL, FLAGS],
                    &[("tokens", Value::Count(window))],
                ),
                (true, Op::BatchGemv(_)) => self.launch(
                    op,
                    &[("w", *w), ("xq", xq), ("xd", xd), ("y", *y)],
                    &[("tokens", Value::Count(window))],
                ),
                (true, _) => self.launch(op, &[("w", *w), ("xq", xq), ("xd", xd), ("y", *y)], &[]),
                (false, Op::Gemm(_)) => self.launch(
                    op,
                    &[("w", *w), ("x", x), ("y", *y), PARTIAL, FLAGS],
                    &[("tokens", Value::Count(window))],
                ),
                (false, _) => self.launch(op, &[("w", *w), ("x", x), ("y", *y)], &[]),
            }
        }
    }

    /// `sum = a + b` (the new residual stream) and `y = rmsnorm(sum) · w` over `rows`
    /// rows, for the products of `next`; returns whether it also quantized `y` for them.
    /// `b` is a buffer (Gemma's normed by the weights `b_norm` first), or with `None` the
    /// weighted sum of the experts' outputs.
    #[allow(clippy::too_many_arguments)]
    fn add_norm(&mut self, a: Buf, b: Option<Buf>, b_norm: Buf, w: Buf, sum: Buf, rows: u32, next: &[Matrix]) -> bool {
        let experts = b.is_none() && self.f.experts.is_some();
        let fused = self.f.add_norm(true, experts);
        let q8 = if next.is_empty() { self.k.has(&fused) } else { self.fuse_q8(&fused, next, rows) };
        let mut args = vec![("a", at(a)), ("w", at(w)), ("sum", at(sum)), ("y", at(Buf::Normed))];
        match b {
            Some(b) => args.push(("b", at(b))),
            None => args.extend([("parts", at(Buf::ExpertParts)), ("weights", at(Buf::RouteWeights))]),
        }
        if self.f.post_norms() {
            args.push(("wb", at(b_norm)));
        }
        if q8 {
            args.extend([("xq", at(Buf::Quants)), ("xd", at(Buf::QuantScales))]);
        }
        self.launch(self.f.add_norm(q8, experts), &args, &[("rows", Value::Count(rows))]);
        q8
    }

    /// A layer's attention up to its merged output: a prompt chunk's prefill attention,
    /// or split attention, dense (over a local layer's window) or over QSA's selection,
    /// and the merge of its splits; `o` is the output projection that reads it. Returns
    /// whether the merge quantized its output for it.
    fn attention(&mut self, l: u32, q: At, t: u32, seqs: u32, sparse: bool, o: Matrix) -> bool {
        let tokens = ("tokens", Value::Count(t));
        let window = self.f.window(l);
        if self.gemm
            && (seqs == 1 || t > seqs)
            && let Some(prefill) = self.f.attention_prefill(window)
        {
            let (k, v) = (at(Buf::KCaches(l)), at(Buf::VCaches(l)));
            let args = [
                ("q", q),
                ("k_cache", k),
                ("v_cache", v),
                ("out", at(Buf::AttnOut)),
                ("pos", at(Buf::Pos)),
                ("slots", at(Buf::Slots)),
                ("pages", at(Buf::Pages)),
            ];
            let sizes = [
                tokens,
                ("seqs", Value::Count(seqs)),
                ("n_ctx", Value::Ctx),
                ("n_blocks", Value::Blocks),
                ("cache_rows", Value::CacheRows),
                ("table_entries", Value::TableEntries),
            ];
            self.launch(prefill, &args, &sizes);
            return false;
        }
        self.split_attention(l, q, t, seqs, sparse && window.is_none() && seqs == 1, window);
        // The merge quantizes its output where the output projection reads int8 (a
        // window's or a batch's GEMV, an int8 GEMM).
        let merge_q8 = self.fuse_q8(&self.f.merge(true), &[o], t);
        let (partial, splits) = (("partial", at(Buf::Partial)), ("splits", at(Buf::Splits)));
        let mut args = vec![partial, splits, ("out", at(Buf::AttnOut))];
        if merge_q8 {
            args.extend([("xq", at(Buf::Quants)), ("xd", at(Buf::QuantScales))]);
        }
        self.launch(self.f.merge(merge_q8), &args, &[tokens]);
        merge_q8
    }

    /// Split attention's partial states of the pass's `t` tokens, its `seqs` sequences'
    /// in one launch (QSA's selection: one sequence).
    fn split_attention(&mut self, l: u32, q: At, t: u32, seqs: u32, sparse: bool, window: Option<u32>) {
        let (blocks, table) = (("n_blocks", Value::Blocks), ("table_entries", Value::TableEntries));
        let sizes = [
            ("tokens", Value::Count(t)),
            ("seqs", Value::Count(seqs)),
            ("n_ctx", Value::Ctx),
            ("cache_rows", Value::CacheRows),
            blocks,
            table,
        ];
        let (pos, slots, pages) = (("pos", at(Buf::Pos)), ("slots", at(Buf::Slots)), ("pages", at(Buf::Pages)));
        let mut args = vec![
            ("q", q),
            ("k_cache", at(Buf::KCaches(l))),
            ("v_cache", at(Buf::VCaches(l))),
            ("partial", at(Buf::Partial)),
            ("splits", at(Buf::Splits)),
            pos,
            slots,
            pages,
        ];
        if !sparse {
            self.launch(self.f.attention(false, window), &args, &sizes);
            return;
        }
        let (scores, list, count) = (("scores", at(Buf::Scores)), ("list", at(Buf::List)), ("count", at(Buf::Count)));
        self.launch(
            self.f.qsa_score(),
            &[("q", q), ("k_summary", at(Buf::KSummaries(l))), scores, pos, slots, pages],
            &[sizes[0], blocks, ("summary_rows", Value::SummaryRows), table],
        );
        self.launch(self.f.qsa_select(), &[scores, list, count, pos], &[sizes[0], blocks, ("budget", Value::Budget)]);
        args.extend([list, count]);
        self.launch(self.f.attention(true, None), &args, &sizes);
    }

    /// Gemma's norm of a block's output `x` before the residual add, where the family
    /// has one: returns where the output is now.
    fn post_norm(&mut self, l: u32, x: Buf, weight: Weight, t: u32) -> Buf {
        if !self.f.post_norms() {
            return x;
        }
        let args = [("x", at(x)), ("w", at(Buf::Layer(l, weight))), ("y", at(Buf::PostNormed))];
        self.launch(self.f.norm(), &args, &[("rows", Value::Count(t))]);
        Buf::PostNormed
    }

    /// The SiLU-gated FFN of the normed state (quantized already where `h_q8`) into
    /// [`Buf::Proj`].
    fn dense_ffn(&mut self, l: u32, ffn: FfnShape, t: u32, h_q8: bool) {
        let FfnShape::Dense { gate, up, down, gate_up } = ffn else { return };
        let w = |w| at(Buf::Layer(l, w));
        let (gate_in, up_in) = match self.stacked(gate_up, t) {
            Some(gu) => {
                self.products(at(Buf::Normed), t, &[(w(Weight::GateUp), gu, at(Buf::GateUp))], h_q8);
                (at(Buf::GateUp), At { buf: Buf::GateUp, offset: t * gate.rows })
            }
            _ => {
                let products = [(w(Weight::Gate), gate, at(Buf::Gate)), (w(Weight::Up), up, at(Buf::Up))];
                self.products(at(Buf::Normed), t, &products, h_q8);
                (at(Buf::Gate), at(Buf::Up))
            }
        };
        let act_q8 = self.fuse_q8(&self.f.silu_mul(true), &[down], t);
        let mut args = vec![("gate", gate_in), ("up", up_in), ("y", at(Buf::Act))];
        if act_q8 {
            args.extend([("xq", at(Buf::Quants)), ("xd", at(Buf::QuantScales))]);
        }
        self.launch(self.f.silu_mul(act_q8), &args, &[("tokens", Value::Count(t))]);
        self.products(at(Buf::Act), t, &[(w(Weight::Down), down, at(Buf::Proj))], act_q8);
    }

    /// A layer's mixture of experts over the normed state: router, routing, the host's
    /// placement, the chosen experts' gate·up, SiLU·mul and down, leaving each choice's
    /// output and weight for the next norm (or the last layer's sum).
    fn expert_ffn(&mut self, l: u32, ffn: FfnShape, t: u32, h_q8: bool) {
        let (FfnShape::Experts { router, gate_up, down }, Some(shape)) = (ffn, self.f.experts) else { return };
        let (Some(route), Some(first), Some(second)) = (
            self.f.route(),
            self.f.expert_product(gate_up, t, ExpertInput::Token),
            self.f.expert_product(down, t, ExpertInput::Choice),
        ) else {
            return;
        };
        let normed = at(Buf::Normed);
        // The router reads the state as floats, so it does not disturb its quants.
        self.products(normed, t, &[(at(Buf::Layer(l, Weight::Router)), router, at(Buf::RouterLogits))], h_q8);
        if self.gemm && self.grouped_experts(l, ffn, t, h_q8) {
            return;
        }
        let routing =
            [("logits", at(Buf::RouterLogits)), ("route", at(Buf::Route)), ("weights", at(Buf::RouteWeights))];
        self.launch(route, &routing, &[("tokens", Value::Count(t))]);
        self.steps.push(Step::PlaceExperts(l));
        let (int8_first, int8_second) = (self.k.int8(&first), self.k.int8(&second));
        let (xq, xd) = (("xq", at(Buf::Quants)), ("xd", at(Buf::QuantScales)));
        if int8_first && !h_q8 {
            let quantize = self.f.quantize(self.f.embd);
            self.launch(quantize, &[("x", normed), xq, xd], &[("rows", Value::Count(t))]);
        }
        let product = |walk: &mut Self, op: Op, int8: bool, input: ExpertInput, x: At, y: Buf| {
            let mut args = vec![
                ("w", at(Buf::Pool(l, input))),
                ("route", at(Buf::Route)),
                ("slot_of", at(Buf::SlotOf(l))),
                ("y", at(y)),
            ];
            if int8 {
                args.extend([xq, xd]);
            } else {
                args.push(("x", x));
            }
            walk.launch(op, &args, &[("slots", Value::Slots)]);
        };
        product(self, first, int8_first, ExpertInput::Token, normed, Buf::ExpertGateUp);
        let mut args = vec![("gate_up", at(Buf::ExpertGateUp)), ("y", at(Buf::Act))];
        if int8_second {
            args.extend([xq, xd]);
        }
        self.launch(self.f.silu_mul(int8_second), &args, &[("tokens", Value::Count(t * shape.used))]);
        product(self, second, int8_second, ExpertInput::Choice, at(Buf::Act), Buf::ExpertParts);
    }

    /// A prompt chunk's experts after the router: the choices grouped by expert, and
    /// the experts' gate·up, SiLU·mul and down as grouped GEMMs (resident pools: no
    /// placement). False, launching nothing, where those kernels were not compiled (the
    /// runtime then reads prompts in windows).
    fn grouped_experts(&mut self, l: u32, ffn: FfnShape, t: u32, h_q8: bool) -> bool {
        let (FfnShape::Experts { gate_up, down, .. }, Some(shape)) = (ffn, self.f.experts) else { return false };
        let (Some(group), Some(first), Some(second)) = (
            self.f.group(),
            self.f.expert_gemm(gate_up, ExpertInput::Token),
            self.f.expert_gemm(down, ExpertInput::Choice),
        ) else {
            return false;
        };
        if !(self.k.has(&group) && self.k.has(&first) && self.k.has(&second)) {
            return false;
        }
        let (offsets, order) = (("offsets", at(Buf::ExpertOffsets)), ("order", at(Buf::ExpertOrder)));
        let tokens = ("tokens", Value::Count(t));
        let args = [("logits", at(Buf::RouterLogits)), ("weights", at(Buf::RouteWeights)), offsets, order];
        self.launch(group, &args, &[tokens]);
        let (int8_first, int8_second) = (self.k.int8(&first), self.k.int8(&second));
        let (xq, xd) = (("xq", at(Buf::Quants)), ("xd", at(Buf::QuantScales)));
        if int8_first && !h_q8 {
            let quantize = self.f.quantize(self.f.embd);
            self.launch(quantize, &[("x", at(Buf::Normed)), xq, xd], &[("rows", Value::Count(t))]);
        }
        let product = |walk: &mut Self, op: Op, int8: bool, input: ExpertInput, x: Buf, y: Buf| {
            let mut args = vec![("w", at(Buf::Pool(l, input))), ("slot_of", at(Buf::SlotOf(l))), offsets, order];
            match int8 {
                true => args.extend([xq, xd]),
                false => args.push(("x", at(x))),
            }
            args.push(("y", at(y)));
            walk.launch(op, &args, &[tokens, ("slots", Value::Slots)]);
        };
        product(self, first, int8_first, ExpertInput::Token, Buf::Normed, Buf::ExpertGateUp);
        let mut args = vec![("gate_up", at(Buf::ExpertGateUp)), ("y", at(Buf::Act))];
        if int8_second {
            args.extend([xq, xd]);
        }
        self.launch(self.f.silu_mul(int8_second), &args, &[("tokens", Value::Count(t * shape.used))]);
        product(self, second, int8_second, ExpertInput::Choice, Buf::Act, Buf::ExpertParts);
        true
    }
}

impl Forward {
    /// Every step of `pass`, in launch order.
    pub fn steps(&self, pass: &Pass<'_>, compiled: &mut dyn Compiled) -> Vec<Step> {
        // A batch of decode steps (several prompts' chunks are not one).
        let batch = pass.gemm && pass.seqs > 1 && pass.tokens == pass.seqs;
        let mut w = Walk { f: self, k: compiled, steps: Vec::new(), gemm: pass.gemm, batch };
        let t = pass.tokens;
        let (qd, kd) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let count = Value::Count;
        let layer = |l: u32, weight| at(Buf::Layer(l, weight));
        let embed = [("table", at(Buf::Embedding)), ("ids", at(Buf::Ids)), ("y", at(Buf::Residual(0)))];
        w.launch(self.embed(pass.embedding), &embed, &[("tokens", count(t))]);
        let norm = [("x", at(Buf::Residual(0))), ("w", layer(0, Weight::AttnNorm)), ("y", at(Buf::Normed))];
        w.launch(self.norm(), &norm, &[("rows", count(t))]);
        // Whether the normed state's int8 quants were made by the norm that wrote it.
        let mut h_q8 = false;
        let mut cur = 0u8;
        let residual = |i: u8| Buf::Residual(i);
        for (l, ly) in (0u32..).zip(pass.layers) {
            // Q, K, V: one stacked product, where the pack and the kernels allow.
            let normed = at(Buf::Normed);
            let stacked = w.stacked(ly.qkv, t);
            let (q, k, v) = match stacked {
                Some(qkv) => {
                    w.products(normed, t, &[(layer(l, Weight::Qkv), qkv, at(Buf::Qkv))], h_q8);
                    let part = |offset| At { buf: Buf::Qkv, offset };
                    (part(0), part(t * qd), part(t * (qd + kd)))
                }
                _ => {
                    let (q, k, v) = (at(Buf::Q), at(Buf::K), at(Buf::V));
                    let products = [
                        (layer(l, Weight::Q), ly.q, q),
                        (layer(l, Weight::K), ly.k, k),
                        (layer(l, Weight::V), ly.v, v),
                    ];
                    w.products(normed, t, &products, h_q8);
                    (q, k, v)
                }
            };
            let biases = [(Weight::QBias, q), (Weight::KBias, k), (Weight::VBias, v)];
            for (op, (bias, y)) in self.biases().into_iter().flatten().zip(biases) {
                w.launch(op, &[("a", y), ("b", layer(l, bias)), ("y", y)], &[("tokens", count(t))]);
            }
            // Per-head norms write Q then K into one buffer: in one launch where the
            // decode step's stacked product left the Q and K heads side by side.
            let (q, k) = match (self.head_norm(), self.qk_norm()) {
                (Some(head_norm), Some(fused)) => {
                    let (qn, kn) = (at(Buf::QkNormed), At { buf: Buf::QkNormed, offset: t * qd });
                    if t == 1 && stacked.is_some() && w.k.has(&fused) {
                        let args = [("x", q), ("w", layer(l, Weight::QkNorm)), ("y", qn)];
                        w.launch(fused, &args, &[("rows", count(self.heads + self.kv_heads))]);
                    } else {
                        let args = [("x", q), ("w", layer(l, Weight::QNorm)), ("y", qn)];
                        w.launch(head_norm.clone(), &args, &[("rows", count(t * self.heads))]);
                        let args = [("x", k), ("w", layer(l, Weight::KNorm)), ("y", kn)];
                        w.launch(head_norm, &args, &[("rows", count(t * self.kv_heads))]);
                    }
                    (qn, kn)
                }
                _ => (q, k),
            };
            // Every sequence's keys and values into its own cache slot at its own positions.
            let store = [
                ("q", q),
                ("k", k),
                ("v", v),
                ("k_cache", at(Buf::KCaches(l))),
                ("v_cache", at(Buf::VCaches(l))),
                ("k_summary", at(Buf::KSummaries(l))),
                ("cos_sin", at(if self.window(l).is_some() { Buf::CosSinLocal } else { Buf::CosSin })),
                ("pos", at(Buf::Pos)),
                ("slots", at(Buf::Slots)),
                ("pages", at(Buf::Pages)),
            ];
            let sizes = [
                ("tokens", count(t)),
                ("seqs", count(pass.seqs.max(1))),
                ("n_ctx", Value::Ctx),
                ("n_blocks", Value::Blocks),
                ("cache_rows", Value::CacheRows),
                ("summary_rows", Value::SummaryRows),
                ("table_entries", Value::TableEntries),
            ];
            w.launch(self.rope_store(), &store, &sizes);
            let seqs = pass.seqs.max(1);
            let sparse = pass.sparse_from.is_some_and(|first| l >= first);
            let merge_q8 = w.attention(l, q, t, seqs, sparse, ly.o);
            w.products(at(Buf::AttnOut), t, &[(layer(l, Weight::O), ly.o, at(Buf::Proj))], merge_q8);
            let ffn_norm = Buf::Layer(l, Weight::FfnNorm);
            let (a, sum, next) = (residual(cur), residual(1 - cur), w.ffn_inputs(ly, t));
            let post = Buf::Layer(l, Weight::PostAttnNorm);
            h_q8 = w.add_norm(a, Some(Buf::Proj), post, ffn_norm, sum, t, &next);
            cur = 1 - cur;
            // Where the FFN's output is: the projection's, or (experts) their parts and
            // weights, which the next norm sums itself.
            let out = match ly.ffn {
                FfnShape::Dense { .. } => {
                    w.dense_ffn(l, ly.ffn, t, h_q8);
                    Some(Buf::Proj)
                }
                FfnShape::Experts { .. } => {
                    w.expert_ffn(l, ly.ffn, t, h_q8);
                    None
                }
            };
            match pass.layers.get(l as usize + 1) {
                Some(next) => {
                    let norm = Buf::Layer(l + 1, Weight::AttnNorm);
                    let (a, sum, next) = (residual(cur), residual(1 - cur), w.attention_inputs(next, t));
                    let post = Buf::Layer(l, Weight::PostFfnNorm);
                    h_q8 = w.add_norm(a, out, post, norm, sum, t, &next);
                }
                None => {
                    if let (None, Some(sum)) = (out, self.moe_sum()) {
                        let args = [("parts", at(Buf::ExpertParts)), ("weights", at(Buf::RouteWeights))];
                        w.launch(sum, &[args[0], args[1], ("y", at(Buf::Proj))], &[("tokens", count(t))]);
                    }
                    // The last layer's output, normed where the family norms it, joins the
                    // stream by a plain add.
                    let b = match out {
                        Some(out) => w.post_norm(l, out, Weight::PostFfnNorm, t),
                        None => Buf::Proj,
                    };
                    let args = [("a", at(residual(cur))), ("b", at(b)), ("y", at(residual(1 - cur)))];
                    w.launch(self.residual_add(), &args, &[("tokens", count(t))]);
                }
            }
            cur = 1 - cur;
        }
        let (rows, first) = match pass.logits {
            Logits::None => return w.steps,
            Logits::Last => (1, (t - 1) * self.embd),
            Logits::All => (t, 0),
        };
        let x = At { buf: residual(cur), offset: first };
        w.launch(
            self.norm(),
            &[("x", x), ("w", at(Buf::OutputNorm)), ("y", at(Buf::Normed))],
            &[("rows", count(rows))],
        );
        w.products(at(Buf::Normed), rows, &[(at(Buf::Output), pass.output, at(Buf::Logits))], false);
        w.steps
    }
}
