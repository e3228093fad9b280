//! The KV caches: per layer, one pool of every sequence slot's keys and values of every
//! position read so far (f16 rows, slot-major) and of the keys' per-block (min, max)
//! summaries that QSA scores blocks by, so that one launch serves all of a batch's
//! sequences (each kernel reads its sequence's slot). A slot's position says how much of
//! its cache holds the sequence: resetting or rewinding only moves it back, and later
//! passes overwrite what lies beyond.

use strata_compiler::model::ModelDesc;
use strata_compiler::plan::MAX_WINDOW;

use super::Model;
use crate::backend::{Backend, BufferId, RunError};

/// One layer's KV cache pool: keys, values (f16 rows) and the keys' block summaries of
/// every slot, slot after slot.
#[derive(Clone, Copy)]
pub(crate) struct Cache {
    pub(crate) k: BufferId,
    pub(crate) v: BufferId,
    pub(crate) summary: BufferId,
}

impl Cache {
    /// Bytes of one slot's keys of a layer (as many for its values) and of its key
    /// summaries, for `n_ctx` positions in `n_blocks` blocks.
    pub(super) fn sizes(desc: &ModelDesc, n_ctx: u32, n_blocks: usize) -> (usize, usize) {
        let kv_width = (desc.kv_heads * desc.head_dim_k) as usize;
        let cache_bytes = n_ctx as usize * kv_width * 2;
        let summary_bytes = n_blocks * 2 * kv_width * 2;
        (cache_bytes, summary_bytes)
    }

    /// Allocates `layers` pools of `slots` slots, each slot `cache_bytes` of keys (and of
    /// values) and `summary_bytes` of summaries.
    pub(super) fn alloc_pools(
        b: &mut dyn Backend,
        slots: usize,
        layers: u32,
        cache_bytes: usize,
        summary_bytes: usize,
    ) -> Result<Vec<Cache>, RunError> {
        let too_big = || RunError::Other(format!("{slots} KV cache slots do not fit an allocation"));
        let (cache, summary) = (
            cache_bytes.checked_mul(slots).ok_or_else(too_big)?,
            summary_bytes.checked_mul(slots).ok_or_else(too_big)?,
        );
        (0..layers).map(|_| Ok(Cache { k: b.alloc(cache)?, v: b.alloc(cache)?, summary: b.alloc(summary)? })).collect()
    }
}

impl Model {
    /// Writes the first position and cache slot of each of a pass's sequences
    /// (`(position, slot)`, in pass order) where its kernels read them
    /// ([`Buf::Pos`](strata_compiler::forward::Buf::Pos), then
    /// [`Buf::Slots`](strata_compiler::forward::Buf::Slots) [`MAX_WINDOW`] entries on).
    pub(crate) fn write_positions(&mut self, seqs: &[(u32, usize)]) -> Result<(), RunError> {
        let n = MAX_WINDOW as usize;
        let mut v = vec![0i32; 2 * n];
        for (i, &(pos, slot)) in seqs.iter().enumerate().take(n) {
            v[i] = pos as i32;
            v[n + i] = slot as i32;
        }
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.backend.write(self.s.pos, 0, &bytes)
    }

    /// Empties the current slot's KV cache (a new sequence).
    pub fn reset(&mut self) {
        self.pos[self.slot] = 0;
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
        let (at, summary_at) = (self.slot * self.cache_bytes, self.slot * self.summary_bytes);
        for l in 0..self.layers.len() {
            let cache = self.caches[l];
            for start in (0..depth as usize).step_by(period) {
                let n = (depth as usize - start).min(period) * width * 2;
                self.backend.write(cache.k, at + start * width * 2, &k_bytes[..n])?;
                self.backend.write(cache.v, at + start * width * 2, &v_bytes[..n])?;
            }
            self.backend.write(cache.summary, summary_at, &summary)?;
        }
        self.pos[self.slot] = depth;
        Ok(())
    }
}
