//! One transformer (llama, qwen2, qwen3 dense; qwen3moe with its experts in
//! [`experts`]) on a backend: weights uploaded once, an f16 KV cache, and a forward pass
//! over windows of tokens built from plan records.
//!
//! Every step is a sequence of kernel calls on the backend; the host only writes token
//! ids and the position, and reads what it asked for (logits or the argmax tokens). A
//! decode step of one token, and a verify window of `t` tokens, is captured once per
//! slot and replayed (a CUDA graph on CUDA).
//!
//! [`Model`] is split by what it holds: the weights (`weights.rs`, uploaded through
//! `upload.rs`), the scratch of a pass (`scratch.rs`), the KV caches of the sequence slots
//! (`kv.rs`), the captured steps (`graphs.rs`) and the forward walk that queues a pass
//! (`forward.rs`); this module keeps the model itself, its loading and the small public
//! API. The benchmarks of its kernels are in [`crate::bench`].

mod budget;
mod checked;
pub mod experts;
mod forward;
mod graphs;
mod kv;
mod prompts;
pub mod qsa;
mod rope;
mod scan;
mod scratch;
mod upload;
mod weights;

use std::collections::HashMap;
use std::sync::Arc;

pub use budget::KvBudget;
pub use experts::{CacheSize, ExpertOptions, ExpertStats, Placement, Policy};
pub use forward::Logits;
pub use graphs::BatchIds;
pub use qsa::QsaConfig;
pub use scan::check_finite;

use experts::Experts;
pub(crate) use kv::{Cache, PageTable};
use scratch::Scratch;
use upload::Uploader;
use weights::{Layer, Weight, Weights};

use strata_compiler::forward::{FfnShape, Forward, LayerShape, Step};
use strata_compiler::model::ModelDesc;
use strata_compiler::ops::ExpertInput;
use strata_compiler::pack::Pack;
use strata_compiler::plan::{MAX_BATCH, MAX_WINDOW, Tuning, rules};

use crate::backend::{Backend, GraphId, RunError};
use crate::kernels::Kernels;

/// Where in the positions buffer a pass's sequences' cache slots start (bytes): after
/// [`MAX_BATCH`] first positions (see [`Model::write_positions`]).
pub(crate) const SLOTS_AT: usize = MAX_BATCH as usize * 4;

/// A kind of pass: (tokens, sequences, logits, first sparse layer).
type PassKey = (u32, u32, Logits, Option<u32>);

/// A model ready to run on a backend.
pub struct Model {
    /// The model's shape.
    pub desc: ModelDesc,
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) kernels: Kernels,
    pub(crate) layers: Vec<Layer>,
    embed: Weight,
    output_norm: Weight,
    output: Weight,
    pub(crate) s: Scratch,
    pub(crate) n_ctx: u32,
    window: u32,
    /// Tokens of a prompt chunk: on the matrix units where the prefill kernels exist
    /// and it is wider than `window`; else the widest window.
    chunk: u32,
    /// Whether prompt chunks take the GEMMs (and a mixture of experts' the grouped
    /// expert GEMMs), not GEMV windows.
    chunk_gemm: bool,
    /// Most sequences a batched decode pass holds: `window`, or where chunks take the
    /// GEMMs, up to [`MAX_BATCH`].
    batch: u32,
    /// Most columns of the batch GEMVs the products of a pass wider than `window`
    /// take, where a layer's products have them (else 0).
    batch_gemv: u32,
    /// Most sequences a pass of several prompts' chunks holds ([`Model::read_prompts`]).
    prompt_seqs: u32,
    /// Per layer: the KV cache pool, pages of every sequence slot.
    pub(crate) caches: Vec<Cache>,
    /// Which pages each slot holds (the page table).
    pub(crate) pages: PageTable,
    /// KV positions per block of the key summaries (and of QSA's selection).
    pub(crate) block: u32,
    /// The op of every step of the forward pass (the description the plan compiled).
    pub(crate) ops: Forward,
    /// Each layer's products, as the steps of a pass name them.
    shapes: Vec<LayerShape>,
    /// The steps of each kind of pass made so far.
    passes: HashMap<PassKey, Arc<[Step]>>,
    /// QSA's budget in blocks, where decode passes attend sparsely.
    qsa: Option<u32>,
    /// The slot forward passes run on.
    pub(crate) slot: usize,
    /// Per slot: tokens in its KV cache.
    pos: Vec<u32>,
    /// Captured steps by (sequences, tokens, with argmax, sparse): a step bakes in how
    /// many sequences it holds, its window size and whether it attends sparsely; which
    /// slots, their positions and pages it reads from the device at each replay.
    graphs: HashMap<(u32, u32, bool, bool), GraphId>,
    /// The (slot, token) in `next[0]` on the device, as last read back.
    on_device: Option<(usize, u32)>,
    /// Mixture-of-experts packs: the experts' pools and cache.
    experts: Option<Experts>,
    /// Whether greedy picks refuse non-finite logits (see `checked.rs`).
    checked: bool,
    /// Tokens and logits of the last `forward`, which a checked run replays.
    last_pass: Option<(u32, Logits)>,
}

impl Model {
    /// Uploads the pack's weights to `backend` and allocates a KV pool (sized by `kv`)
    /// for `slots` concurrent sequences of up to `n_ctx` positions, and scratch for
    /// windows of up to `window` tokens (fewer where an expert cache holds only narrower
    /// passes' experts) and prompt chunks of up to `prefill` tokens (where the kernels
    /// have the prefill ops); `expert_options` place a mixture-of-experts pack's experts.
    /// `progress` sees bytes uploaded and the total.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        pack: &Pack,
        mut backend: Box<dyn Backend>,
        mut kernels: Kernels,
        n_ctx: u32,
        window: u32,
        prefill: u32,
        slots: usize,
        kv: KvBudget,
        expert_options: &ExpertOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model, RunError> {
        let desc = ModelDesc::from_pack(pack).map_err(|e| RunError::Other(e.to_string()))?;
        if n_ctx == 0 || window == 0 || slots == 0 {
            return Err(RunError::Other("context, window and slots must be at least 1".into()));
        }
        let total: u64 = pack.tensors().iter().map(|t| t.bytes).sum();
        // Experts may stay in host memory (the expert cache streams them): only the rest
        // must fit beside the context.
        let experts: std::collections::HashSet<String> = desc
            .expected_tensors()
            .into_iter()
            .filter(|t| t.role == strata_compiler::model::Role::Experts)
            .map(|t| t.name)
            .collect();
        let resident: u64 = pack.tensors().iter().filter(|t| !experts.contains(&t.name)).map(|t| t.bytes).sum();
        let block = kernels
            .qsa_block()
            .ok_or_else(|| RunError::Other("the kernels have no rope_store, so no KV block size".into()))?;
        // Before anything is allocated: a context too large for memory is an error, not
        // an abort halfway through the upload.
        let pool = budget::pool_pages(&desc, n_ctx, block, slots, kv)?;
        budget::check_context(&desc, n_ctx, block, pool, resident, budget::Budget::of(&backend.info()))?;
        check_finite(pack)?;
        let b = backend.as_mut();
        let mut up = Uploader { pack, done: 0, total, progress };
        let Weights { embed, output_norm, output, layers } = Weights::upload(&mut up, b, &kernels, &desc)?;
        let n_blocks = n_ctx.div_ceil(block) as usize;
        let ops = Forward::new(&desc, block);
        // Prompt chunks: GEMM chunks of `prefill` tokens where the kernels have them (a
        // mixture of experts' up to MAX_EXPERT_CHUNK, on its grouped expert GEMMs, once
        // its experts prove resident). Else a mixture of experts reads its prompt in the
        // widest window passes its kernels have, up to `prefill` tokens (and MAX_WINDOW,
        // the most its routing takes). Heads too long for the prefill attention's tiles
        // leave a chunk's attention to the split kernels: then its GEMMs say whether
        // chunks were compiled.
        let chunk_compiled = match ops.attention_prefill(None) {
            Some(attention) => kernels.has(&attention),
            None => layers.first().is_some_and(|ly| kernels.has(&ops.gemm(ly.q.matrix()))),
        };
        // Every layer's experts on the grouped GEMMs, where they were compiled.
        let grouping = ops.group().is_some_and(|op| kernels.has(&op));
        let mut grouped_gemm = |l: u32, name: &str, input| {
            let op = pack.tensor(&format!("blk.{l}.{name}.weight")).and_then(|t| ops.expert_gemm(t.ty, input));
            op.and_then(|op| kernels.get(&op).ok())
                .is_some_and(|k| matches!(k.tuning, Tuning::Gemm(_) | Tuning::GemmQ8(_)))
        };
        let grouped = chunk_compiled
            && grouping
            && (0..desc.layers).all(|l| {
                grouped_gemm(l, "ffn_gate_exps", ExpertInput::Token)
                    && grouped_gemm(l, "ffn_down_exps", ExpertInput::Choice)
            });
        let chunk = match desc.experts {
            None if chunk_compiled => prefill.max(1),
            None => window,
            Some(_) => {
                let gate = pack.tensor("blk.0.ffn_gate_exps.weight").map(|t| t.ty);
                let has = |w: u32| {
                    gate.and_then(|ty| ops.expert_product(ty, w, ExpertInput::Token)).is_some_and(|op| kernels.has(&op))
                };
                (window + 1..=prefill.min(MAX_WINDOW)).rev().find(|&w| has(w)).unwrap_or(window)
            }
        };
        let grouped_chunk = prefill.clamp(1, rules::MAX_EXPERT_CHUNK);
        let widest = if desc.experts.is_some() { chunk } else { window };
        let scratch_chunk = if grouped { chunk.max(grouped_chunk) } else { chunk };
        let s = Scratch::alloc(b, &mut kernels, &desc, &ops, widest, scratch_chunk, n_ctx, n_blocks)?;
        let (page_bytes, summary_bytes) = Cache::page_sizes(&desc, block);
        let caches = Cache::alloc_pools(b, pool as usize, desc.layers, page_bytes, summary_bytes)?;
        let pages = PageTable::new(b, slots, n_ctx, block, pool as u32)?;
        let table = rope::table(n_ctx, &rope::Rope::of(&desc, rope::freq_factors(pack, &desc)?))?;
        b.write(s.cos_sin, 0, &table)?;
        if let Some(local) = rope::Rope::local(&desc) {
            b.write(s.cos_sin_local, 0, &rope::table(n_ctx, &local)?)?;
        }
        let experts = match desc.experts {
            Some(_) => {
                let expert_bytes: u64 =
                    pack.tensors().iter().filter(|t| t.name.contains("_exps.")).map(|t| t.bytes).sum();
                // What the rest of the model takes: its weights, the KV caches, and room
                // for scratch.
                let other = total - expert_bytes
                    + pool * u64::from(desc.layers) * (2 * page_bytes + summary_bytes) as u64
                    + (512 << 20);
                let mut done = up.done;
                let progress = &mut *up.progress;
                let x = Experts::load(pack, &desc, b, expert_options, widest, other, &mut |n| {
                    done += n;
                    progress(done, total);
                })?;
                Some(x)
            }
            None => None,
        };
        // Routing takes up to MAX_WINDOW tokens a pass, and a small cache fewer: where it
        // cannot hold the prompt window's experts, prompts go in verify windows.
        let window = experts.as_ref().map_or(window, |x| window.min(x.max_window).min(MAX_WINDOW));
        let resident = experts.as_ref().is_some_and(|x| !x.cached());
        let chunk = match &experts {
            Some(_) if grouped && resident => grouped_chunk,
            Some(x) if chunk > x.max_window => window,
            _ => chunk,
        };
        let chunk_gemm = match desc.experts {
            None => chunk_compiled,
            Some(_) => grouped && resident,
        };
        // A batch wider than the window runs its products on the GEMMs, as a chunk does,
        // up to the sequences the cache kernels were built for.
        let mut seqs_max = |op| {
            let k = kernels.get(&op).ok()?;
            k.scalars.iter().find(|s| s.name == "seqs").map(|s| s.max)
        };
        let built = seqs_max(ops.rope_store()).min(seqs_max(ops.attention(false, None))).unwrap_or(0);
        let batch = if chunk_gemm { chunk.min(MAX_BATCH).min(built).max(window) } else { window };
        // Several prompts' chunks share a GEMM pass where the prefill attention takes
        // several sequences (artifacts built before it did read one prompt a pass), or
        // where split attention reads the chunks (heads too long for the prefill tiles).
        let prompt_seqs = match ops.attention_prefill(None) {
            _ if !chunk_gemm => 1,
            Some(attention) => seqs_max(attention).unwrap_or(1).min(built),
            None => built,
        };
        let prompt_seqs = prompt_seqs.clamp(1, MAX_BATCH);
        let shapes = (0..layers.len())
            .map(|l| {
                let pools = experts.as_ref().map(|x| (x.gate_up[l].ty, x.down[l].ty));
                layers[l].shape(pools).ok_or_else(|| RunError::Other(format!("layer {l}: its experts were not loaded")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Batches wider than the window take the batch GEMVs where products that have
        // them hold most of the layers' weights (the others take the GEMM, which costs
        // more than a second window pass: SmolLM2's Q4_1 with only its down projection
        // on the matrix unit went from 12024 to 9174 t/s at 32 sequences, H100).
        let (mut held, mut all) = (0u64, 0u64);
        for ly in &shapes {
            let dense = match ly.ffn {
                FfnShape::Dense { gate, up, down, .. } => vec![gate, up, down],
                FfnShape::Experts { .. } => vec![],
            };
            for m in [ly.q, ly.k, ly.v, ly.o].into_iter().chain(dense) {
                let bytes = m.quant.row_bytes(u64::from(m.cols)).unwrap_or(0) * u64::from(m.rows);
                all += bytes;
                if kernels.get(&ops.batch_product(m)).is_ok_and(|k| matches!(k.tuning, Tuning::GemvMma(_))) {
                    held += bytes;
                }
            }
        }
        let batch_gemvs = batch > window && chunk >= rules::BATCH_GEMV_COLUMNS && held > 0 && 2 * held >= all;
        let batch_gemv = if batch_gemvs { rules::BATCH_GEMV_COLUMNS.min(batch) } else { 0 };
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
            chunk,
            chunk_gemm,
            batch,
            batch_gemv,
            prompt_seqs,
            caches,
            pages,
            block,
            ops,
            shapes,
            passes: HashMap::new(),
            qsa: None,
            slot: 0,
            pos: vec![0; slots],
            graphs: HashMap::new(),
            on_device: None,
            experts,
            checked: false,
            last_pass: None,
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

    /// Largest window of GEMV products (a verify window; a decode step is 1).
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Tokens of a prompt chunk, whose products run on the matrix units when it is
    /// wider than [`Model::window`].
    pub fn chunk(&self) -> u32 {
        self.chunk
    }

    /// Most sequences one batched decode pass holds ([`Model::decode_batch_greedy`]).
    pub fn batch_width(&self) -> u32 {
        self.batch
    }

    /// The passes that decode one token of each of `n` sequences, as ranges of them in
    /// order ([`decode_passes`]).
    pub fn batch_passes(&self, n: usize) -> Vec<std::ops::Range<usize>> {
        decode_passes(n, self.window, self.batch, self.batch_gemv)
    }

    /// The backend (for device information and synchronization).
    pub fn backend(&mut self) -> &mut dyn Backend {
        self.backend.as_mut()
    }

    /// The passes that read `n` prompt tokens, in order: chunks, and where a chunk is a
    /// mixture of experts' prompt window, the tokens after the last whole one in verify
    /// windows (the narrower widths its kernels have).
    pub fn prompt_passes(&self, n: usize) -> Vec<std::ops::Range<usize>> {
        let (chunk, window) = (self.chunk.max(1) as usize, self.window.max(1) as usize);
        let mut passes = Vec::with_capacity(n.div_ceil(chunk) + window);
        let mut at = 0;
        while at < n {
            let rest = n - at;
            let take = if rest >= chunk || self.chunk_gemm || self.experts.is_none() {
                rest.min(chunk)
            } else {
                rest.min(window)
            };
            passes.push(at..at + take);
            at += take;
        }
        passes
    }

    /// Checks that `t` tokens fit one pass and the context, returning `t`.
    fn room(&self, t: usize) -> Result<u32, RunError> {
        let pos = self.pos[self.slot];
        let t = u32::try_from(t).unwrap_or(u32::MAX);
        let most = self.chunk.max(self.window);
        if t == 0 || t > most {
            return Err(RunError::Other(format!("a forward pass takes 1 to {most} tokens, not {t}")));
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
        self.write_positions(&[(self.pos[self.slot], self.slot)], tokens.len() as u32)
    }

    /// Runs `tokens` (at most the wider of [`Model::chunk`] and [`Model::window`]) at
    /// the next positions and leaves the asked-for logits in the logits buffer.
    pub fn forward(&mut self, tokens: &[u32], logits: Logits) -> Result<(), RunError> {
        let t = self.room(tokens.len())?;
        self.upload_ids(tokens)?;
        self.enqueue(self.s.ids, t, &[self.slot], logits, false)?;
        self.end_pass(t)?;
        self.pos[self.slot] += t;
        self.last_pass = Some((t, logits));
        Ok(())
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
        if self.checked {
            self.check_logits(rows)?;
        }
        self.enqueue_argmax(rows)?;
        let ids = self.read_next(rows as usize)?;
        self.on_device = ids.first().map(|&id| (self.slot, id));
        Ok(ids)
    }

    /// The first `n` token ids in `next` (where the argmax leaves them).
    fn read_next(&mut self, n: usize) -> Result<Vec<u32>, RunError> {
        let mut out = vec![0u8; n * 4];
        self.backend.read(self.s.next, 0, &mut out)?;
        Ok(out.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32).collect())
    }

    /// Reads `rows` rows of logits left by the last forward pass.
    pub fn logits(&mut self, rows: u32) -> Result<Vec<f32>, RunError> {
        if self.checked {
            self.check_logits(rows)?;
        }
        self.read_logits(rows)
    }
}

/// The passes that decode one token of each of `n` sequences, in order: one window
/// pass, whose rows are each computed as decoding it alone computes it (to rounding
/// where the window's GEMVs take the matrix unit and the single token's do not,
/// `Options::gemv_mma_from`), for up to `window` sequences. More: one pass of batch
/// GEMVs where they pay (`batch_gemv` columns, 0 where they do not) and hold all `n`;
/// else window passes for up to [`rules::BATCH_WINDOW_PASSES`] windows' worth (and
/// [`MAX_WINDOW`]) of sequences, and more in as few GEMM passes of up to `batch` as hold
/// them, sized alike. (Two passes of batch GEMVs cost twice one: their time grows with
/// the columns past 16, where one GEMM pass of up to 64 costs about the same at any
/// width; measured on the H100, docs/PERFORMANCE.md.)
fn decode_passes(n: usize, window: u32, batch: u32, batch_gemv: u32) -> Vec<std::ops::Range<usize>> {
    let (window, batch, batch_gemv) = (window.max(1) as usize, batch.max(1) as usize, batch_gemv as usize);
    let windows = (window * rules::BATCH_WINDOW_PASSES as usize).max(MAX_WINDOW as usize);
    let alike = |most: usize| n.div_ceil(n.div_ceil(most));
    let width = match n {
        _ if n <= window => window,
        _ if n <= batch_gemv => n,
        _ if n > windows && batch > window => alike(batch),
        _ => window,
    };
    (0..n).step_by(width.max(1)).map(|at| at..(at + width).min(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_take_window_passes_until_gemm_passes_pay() {
        let widths = |n, window, batch| decode_passes(n, window, batch, 0).iter().map(|p| p.len()).collect::<Vec<_>>();
        assert_eq!(widths(1, 16, 64), [1]);
        assert_eq!(widths(16, 16, 64), [16]);
        assert_eq!(widths(32, 16, 64), [16, 16], "two window passes");
        assert_eq!(widths(33, 16, 64), [33], "one GEMM pass");
        assert_eq!(widths(100, 16, 64), [50, 50], "GEMM passes sized alike");
        assert_eq!(widths(40, 16, 16), [16, 16, 8], "no GEMMs: windows only");
        assert_eq!(widths(16, 4, 64), [4, 4, 4, 4], "a narrow window: GEMMs past the widest");
        assert_eq!(widths(17, 4, 64), [17]);
        assert!(decode_passes(0, 16, 64, 0).is_empty());
    }

    #[test]
    fn batches_wider_than_the_window_take_one_batch_gemv_pass_where_it_holds_them() {
        let widths = |n| decode_passes(n, 16, 64, 32).iter().map(|p| p.len()).collect::<Vec<_>>();
        assert_eq!(widths(16), [16], "a window pass");
        assert_eq!(widths(17), [17]);
        assert_eq!(widths(32), [32]);
        assert_eq!(widths(33), [33], "one GEMM pass");
        assert_eq!(widths(64), [64]);
        assert_eq!(widths(65), [33, 32]);
        assert!(decode_passes(0, 16, 64, 32).is_empty());
    }
}
