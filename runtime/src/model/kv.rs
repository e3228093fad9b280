//! The KV caches, paged: per layer, one pool of pages, each the keys and values (f16
//! rows) of one block of positions and the keys' (min, max) summary of the block that QSA
//! scores blocks by. A sequence slot takes pages as it grows and its row of the page
//! table (on the device, read by every kernel that touches the caches) names the page of
//! each of its blocks, so that one launch serves all of a batch's sequences and a pool
//! sized by `--kv-budget` serves slots of any length. A slot's position says how much of
//! its pages hold the sequence: rewinding moves it back and gives up the pages past it;
//! later passes overwrite what lies beyond within a page. Slots may share the whole pages
//! of a common prefix (counted per page, free once no slot holds it); no slot writes a
//! page it shares.

use strata_compiler::model::ModelDesc;
use strata_compiler::plan::MAX_BATCH;

use super::Model;
use crate::backend::{Backend, BufferId, RunError};

/// One layer's KV cache pool: keys, values (f16 rows) and the keys' block summaries of
/// every page, page after page.
#[derive(Clone, Copy)]
pub(crate) struct Cache {
    pub(crate) k: BufferId,
    pub(crate) v: BufferId,
    pub(crate) summary: BufferId,
}

impl Cache {
    /// Bytes of one page's keys of a layer (as many for its values) and of its key
    /// summary, for pages of `block` positions.
    pub(super) fn page_sizes(desc: &ModelDesc, block: u32) -> (usize, usize) {
        let kv_width = (desc.kv_heads * desc.head_dim_k) as usize;
        (block as usize * kv_width * 2, 2 * kv_width * 2)
    }

    /// Allocates `layers` pools of `pages` pages, each `page_bytes` of keys (and of
    /// values) and `summary_bytes` of summary.
    pub(super) fn alloc_pools(
        b: &mut dyn Backend,
        pages: usize,
        layers: u32,
        page_bytes: usize,
        summary_bytes: usize,
    ) -> Result<Vec<Cache>, RunError> {
        let too_big = || RunError::Other(format!("a KV pool of {pages} pages does not fit an allocation"));
        let (cache, summary) =
            (page_bytes.checked_mul(pages).ok_or_else(too_big)?, summary_bytes.checked_mul(pages).ok_or_else(too_big)?);
        (0..layers).map(|_| Ok(Cache { k: b.alloc(cache)?, v: b.alloc(cache)?, summary: b.alloc(summary)? })).collect()
    }
}

/// Which pool pages each sequence slot holds, and which are free: the host's copy of
/// the page table, written to the device (`table`) a slot's row at a time when it changes.
pub(crate) struct PageTable {
    /// Positions a page.
    pub(crate) block: u32,
    /// Entries of a slot's row: the pages of a whole context.
    pub(crate) row: usize,
    /// Pages in the pool.
    pub(crate) total: u32,
    /// Per slot: its pages, in position order.
    held: Vec<Vec<u32>>,
    /// Per page: how many slots hold it (more than one: a shared prefix's page, which no
    /// slot writes).
    refs: Vec<u32>,
    /// Pages no slot holds (taken from the end).
    free: Vec<u32>,
    /// Slots whose row changed since it was last written to the device.
    dirty: Vec<bool>,
    /// The table on the device: `slots × row` i32 page numbers (-1: none).
    pub(crate) table: BufferId,
}

impl PageTable {
    /// A table of `slots` rows for contexts of `n_ctx` positions over a pool of `total`
    /// pages of `block` positions, every page free.
    pub(super) fn new(b: &mut dyn Backend, slots: usize, n_ctx: u32, block: u32, total: u32) -> Result<Self, RunError> {
        let row = n_ctx.div_ceil(block) as usize;
        let table = b.alloc(slots * row * 4)?;
        b.write(table, 0, &vec![0xFF; slots * row * 4])?;
        Ok(PageTable {
            block,
            row,
            total,
            held: vec![Vec::new(); slots],
            refs: vec![0; total as usize],
            free: (0..total).rev().collect(),
            dirty: vec![false; slots],
            table,
        })
    }

    /// Pages no slot holds.
    pub(crate) fn free(&self) -> u32 {
        self.free.len() as u32
    }

    /// Pages `slot` holds.
    pub(crate) fn held(&self, slot: usize) -> u32 {
        self.held.get(slot).map_or(0, |h| h.len() as u32)
    }

    /// Pages that `positions` positions take.
    pub(crate) fn pages_for(&self, positions: u32) -> u32 {
        positions.div_ceil(self.block)
    }

    /// Makes `slot` hold the pages of its first `positions` positions, taking free ones;
    /// an error (nothing taken) when the pool has too few.
    fn grow(&mut self, slot: usize, positions: u32) -> Result<(), RunError> {
        let want = self.pages_for(positions) as usize;
        let held = &mut self.held[slot];
        let need = want.saturating_sub(held.len());
        if need > self.free.len() {
            return Err(RunError::Other(format!(
                "the KV pool is full: slot {slot} needs {need} more page(s) of {} positions, {} of {} are free",
                self.block,
                self.free.len(),
                self.total
            )));
        }
        if need > 0 {
            for page in self.free.drain(self.free.len() - need..).rev() {
                self.refs[page as usize] = 1;
                held.push(page);
            }
            self.dirty[slot] = true;
        }
        Ok(())
    }

    /// Gives up `slot`'s pages past its first `positions` positions (a page is free once
    /// no slot holds it).
    fn shrink(&mut self, slot: usize, positions: u32) {
        let keep = self.pages_for(positions) as usize;
        let held = &mut self.held[slot];
        if held.len() > keep {
            for page in held.drain(keep..).rev() {
                let refs = &mut self.refs[page as usize];
                *refs = refs.saturating_sub(1);
                if *refs == 0 {
                    self.free.push(page);
                }
            }
            self.dirty[slot] = true;
        }
    }

    /// Whether the next write of `slot` after its first `positions` positions would land
    /// in a page another slot also holds (inside a shared prefix's page).
    fn shared_at(&self, slot: usize, positions: u32) -> bool {
        let blk = (positions / self.block) as usize;
        !positions.is_multiple_of(self.block) && self.page(slot, blk).is_some_and(|p| self.refs[p as usize] > 1)
    }

    /// Makes the empty slot `to` hold `from`'s first `blocks` pages too (a shared prefix:
    /// both read them; neither writes them, as both write only past the prefix).
    fn share(&mut self, from: usize, to: usize, blocks: usize) {
        let pages: Vec<u32> = self.held[from].iter().take(blocks).copied().collect();
        for &page in &pages {
            self.refs[page as usize] += 1;
        }
        self.held[to] = pages;
        self.dirty[to] = true;
    }

    /// Writes the rows that changed to the device.
    fn flush(&mut self, b: &mut dyn Backend) -> Result<(), RunError> {
        for slot in 0..self.held.len() {
            if !std::mem::take(&mut self.dirty[slot]) {
                continue;
            }
            let mut row = vec![-1i32; self.row];
            for (entry, &page) in row.iter_mut().zip(&self.held[slot]) {
                *entry = page as i32;
            }
            let bytes: Vec<u8> = row.iter().flat_map(|x| x.to_le_bytes()).collect();
            b.write(self.table, slot * self.row * 4, &bytes)?;
        }
        Ok(())
    }

    /// The pool page of block `blk` of `slot`.
    pub(crate) fn page(&self, slot: usize, blk: usize) -> Option<u32> {
        self.held.get(slot)?.get(blk).copied()
    }
}

impl Model {
    /// Readies a pass of `tokens` tokens for each of its sequences (`(position, slot)`,
    /// in pass order): each slot takes the pages its new positions need (an error where
    /// the pool has too few), the page table's changed rows go to the device, and the
    /// first positions and slots go where the kernels read them
    /// ([`Buf::Pos`](strata_compiler::forward::Buf::Pos), then
    /// [`Buf::Slots`](strata_compiler::forward::Buf::Slots) [`MAX_BATCH`] entries on).
    pub(crate) fn write_positions(&mut self, seqs: &[(u32, usize)], tokens: u32) -> Result<(), RunError> {
        for &(pos, slot) in seqs {
            self.pages.grow(slot, pos.saturating_add(tokens).min(self.n_ctx))?;
        }
        self.pages.flush(self.backend.as_mut())?;
        let n = MAX_BATCH as usize;
        let mut v = vec![0i32; 2 * n];
        for (i, &(pos, slot)) in seqs.iter().enumerate().take(n) {
            v[i] = pos as i32;
            v[n + i] = slot as i32;
        }
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.backend.write(self.s.pos, 0, &bytes)
    }

    /// Empties the current slot's KV cache (a new sequence), giving up its pages.
    pub fn reset(&mut self) {
        self.pos[self.slot] = 0;
        self.pages.shrink(self.slot, 0);
    }

    /// Forgets the current slot's positions from `pos` on (the KV entries of rejected
    /// draft tokens), giving up the pages past it; later passes overwrite them. Refused
    /// where the next write would land in a page another slot shares (see
    /// [`Model::keep_prefix`]).
    pub fn rewind(&mut self, pos: u32) -> Result<(), RunError> {
        let now = self.pos[self.slot];
        if pos > now {
            return Err(RunError::Other(format!("cannot rewind to position {pos}: the sequence holds {now}")));
        }
        if self.pages.shared_at(self.slot, pos) {
            return Err(RunError::Other(format!(
                "cannot rewind to position {pos}: its page is shared with another slot"
            )));
        }
        self.pos[self.slot] = pos;
        self.pages.shrink(self.slot, pos);
        Ok(())
    }

    /// Keeps the current slot's first `pos` positions for a new request that shares them
    /// (at most what it holds), fewer where the next write would land in a page another
    /// slot shares: then only the whole pages before it. Returns the positions kept.
    pub fn keep_prefix(&mut self, pos: u32) -> Result<u32, RunError> {
        let mut keep = pos.min(self.pos[self.slot]);
        if self.pages.shared_at(self.slot, keep) {
            keep -= keep % self.block;
        }
        self.rewind(keep)?;
        Ok(keep)
    }

    /// Makes the current slot a new sequence that starts with `from`'s first `positions`
    /// positions, sharing their pages (a prefix cache across slots: a system prompt, a
    /// conversation another slot holds). `positions` must be whole pages, and `from` must
    /// hold them; the current slot's own pages are given up first.
    pub fn share_prefix(&mut self, from: usize, positions: u32) -> Result<(), RunError> {
        let slot = self.slot;
        let held = self.pos.get(from).copied().unwrap_or(0);
        if from == slot || positions > held || !positions.is_multiple_of(self.block) {
            return Err(RunError::Other(format!(
                "slot {slot} cannot share {positions} positions of slot {from}, which holds {held} (pages of {})",
                self.block
            )));
        }
        self.reset();
        self.pages.share(from, slot, (positions / self.block) as usize);
        self.pos[slot] = positions;
        Ok(())
    }

    /// Tokens in `slot`'s KV cache.
    pub fn pos_of(&self, slot: usize) -> u32 {
        self.pos.get(slot).copied().unwrap_or(0)
    }

    /// Pages of the KV pool: (free, total), each [`Model::qsa_block`] positions.
    pub fn kv_pages(&self) -> (u32, u32) {
        (self.pages.free(), self.pages.total)
    }

    /// Pages `slot` holds.
    pub fn kv_held(&self, slot: usize) -> u32 {
        self.pages.held(slot)
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
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut pattern = |n: usize| -> Vec<half::f16> {
            (0..n).map(|_| half::f16::from_f32(rng.random_range(-1.0f32..1.0))).collect()
        };
        let bytes = |v: &[half::f16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (keys, values) = (pattern(period * width), pattern(period * width));
        let (k_bytes, v_bytes) = (bytes(&keys), bytes(&values));
        // Each block's summary, [KV head][dimension][min, max]: the page's summary.
        let blocks = (depth as usize).div_ceil(block);
        let mut summary = vec![half::f16::ZERO; blocks * 2 * width];
        for blk in 0..blocks {
            let rows = blk * block..((blk + 1) * block).min(depth as usize);
            for h in 0..width / hd {
                for d in 0..hd {
                    let column = rows.clone().map(|p| keys[(p % period) * width + h * hd + d]);
                    let lo = column.clone().fold(half::f16::INFINITY, |a, b| if b < a { b } else { a });
                    let hi = column.fold(half::f16::NEG_INFINITY, |a, b| if b > a { b } else { a });
                    summary[((blk * width / hd + h) * hd + d) * 2] = lo;
                    summary[((blk * width / hd + h) * hd + d) * 2 + 1] = hi;
                }
            }
        }
        let summary = bytes(&summary);
        let slot = self.slot;
        self.pos[slot] = 0;
        self.pages.shrink(slot, 0);
        self.pages.grow(slot, depth)?;
        self.pages.flush(self.backend.as_mut())?;
        // Runs of blocks on consecutive pages (all of them, on a fresh pool), cut where
        // the pattern repeats: one write each.
        let (row_bytes, summary_bytes) = (width * 2, 2 * width * 2);
        let mut runs: Vec<(usize, usize, usize)> = Vec::new(); // (first block, first page, blocks)
        for blk in 0..blocks {
            let page = self.pages.page(slot, blk).unwrap_or_default() as usize;
            match runs.last_mut() {
                Some((b0, p0, n)) if *p0 + *n == page && !(blk * block).is_multiple_of(period) && *b0 + *n == blk => {
                    *n += 1
                }
                _ => runs.push((blk, page, 1)),
            }
        }
        for l in 0..self.layers.len() {
            let cache = self.caches[l];
            for &(b0, p0, n) in &runs {
                let (first, end) = (b0 * block, ((b0 + n) * block).min(depth as usize));
                let (at, from) = (p0 * block * row_bytes, (first % period) * row_bytes);
                let len = (end - first) * row_bytes;
                self.backend.write(cache.k, at, &k_bytes[from..from + len])?;
                self.backend.write(cache.v, at, &v_bytes[from..from + len])?;
                self.backend.write(
                    cache.summary,
                    p0 * summary_bytes,
                    &summary[b0 * summary_bytes..(b0 + n) * summary_bytes],
                )?;
            }
        }
        self.pos[self.slot] = depth;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::PageTable;
    use crate::backend::Backend;
    use crate::backend::cpu::Cpu;

    /// The table row of `slot` on the device.
    fn row(cpu: &mut Cpu, t: &PageTable, slot: usize) -> Vec<i32> {
        let mut bytes = vec![0u8; t.row * 4];
        cpu.read(t.table, slot * t.row * 4, &mut bytes).expect("in bounds");
        bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    #[test]
    fn pages_are_taken_as_sequences_grow_shared_and_free_once_no_slot_holds_them() {
        let mut cpu = Cpu::new();
        let mut t = PageTable::new(&mut cpu, 2, 64, 16, 5).expect("a table");
        t.grow(0, 33).expect("three pages");
        assert_eq!((t.held(0), t.free()), (3, 2));
        assert!(t.grow(1, 64).is_err(), "four pages, two free");
        assert_eq!(t.free(), 2, "a refused growth takes nothing");
        t.flush(&mut cpu).expect("written");
        let held: Vec<i32> = (0..3).map(|b| t.page(0, b).expect("held") as i32).collect();
        assert_eq!(row(&mut cpu, &t, 0), [held.clone(), vec![-1]].concat());
        assert_eq!(row(&mut cpu, &t, 1), [-1; 4]);
        // Slot 1 starts from slot 0's first two pages: its next write (position 32) is
        // its own, but one inside them would land in a shared page.
        t.share(0, 1, 2);
        assert_eq!((t.held(1), t.free()), (2, 2));
        assert!(t.shared_at(1, 20) && t.shared_at(0, 20) && !t.shared_at(1, 32) && !t.shared_at(0, 40));
        t.flush(&mut cpu).expect("written");
        assert_eq!(row(&mut cpu, &t, 1), [&held[..2], &[-1, -1]].concat());
        t.shrink(0, 0);
        assert_eq!(t.free(), 3, "the shared pages stay with slot 1");
        assert!(!t.shared_at(1, 20));
        t.shrink(1, 0);
        assert_eq!(t.free(), 5);
    }
}
