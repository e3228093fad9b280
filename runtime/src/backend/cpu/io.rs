//! What every op's reference reads and writes through: [`OpIo`], a kernel's arguments
//! by name (inputs, scalars, outputs), and the small helpers the op modules share
//! (little-endian readers and writers, the fixed-order f32 dot product).
//!
//! An op computes its outputs into fresh vectors from borrowed inputs and hands them to
//! [`OpIo::output`]; they are stored only after the op returns (see [`OpIo::finish`]),
//! so an output that aliases an input never changes what the op reads.

use half::f16;
use strata_compiler::plan::KernelRecord;

use super::memory::Memory;
use super::{Arg, RunError};

/// Paged KV caches as a launch sees them (see [`OpIo::pages`]).
pub(super) struct Pages {
    table: Vec<i32>,
    n_blocks: usize,
    pool: usize,
    /// Positions a page.
    pub block: usize,
}

impl Pages {
    /// The pool page of block `blk` of cache slot `slot`, if the table has one in the pools.
    pub fn page(&self, slot: usize, blk: usize) -> Option<usize> {
        if blk >= self.n_blocks {
            return None;
        }
        let page = *self.table.get(slot.checked_mul(self.n_blocks)?.checked_add(blk)?)?;
        usize::try_from(page).ok().filter(|&p| p < self.pool)
    }

    /// The pool row of position `p` of cache slot `slot`.
    pub fn row(&self, slot: usize, p: usize) -> Option<usize> {
        Some(self.page(slot, p / self.block)? * self.block + p % self.block)
    }

    /// Whether every position of `span` of cache slot `slot` has a page in the pools.
    pub fn holds(&self, slot: usize, span: std::ops::Range<usize>) -> bool {
        span.is_empty() || (span.start / self.block..=(span.end - 1) / self.block).all(|b| self.page(slot, b).is_some())
    }

    /// The rows of `width` f16s of positions `0..n` of cache slot `slot` in `pool`,
    /// gathered from their pages and widened (`None` where a page is missing).
    pub fn gather(&self, pool: &[u8], slot: usize, n: usize, width: usize) -> Option<Vec<f32>> {
        let mut rows = Vec::with_capacity(n * width);
        for start in (0..n).step_by(self.block) {
            let at = self.row(slot, start)? * width * 2;
            rows.extend(halves(pool.get(at..)?, (n - start).min(self.block) * width));
        }
        (rows.len() == n * width).then_some(rows)
    }
}

/// One launch's arguments, by the names the plan record gives them.
pub(super) struct OpIo<'a> {
    spec: &'a KernelRecord,
    args: &'a [Arg],
    buffers: &'a mut [Memory],
    outputs: Vec<(&'static str, Vec<u8>)>,
}

impl<'a> OpIo<'a> {
    /// The arguments `args` (in the record's order) of a launch of `spec` over `buffers`.
    pub(super) fn new(spec: &'a KernelRecord, args: &'a [Arg], buffers: &'a mut [Memory]) -> OpIo<'a> {
        OpIo { spec, args, buffers, outputs: Vec::new() }
    }

    /// The record being run.
    pub(super) fn spec(&self) -> &'a KernelRecord {
        self.spec
    }

    /// The scalar argument `name` (0 when there is none).
    pub(super) fn scalar(&self, name: &str) -> u32 {
        let nb = self.spec.buffers.len();
        let i = self.spec.scalars.iter().position(|s| s.name == name);
        match i.and_then(|i| self.args.get(nb + i)) {
            Some(Arg::U32(v)) => *v,
            _ => 0,
        }
    }

    /// Whether the record has a buffer `name`.
    pub(super) fn has(&self, name: &str) -> bool {
        self.spec.buffers.iter().any(|b| b.name == name)
    }

    /// The buffer argument `name` as (buffer, byte offset), if bound.
    fn bound(&self, name: &str) -> Option<(usize, usize)> {
        let i = self.spec.buffers.iter().position(|b| b.name == name)?;
        match self.args.get(i) {
            Some(Arg::Buf(id, offset)) => Some((id.0, *offset)),
            _ => None,
        }
    }

    /// The bytes of input `name` from its offset on (empty when it is not bound).
    pub(super) fn input(&self, name: &str) -> &[u8] {
        match self.bound(name) {
            Some((id, offset)) => &self.buffers[id][offset..],
            None => &[],
        }
    }

    /// The first `n` f32s of input `name`.
    pub(super) fn floats(&self, name: &str, n: usize) -> Vec<f32> {
        floats(self.input(name), n)
    }

    /// The first `n` i32s of input `name`.
    pub(super) fn ints(&self, name: &str, n: usize) -> Vec<i32> {
        ints(self.input(name), n)
    }

    /// The first `n` f16s of input `name`, widened.
    pub(super) fn halves(&self, name: &str, n: usize) -> Vec<f32> {
        halves(self.input(name), n)
    }

    /// A pass's sequences (`seqs`, each `tokens / seqs` columns) with each one's first
    /// position and cache slot (`pos`, `slots`): what `rope_store` and attention read.
    pub(super) fn sequences(&self, tokens: usize) -> Result<(usize, Vec<i32>, Vec<i32>), RunError> {
        let seqs = (self.scalar("seqs") as usize).max(1);
        let (pos, slots) = (self.ints("pos", seqs), self.ints("slots", seqs));
        if pos.len() < seqs || slots.len() < seqs || !tokens.is_multiple_of(seqs) {
            let name = &self.spec.name;
            return Err(RunError::Other(format!("{name}: {tokens} tokens in {seqs} sequences, positions and slots")));
        }
        Ok((seqs, pos, slots))
    }

    /// The page table of the KV pools (`pages`, `table_entries` of them: a cache slot's
    /// row of `n_blocks` entries names the pool page of each of its `block`-position
    /// blocks; the pools hold `summary_rows` pages, or `cache_rows` rows).
    pub(super) fn pages(&self, block: u32) -> Pages {
        let block = block.max(1) as usize;
        let pool = match self.spec.scalars.iter().any(|s| s.name == "summary_rows") {
            true => self.scalar("summary_rows") as usize,
            false => self.scalar("cache_rows") as usize / block,
        };
        Pages {
            table: self.ints("pages", self.scalar("table_entries") as usize),
            n_blocks: self.scalar("n_blocks") as usize,
            pool,
            block,
        }
    }

    /// The current bytes of output `name` from its offset on, for an op that updates
    /// only part of it; an error when it is not bound.
    pub(super) fn target(&self, name: &str) -> Result<&[u8], RunError> {
        let (id, offset) = self.bound(name).ok_or_else(|| self.missing(name))?;
        Ok(&self.buffers[id][offset..])
    }

    /// Output `name` from its offset on, to write in place now (not after the op, as
    /// [`OpIo::output`] does); an error when it is not bound.
    pub(super) fn target_mut(&mut self, name: &str) -> Result<&mut [u8], RunError> {
        let (id, offset) = self.bound(name).ok_or_else(|| self.missing(name))?;
        Ok(&mut self.buffers[id].bytes_mut()?[offset..])
    }

    fn missing(&self, name: &str) -> RunError {
        RunError::Other(format!("{}: no {name}", self.spec.op.kind()))
    }

    /// Stores `bytes` at the start of output `name` once the op has returned.
    pub(super) fn output(&mut self, name: &'static str, bytes: Vec<u8>) {
        self.outputs.push((name, bytes));
    }

    /// [`OpIo::output`] of f32s.
    pub(super) fn output_floats(&mut self, name: &'static str, values: &[f32]) {
        self.output(name, f32_bytes(values));
    }

    /// [`OpIo::output`] of i32s.
    pub(super) fn output_ints(&mut self, name: &'static str, values: &[i32]) {
        self.output(name, values.iter().flat_map(|v| v.to_le_bytes()).collect());
    }

    /// Stores the op's outputs, in the order it gave them.
    pub(super) fn finish(&mut self) -> Result<(), RunError> {
        for (name, bytes) in std::mem::take(&mut self.outputs) {
            let (id, offset) =
                self.bound(name).ok_or_else(|| RunError::Other(format!("{}: no {name}", self.spec.name)))?;
            self.buffers[id].bytes_mut()?[offset..offset + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }

    /// A product's `n` input values: an int8-dot kernel reads its input quantized, and
    /// the reference multiplies by the same dequantized activations (so only the
    /// summation order differs); a float kernel reads `x`.
    pub(super) fn activations(&self, n: usize) -> Vec<f32> {
        if self.has("xq") {
            let (xq, xd) = (self.input("xq"), self.floats("xd", n / 16));
            (0..n).map(|i| f32::from(xq[i] as i8) * xd[i / 32 * 2]).collect()
        } else {
            self.floats("x", n)
        }
    }
}

/// f32 dot product with eight partial sums of fused multiply-adds (the order is fixed).
/// Where the CPU has FMA it runs as vector FMAs: built for baseline x86-64, each
/// `mul_add` is a call to `fmaf` for one element, which made this most of the reference's
/// time. The results are the same bit for bit: a fused multiply-add rounds once either way.
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has the features `dot_fma` is compiled for.
        return unsafe { dot_fma(a, b) };
    }
    dot_lanes(a, b)
}

/// [`dot`] compiled for FMA and AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,avx2")]
fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, ra) = a.as_chunks::<8>();
    let (cb, rb) = b.as_chunks::<8>();
    for (x, y) in ca.iter().zip(cb) {
        for l in 0..8 {
            lanes[l] = x[l].mul_add(y[l], lanes[l]);
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

/// The first `n` little-endian f32s of `bytes`.
pub(super) fn floats(bytes: &[u8], n: usize) -> Vec<f32> {
    bytes.chunks_exact(4).take(n).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The first `n` little-endian i32s of `bytes`.
pub(super) fn ints(bytes: &[u8], n: usize) -> Vec<i32> {
    bytes.chunks_exact(4).take(n).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The first `n` little-endian f16s of `bytes`, widened.
pub(super) fn halves(bytes: &[u8], n: usize) -> Vec<f32> {
    bytes.chunks_exact(2).take(n).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
}

/// `v` as little-endian bytes.
pub(super) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
