//! The CPU backend: the reference every GPU kernel is tested against, and a way to run
//! the default model with no GPU.
//!
//! Each op is plain Rust with the meaning its plan record states (see `plan::Op`),
//! written for clarity: weights are dequantized with the bit-exact ggml-compatible
//! dequantizers, reductions accumulate in f64 where a kernel would accumulate in f32,
//! and the large products use all cores.

use std::time::Duration;

use half::f16;
use rayon::prelude::*;
use strata_compiler::ops::{self, ExpertInput, Op, RopeStyle, RouteLayout};
use strata_compiler::plan::{KernelSpec, MAX_WINDOW, Tuning, rules};

use super::{Arg, Backend, BufferId, DeviceInfo, GraphId, HostId, RunError, bind};

/// Reference backend over host memory.
#[derive(Default)]
pub struct Cpu {
    buffers: Vec<Vec<u8>>,
    host: Vec<Vec<u8>>,
    errors: Option<BufferId>,
    capturing: Option<Vec<Recorded>>,
    graphs: Vec<Vec<Recorded>>,
}

/// A recorded step of a capture.
#[derive(Clone)]
enum Recorded {
    Launch(Box<KernelSpec>, Vec<Arg>),
    Write(BufferId, usize, Vec<u8>),
}

impl Cpu {
    /// A CPU backend with no buffers.
    pub fn new() -> Cpu {
        Cpu::default()
    }

    fn run(&mut self, spec: &KernelSpec, args: &[Arg]) -> Result<(), RunError> {
        let nb = spec.buffers.len();
        let scalar = |name: &str| -> u32 {
            let i = spec.scalars.iter().position(|s| s.name == name);
            match i.and_then(|i| args.get(nb + i)) {
                Some(Arg::U32(v)) => *v,
                _ => 0,
            }
        };
        // Outputs are computed into fresh vectors from borrowed inputs, then stored.
        let input = |name: &str| -> &[u8] {
            let i = spec.buffers.iter().position(|b| b.name == name).unwrap_or(usize::MAX);
            match args.get(i) {
                Some(Arg::Buf(id, offset)) => &self.buffers[id.0][*offset..],
                _ => &[],
            }
        };
        let target = |name: &str| -> Option<(BufferId, usize)> {
            let i = spec.buffers.iter().position(|b| b.name == name)?;
            match args.get(i) {
                Some(Arg::Buf(id, offset)) => Some((*id, *offset)),
                _ => None,
            }
        };
        let mut outputs: Vec<(&str, Vec<u8>)> = Vec::new();
        match &spec.op {
            Op::Gemv(ops::Gemv { quant, rows, cols, window }) => {
                let (rows, cols, window) = (*rows as usize, *cols as usize, *window as usize);
                let x = activations(spec, &input, window * cols);
                let w = input("w");
                let row_bytes = quant.row_bytes(cols as u64).unwrap_or(0) as usize;
                let mut y = vec![0f32; window * rows];
                let results: Vec<Vec<f32>> = (0..rows)
                    .into_par_iter()
                    .map(|r| {
                        let mut wr = vec![0f32; cols];
                        // Rows were sized by `bind`; a dequantization error cannot occur.
                        let _ = quant.dequantize(&w[r * row_bytes..(r + 1) * row_bytes], &mut wr);
                        (0..window).map(|t| dot(&wr, &x[t * cols..(t + 1) * cols])).collect()
                    })
                    .collect();
                for (r, column) in results.iter().enumerate() {
                    for t in 0..window {
                        y[t * rows + r] = column[t];
                    }
                }
                outputs.push(("y", f32_bytes(&y)));
            }
            Op::QuantizeQ8(ops::QuantizeQ8 { cols }) => {
                let (cols, rows) = (*cols as usize, scalar("rows") as usize);
                let (xq, xd) = quantize_q8(&floats(input("x"), rows * cols));
                outputs.push(("xq", xq));
                outputs.push(("xd", f32_bytes(&xd)));
            }
            Op::RmsNorm(ops::RmsNorm { n, eps, qk }) => {
                let (n, rows) = (*n as usize, scalar("rows") as usize);
                let (x, w) = (floats(input("x"), rows * n), floats(input("w"), if qk.is_some() { 2 * n } else { n }));
                let y = match qk {
                    None => rmsnorm(&x, &w, n, *eps),
                    // Each row with its own weights: the query norm, then the key norm.
                    Some([q, k]) => x
                        .chunks_exact(n)
                        .enumerate()
                        .flat_map(|(r, row)| {
                            let (period, queries) = ((q + k) as usize, *q as usize);
                            let half = if r % period < queries { 0 } else { n };
                            rmsnorm(row, &w[half..half + n], n, *eps)
                        })
                        .collect(),
                };
                outputs.push(("y", f32_bytes(&y)));
            }
            Op::AddRmsNorm(ops::AddRmsNorm { n, eps, q8, experts }) => {
                let (n, rows, k) = (*n as usize, scalar("rows") as usize, *experts as usize);
                let a = floats(input("a"), rows * n);
                let b = if k > 0 {
                    moe_sum(&floats(input("parts"), rows * k * n), &floats(input("weights"), rows * k), n, k)
                } else {
                    floats(input("b"), rows * n)
                };
                let sum: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
                let y = rmsnorm(&sum, &floats(input("w"), n), n, *eps);
                if *q8 {
                    let (xq, xd) = quantize_q8(&y);
                    outputs.push(("xq", xq));
                    outputs.push(("xd", f32_bytes(&xd)));
                }
                outputs.push(("y", f32_bytes(&y)));
                outputs.push(("sum", f32_bytes(&sum)));
            }
            Op::RopeStore(ops::RopeStore { style, heads, kv_heads, head_dim, rope_dims, block }) => {
                let (heads, kv, hd, rd) =
                    (*heads as usize, *kv_heads as usize, *head_dim as usize, *rope_dims as usize);
                let (tokens, n_ctx) = (scalar("tokens") as usize, scalar("n_ctx") as usize);
                let (block, n_blocks) = (*block as usize, scalar("n_blocks") as usize);
                let pos0 = ints(input("pos"), 1)[0] as usize;
                let table = floats(input("cos_sin"), n_ctx * rd);
                let mut q = floats(input("q"), tokens * heads * hd);
                let mut k = floats(input("k"), tokens * kv * hd);
                let v = floats(input("v"), tokens * kv * hd);
                let rotate = |h: &mut [f32], p: usize| {
                    for i in 0..rd / 2 {
                        let (c, s) = (table[p * rd + 2 * i], table[p * rd + 2 * i + 1]);
                        let (a, b) = match style {
                            RopeStyle::Normal => (2 * i, 2 * i + 1),
                            RopeStyle::Neox => (i, i + rd / 2),
                        };
                        let (x0, x1) = (h[a], h[b]);
                        h[a] = x0 * c - x1 * s;
                        h[b] = x0 * s + x1 * c;
                    }
                };
                let width = kv * hd;
                let end = (pos0 + tokens).min(n_ctx);
                for t in 0..end.saturating_sub(pos0) {
                    let p = pos0 + t;
                    q[t * heads * hd..(t + 1) * heads * hd].chunks_exact_mut(hd).for_each(|h| rotate(h, p));
                    k[t * width..(t + 1) * width].chunks_exact_mut(hd).for_each(|h| rotate(h, p));
                    for (name, src) in [("k_cache", &k), ("v_cache", &v)] {
                        let (id, offset) =
                            target(name).ok_or_else(|| RunError::Other(format!("rope_store: no {name}")))?;
                        let row = &mut self.buffers[id.0][offset + 2 * p * width..offset + 2 * (p + 1) * width];
                        for (out, x) in row.chunks_exact_mut(2).zip(&src[t * width..(t + 1) * width]) {
                            out.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
                        }
                    }
                }
                // The key summary of every block the window wrote into, over its rows so far.
                let (kid, koff) = target("k_cache").ok_or_else(|| RunError::Other("rope_store: no k_cache".into()))?;
                let (sid, soff) =
                    target("k_summary").ok_or_else(|| RunError::Other("rope_store: no k_summary".into()))?;
                if end > pos0 {
                    for blk in pos0 / block..=(end - 1) / block {
                        let rows = blk * block..((blk + 1) * block).min(end);
                        let keys = halves(&self.buffers[kid.0][koff + 2 * rows.start * width..], rows.len() * width);
                        for h in 0..kv {
                            for d in 0..hd {
                                let column = keys.chunks_exact(width).map(|row| row[h * hd + d]);
                                let (lo, hi) = column
                                    .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
                                for (which, value) in [(0, lo), (1, hi)] {
                                    if blk < n_blocks {
                                        let at = soff + 2 * (((h * n_blocks + blk) * hd + d) * 2 + which);
                                        self.buffers[sid.0][at..at + 2]
                                            .copy_from_slice(&f16::from_f32(value).to_le_bytes());
                                    }
                                }
                            }
                        }
                    }
                }
                outputs.push(("q", f32_bytes(&q)));
            }
            Op::SiluMul(ops::SiluMul { n, q8, paired }) => {
                let (n, tokens) = (*n as usize, scalar("tokens") as usize);
                let len = n * tokens;
                let (g, u) = if *paired {
                    let rows = floats(input("gate_up"), 2 * len);
                    let half = |i: usize| -> Vec<f32> {
                        rows.chunks_exact(2 * n).flat_map(|r| r[i * n..(i + 1) * n].to_vec()).collect()
                    };
                    (half(0), half(1))
                } else {
                    (floats(input("gate"), len), floats(input("up"), len))
                };
                let y: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect();
                if *q8 {
                    let (xq, xd) = quantize_q8(&y);
                    outputs.push(("xq", xq));
                    outputs.push(("xd", f32_bytes(&xd)));
                }
                outputs.push(("y", f32_bytes(&y)));
            }
            Op::MoeRoute(ops::MoeRoute { experts, used }) => {
                let (e, k, tokens) = (*experts as usize, *used as usize, scalar("tokens") as usize);
                let layout = RouteLayout::new(*experts, *used);
                let mut route = ints(input("route"), layout.len() as usize);
                let mut weights = floats(input("weights"), MAX_WINDOW as usize * k);
                moe_route(&floats(input("logits"), tokens * e), e, layout, &mut route, &mut weights);
                outputs.push(("route", route.iter().flat_map(|v| v.to_le_bytes()).collect()));
                outputs.push(("weights", f32_bytes(&weights)));
            }
            Op::ExpertGemv(ops::ExpertGemv { quant, rows, cols, window, used, experts, input: which }) => {
                let (rows, cols, window, used) = (*rows as usize, *cols as usize, *window as usize, *used as usize);
                let layout = RouteLayout::new(*experts, used as u32);
                let route = ints(input("route"), layout.len() as usize);
                let slot_of = ints(input("slot_of"), *experts as usize);
                let in_rows = if *which == ExpertInput::Token { window } else { window * used };
                let x = activations(spec, &input, in_rows * cols);
                let row_bytes = quant.row_bytes(cols as u64).unwrap_or(0) as usize;
                let (w, slots) = (input("w"), scalar("slots") as usize);
                let mut y = floats(input("y"), window * used * rows);
                for u in 0..(route[0].max(0) as usize).min(layout.union(window as u32) as usize) {
                    let expert = route[1 + u];
                    let Some(&slot) = usize::try_from(expert).ok().and_then(|e| slot_of.get(e)) else { continue };
                    let Ok(slot) = usize::try_from(slot) else { continue };
                    if slot >= slots {
                        continue;
                    }
                    let matrix = &w[slot * rows * row_bytes..(slot + 1) * rows * row_bytes];
                    let columns: Vec<(usize, usize)> = (0..window)
                        .filter_map(|t| {
                            let j = usize::try_from(route[layout.pick(u as u32, t as u32) as usize]).ok()?;
                            let input = if *which == ExpertInput::Token { t } else { t * used + j };
                            Some((t * used + j, input))
                        })
                        .collect();
                    let results: Vec<Vec<f32>> = (0..rows)
                        .into_par_iter()
                        .map(|r| {
                            let mut wr = vec![0f32; cols];
                            let _ = quant.dequantize(&matrix[r * row_bytes..(r + 1) * row_bytes], &mut wr);
                            columns.iter().map(|&(_, i)| dot(&wr, &x[i * cols..(i + 1) * cols])).collect()
                        })
                        .collect();
                    for (r, values) in results.iter().enumerate() {
                        for (&(out, _), v) in columns.iter().zip(values) {
                            y[out * rows + r] = *v;
                        }
                    }
                }
                outputs.push(("y", f32_bytes(&y)));
            }
            Op::MoeSum(ops::MoeSum { n, used }) => {
                let (n, k, tokens) = (*n as usize, *used as usize, scalar("tokens") as usize);
                let (parts, weights) = (floats(input("parts"), tokens * k * n), floats(input("weights"), tokens * k));
                outputs.push(("y", f32_bytes(&moe_sum(&parts, &weights, n, k))));
            }
            Op::Add(ops::Add { n, broadcast }) => {
                let (n, tokens) = (*n as usize, scalar("tokens") as usize);
                let a = floats(input("a"), n * tokens);
                let b = floats(input("b"), if *broadcast { n } else { n * tokens });
                let y: Vec<f32> = (0..n * tokens).map(|i| a[i] + b[if *broadcast { i % n } else { i }]).collect();
                outputs.push(("y", f32_bytes(&y)));
            }
            Op::Embed(ops::Embed { quant, cols, vocab }) => {
                let (cols, tokens) = (*cols as usize, scalar("tokens") as usize);
                let row_bytes = quant.row_bytes(cols as u64).unwrap_or(0) as usize;
                let ids = ints(input("ids"), tokens);
                let table = input("table");
                let (yid, yoff) = target("y").ok_or_else(|| RunError::Other("embed: no y".into()))?;
                let mut y = floats(&self.buffers[yid.0][yoff..], tokens * cols);
                for (t, &id) in ids.iter().enumerate() {
                    let id = id as u32;
                    if id < *vocab {
                        let row = &table[id as usize * row_bytes..(id as usize + 1) * row_bytes];
                        let _ = quant.dequantize(row, &mut y[t * cols..(t + 1) * cols]);
                    }
                }
                outputs.push(("y", f32_bytes(&y)));
            }
            Op::Attention(ops::Attention { heads, kv_heads, head_dim, scale, block, sparse }) => {
                let Tuning::Attention(tuning) = &spec.tuning else {
                    return Err(RunError::Other(format!("{}: no split rule", spec.name)));
                };
                let (heads, kv_heads, hd, block) =
                    (*heads as usize, *kv_heads as usize, *head_dim as usize, *block as usize);
                let (n_ctx, tokens, n_blocks) =
                    (scalar("n_ctx") as usize, scalar("tokens") as usize, scalar("n_blocks") as usize);
                let pos = ints(input("pos"), 1)[0] as usize;
                let (width, group, splits, state) = (kv_heads * hd, heads / kv_heads, tuning.splits as usize, hd + 2);
                let q = floats(input("q"), tokens * heads * hd);
                let most = (pos + tokens).min(n_ctx);
                let (kc, vc) = (halves(input("k_cache"), most * width), halves(input("v_cache"), most * width));
                let (list, count) = if *sparse {
                    (
                        ints(input("list"), MAX_WINDOW as usize * kv_heads * n_blocks),
                        ints(input("count"), MAX_WINDOW as usize * kv_heads),
                    )
                } else {
                    (Vec::new(), Vec::new())
                };
                let (pid, poff) = target("partial").ok_or_else(|| RunError::Other("attention: no partial".into()))?;
                let mut partial = floats(&self.buffers[pid.0][poff..], tokens * heads * splits * state);
                let mut used = vec![0i32; tokens * heads];
                // One (token, head) a task: its shares exactly as the kernel splits them.
                partial.par_chunks_mut(splits * state).zip(used.par_iter_mut()).enumerate().for_each(
                    |(i, (out, used))| {
                        let (t, h) = (i / heads, i % heads);
                        let kvh = h / group;
                        let n_kv = pos + t + 1;
                        if n_kv > n_ctx {
                            return;
                        }
                        let blocks: Vec<usize> = if *sparse {
                            let row = (t * kv_heads + kvh) * n_blocks;
                            list[row..row + count[t * kv_heads + kvh].max(0) as usize]
                                .iter()
                                .map(|&b| b as usize)
                                .collect()
                        } else {
                            (0..(n_kv - 1) / block + 1).collect()
                        };
                        let (per, shares) = tuning.shares(blocks.len() as u32);
                        *used = shares as i32;
                        let q = &q[i * hd..][..hd];
                        for (s, share) in blocks.chunks(per as usize).enumerate().take(shares as usize) {
                            let positions: Vec<usize> =
                                share.iter().flat_map(|&b| b * block..(b + 1) * block).filter(|&p| p < n_kv).collect();
                            let scores: Vec<f64> = positions
                                .iter()
                                .map(|&p| {
                                    let k = &kc[p * width + kvh * hd..][..hd];
                                    (0..hd).map(|d| f64::from(q[d] * scale) * f64::from(k[d])).sum()
                                })
                                .collect();
                            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                            let st = &mut out[s * state..(s + 1) * state];
                            st[0] = max as f32;
                            st[1] = weights.iter().sum::<f64>() as f32;
                            for d in 0..hd {
                                let v: f64 = positions
                                    .iter()
                                    .zip(&weights)
                                    .map(|(&p, w)| w * f64::from(vc[p * width + kvh * hd + d]))
                                    .sum();
                                st[2 + d] = v as f32;
                            }
                        }
                    },
                );
                outputs.push(("partial", f32_bytes(&partial)));
                outputs.push(("splits", used.iter().flat_map(|v| v.to_le_bytes()).collect()));
            }
            Op::AttentionMerge(ops::AttentionMerge { heads, head_dim, q8 }) => {
                let Tuning::Attention(tuning) = &spec.tuning else {
                    return Err(RunError::Other(format!("{}: no split rule", spec.name)));
                };
                let (heads, hd, tokens) = (*heads as usize, *head_dim as usize, scalar("tokens") as usize);
                let (splits, state) = (tuning.splits as usize, hd + 2);
                let partial = floats(input("partial"), tokens * heads * splits * state);
                let used = ints(input("splits"), tokens * heads);
                let mut out = vec![0f32; tokens * heads * hd];
                for (i, out) in out.chunks_exact_mut(hd).enumerate() {
                    let n = (used[i].max(0) as usize).min(splits);
                    let states: Vec<&[f32]> = partial[i * splits * state..].chunks_exact(state).take(n).collect();
                    let big = states.iter().map(|st| f64::from(st[0])).fold(f64::NEG_INFINITY, f64::max);
                    let factor: Vec<f64> = states.iter().map(|st| (f64::from(st[0]) - big).exp()).collect();
                    let den: f64 = states.iter().zip(&factor).map(|(st, f)| f64::from(st[1]) * f).sum();
                    for (d, o) in out.iter_mut().enumerate() {
                        let num: f64 = states.iter().zip(&factor).map(|(st, f)| f64::from(st[2 + d]) * f).sum();
                        *o = if den > 0.0 { (num / den) as f32 } else { 0.0 };
                    }
                }
                if *q8 {
                    let (xq, xd) = quantize_q8(&out);
                    outputs.push(("xq", xq));
                    outputs.push(("xd", f32_bytes(&xd)));
                }
                outputs.push(("out", f32_bytes(&out)));
            }
            Op::QsaScore(ops::QsaScore { heads, kv_heads, head_dim, block }) => {
                let (heads, kv_heads, hd, block) =
                    (*heads as usize, *kv_heads as usize, *head_dim as usize, *block as usize);
                let (tokens, n_blocks) = (scalar("tokens") as usize, scalar("n_blocks") as usize);
                let pos = ints(input("pos"), 1)[0] as usize;
                let group = heads / kv_heads;
                let q = floats(input("q"), tokens * heads * hd);
                let summary = halves(input("k_summary"), n_blocks * kv_heads * 2 * hd);
                let (sid, soff) = target("scores").ok_or_else(|| RunError::Other("qsa_score: no scores".into()))?;
                let mut scores = floats(&self.buffers[sid.0][soff..], MAX_WINDOW as usize * kv_heads * n_blocks);
                for t in 0..tokens {
                    let newest = (pos + t) / block;
                    for kvh in 0..kv_heads {
                        for b in 0..n_blocks {
                            let column = |which: usize| -> Vec<f32> {
                                (0..hd).map(|d| summary[((kvh * n_blocks + b) * hd + d) * 2 + which]).collect()
                            };
                            scores[(t * kv_heads + kvh) * n_blocks + b] = if b == 0 || b == newest {
                                f32::INFINITY
                            } else if b > newest {
                                f32::NEG_INFINITY
                            } else {
                                let (lo, hi) = (column(0), column(1));
                                (0..group)
                                    .map(|g| qsa_bound(&q[(t * heads + kvh * group + g) * hd..][..hd], &lo, &hi))
                                    .fold(f32::NEG_INFINITY, f32::max)
                            };
                        }
                    }
                }
                outputs.push(("scores", f32_bytes(&scores)));
            }
            Op::QsaSelect(ops::QsaSelect { kv_heads, block }) => {
                let (kv_heads, block) = (*kv_heads as usize, *block as usize);
                let (tokens, n_blocks, budget) =
                    (scalar("tokens") as usize, scalar("n_blocks") as usize, scalar("budget") as usize);
                let pos = ints(input("pos"), 1)[0] as usize;
                let scores = floats(input("scores"), MAX_WINDOW as usize * kv_heads * n_blocks);
                let (lid, loff) = target("list").ok_or_else(|| RunError::Other("qsa_select: no list".into()))?;
                let (cid, coff) = target("count").ok_or_else(|| RunError::Other("qsa_select: no count".into()))?;
                let mut list = ints(&self.buffers[lid.0][loff..], MAX_WINDOW as usize * kv_heads * n_blocks);
                let mut count = ints(&self.buffers[cid.0][coff..], MAX_WINDOW as usize * kv_heads);
                for t in 0..tokens {
                    let n = ((pos + t) / block + 1).min(n_blocks);
                    for kvh in 0..kv_heads {
                        let row = (t * kv_heads + kvh) * n_blocks;
                        let chosen = qsa_select(&scores[row..row + n], budget);
                        for (i, b) in chosen.iter().enumerate() {
                            list[row + i] = *b as i32;
                        }
                        count[t * kv_heads + kvh] = chosen.len() as i32;
                    }
                }
                outputs.push(("list", list.iter().flat_map(|v| v.to_le_bytes()).collect()));
                outputs.push(("count", count.iter().flat_map(|v| v.to_le_bytes()).collect()));
            }
            Op::Softmax(ops::Softmax { n }) => {
                let (n, rows) = (*n as usize, scalar("rows") as usize);
                let mut x = floats(input("x"), rows * n);
                for row in x.chunks_exact_mut(n) {
                    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let total: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
                    for v in row.iter_mut() {
                        *v = (f64::from(*v - max).exp() / total) as f32;
                    }
                }
                outputs.push(("x", f32_bytes(&x)));
            }
            Op::Argmax(ops::Argmax { n }) => {
                let (n, rows) = (*n as usize, scalar("rows") as usize);
                let x = floats(input("x"), rows * n);
                let out: Vec<i32> = x.chunks_exact(n).map(|row| argmax(row) as i32).collect();
                outputs.push(("out", out.iter().flat_map(|v| v.to_le_bytes()).collect()));
            }
        }
        for (name, bytes) in outputs {
            let (id, offset) = target(name).ok_or_else(|| RunError::Other(format!("{}: no {name}", spec.name)))?;
            self.buffers[id.0][offset..offset + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }
}

/// `x · w / sqrt(mean(x²) + eps)` for each row of `n` (the mean in f64).
/// Int8 quants of `x` per 32-element chunk, and per chunk (scale, sum of quants), exactly
/// as the `quantize_q8` kernel makes them: scale = max |x| / 127, quant = round(x · (1 /
/// scale)) half away from zero, all zero where the scale is.
pub fn quantize_q8(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut xq = Vec::with_capacity(x.len());
    let mut xd = Vec::with_capacity(x.len() / 16);
    for chunk in x.chunks(32) {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for v in chunk {
            let q = (v * id).round() as i32;
            sum += q;
            xq.push(q as i8 as u8);
        }
        xd.extend([d, sum as f32]);
    }
    (xq, xd)
}

fn rmsnorm(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (row, out) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let mean = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n as f64;
        let scale = (1.0 / (mean + f64::from(eps)).sqrt()) as f32;
        for i in 0..n {
            out[i] = row[i] * scale * w[i];
        }
    }
    y
}

/// QSA's bound on `q · k` for every key `k` of a block whose element-wise minimum and
/// maximum are `lo` and `hi`: `Σ_i max(q_i·lo_i, q_i·hi_i)`, summed in f32 as the
/// `qsa_score` kernel sums it: [`rules::qsa_score_lanes`] consecutive runs of the
/// dimensions each in order, then a butterfly over the runs (xor lanes/2 down to 1).
pub fn qsa_bound(q: &[f32], lo: &[f32], hi: &[f32]) -> f32 {
    let lanes = rules::qsa_score_lanes(q.len() as u32) as usize;
    let mut sums: Vec<f32> = (0..lanes)
        .map(|c| {
            let run = c * q.len() / lanes..(c + 1) * q.len() / lanes;
            q[run.clone()]
                .iter()
                .zip(&lo[run.clone()])
                .zip(&hi[run])
                .fold(0f32, |s, ((&x, &lo), &hi)| s + (x * lo).max(x * hi))
        })
        .collect();
    let mut m = lanes / 2;
    while m > 0 {
        sums = (0..lanes).map(|c| sums[c] + sums[c ^ m]).collect();
        m /= 2;
    }
    sums[0]
}

/// QSA's selection from one (token, KV head)'s block scores: every block where there
/// are no more than `budget`, else the `budget` of the largest score (ties: the lower
/// block), in ascending order. Scores compare as the kernel's keys do (-0 as +0).
pub fn qsa_select(scores: &[f32], budget: usize) -> Vec<usize> {
    if scores.len() <= budget {
        return (0..scores.len()).collect();
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| (scores[b] + 0.0).total_cmp(&(scores[a] + 0.0)).then(a.cmp(&b)));
    order.truncate(budget);
    order.sort_unstable();
    order
}

/// Index of the largest value (the first on ties).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Rows of `n`: `Σ_j weights[t][j] · parts[t·k + j]`, in ascending `j` (fused multiply-adds
/// from zero, as the kernels sum).
fn moe_sum(parts: &[f32], weights: &[f32], n: usize, k: usize) -> Vec<f32> {
    (0..weights.len() / k.max(1) * n)
        .map(|i| {
            let (t, c) = (i / n, i % n);
            (0..k).fold(0f32, |acc, j| weights[t * k + j].mul_add(parts[(t * k + j) * n + c], acc))
        })
        .collect()
}

/// A product's `n` input values: an int8-dot kernel reads its input quantized, and the
/// reference multiplies by the same dequantized activations (so only the summation order
/// differs); a float kernel reads `x`.
fn activations<'a>(spec: &KernelSpec, input: &impl Fn(&str) -> &'a [u8], n: usize) -> Vec<f32> {
    if spec.buffers.iter().any(|b| b.name == "xq") {
        let (xq, xd) = (input("xq"), floats(input("xd"), n / 16));
        (0..n).map(|i| f32::from(xq[i] as i8) * xd[i / 32 * 2]).collect()
    } else {
        floats(input("x"), n)
    }
}

/// Routes each row of `logits` (one token's `experts` router logits, at most
/// [`MAX_WINDOW`] tokens) as `moe_route` does: each token's choices and weights, and the
/// window's union with its picks, into `route` and `weights` where [`RouteLayout`] puts
/// them (union entries past its size are left as they are).
pub fn moe_route(logits: &[f32], experts: usize, layout: RouteLayout, route: &mut [i32], weights: &mut [f32]) {
    let k = layout.used as usize;
    let choices: Vec<Vec<usize>> =
        logits.chunks_exact(experts).take(MAX_WINDOW as usize).map(|row| top_experts(row, k)).collect();
    for (t, chosen) in choices.iter().enumerate() {
        weights[t * k..(t + 1) * k].copy_from_slice(&route_weights(&logits[t * experts..(t + 1) * experts], chosen));
    }
    let mut union: Vec<usize> = choices.iter().flatten().copied().collect();
    union.sort_unstable();
    union.dedup();
    route[0] = union.len() as i32;
    for (u, &expert) in union.iter().enumerate() {
        route[1 + u] = expert as i32;
        for t in 0..MAX_WINDOW {
            let j = choices.get(t as usize).and_then(|c| c.iter().position(|&x| x == expert));
            route[layout.pick(u as u32, t) as usize] = j.map_or(-1, |j| j as i32);
        }
    }
}

/// The `k` experts of the largest router logits, largest first (ties: the lower expert;
/// an expert whose logit compares false with everything is taken only when nothing else
/// is left), as `moe_route` chooses them.
pub fn top_experts(logits: &[f32], k: usize) -> Vec<usize> {
    let mut taken = vec![false; logits.len()];
    let mut chosen = Vec::with_capacity(k);
    for _ in 0..k.min(logits.len()) {
        let mut best: Option<usize> = None;
        for (e, &x) in logits.iter().enumerate() {
            if !taken[e] && best.is_none_or(|b| x > logits[b]) {
                best = Some(e);
            }
        }
        if let Some(b) = best {
            taken[b] = true;
            chosen.push(b);
        }
    }
    chosen
}

/// The routing weights of `chosen` (largest logit first): the softmax over their logits,
/// summed in choice order.
pub fn route_weights(logits: &[f32], chosen: &[usize]) -> Vec<f32> {
    let top = chosen.first().map_or(0.0, |&e| logits[e]);
    let sum: f32 = chosen.iter().map(|&e| (logits[e] - top).exp()).sum();
    chosen.iter().map(|&e| (logits[e] - top).exp() / sum).collect()
}

/// f32 dot product with eight partial sums (vectorizes; the order is fixed).
fn dot(a: &[f32], b: &[f32]) -> f32 {
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

fn floats(bytes: &[u8], n: usize) -> Vec<f32> {
    bytes.chunks_exact(4).take(n).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn ints(bytes: &[u8], n: usize) -> Vec<i32> {
    bytes.chunks_exact(4).take(n).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn halves(bytes: &[u8], n: usize) -> Vec<f32> {
    bytes.chunks_exact(2).take(n).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Backend for Cpu {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            backend: "cpu",
            name: format!("host CPU ({} threads)", rayon::current_num_threads()),
            arch: "cpu".into(),
            driver: String::new(),
            memory: 0,
            dialect: None,
        }
    }

    fn load(&mut self, _module: &[u8], _kernels: &[KernelSpec]) -> Result<(), RunError> {
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufferId, RunError> {
        self.buffers.push(vec![0; bytes]);
        Ok(BufferId(self.buffers.len() - 1))
    }

    fn size(&self, buf: BufferId) -> usize {
        self.buffers[buf.0].len()
    }

    fn write(&mut self, buf: BufferId, offset: usize, data: &[u8]) -> Result<(), RunError> {
        if offset + data.len() > self.size(buf) {
            return Err(RunError::Other(format!(
                "write of {} bytes at {offset} past a {}-byte buffer",
                data.len(),
                self.size(buf)
            )));
        }
        match &mut self.capturing {
            Some(steps) => steps.push(Recorded::Write(buf, offset, data.to_vec())),
            None => self.buffers[buf.0][offset..offset + data.len()].copy_from_slice(data),
        }
        Ok(())
    }

    fn read(&mut self, buf: BufferId, offset: usize, out: &mut [u8]) -> Result<(), RunError> {
        let src = self.buffers[buf.0].get(offset..offset + out.len()).ok_or_else(|| {
            RunError::Other(format!("read of {} bytes at {offset} past a {}-byte buffer", out.len(), self.size(buf)))
        })?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn launch(&mut self, spec: &KernelSpec, args: &[Arg]) -> Result<(), RunError> {
        let named: Vec<(&str, Arg)> = spec
            .buffers
            .iter()
            .map(|b| b.name.as_str())
            .chain(spec.scalars.iter().map(|s| s.name.as_str()))
            .zip(args.iter().copied())
            .collect();
        bind(spec, &named, |id| self.size(id))?;
        match &mut self.capturing {
            Some(steps) => steps.push(Recorded::Launch(Box::new(spec.clone()), args.to_vec())),
            None => self.run(spec, args)?,
        }
        Ok(())
    }

    fn copy(&mut self, from: BufferId, to: BufferId, bytes: usize) -> Result<(), RunError> {
        if bytes > self.buffers[from.0].len() || bytes > self.buffers[to.0].len() {
            return Err(RunError::Other("copy past the end of a buffer".into()));
        }
        let data = self.buffers[from.0][..bytes].to_vec();
        self.buffers[to.0][..bytes].copy_from_slice(&data);
        Ok(())
    }

    fn sync_within(&mut self, _deadline: Duration) -> Result<bool, RunError> {
        Ok(true)
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<HostId, RunError> {
        self.host.push(vec![0; bytes]);
        Ok(HostId(self.host.len() - 1))
    }

    fn host_mut(&mut self, host: HostId) -> &mut [u8] {
        &mut self.host[host.0]
    }

    fn upload(
        &mut self,
        from: HostId,
        from_offset: usize,
        to: BufferId,
        offset: usize,
        bytes: usize,
    ) -> Result<(), RunError> {
        let src = self.host[from.0].get(from_offset..from_offset + bytes);
        let dst = self.buffers[to.0].get_mut(offset..offset + bytes);
        match (src, dst) {
            (Some(src), Some(dst)) => {
                dst.copy_from_slice(src);
                Ok(())
            }
            _ => Err(RunError::Other(format!("upload of {bytes} bytes past the end of a buffer"))),
        }
    }

    fn error_slot(&mut self) -> &mut Option<BufferId> {
        &mut self.errors
    }

    fn begin_capture(&mut self) -> Result<(), RunError> {
        self.capturing = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&mut self) -> Result<GraphId, RunError> {
        let steps = self.capturing.take().ok_or_else(|| RunError::Other("no capture in progress".into()))?;
        self.graphs.push(steps);
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn replay(&mut self, graph: GraphId) -> Result<(), RunError> {
        let steps = self.graphs.get(graph.0).cloned().ok_or_else(|| RunError::Other("no such graph".into()))?;
        for step in steps {
            match step {
                Recorded::Launch(spec, args) => self.run(&spec, &args)?,
                Recorded::Write(buf, offset, data) => {
                    self.buffers[buf.0][offset..offset + data.len()].copy_from_slice(&data)
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use strata_compiler::plan::{Int8Dot, Options, Tuning, rules};
    use strata_compiler::quant::{GgmlType, random_blocks, random_floats};
    use strata_compiler::target::Target;

    use super::*;

    #[test]
    fn q8_quants_round_half_away_from_zero_with_the_chunk_scale() {
        let mut x = vec![0f32; 64];
        x[0] = 1.27; // the chunk's scale is 0.01
        x[1] = -0.005; // -0.5 quants: away from zero
        x[2] = 0.635;
        let (q, d) = quantize_q8(&x);
        assert_eq!(&q[..3], &[127u8, (-1i8) as u8, 64]);
        assert!((d[0] - 0.01).abs() < 1e-9);
        assert_eq!(d[1], 190.0, "the sum of the chunk's quants");
        assert_eq!(&d[2..], &[0.0, 0.0], "an all-zero chunk has scale 0 and quants 0");
    }

    /// The int8 GEMV's reference is the float GEMV of the dequantized activations.
    #[test]
    fn int8_gemv_reference_is_the_float_product_of_dequantized_activations() {
        let target = Target::load("sm_90").expect("known");
        let (rows, cols, window) = (8u32, 512u32, 3u32);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for quant in [GgmlType::Q4_0, GgmlType::IQ2_XS] {
            let op = Op::Gemv(ops::Gemv { quant, rows, cols, window });
            let (q8, float) = (
                rules::kernel_with(op.clone(), &target, &Options { int8: Int8Dot::Always, ..Options::default() }),
                rules::kernel_with(op, &target, &Options { int8: Int8Dot::Never, ..Options::default() }),
            );
            assert!(matches!(q8.tuning, Tuning::GemvQ8(_)) && matches!(float.tuning, Tuning::Gemv(_)));
            let mut w = vec![0u8; quant.row_bytes(u64::from(cols)).expect("whole") as usize * rows as usize];
            random_blocks(quant, &mut rng, &mut w, 0.05).expect("valid");
            let x = random_floats(&mut rng, (window * cols) as usize, 1.0);
            let (xq, xd) = quantize_q8(&x);
            let dequantized: Vec<f32> = (0..x.len()).map(|i| f32::from(xq[i] as i8) * xd[i / 32 * 2]).collect();
            let mut cpu = Cpu::new();
            let mut buffer = |bytes: &[u8]| {
                let b = cpu.alloc(bytes.len()).expect("host memory");
                cpu.write(b, 0, bytes).expect("in bounds");
                Arg::Buf(b, 0)
            };
            let (wb, xqb, xdb, xb) =
                (buffer(&w), buffer(&xq), buffer(&f32_bytes(&xd)), buffer(&f32_bytes(&dequantized)));
            let (y1, y2) =
                (buffer(&vec![0; (window * rows) as usize * 4]), buffer(&vec![0; (window * rows) as usize * 4]));
            cpu.call(&q8, &[("w", wb), ("xq", xqb), ("xd", xdb), ("y", y1)]).expect("runs");
            cpu.call(&float, &[("w", wb), ("x", xb), ("y", y2)]).expect("runs");
            let read = |cpu: &mut Cpu, a: Arg| {
                let Arg::Buf(b, _) = a else { unreachable!() };
                let mut out = vec![0u8; (window * rows) as usize * 4];
                cpu.read(b, 0, &mut out).expect("in bounds");
                floats(&out, (window * rows) as usize)
            };
            assert_eq!(read(&mut cpu, y1), read(&mut cpu, y2), "{quant}");
        }
    }

    proptest! {
        /// QSA's block bound is at least every `q · k` of the block (up to the f32
        /// rounding of its own sum), whatever the keys and query.
        #[test]
        fn the_block_bound_bounds_every_score(
            keys in proptest::collection::vec(proptest::collection::vec(-8.0f32..8.0, 64), 1..17),
            q in proptest::collection::vec(-4.0f32..4.0, 64),
        ) {
            let keys: Vec<Vec<f32>> = keys.iter().map(|k| k.iter().map(|&x| f16::from_f32(x).to_f32()).collect()).collect();
            let lo: Vec<f32> = (0..64).map(|d| keys.iter().map(|k| k[d]).fold(f32::INFINITY, f32::min)).collect();
            let hi: Vec<f32> = (0..64).map(|d| keys.iter().map(|k| k[d]).fold(f32::NEG_INFINITY, f32::max)).collect();
            let bound = f64::from(qsa_bound(&q, &lo, &hi));
            let slack: f64 = q.iter().zip(&lo).zip(&hi).map(|((&x, &l), &h)| f64::from(x.abs() * l.abs().max(h.abs()))).sum::<f64>() * 1e-6;
            for k in &keys {
                let dot: f64 = q.iter().zip(k).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
                prop_assert!(dot <= bound + slack, "q·k = {dot} above the bound {bound}");
            }
        }
    }

    #[test]
    fn selection_keeps_the_highest_scores_in_block_order() {
        let scores = [f32::INFINITY, 0.5, 2.0, -0.0, 0.0, 2.0, 1.0, f32::INFINITY];
        assert_eq!(qsa_select(&scores, 8), (0..8).collect::<Vec<_>>());
        assert_eq!(qsa_select(&scores, 4), vec![0, 2, 5, 7]);
        // Ties go to the lower block; -0 and +0 tie.
        assert_eq!(qsa_select(&scores, 3), vec![0, 2, 7]);
        assert_eq!(qsa_select(&scores, 7), vec![0, 1, 2, 3, 5, 6, 7]);
    }
}
