//! The scratch buffers a forward pass works in, allocated once at load for the widest
//! window: the residual stream, each product's input and output, the int8 quants of a
//! product's input, attention's split partial states, QSA's block selection, the routing
//! of a mixture of experts, the logits, the token ids in and out, and the stream-K
//! GEMMs' workspace.
//!
//! Every captured step bakes these buffers in, so they never move.

use strata_compiler::forward::Forward;
use strata_compiler::model::ModelDesc;
use strata_compiler::ops::RouteLayout;
use strata_compiler::plan::{Extent, MAX_BATCH, MAX_WINDOW, Tuning, rules};

use crate::backend::{Backend, BufferId, RunError};
use crate::kernels::Kernels;

/// Scratch buffers for a window of up to `window` tokens.
pub(crate) struct Scratch {
    pub(super) x: [BufferId; 2],
    pub(super) h: BufferId,
    pub(crate) q: BufferId,
    pub(super) k: BufferId,
    pub(super) v: BufferId,
    pub(super) qkv: BufferId,
    pub(super) qkn: BufferId,
    pub(crate) attn: BufferId,
    pub(super) proj: BufferId,
    /// Gemma: a block's output normed before the residual add.
    pub(super) post: BufferId,
    pub(super) gate: BufferId,
    pub(super) up: BufferId,
    pub(super) gate_up: BufferId,
    pub(super) act: BufferId,
    /// The int8 quants of a product's input, and per 32-element chunk (scale, sum).
    pub(super) xq: BufferId,
    pub(super) xd: BufferId,
    pub(super) logits: BufferId,
    pub(super) ids: BufferId,
    pub(crate) pos: BufferId,
    pub(super) next: BufferId,
    pub(super) cos_sin: BufferId,
    /// The sliding-window layers' RoPE table (Gemma 3).
    pub(super) cos_sin_local: BufferId,
    /// Attention's split partial states and split counts.
    pub(crate) partial: BufferId,
    pub(crate) splits: BufferId,
    /// QSA: block scores, the selected blocks and their counts, per (token, KV head).
    pub(crate) scores: BufferId,
    pub(crate) list: BufferId,
    pub(crate) count: BufferId,
    /// Mixture of experts: router logits, the routing ([`RouteLayout`]) and weights, a
    /// prompt chunk's choices grouped by expert (`moe_group`), each choice's gate·up and
    /// down outputs.
    pub(super) router: BufferId,
    pub(super) route: BufferId,
    pub(super) route_weights: BufferId,
    pub(super) expert_offsets: BufferId,
    pub(super) expert_order: BufferId,
    pub(super) expert_gate_up: BufferId,
    pub(super) expert_parts: BufferId,
    /// The stream-K GEMMs' workspace (partial tiles, arrival counts), shared by all:
    /// they run one after another.
    pub(super) gemm_part: BufferId,
    pub(super) gemm_flags: BufferId,
}

impl Scratch {
    /// Allocates scratch for windows of `window` tokens of `desc` and prompt chunks of
    /// `chunk` (the token-wide buffers, the int8 quants and the logits; split attention's
    /// states and the routing serve windows only), a context of `n_ctx`
    /// positions in `n_blocks` KV blocks, and as many attention splits as the compiled
    /// merge takes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn alloc(
        b: &mut dyn Backend,
        kernels: &mut Kernels,
        desc: &ModelDesc,
        forward: &Forward,
        window: u32,
        chunk: u32,
        n_ctx: u32,
        n_blocks: usize,
    ) -> Result<Scratch, RunError> {
        let splits = match kernels.get(&forward.merge(false))?.tuning {
            Tuning::Attention(t) => t.splits as usize,
            _ => rules::ATTENTION_SPLITS as usize,
        };
        let (w, c) = (window as usize, chunk.max(window) as usize);
        let kv_width = (desc.kv_heads * desc.head_dim_k) as usize;
        let f32s = |b: &mut dyn Backend, n: usize| b.alloc(n * 4);
        let (e, qd, kd, ffn) =
            (desc.embd as usize, (desc.heads * desc.head_dim_k) as usize, kv_width, desc.ffn as usize);
        // Mixture of experts: per token, `used` choices of the experts' FFN width.
        let (n_experts, used, effn) =
            desc.experts.map_or((1, 1, 1), |x| (x.count as usize, x.used as usize, x.ffn as usize));
        let route_len = RouteLayout::new(n_experts as u32, used as u32).len() as usize;
        let widest = [e, qd, ffn, used * effn].into_iter().max().unwrap_or(0);
        // The largest workspace a compiled kernel asks for (none planned on demand do),
        // zeroed once: the kernels leave their counts zero.
        let workspace = |name: &str| {
            let bytes = kernels.specs().flat_map(|k| &k.buffers).filter(|b| b.workspace && b.name == name);
            bytes.map(|b| if let Extent::Fixed(n) = b.extent { n * b.elem.bytes() } else { 0 }).max().unwrap_or(4)
        };
        let zeroed = |b: &mut dyn Backend, bytes: u64| -> Result<BufferId, RunError> {
            let bytes = usize::try_from(bytes).map_err(|e| RunError::Other(e.to_string()))?;
            let buf = b.alloc(bytes)?;
            b.write(buf, 0, &vec![0; bytes])?;
            Ok(buf)
        };
        let (part_bytes, flags_bytes) = (workspace("part"), workspace("flags"));
        // Split attention's states serve windows and batches of decode steps, and prompt
        // chunks too where the heads are too long for the prefill attention.
        let batch = w.max(c.min(MAX_BATCH as usize));
        let attending = if forward.attention_prefill(None).is_none() { c } else { batch };
        let table = n_ctx as usize * desc.rope_dims as usize;
        Ok(Scratch {
            x: [f32s(b, c * e)?, f32s(b, c * e)?],
            h: f32s(b, c * e)?,
            q: f32s(b, c * qd)?,
            k: f32s(b, c * kd)?,
            v: f32s(b, c * kd)?,
            // Stacked products serve windows and batches of decode steps, not prompt chunks.
            qkv: f32s(b, batch * (qd + 2 * kd))?,
            qkn: f32s(b, c * (qd + kd))?,
            attn: f32s(b, c * qd)?,
            proj: f32s(b, c * e)?,
            post: f32s(b, if forward.post_norms() { c * e } else { 1 })?,
            gate: f32s(b, c * ffn)?,
            up: f32s(b, c * ffn)?,
            gate_up: f32s(b, batch * 2 * ffn)?,
            act: f32s(b, c * ffn.max(used * effn))?,
            xq: b.alloc(c * widest)?,
            xd: f32s(b, c * widest / 16)?,
            logits: f32s(b, c * desc.vocab as usize)?,
            ids: f32s(b, c)?,
            // A pass's sequences' first positions, then their cache slots (Buf::Slots),
            // MAX_BATCH of each.
            pos: f32s(b, 2 * MAX_BATCH as usize)?,
            next: f32s(b, c)?,
            cos_sin: f32s(b, table)?,
            cos_sin_local: f32s(b, if desc.sliding.is_some() { table } else { 1 })?,
            partial: f32s(b, attending * desc.heads as usize * splits * (desc.head_dim_k as usize + 2))?,
            splits: f32s(b, attending * desc.heads as usize)?,
            scores: f32s(b, MAX_WINDOW as usize * desc.kv_heads as usize * n_blocks)?,
            list: f32s(b, MAX_WINDOW as usize * desc.kv_heads as usize * n_blocks)?,
            count: f32s(b, MAX_WINDOW as usize * desc.kv_heads as usize)?,
            router: f32s(b, c * n_experts)?,
            route: f32s(b, route_len)?,
            route_weights: f32s(b, c.max(MAX_WINDOW as usize) * used)?,
            expert_offsets: f32s(b, n_experts + 1)?,
            expert_order: f32s(b, c * used)?,
            expert_gate_up: f32s(b, c * used * 2 * effn)?,
            expert_parts: f32s(b, c * used * e)?,
            gemm_part: zeroed(b, part_bytes)?,
            gemm_flags: zeroed(b, flags_bytes)?,
        })
    }
}
