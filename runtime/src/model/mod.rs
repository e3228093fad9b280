//! One transformer (llama, qwen2, qwen3 dense; qwen3moe with its experts in
//! [`experts`]) on a backend: weights uploaded once, an f16 KV cache, and a forward pass
//! over windows of tokens built from plan records.
//!
//! Every step is a sequence of kernel calls on the backend; the host only writes token
//! ids and the position, and reads what it asked for (logits or the argmax tokens). A
//! decode step of one token, and a verify window of `t` tokens, is captured once per
//! slot and replayed (a CUDA graph on CUDA).

mod attention_bench;
pub mod experts;
mod kernel_bench;
pub mod qsa;
mod rope;
mod upload;

use std::collections::HashMap;

pub use attention_bench::AttentionTiming;
pub use experts::{CacheSize, ExpertOptions, ExpertStats, Placement, Policy};
pub use kernel_bench::{KernelReport, KernelTiming};
pub use qsa::QsaConfig;

use experts::Experts;
use upload::Uploader;

use strata_compiler::model::{Family, ModelDesc};
use strata_compiler::ops::{self, ExpertInput, Op, RopeStyle, RouteLayout};
use strata_compiler::pack::Pack;
use strata_compiler::plan::{KernelSpec, MAX_WINDOW, Tuning, rules};
use strata_compiler::quant::GgmlType;

use crate::backend::{Arg, Backend, BufferId, GraphId, RunError};
use crate::kernels::Kernels;

/// A weight tensor on the device.
#[derive(Clone, Copy, Debug)]
struct Weight {
    buf: BufferId,
    /// Byte offset in `buf` (weights fused for decode share one buffer).
    offset: usize,
    ty: GgmlType,
    /// Row length (ggml `ne0`) and rows (`ne1`).
    cols: u32,
    rows: u32,
}

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

/// Per-layer weights.
#[derive(Clone, Copy)]
struct Layer {
    attn_norm: Weight,
    q: Weight,
    k: Weight,
    v: Weight,
    q_bias: Option<Weight>,
    k_bias: Option<Weight>,
    v_bias: Option<Weight>,
    /// qwen3's per-head norms: query, key, and both side by side.
    qk_norm: Option<[Weight; 3]>,
    o: Weight,
    ffn_norm: Weight,
    /// Q, K and V stacked, for the decode step's one fused product.
    qkv: Option<Weight>,
    ffn: Ffn,
}

/// A layer's feed-forward weights.
#[derive(Clone, Copy)]
enum Ffn {
    /// One SiLU-gated FFN; gate and up also stacked for the decode step's fused product.
    Dense { gate: Weight, up: Weight, down: Weight, gate_up: Option<Weight> },
    /// Mixture of experts: the router here, the experts in [`Experts`]' pools.
    Experts { router: Weight },
}

/// Scratch buffers for a window of up to `window` tokens.
struct Scratch {
    x: [BufferId; 2],
    h: BufferId,
    q: BufferId,
    k: BufferId,
    v: BufferId,
    qkv: BufferId,
    qkn: BufferId,
    attn: BufferId,
    proj: BufferId,
    gate: BufferId,
    up: BufferId,
    gate_up: BufferId,
    act: BufferId,
    /// The int8 quants of a product's input, and per 32-element chunk (scale, sum).
    xq: BufferId,
    xd: BufferId,
    logits: BufferId,
    ids: BufferId,
    pos: BufferId,
    next: BufferId,
    cos_sin: BufferId,
    /// Attention's split partial states and split counts.
    partial: BufferId,
    splits: BufferId,
    /// QSA: block scores, the selected blocks and their counts, per (token, KV head).
    scores: BufferId,
    list: BufferId,
    count: BufferId,
    /// Mixture of experts: router logits, the routing ([`RouteLayout`]) and weights, each
    /// choice's gate·up and down outputs.
    router: BufferId,
    route: BufferId,
    route_weights: BufferId,
    expert_gate_up: BufferId,
    expert_parts: BufferId,
}

/// The kernels of a sparse attention pass and the budget in blocks.
struct QsaKernels {
    score: KernelSpec,
    select: KernelSpec,
    sparse: KernelSpec,
    budget: u32,
}

/// One layer's KV cache in one slot: keys, values (f16 rows) and the keys' block summaries.
#[derive(Clone, Copy)]
struct Cache {
    k: BufferId,
    v: BufferId,
    summary: BufferId,
}

/// A model ready to run on a backend.
pub struct Model {
    /// The model's shape.
    pub desc: ModelDesc,
    backend: Box<dyn Backend>,
    kernels: Kernels,
    layers: Vec<Layer>,
    embed: Weight,
    output_norm: Weight,
    output: Weight,
    s: Scratch,
    n_ctx: u32,
    window: u32,
    /// Per sequence slot, per layer: the KV cache.
    caches: Vec<Vec<Cache>>,
    /// KV positions per block of the key summaries (and of QSA's selection).
    block: u32,
    /// QSA's budget in blocks, where decode passes attend sparsely.
    qsa: Option<u32>,
    /// The slot forward passes run on.
    slot: usize,
    /// Per slot: tokens in its KV cache.
    pos: Vec<u32>,
    /// Captured steps by (slot, tokens, with argmax, sparse): a step bakes in its slot's
    /// caches, its window size and whether it attends sparsely.
    graphs: HashMap<(usize, u32, bool, bool), GraphId>,
    /// The (slot, token) in `next[0]` on the device, as last read back.
    on_device: Option<(usize, u32)>,
    /// Mixture-of-experts packs: the experts' pools and cache.
    experts: Option<Experts>,
}

impl Model {
    /// Uploads the pack's weights to `backend` and allocates `slots` KV caches (one per
    /// concurrent sequence) of `n_ctx` positions and scratch for windows of up to
    /// `window` tokens (fewer where an expert cache holds only narrower passes' experts);
    /// `expert_options` place a mixture-of-experts pack's experts. `progress` sees bytes
    /// uploaded and the total.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        pack: &Pack,
        mut backend: Box<dyn Backend>,
        mut kernels: Kernels,
        n_ctx: u32,
        window: u32,
        slots: usize,
        expert_options: &ExpertOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model, RunError> {
        let desc = ModelDesc::from_pack(pack).map_err(|e| RunError::Other(e.to_string()))?;
        if n_ctx == 0 || window == 0 || slots == 0 {
            return Err(RunError::Other("context, window and slots must be at least 1".into()));
        }
        let total: u64 = pack.tensors().iter().map(|t| t.bytes).sum();
        let b = backend.as_mut();
        let mut up = Uploader { pack, done: 0, total, progress };
        let embed = up.one(b, "token_embd.weight")?;
        let output_norm = up.one(b, "output_norm.weight")?;
        let output = if desc.tied_output { embed } else { up.one(b, "output.weight")? };
        let kv_width = (desc.kv_heads * desc.head_dim_k) as usize;
        let mut layers = Vec::with_capacity(desc.layers as usize);
        for i in 0..desc.layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let nb = |s: &str| format!("blk.{i}.{s}");
            let qwen2 = desc.family == Family::Qwen2;
            let qwen3 = matches!(desc.family, Family::Qwen3 | Family::Qwen3Moe);
            let q_bias = up.optional(b, &nb("attn_q.bias"), qwen2)?;
            let k_bias = up.optional(b, &nb("attn_k.bias"), qwen2)?;
            let v_bias = up.optional(b, &nb("attn_v.bias"), qwen2)?;
            let qk_norm = if qwen3 { Some(up.norm_pair(b, [&n("attn_q_norm"), &n("attn_k_norm")])?) } else { None };
            let qkv = up.stacked(b, &kernels, &["attn_q", "attn_k", "attn_v"].map(n))?;
            let ffn = if desc.experts.is_some() {
                Ffn::Experts { router: up.one(b, &n("ffn_gate_inp"))? }
            } else {
                let gate_up = up.stacked(b, &kernels, &["ffn_gate", "ffn_up"].map(n))?;
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
                qkv: qkv.as_ref().map(|p| p[3]),
                ffn,
            });
        }
        let block = kernels
            .qsa_block()
            .ok_or_else(|| RunError::Other("the kernels have no rope_store, so no KV block size".into()))?;
        let n_blocks = n_ctx.div_ceil(block) as usize;
        let splits = match kernels
            .get(&Op::AttentionMerge(ops::AttentionMerge { heads: desc.heads, head_dim: desc.head_dim_k, q8: false }))?
            .tuning
        {
            Tuning::Attention(t) => t.splits as usize,
            _ => rules::ATTENTION_SPLITS as usize,
        };
        let w = window as usize;
        let f32s = |b: &mut dyn Backend, n: usize| b.alloc(n * 4);
        let (e, qd, kd, ffn) =
            (desc.embd as usize, (desc.heads * desc.head_dim_k) as usize, kv_width, desc.ffn as usize);
        // Mixture of experts: per token, `used` choices of the experts' FFN width.
        let (n_experts, used, effn) =
            desc.experts.map_or((1, 1, 1), |x| (x.count as usize, x.used as usize, x.ffn as usize));
        let route_len = RouteLayout::new(n_experts as u32, used as u32).len() as usize;
        let widest = [e, qd, ffn, used * effn].into_iter().max().unwrap_or(0);
        let s = Scratch {
            x: [f32s(b, w * e)?, f32s(b, w * e)?],
            h: f32s(b, w * e)?,
            q: f32s(b, w * qd)?,
            k: f32s(b, w * kd)?,
            v: f32s(b, w * kd)?,
            qkv: f32s(b, qd + 2 * kd)?,
            qkn: f32s(b, w * (qd + kd))?,
            attn: f32s(b, w * qd)?,
            proj: f32s(b, w * e)?,
            gate: f32s(b, w * ffn)?,
            up: f32s(b, w * ffn)?,
            gate_up: f32s(b, 2 * ffn)?,
            act: f32s(b, w * ffn.max(used * effn))?,
            xq: b.alloc(w * widest)?,
            xd: f32s(b, w * widest / 16)?,
            logits: f32s(b, w * desc.vocab as usize)?,
            ids: f32s(b, w)?,
            pos: f32s(b, 1)?,
            next: f32s(b, w)?,
            cos_sin: f32s(b, n_ctx as usize * desc.rope_dims as usize)?,
            partial: f32s(b, w * desc.heads as usize * splits * (desc.head_dim_k as usize + 2))?,
            splits: f32s(b, w * desc.heads as usize)?,
            scores: f32s(b, MAX_WINDOW as usize * desc.kv_heads as usize * n_blocks)?,
            list: f32s(b, MAX_WINDOW as usize * desc.kv_heads as usize * n_blocks)?,
            count: f32s(b, MAX_WINDOW as usize * desc.kv_heads as usize)?,
            router: f32s(b, w * n_experts)?,
            route: f32s(b, route_len)?,
            route_weights: f32s(b, MAX_WINDOW as usize * used)?,
            expert_gate_up: f32s(b, w * used * 2 * effn)?,
            expert_parts: f32s(b, w * used * e)?,
        };
        let cache_bytes = n_ctx as usize * kv_width * 2;
        let summary_bytes = n_blocks * 2 * kv_width * 2;
        let caches = (0..slots)
            .map(|_| {
                (0..desc.layers)
                    .map(|_| {
                        Ok(Cache {
                            k: b.alloc(cache_bytes)?,
                            v: b.alloc(cache_bytes)?,
                            summary: b.alloc(summary_bytes)?,
                        })
                    })
                    .collect()
            })
            .collect::<Result<Vec<Vec<_>>, RunError>>()?;
        let table = rope::table(n_ctx, desc.rope_dims, desc.rope_base);
        b.write(s.cos_sin, 0, &table)?;
        let experts = match desc.experts {
            Some(_) => {
                let expert_bytes: u64 =
                    pack.tensors().iter().filter(|t| t.name.contains("_exps.")).map(|t| t.bytes).sum();
                // What the rest of the model takes: its weights, the KV caches, and room
                // for scratch.
                let other = total - expert_bytes
                    + (slots * desc.layers as usize * (2 * cache_bytes + summary_bytes)) as u64
                    + (512 << 20);
                let mut done = up.done;
                let progress = &mut *up.progress;
                let x = Experts::load(pack, &desc, b, expert_options, window, other, &mut |n| {
                    done += n;
                    progress(done, total);
                })?;
                Some(x)
            }
            None => None,
        };
        // Routing takes up to MAX_WINDOW tokens a pass (and a small cache fewer).
        let window = experts.as_ref().map_or(window, |x| window.min(x.max_window).min(MAX_WINDOW));
        Ok(Model {
            desc,
            backend,
            kernels,
            layers,
            embed,
            output_norm,
            output,
            s,
            n_ctx,
            window,
            caches,
            block,
            qsa: None,
            slot: 0,
            pos: vec![0; slots],
            graphs: HashMap::new(),
            on_device: None,
            experts,
        })
    }

    /// Sets QSA for later decode passes (captured steps are recaptured), or refuses
    /// settings the compiled kernels do not fit.
    pub fn set_qsa(&mut self, qsa: QsaConfig) -> Result<(), RunError> {
        let blocks = qsa.blocks(self.block).map_err(RunError::Other)?;
        self.qsa = qsa.enabled.then_some(blocks);
        self.graphs.clear();
        Ok(())
    }

    /// KV positions per block of the key summaries.
    pub fn qsa_block(&self) -> u32 {
        self.block
    }

    /// Whether a pass of `t` tokens at the slot's position attends sparsely: QSA is on
    /// and some token of it sees more than the budget.
    fn sparse(&self, t: u32) -> bool {
        self.qsa.is_some_and(|blocks| self.pos[self.slot] + t > blocks * self.block)
    }

    /// Context length (KV cache positions).
    pub fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    /// Tokens in the current slot's KV cache.
    pub fn pos(&self) -> u32 {
        self.pos[self.slot]
    }

    /// The slot forward passes run on.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Sequence slots (KV caches).
    pub fn slots(&self) -> usize {
        self.pos.len()
    }

    /// Makes `slot` the sequence later calls run on.
    pub fn select(&mut self, slot: usize) -> Result<(), RunError> {
        if slot >= self.pos.len() {
            return Err(RunError::Other(format!("slot {slot} of {}", self.pos.len())));
        }
        self.slot = slot;
        Ok(())
    }

    /// Largest window a single forward pass takes.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// The backend (for device information and synchronization).
    pub fn backend(&mut self) -> &mut dyn Backend {
        self.backend.as_mut()
    }

    /// Empties the current slot's KV cache (a new sequence).
    pub fn reset(&mut self) {
        self.pos[self.slot] = 0;
    }

    /// Fills the current slot's KV cache up to `depth` positions with synthetic keys and
    /// values (uniform in ±1, repeating every 4096 positions) and their block summaries,
    /// as if that many tokens had been read: for benchmarks of decoding deep in a long
    /// context, which a real prefill would take minutes to reach.
    pub fn fill_context(&mut self, depth: u32, seed: u64) -> Result<(), RunError> {
        use rand::{RngExt, SeedableRng};
        if depth > self.n_ctx {
            return Err(RunError::Other(format!("depth {depth} is beyond --ctx {}", self.n_ctx)));
        }
        let width = (self.desc.kv_heads * self.desc.head_dim_k) as usize;
        let hd = self.desc.head_dim_k as usize;
        let block = self.block as usize;
        let period = 4096usize.next_multiple_of(block);
        let n_blocks = self.n_ctx.div_ceil(self.block) as usize;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut pattern = |n: usize| -> Vec<half::f16> {
            (0..n).map(|_| half::f16::from_f32(rng.random_range(-1.0f32..1.0))).collect()
        };
        let bytes = |v: &[half::f16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (keys, values) = (pattern(period * width), pattern(period * width));
        let (k_bytes, v_bytes) = (bytes(&keys), bytes(&values));
        // The summaries of the pattern's blocks, [KV head][block][dimension][min, max].
        let mut summary = vec![half::f16::ZERO; n_blocks * 2 * width];
        for blk in 0..(depth as usize).div_ceil(block) {
            let rows = blk * block..((blk + 1) * block).min(depth as usize);
            for h in 0..width / hd {
                for d in 0..hd {
                    let column = rows.clone().map(|p| keys[(p % period) * width + h * hd + d]);
                    let lo = column.clone().fold(half::f16::INFINITY, |a, b| if b < a { b } else { a });
                    let hi = column.fold(half::f16::NEG_INFINITY, |a, b| if b > a { b } else { a });
                    summary[((h * n_blocks + blk) * hd + d) * 2] = lo;
                    summary[((h * n_blocks + blk) * hd + d) * 2 + 1] = hi;
                }
            }
        }
        let summary = bytes(&summary);
        for l in 0..self.layers.len() {
            let cache = self.caches[self.slot][l];
            for start in (0..depth as usize).step_by(period) {
                let n = (depth as usize - start).min(period) * width * 2;
                self.backend.write(cache.k, start * width * 2, &k_bytes[..n])?;
                self.backend.write(cache.v, start * width * 2, &v_bytes[..n])?;
            }
            self.backend.write(cache.summary, 0, &summary)?;
        }
        self.pos[self.slot] = depth;
        Ok(())
    }

    /// Forgets the current slot's positions from `pos` on (the KV entries of rejected
    /// draft tokens); later passes overwrite them.
    pub fn rewind(&mut self, pos: u32) -> Result<(), RunError> {
        let now = self.pos[self.slot];
        if pos > now {
            return Err(RunError::Other(format!("cannot rewind to position {pos}: the sequence holds {now}")));
        }
        self.pos[self.slot] = pos;
        Ok(())
    }

    /// Checks that `t` tokens fit one pass and the context, returning `t`.
    fn room(&self, t: usize) -> Result<u32, RunError> {
        let pos = self.pos[self.slot];
        let t = u32::try_from(t).unwrap_or(u32::MAX);
        if t == 0 || t > self.window {
            return Err(RunError::Other(format!("a forward pass takes 1 to {} tokens, not {t}", self.window)));
        }
        if pos.saturating_add(t) > self.n_ctx {
            return Err(RunError::Other(format!(
                "the context is full: {pos} + {t} tokens exceed --ctx {}",
                self.n_ctx
            )));
        }
        Ok(t)
    }

    /// Writes `tokens` and the slot's position for the next pass.
    fn upload_ids(&mut self, tokens: &[u32]) -> Result<(), RunError> {
        let ids: Vec<u8> = tokens.iter().flat_map(|&id| (id as i32).to_le_bytes()).collect();
        self.backend.write(self.s.ids, 0, &ids)?;
        self.backend.write(self.s.pos, 0, &(self.pos[self.slot] as i32).to_le_bytes())
    }

    /// Runs `tokens` (at most [`Model::window`]) at the next positions and leaves the
    /// asked-for logits in the logits buffer.
    pub fn forward(&mut self, tokens: &[u32], logits: Logits) -> Result<(), RunError> {
        let t = self.room(tokens.len())?;
        self.upload_ids(tokens)?;
        self.enqueue(self.s.ids, t, logits, false)?;
        self.end_pass(t)?;
        self.pos[self.slot] += t;
        Ok(())
    }

    /// Decodes one token and returns the greedy next token, reading back only its id.
    /// The step is captured on first use and replayed after.
    pub fn decode_greedy(&mut self, token: u32) -> Result<u32, RunError> {
        let slot = self.slot;
        self.room(1)?;
        // The step reads its token from where the last argmax left it: when it is that
        // token (greedy decoding), only the position travels to the device.
        if self.on_device != Some((slot, token)) {
            self.backend.write(self.s.next, 0, &(token as i32).to_le_bytes())?;
        }
        self.backend.write(self.s.pos, 0, &(self.pos[slot] as i32).to_le_bytes())?;
        self.replay_step(1, true)?;
        self.pos[slot] += 1;
        let mut out = [0u8; 4];
        self.backend.read(self.s.next, 0, &mut out)?;
        let next = i32::from_le_bytes(out) as u32;
        self.on_device = Some((slot, next));
        Ok(next)
    }

    /// Runs a verify window (`tokens` at the next positions, in one pass of window
    /// GEMVs) and returns the greedy token after each of them, reading back only the
    /// ids. Row `i` is computed exactly as decoding `tokens[i]` alone would compute it.
    pub fn verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>, RunError> {
        if let [token] = tokens {
            return Ok(vec![self.decode_greedy(*token)?]);
        }
        let t = self.room(tokens.len())?;
        self.upload_ids(tokens)?;
        self.replay_step(t, true)?;
        self.pos[self.slot] += t;
        let mut out = vec![0u8; tokens.len() * 4];
        self.backend.read(self.s.next, 0, &mut out)?;
        let ids: Vec<u32> = out.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32).collect();
        self.on_device = ids.first().map(|&id| (self.slot, id));
        Ok(ids)
    }

    /// Runs a verify window as [`Model::verify_greedy`] does and returns every row of
    /// logits (for sampling).
    pub fn verify_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RunError> {
        let t = self.room(tokens.len())?;
        self.upload_ids(tokens)?;
        self.replay_step(t, false)?;
        self.pos[self.slot] += t;
        self.logits(t)
    }

    /// Replays the captured pass of `t` tokens at the slot's position (capturing it on
    /// first use), leaving every row's logits and, with `argmax`, their greedy ids in
    /// `next`. Its token ids are read from `next` for a greedy single token (where the
    /// last argmax left them), else from `ids`.
    fn replay_step(&mut self, t: u32, argmax: bool) -> Result<(), RunError> {
        let sparse = self.sparse(t);
        if self.experts.as_ref().is_some_and(Experts::cached) {
            // The host picks experts between layers: nothing to capture.
            let ids = if t == 1 && argmax { self.s.next } else { self.s.ids };
            self.enqueue(ids, t, Logits::All, sparse)?;
            if argmax {
                self.enqueue_argmax(t)?;
            }
            return self.end_pass(t);
        }
        let key = (self.slot, t, argmax, sparse);
        let graph = match self.graphs.get(&key) {
            Some(&g) => g,
            None => {
                let ids = if t == 1 && argmax { self.s.next } else { self.s.ids };
                self.backend.begin_capture()?;
                let queued = self
                    .enqueue(ids, t, Logits::All, sparse)
                    .and_then(|()| if argmax { self.enqueue_argmax(t) } else { Ok(()) });
                let graph = self.backend.end_capture();
                queued?;
                let g = graph?;
                self.graphs.insert(key, g);
                g
            }
        };
        self.backend.replay(graph)?;
        self.end_pass(t)
    }

    /// Counts a pass of `t` tokens in the expert statistics.
    fn end_pass(&mut self, t: u32) -> Result<(), RunError> {
        match &mut self.experts {
            Some(x) => x.end_pass(self.backend.as_mut(), t),
            None => Ok(()),
        }
    }

    /// How the experts were placed (mixture-of-experts packs).
    pub fn expert_placement(&self) -> Option<&Placement> {
        self.experts.as_ref().map(|x| &x.placement)
    }

    /// The expert cache's counters since the last call (mixture-of-experts packs).
    pub fn take_expert_stats(&mut self) -> Option<ExpertStats> {
        self.experts.as_mut().map(Experts::take_stats)
    }

    /// The greedy tokens of the logits rows left by the last forward pass.
    pub fn argmax(&mut self, rows: u32) -> Result<Vec<u32>, RunError> {
        self.enqueue_argmax(rows)?;
        let mut out = vec![0u8; rows as usize * 4];
        self.backend.read(self.s.next, 0, &mut out)?;
        let ids: Vec<u32> = out.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32).collect();
        self.on_device = ids.first().map(|&id| (self.slot, id));
        Ok(ids)
    }

    /// Reads `rows` rows of logits left by the last forward pass.
    pub fn logits(&mut self, rows: u32) -> Result<Vec<f32>, RunError> {
        let mut out = vec![0u8; rows as usize * self.desc.vocab as usize * 4];
        self.backend.read(self.s.logits, 0, &mut out)?;
        Ok(out.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    fn enqueue_argmax(&mut self, rows: u32) -> Result<(), RunError> {
        let spec = self.kernels.get(&Op::Argmax(ops::Argmax { n: self.desc.vocab }))?;
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
            let spec = self.kernels.get(&Op::Gemv(ops::Gemv { quant: w.ty, rows: w.rows, cols: w.cols, window }))?;
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
            .map(|(w, _)| self.kernels.get(&Op::Gemv(ops::Gemv { quant: w.ty, rows: w.rows, cols: w.cols, window })))
            .collect::<Result<Vec<_>, _>>()?;
        let (xq, xd) = (Arg::Buf(self.s.xq, 0), Arg::Buf(self.s.xd, 0));
        if let Some((w, _)) = products
            .iter()
            .zip(&specs)
            .find(|(_, s)| matches!(s.tuning, Tuning::GemvQ8(_)))
            .map(|p| p.0)
            .filter(|_| !quantized)
        {
            let quantize = self.kernels.get(&Op::QuantizeQ8(ops::QuantizeQ8 { cols: w.cols }))?;
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

    fn rmsnorm(&mut self, n: u32, x: Arg, w: Weight, y: Arg, rows: u32) -> Result<(), RunError> {
        let spec = self.kernels.get(&Op::RmsNorm(ops::RmsNorm { n, eps: self.desc.rms_eps, qk: None }))?;
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
        let (n, eps) = (self.desc.embd, self.desc.rms_eps);
        let experts = if b.is_none() { self.desc.experts.map_or(0, |x| x.used) } else { 0 };
        let fused = Op::AddRmsNorm(ops::AddRmsNorm { n, eps, q8: true, experts });
        let q8 = if next.is_empty() { self.kernels.has(&fused) } else { self.fuse_q8(&fused, next, rows)? };
        let spec = self.kernels.get(&Op::AddRmsNorm(ops::AddRmsNorm { n, eps, q8, experts }))?;
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
    fn attention(
        &mut self,
        dense: &KernelSpec,
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
        let act_q8 = self.fuse_q8(&Op::SiluMul(ops::SiluMul { n: ffn, q8: true, paired: false }), &[down], t)?;
        let silu = self.kernels.get(&Op::SiluMul(ops::SiluMul { n: ffn, q8: act_q8, paired: false }))?;
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
        let routing = self.kernels.get(&Op::MoeRoute(ops::MoeRoute { experts: shape.count, used: shape.used }))?;
        self.backend
            .call(&routing, &[("logits", logits), ("route", route), ("weights", weights), ("tokens", Arg::U32(t))])?;
        let Some(x) = self.experts.as_mut() else { return Err(RunError::Other("experts were not loaded".into())) };
        x.prepare_layer(self.backend.as_mut(), layer, route_buf)?;
        let l = layer as usize;
        let (gate_up, down, slot_of, slots) = (x.gate_up[l], x.down[l], x.slot_of, x.pool_slots);
        let row = Arg::Buf(slot_of, (layer * shape.count) as usize * 4);
        let product = |quant, rows, cols, input| {
            Op::ExpertGemv(ops::ExpertGemv {
                quant,
                rows,
                cols,
                window: t,
                used: shape.used,
                experts: shape.count,
                input,
            })
        };
        let first = self.kernels.get(&product(gate_up.ty, 2 * shape.ffn, embd, ExpertInput::Token))?;
        let second = self.kernels.get(&product(down.ty, embd, shape.ffn, ExpertInput::Choice))?;
        let int8 = |spec: &KernelSpec| matches!(spec.tuning, Tuning::GemvQ8(_));
        // Each product reads its input quantized (int8 path) or as floats.
        let call = |b: &mut dyn Backend, spec: &KernelSpec, pool: experts::Pool, x, y| {
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
            let quantize = self.kernels.get(&Op::QuantizeQ8(ops::QuantizeQ8 { cols: embd }))?;
            self.backend.call(&quantize, &[("x", h), ("xq", xq), ("xd", xd), ("rows", Arg::U32(t))])?;
        }
        call(self.backend.as_mut(), &first, gate_up, h, gate_up_out)?;
        let silu = self.kernels.get(&Op::SiluMul(ops::SiluMul { n: shape.ffn, q8: int8(&second), paired: true }))?;
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
        let Some(shape) = self.desc.experts else { return Ok(()) };
        let s = &self.s;
        let buf = |id| Arg::Buf(id, 0);
        let args = [("parts", buf(s.expert_parts)), ("weights", buf(s.route_weights)), ("y", buf(s.proj))];
        let sum = self.kernels.get(&Op::MoeSum(ops::MoeSum { n: self.desc.embd, used: shape.used }))?;
        self.backend.call(&sum, &[args[0], args[1], args[2], ("tokens", Arg::U32(t))])
    }

    fn add(&mut self, n: u32, a: Arg, b: Arg, y: Arg, tokens: u32, broadcast: bool) -> Result<(), RunError> {
        let spec = self.kernels.get(&Op::Add(ops::Add { n, broadcast }))?;
        self.backend.call(&spec, &[("a", a), ("b", b), ("y", y), ("tokens", Arg::U32(tokens))])
    }

    /// Queues the forward pass of `t` tokens whose ids are already in `ids` and first
    /// position in the `pos` buffer; with `sparse`, layers past the first few attend to
    /// QSA's selected blocks.
    fn enqueue(&mut self, ids: BufferId, t: u32, logits: Logits, sparse: bool) -> Result<(), RunError> {
        let d = self.desc.clone();
        let s = &self.s;
        let (x, h, attn, proj, pos) = (s.x, s.h, s.attn, s.proj, s.pos);
        let buf = |id| Arg::Buf(id, 0);
        let at = |id, floats: u32| Arg::Buf(id, floats as usize * 4);
        let (qd, kd) = (d.heads * d.head_dim_k, d.kv_heads * d.head_dim_k);

        let embed = self.kernels.get(&Op::Embed(ops::Embed { quant: self.embed.ty, cols: d.embd, vocab: d.vocab }))?;
        self.backend.call(
            &embed,
            &[("table", buf(self.embed.buf)), ("ids", buf(ids)), ("y", buf(x[0])), ("tokens", Arg::U32(t))],
        )?;
        let (heads, kv_heads, head_dim, block) = (d.heads, d.kv_heads, d.head_dim_k, self.block);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let dense = self.kernels.get(&Op::Attention(ops::Attention {
            heads,
            kv_heads,
            head_dim,
            scale,
            block,
            sparse: false,
        }))?;
        let qsa = match self.qsa.filter(|_| sparse) {
            Some(budget) => Some(QsaKernels {
                score: self.kernels.get(&Op::QsaScore(ops::QsaScore { heads, kv_heads, head_dim, block }))?,
                select: self.kernels.get(&Op::QsaSelect(ops::QsaSelect { kv_heads, block }))?,
                sparse: self.kernels.get(&Op::Attention(ops::Attention {
                    heads,
                    kv_heads,
                    head_dim,
                    scale,
                    block,
                    sparse: true,
                }))?,
                budget,
            }),
            None => None,
        };
        let n_blocks = self.n_ctx.div_ceil(block);
        let style = if d.family == Family::Llama { RopeStyle::Normal } else { RopeStyle::Neox };
        let rope_store = self.kernels.get(&Op::RopeStore(ops::RopeStore {
            style,
            heads: d.heads,
            kv_heads: d.kv_heads,
            head_dim: d.head_dim_k,
            rope_dims: d.rope_dims,
            block,
        }))?;
        let mut cur = 0;
        self.rmsnorm(d.embd, buf(x[0]), self.layers[0].attn_norm, buf(h), t)?;
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
            for (bias, y, n) in [(ly.q_bias, q, qd), (ly.k_bias, k, kd), (ly.v_bias, v, kd)] {
                if let Some(bias) = bias {
                    self.add(n, y, buf(bias.buf), y, t, true)?;
                }
            }
            // Per-head norms (qwen3) write Q then K into one buffer: in one launch where
            // the decode step's fused product left the Q and K heads side by side.
            let (q, k) = match ly.qk_norm {
                Some([qw, kw, both]) => {
                    let (qn, kn) = (buf(self.s.qkn), at(self.s.qkn, t * qd));
                    let fused =
                        Op::RmsNorm(ops::RmsNorm { n: d.head_dim_k, eps: d.rms_eps, qk: Some([d.heads, d.kv_heads]) });
                    if t == 1 && ly.qkv.is_some() && self.kernels.has(&fused) {
                        let spec = self.kernels.get(&fused)?;
                        let w = Arg::Buf(both.buf, both.offset);
                        self.backend
                            .call(&spec, &[("x", q), ("w", w), ("y", qn), ("rows", Arg::U32(d.heads + d.kv_heads))])?;
                    } else {
                        self.rmsnorm(d.head_dim_k, q, qw, qn, t * d.heads)?;
                        self.rmsnorm(d.head_dim_k, k, kw, kn, t * d.kv_heads)?;
                    }
                    (qn, kn)
                }
                None => (q, k),
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
            let merge_q8 =
                self.fuse_q8(&Op::AttentionMerge(ops::AttentionMerge { heads, head_dim, q8: true }), &[ly.o], t)?;
            let merge = self.kernels.get(&Op::AttentionMerge(ops::AttentionMerge { heads, head_dim, q8: merge_q8 }))?;
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
                    self.add(d.embd, buf(x[cur]), buf(proj), buf(x[1 - cur]), t, false)?;
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
                self.rmsnorm(d.embd, last, self.output_norm, buf(h), 1)?;
                self.gemv(self.output, buf(h), buf(logits_buf), 1)
            }
            Logits::All => {
                self.rmsnorm(d.embd, buf(x[cur]), self.output_norm, buf(h), t)?;
                self.gemv(self.output, buf(h), buf(logits_buf), t)
            }
        }
    }
}
