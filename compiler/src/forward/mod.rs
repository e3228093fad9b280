//! The ops of a model's forward pass, described once from its [`ModelDesc`]: which
//! kernel each step of a window launches. [`crate::plan::plan`] compiles what these
//! describe for every window; the runtime's forward walk asks the same description for
//! the kernel of each step, so the two cannot disagree about a family's RoPE style,
//! attention scale, norms, biases or experts, nor about which producer quantizes its
//! output for the int8-dot products that read it. [`Forward::steps`] writes a whole pass
//! as data (`steps.rs`): the runtime launches it as it comes.

mod steps;

pub use steps::{At, Buf, Compiled, FfnShape, LayerShape, Logits, Pass, Step, Value, Weight};

use crate::model::{Experts, ModelDesc, SlidingWindow};
use crate::ops::{self, Activation, ExpertInput, Op, RopeStyle};
use crate::pack::Pack;
use crate::quant::GgmlType;

/// A weight matrix a product reads: type and shape (rows of `cols`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matrix {
    /// Weight type.
    pub quant: GgmlType,
    /// Output features.
    pub rows: u32,
    /// Input features.
    pub cols: u32,
    /// The matrices stacked in it (Q·K·V, gate·up): products of several columns lay
    /// out each one's outputs apart ([`ops::Stack`]).
    pub stack: ops::Stack,
}

impl Matrix {
    /// One matrix.
    pub fn new(quant: GgmlType, rows: u32, cols: u32) -> Matrix {
        Matrix { quant, rows, cols, stack: ops::Stack::SINGLE }
    }
}

/// The forward pass of one model: every step's op.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    embd: u32,
    vocab: u32,
    eps: f32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rope_dims: u32,
    rope_style: RopeStyle,
    qkv_bias: bool,
    qk_norm: bool,
    post_norms: bool,
    act: Activation,
    embed_scale: f32,
    scale: f32,
    sliding: Option<SlidingWindow>,
    ffn: u32,
    experts: Option<Experts>,
    block: u32,
}

impl Forward {
    /// The forward pass of `desc`, with QSA's key summaries kept per `block` positions.
    pub fn new(desc: &ModelDesc, block: u32) -> Forward {
        Forward {
            embd: desc.embd,
            vocab: desc.vocab,
            eps: desc.rms_eps,
            heads: desc.heads,
            kv_heads: desc.kv_heads,
            head_dim: desc.head_dim_k,
            rope_dims: desc.rope_dims,
            rope_style: desc.family.rope_style(),
            qkv_bias: desc.family.qkv_bias(),
            qk_norm: desc.family.qk_norm(),
            post_norms: desc.family.post_norms(),
            act: desc.family.activation(),
            embed_scale: desc.family.embedding_scale(desc.embd),
            scale: desc.attention_scale(),
            sliding: desc.sliding.clone(),
            ffn: desc.experts.map_or(desc.ffn, |x| x.ffn),
            experts: desc.experts,
            block,
        }
    }

    /// Each layer's products as `pack` stores them: Q·K·V and gate·up stacked for the
    /// decode step where [`crate::plan::fused_gemv`] allows (as the runtime uploads
    /// them); `None` where a tensor is missing (the model check names it).
    pub fn layers(&self, desc: &ModelDesc, pack: &Pack) -> Option<Vec<LayerShape>> {
        (0..desc.layers)
            .map(|l| {
                let tensor = |n: &str| pack.tensor(&format!("blk.{l}.{n}.weight"));
                let matrix = |n: &str| {
                    let t = tensor(n)?;
                    Some(Matrix::new(t.ty, *t.shape.get(1)? as u32, *t.shape.first()? as u32))
                };
                let stacked = |names: &[&str]| {
                    let tensors: Option<Vec<_>> = names.iter().map(|n| tensor(n)).collect();
                    crate::plan::stacked_matrix(tensors.as_deref()?)
                };
                let ffn = match self.experts {
                    None => FfnShape::Dense {
                        gate: matrix("ffn_gate")?,
                        up: matrix("ffn_up")?,
                        down: matrix("ffn_down")?,
                        gate_up: stacked(&["ffn_gate", "ffn_up"]),
                    },
                    Some(_) => FfnShape::Experts {
                        router: matrix("ffn_gate_inp")?,
                        gate_up: tensor("ffn_gate_exps")?.ty,
                        down: tensor("ffn_down_exps")?.ty,
                    },
                };
                Some(LayerShape {
                    q: matrix("attn_q")?,
                    k: matrix("attn_k")?,
                    v: matrix("attn_v")?,
                    o: matrix("attn_output")?,
                    qkv: stacked(&["attn_q", "attn_k", "attn_v"]),
                    ffn,
                })
            })
            .collect()
    }

    /// Attention's score scale ([`ModelDesc::attention_scale`]).
    pub fn attention_scale(&self) -> f32 {
        self.scale
    }

    /// Layer `l`'s sliding window, if it is a local layer.
    pub fn window(&self, l: u32) -> Option<u32> {
        self.sliding.as_ref()?.of_layer(l)
    }

    /// The attention windows the layers use: the whole context, and the local layers'.
    pub fn windows(&self) -> Vec<Option<u32>> {
        let local = self.sliding.as_ref().filter(|s| s.local.contains(&true)).map(|s| s.window);
        std::iter::once(None).chain(local.map(Some)).collect()
    }

    /// Whether attention's and the FFN's outputs are normed before the residual add.
    pub fn post_norms(&self) -> bool {
        self.post_norms
    }

    /// Experts each token uses (0 for a dense FFN).
    fn used(&self) -> u32 {
        self.experts.map_or(0, |x| x.used)
    }

    /// A product of `window` columns with `w` (of one column, a stack's kernel is the
    /// plain one: its output is laid out alike).
    pub fn product(&self, w: Matrix, window: u32) -> Op {
        let stack = if window > 1 { w.stack } else { ops::Stack::SINGLE };
        ops::Gemv { quant: w.quant, rows: w.rows, cols: w.cols, window, stack }.into()
    }

    /// A product of a batch's columns (their count a runtime scalar, at most
    /// [`rules::BATCH_GEMV_COLUMNS`]) with `w`, on the matrix unit.
    pub fn batch_product(&self, w: Matrix) -> Op {
        let max = crate::plan::rules::BATCH_GEMV_COLUMNS;
        ops::BatchGemv { quant: w.quant, rows: w.rows, cols: w.cols, max, stack: w.stack }.into()
    }

    /// A product of a prompt chunk's columns (their count a runtime scalar) with `w`.
    pub fn gemm(&self, w: Matrix) -> Op {
        ops::Gemm { quant: w.quant, rows: w.rows, cols: w.cols }.into()
    }

    /// Causal attention of a prompt chunk over the cache (no splits to merge), seeing
    /// `window` positions; `None` where the heads are too long for its tiles (a chunk's
    /// attention is then the split decode attention).
    pub fn attention_prefill(&self, window: Option<u32>) -> Option<Op> {
        let (heads, kv_heads, head_dim, page) = (self.heads, self.kv_heads, self.head_dim, self.block);
        let window = window.unwrap_or(0);
        (head_dim <= ops::attention_prefill::MAX_HEAD_DIM)
            .then(|| ops::AttentionPrefill { heads, kv_heads, head_dim, scale: self.scale, window, page }.into())
    }

    /// The token embedding rows of a `quant` table (scaled, for Gemma).
    pub fn embed(&self, quant: GgmlType) -> Op {
        ops::Embed { quant, cols: self.embd, vocab: self.vocab, scale: self.embed_scale }.into()
    }

    /// The first layer's attention norm of the embeddings.
    pub fn norm(&self) -> Op {
        ops::RmsNorm { n: self.embd, eps: self.eps, qk: None }.into()
    }

    /// The residual add and the next norm; `q8` quantizes the result for int8 products,
    /// `experts` sums a mixture-of-experts layer's outputs first; Gemma norms the block's
    /// output first.
    pub fn add_norm(&self, q8: bool, experts: bool) -> Op {
        let experts = if experts { self.used() } else { 0 };
        ops::AddRmsNorm { n: self.embd, eps: self.eps, q8, experts, norm_b: self.post_norms }.into()
    }

    /// The Q, K and V biases (the Qwen2 family), in that order: broadcast adds.
    pub fn biases(&self) -> Option<[Op; 3]> {
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let bias = |n| ops::Add { n, broadcast: true }.into();
        self.qkv_bias.then(|| [bias(q), bias(kv), bias(kv)])
    }

    /// The per-head query and key norms (the Qwen3 families): one head a row.
    pub fn head_norm(&self) -> Option<Op> {
        self.qk_norm.then(|| ops::RmsNorm { n: self.head_dim, eps: self.eps, qk: None }.into())
    }

    /// The per-head norms of a decode step's query and key heads in one launch.
    pub fn qk_norm(&self) -> Option<Op> {
        let qk = Some([self.heads, self.kv_heads]);
        self.qk_norm.then(|| ops::RmsNorm { n: self.head_dim, eps: self.eps, qk }.into())
    }

    /// RoPE, the KV store and QSA's key summaries.
    pub fn rope_store(&self) -> Op {
        ops::RopeStore {
            style: self.rope_style,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            rope_dims: self.rope_dims,
            block: self.block,
        }
        .into()
    }

    /// Attention's split partial states, dense (over the latest `window` positions, or
    /// all) or over QSA's selected blocks.
    pub fn attention(&self, sparse: bool, window: Option<u32>) -> Op {
        let (heads, kv_heads, head_dim, block) = (self.heads, self.kv_heads, self.head_dim, self.block);
        let window = window.unwrap_or(0);
        ops::Attention { heads, kv_heads, head_dim, scale: self.scale, block, sparse, window }.into()
    }

    /// QSA's block scores.
    pub fn qsa_score(&self) -> Op {
        ops::QsaScore { heads: self.heads, kv_heads: self.kv_heads, head_dim: self.head_dim, block: self.block }.into()
    }

    /// QSA's block selection.
    pub fn qsa_select(&self) -> Op {
        ops::QsaSelect { kv_heads: self.kv_heads, block: self.block }.into()
    }

    /// The merge of attention's splits; `q8` quantizes it for an int8 output projection.
    pub fn merge(&self, q8: bool) -> Op {
        ops::AttentionMerge { heads: self.heads, head_dim: self.head_dim, q8 }.into()
    }

    /// Whether the merge can quantize its output: its heads are whole int8 chunks.
    pub fn merge_quantizes(&self) -> bool {
        self.head_dim.is_multiple_of(32)
    }

    /// The FFN's gated activation (of the experts' stacked gate·up rows in a MoE layer).
    pub fn silu_mul(&self, q8: bool) -> Op {
        ops::SiluMul { n: self.ffn, q8, paired: self.experts.is_some(), act: self.act }.into()
    }

    /// A mixture-of-experts layer's routing.
    pub fn route(&self) -> Option<Op> {
        self.experts.map(|x| ops::MoeRoute { experts: x.count, used: x.used }.into())
    }

    /// The routed experts' products of a window: gate·up stacked (reading each token's
    /// row) or down (reading each choice's).
    pub fn expert_product(&self, quant: GgmlType, window: u32, input: ExpertInput) -> Option<Op> {
        let x = self.experts?;
        let (rows, cols) = match input {
            ExpertInput::Token => (2 * x.ffn, self.embd),
            ExpertInput::Choice => (self.embd, x.ffn),
        };
        Some(ops::ExpertGemv { quant, rows, cols, window, used: x.used, experts: x.count, input }.into())
    }

    /// A prompt chunk's routing, grouped by expert for [`Forward::expert_gemm`].
    pub fn group(&self) -> Option<Op> {
        self.experts.map(|x| ops::MoeGroup { experts: x.count, used: x.used }.into())
    }

    /// A prompt chunk's routed experts' products, grouped by expert: gate·up stacked
    /// (reading each token's row) or down (reading each choice's).
    pub fn expert_gemm(&self, quant: GgmlType, input: ExpertInput) -> Option<Op> {
        let x = self.experts?;
        let (rows, cols) = match input {
            ExpertInput::Token => (2 * x.ffn, self.embd),
            ExpertInput::Choice => (self.embd, x.ffn),
        };
        Some(ops::ExpertGemm { quant, rows, cols, used: x.used, experts: x.count, input }.into())
    }

    /// The last MoE layer's weighted sum of its experts' outputs.
    pub fn moe_sum(&self) -> Option<Op> {
        self.experts.map(|x| ops::MoeSum { n: self.embd, used: x.used }.into())
    }

    /// The last layer's residual add.
    pub fn residual_add(&self) -> Op {
        ops::Add { n: self.embd, broadcast: false }.into()
    }

    /// The quantizer of rows of `cols` for the int8-dot products that read them.
    pub fn quantize(&self, cols: u32) -> Op {
        ops::QuantizeQ8 { cols }.into()
    }

    /// Greedy sampling on the device.
    pub fn argmax(&self) -> Op {
        ops::Argmax { n: self.vocab }.into()
    }

    /// Probabilities over the vocabulary.
    pub fn softmax(&self) -> Op {
        ops::Softmax { n: self.vocab }.into()
    }

    /// Every producer that can quantize its output for int8 products of row length
    /// `cols` (the norms of the hidden state, the attention merge, SiLU·mul): where any
    /// product of that row length takes the int8 path, the plan compiles these too.
    pub fn quantizing_producers(&self, cols: u32) -> Vec<Op> {
        let mut out = Vec::new();
        if cols == self.embd {
            out.push(self.add_norm(true, false));
            if self.experts.is_some() {
                out.push(self.add_norm(true, true));
            }
        }
        if cols == self.heads * self.head_dim && self.merge_quantizes() {
            out.push(self.merge(true));
        }
        if cols == self.ffn {
            out.push(self.silu_mul(true));
        }
        out
    }
}
