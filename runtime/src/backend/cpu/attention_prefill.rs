//! The `attention_prefill` reference: each (token, head)'s causal softmax attention over
//! the cache (or a local layer's sliding window of it), exactly (scores, weights and
//! sums in f64).

use rayon::prelude::*;

use super::RunError;
use super::io::OpIo;
use strata_compiler::ops;

/// `out[t][h]` for the `tokens` tokens of `seqs` sequences of `tokens / seqs` columns each,
/// sequence `s`'s from position `pos[s]` in the pages of cache slot `slots[s]` (a token past
/// `n_ctx` leaves its rows as they were, as does every token where a page of some
/// sequence is not in the pools).
pub(super) fn run(op: &ops::AttentionPrefill, io: &mut OpIo) -> Result<(), RunError> {
    let ops::AttentionPrefill { heads, kv_heads, head_dim, scale, window, page } = *op;
    let (heads, kv_heads, hd) = (heads as usize, kv_heads as usize, head_dim as usize);
    let (n_ctx, tokens) = (io.scalar("n_ctx") as usize, io.scalar("tokens") as usize);
    let seqs = (io.scalar("seqs") as usize).max(1);
    let per = tokens / seqs;
    let pos: Vec<usize> = io.ints("pos", seqs).iter().map(|&p| p.max(0) as usize).collect();
    let slots: Vec<usize> = io.ints("slots", seqs).iter().map(|&s| s.max(0) as usize).collect();
    let (width, group) = (kv_heads * hd, heads / kv_heads.max(1));
    let q = io.floats("q", tokens * heads * hd);
    let pages = io.pages(page);
    let mut out = io.floats("out", tokens * heads * hd);
    // Each sequence's keys and values, its positions up to its last token's.
    let caches: Option<Vec<(Vec<f32>, Vec<f32>)>> = (0..seqs)
        .map(|s| {
            let most = (pos.get(s)? + per).min(n_ctx);
            let slot = *slots.get(s)?;
            Some((
                pages.gather(io.input("k_cache"), slot, most, width)?,
                pages.gather(io.input("v_cache"), slot, most, width)?,
            ))
        })
        .collect();
    let Some(caches) = caches else {
        io.output_floats("out", &out);
        return Ok(());
    };
    out.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
        let (t, h) = (i / heads, i % heads);
        let seq = t / per.max(1);
        let Some((kc, vc)) = caches.get(seq) else { return };
        let (kvh, n_kv) = (h / group, pos[seq] + t % per.max(1) + 1);
        if n_kv > n_ctx {
            return;
        }
        let q = &q[i * hd..][..hd];
        let first = if window > 0 { n_kv.saturating_sub(window as usize) } else { 0 };
        let scores: Vec<f64> = (first..n_kv)
            .map(|p| {
                let k = &kc[p * width + kvh * hd..][..hd];
                (0..hd).map(|d| f64::from(q[d]) * f64::from(k[d])).sum::<f64>() * f64::from(scale)
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = weights.iter().sum();
        for (d, o) in out.iter_mut().enumerate() {
            let v: f64 = weights.iter().zip(first..).map(|(w, p)| w * f64::from(vc[p * width + kvh * hd + d])).sum();
            *o = (v / sum) as f32;
        }
    });
    io.output_floats("out", &out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;
    use strata_compiler::ops::{self, Op};
    use strata_compiler::plan::rules;
    use strata_compiler::target::Target;

    use super::super::io::{f32_bytes, floats};
    use super::super::{Arg, Backend, Cpu};

    const HEADS: usize = 4;
    const KV_HEADS: usize = 2;
    const DIM: usize = 16;
    const WIDTH: usize = KV_HEADS * DIM;

    /// Runs the reference on `q` (tokens × heads × dim) over the caches (n_ctx rows of
    /// WIDTH, at most a page) from position `pos`, the sequence's one page the second of
    /// a pool of two; `out` starts as all 7.0.
    fn attend(q: &[f32], k: &[f32], v: &[f32], pos: i32, n_ctx: u32, window: u32) -> Vec<f32> {
        let target = Target::load("sm_90").expect("known");
        let (heads, kv_heads, head_dim) = (HEADS as u32, KV_HEADS as u32, DIM as u32);
        let op = ops::AttentionPrefill { heads, kv_heads, head_dim, scale: 0.25, window, page: 16 };
        let spec = rules::kernel(Op::AttentionPrefill(op), &target);
        let tokens = q.len() / (HEADS * DIM);
        // Page 1 of the pool: 16 rows of zeros first.
        let halves = |x: &[f32]| {
            let mut rows = vec![0u8; 16 * WIDTH * 2];
            rows.extend(x.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()));
            rows.resize(32 * WIDTH * 2, 0);
            rows
        };
        let mut cpu = Cpu::new();
        let mut buffer = |bytes: &[u8]| {
            let b = cpu.alloc(bytes.len()).expect("host memory");
            cpu.write(b, 0, bytes).expect("in bounds");
            b
        };
        let out_len = tokens * HEADS * DIM;
        let bufs = [
            buffer(&f32_bytes(q)),
            buffer(&halves(k)),
            buffer(&halves(v)),
            buffer(&f32_bytes(&vec![7.0; out_len])),
            buffer(&pos.to_le_bytes()),
            buffer(&0i32.to_le_bytes()),
            buffer(&1i32.to_le_bytes()),
        ];
        let names = ["q", "k_cache", "v_cache", "out", "pos", "slots", "pages"];
        let mut args: Vec<(&str, Arg)> = names.iter().zip(bufs).map(|(n, b)| (*n, Arg::Buf(b, 0))).collect();
        let scalars = [
            ("tokens", tokens as u32),
            ("seqs", 1),
            ("n_ctx", n_ctx),
            ("n_blocks", 1),
            ("cache_rows", 32),
            ("table_entries", 1),
        ];
        args.extend(scalars.map(|(n, v)| (n, Arg::U32(v))));
        cpu.call(&spec, &args).expect("runs");
        let mut out = vec![0u8; out_len * 4];
        cpu.read(bufs[3], 0, &mut out).expect("in bounds");
        floats(&out, out_len)
    }

    /// Small exact f16 values, different for every (row, column).
    fn rows(n: usize, salt: usize) -> Vec<f32> {
        (0..n * WIDTH).map(|i| ((i * 7 + salt) % 17) as f32 / 8.0 - 1.0).collect()
    }

    /// The first token of a prompt sees only its own position: its output is that
    /// position's value row of its KV head, whatever the query.
    #[test]
    fn one_position_gives_its_value_row() {
        let (k, v) = (rows(4, 1), rows(4, 2));
        let q: Vec<f32> = (0..HEADS * DIM).map(|i| i as f32 * 0.37 - 3.0).collect();
        let out = attend(&q, &k, &v, 0, 4, 0);
        for h in 0..HEADS {
            let kvh = h / (HEADS / KV_HEADS);
            assert_eq!(&out[h * DIM..][..DIM], &v[kvh * DIM..][..DIM], "head {h}");
        }
    }

    /// With every key equal, every score is equal: token t of a chunk at `pos` averages
    /// the value rows 0..=pos+t of its KV head (the latest `window` of them in a local
    /// layer); a token past the context leaves its rows.
    #[test]
    fn equal_keys_average_the_values_seen_causally() {
        for window in [0, 1, 3] {
            equal_keys_average(window);
        }
    }

    fn equal_keys_average(window: usize) {
        let (n_ctx, pos, tokens) = (6usize, 2usize, 5usize);
        let key: Vec<f32> = (0..WIDTH).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        let k: Vec<f32> = key.iter().copied().cycle().take(n_ctx * WIDTH).collect();
        let v = rows(n_ctx, 3);
        let q: Vec<f32> = (0..tokens * HEADS * DIM).map(|i| ((i * 13) % 11) as f32 * 0.3 - 1.5).collect();
        let out = attend(&q, &k, &v, pos as i32, n_ctx as u32, window as u32);
        for t in 0..tokens {
            for h in 0..HEADS {
                let (kvh, row) = (h / (HEADS / KV_HEADS), &out[(t * HEADS + h) * DIM..][..DIM]);
                let seen = pos + t + 1;
                if seen > n_ctx {
                    assert!(row.iter().all(|&x| x == 7.0), "token {t} is past the context: {row:?}");
                    continue;
                }
                let first = if window > 0 { seen.saturating_sub(window) } else { 0 };
                for (d, &got) in row.iter().enumerate() {
                    let mean = (first..seen).map(|p| f64::from(v[p * WIDTH + kvh * DIM + d])).sum::<f64>()
                        / (seen - first) as f64;
                    assert!((f64::from(got) - mean).abs() < 1e-6, "token {t} head {h} dim {d}: {got} vs {mean}");
                }
            }
        }
    }
}
