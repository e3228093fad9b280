//! The model's weights on the device: the token embedding, the output norm and head, and
//! each layer's norms, projections and feed-forward (dense, or a router whose experts live
//! in [`super::experts`]' pools).
//!
//! They are uploaded once, at load, through [`Uploader`]; the decode step's fused
//! products (Q·K·V, gate·up) read the tensors stacked (the pack's own bytes where it
//! stores them adjacent, else a copy), which the separate products view too.

use strata_compiler::forward::Matrix;
use strata_compiler::model::ModelDesc;
use strata_compiler::ops::Stack;
use strata_compiler::quant::GgmlType;

use super::upload::Uploader;
use crate::backend::{Backend, BufferId, RunError};
use crate::kernels::Kernels;

/// A weight tensor on the device.
#[derive(Clone, Copy, Debug)]
pub(super) struct Weight {
    pub(super) buf: BufferId,
    /// Byte offset in `buf` (weights fused for decode share one buffer).
    pub(super) offset: usize,
    pub(super) ty: GgmlType,
    /// Row length (ggml `ne0`) and rows (`ne1`).
    pub(super) cols: u32,
    pub(super) rows: u32,
}

impl Weight {
    /// The matrix a product of this weight reads.
    pub(super) fn matrix(&self) -> Matrix {
        Matrix::new(self.ty, self.rows, self.cols)
    }

    /// The matrix of this weight, `parts` stacked.
    pub(super) fn stacked(&self, parts: &[Weight]) -> Matrix {
        let rows: Vec<u32> = parts.iter().map(|w| w.rows).collect();
        Matrix { stack: Stack::of(&rows), ..self.matrix() }
    }
}

/// Per-layer weights.
#[derive(Clone, Copy)]
pub(crate) struct Layer {
    pub(super) attn_norm: Weight,
    pub(super) q: Weight,
    pub(super) k: Weight,
    pub(super) v: Weight,
    pub(super) q_bias: Option<Weight>,
    pub(super) k_bias: Option<Weight>,
    pub(super) v_bias: Option<Weight>,
    /// The per-head norms (qwen3, Gemma 3): query, key, and both side by side.
    pub(super) qk_norm: Option<[Weight; 3]>,
    pub(super) o: Weight,
    pub(super) ffn_norm: Weight,
    /// Gemma's norms of attention's and the FFN's outputs.
    pub(super) post_norms: Option<[Weight; 2]>,
    /// Q, K and V stacked, for the decode step's one fused product.
    pub(super) qkv: Option<Weight>,
    pub(super) ffn: Ffn,
}

/// A layer's feed-forward weights.
#[derive(Clone, Copy)]
pub(super) enum Ffn {
    /// One SiLU-gated FFN; gate and up also stacked for the decode step's fused product.
    Dense { gate: Weight, up: Weight, down: Weight, gate_up: Option<Weight> },
    /// Mixture of experts: the router here, the experts in [`super::experts::Experts`]' pools.
    Experts { router: Weight },
}

/// Every weight but the experts', as uploaded.
pub(super) struct Weights {
    pub(super) embed: Weight,
    pub(super) output_norm: Weight,
    pub(super) output: Weight,
    pub(super) layers: Vec<Layer>,
}

impl Weights {
    /// Uploads the embedding, the output norm and head (the embedding again where tied)
    /// and every layer's weights, in that order.
    pub(super) fn upload(
        up: &mut Uploader,
        b: &mut dyn Backend,
        kernels: &Kernels,
        desc: &ModelDesc,
    ) -> Result<Weights, RunError> {
        let embed = up.one(b, "token_embd.weight")?;
        let output_norm = up.one(b, "output_norm.weight")?;
        let output = if desc.tied_output { embed } else { up.one(b, "output.weight")? };
        let mut layers = Vec::with_capacity(desc.layers as usize);
        for i in 0..desc.layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let nb = |s: &str| format!("blk.{i}.{s}");
            let (qwen2, qk_norms) = (desc.family.qkv_bias(), desc.family.qk_norm());
            let q_bias = up.optional(b, &nb("attn_q.bias"), qwen2)?;
            let k_bias = up.optional(b, &nb("attn_k.bias"), qwen2)?;
            let v_bias = up.optional(b, &nb("attn_v.bias"), qwen2)?;
            let post_norms = if desc.family.post_norms() {
                Some([up.one(b, &n("post_attention_norm"))?, up.one(b, &n("post_ffw_norm"))?])
            } else {
                None
            };
            let qk_norm = if qk_norms { Some(up.norm_pair(b, [&n("attn_q_norm"), &n("attn_k_norm")])?) } else { None };
            let qkv = up.stacked(b, kernels, &["attn_q", "attn_k", "attn_v"].map(n))?;
            let ffn = if desc.experts.is_some() {
                Ffn::Experts { router: up.one(b, &n("ffn_gate_inp"))? }
            } else {
                let gate_up = up.stacked(b, kernels, &["ffn_gate", "ffn_up"].map(n))?;
                Ffn::Dense {
                    gate: up.part(b, &gate_up, 0, &n("ffn_gate"))?,
                    up: up.part(b, &gate_up, 1, &n("ffn_up"))?,
                    down: up.one(b, &n("ffn_down"))?,
                    gate_up: gate_up.as_ref().map(|p| p[2]),
                }
            };
            layers.push(Layer {
                attn_norm: up.one(b, &n("attn_norm"))?,
                q: up.part(b, &qkv, 0, &n("attn_q"))?,
                k: up.part(b, &qkv, 1, &n("attn_k"))?,
                v: up.part(b, &qkv, 2, &n("attn_v"))?,
                q_bias,
                k_bias,
                v_bias,
                qk_norm,
                o: up.one(b, &n("attn_output"))?,
                ffn_norm: up.one(b, &n("ffn_norm"))?,
                post_norms,
                qkv: qkv.as_ref().map(|p| p[3]),
                ffn,
            });
        }
        Ok(Weights { embed, output_norm, output, layers })
    }
}
