//! The self-test: every kernel of the artifacts runs on the device on random valid
//! inputs and is compared with the CPU reference running the same plan record on the
//! same inputs. A mismatch names the kernel, the largest error and the first bad
//! index; a kernel that does not finish by the deadline is reported as a hang.
//!
//! A pass is remembered per (module hash, device, driver) so later runs skip it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use half::f16;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};
use strata_compiler::artifacts::Manifest;
use strata_compiler::ops::{self, Op};
use strata_compiler::plan::{ERROR_BUFFER, Elem, Extent, KernelRecord, Tuning};
use strata_compiler::quant::{self as random, GgmlType};

use crate::backend::cpu::Cpu;
use crate::backend::{Arg, Backend, DeviceInfo, RunError};

/// Position the test's KV windows start at (inside the test context): far enough in for
/// attention to take several splits and QSA to choose among a dozen blocks.
const TEST_POS: i32 = 200;
/// Where a kernel's test window starts: [`TEST_POS`], or past a sliding window where the
/// test context holds one more, so that the window cuts the positions a token sees.
fn test_pos(spec: &KernelRecord) -> i32 {
    let window = match spec.op {
        Op::Attention(ops::Attention { window, .. }) | Op::AttentionPrefill(ops::AttentionPrefill { window, .. }) => {
            window
        }
        _ => 0,
    };
    let past = TEST_POS as u32 + window;
    if window > 0 && past + 64 <= TEST_CTX { past as i32 } else { TEST_POS }
}

/// Context the tests run with: well past the windows, so that QSA's score kernel also
/// takes its exit for whole thread blocks of KV blocks past the newest.
const TEST_CTX: u32 = 1280;
/// Blocks QSA keeps in the selection tests (and lists in the sparse attention tests).
const TEST_BUDGET: u32 = 4;
/// Slots of the expert pools in the expert product tests (experts share them).
const TEST_SLOTS: u32 = 3;
/// Tokens of a GEMM's test chunk past its first whole tile: odd, so no multiple of a tile.
const GEMM_PARTIAL_TOKENS: u32 = 37;

/// The outcome of one kernel's test.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The kernel.
    pub kernel: String,
    /// Largest error relative to the reference's largest magnitude.
    pub max_error: f64,
    /// The tolerance it was held to.
    pub tolerance: f64,
    /// First output element past the tolerance: (buffer, index, device value, reference value).
    pub first_bad: Option<(String, usize, f64, f64)>,
    /// Device time of the launch (including the wait).
    pub time: Duration,
}

impl Outcome {
    /// Whether the kernel matched the reference.
    pub fn passed(&self) -> bool {
        self.first_bad.is_none()
    }

    /// One line for a refusal.
    pub fn failure(&self) -> String {
        match &self.first_bad {
            None => format!("kernel {} passed", self.kernel),
            Some((buffer, index, got, want)) => format!(
                "kernel {} does not match the CPU reference: max error {:.3e} (tolerance {:.1e}); first bad index {index} of {buffer}: device {got}, reference {want}",
                self.kernel, self.max_error, self.tolerance
            ),
        }
    }
}

/// The scalar value a test launch uses.
fn test_scalar(spec: &KernelRecord, name: &str) -> u32 {
    let block = match spec.op {
        Op::RopeStore(ops::RopeStore { block, .. })
        | Op::Attention(ops::Attention { block, .. })
        | Op::QsaScore(ops::QsaScore { block, .. })
        | Op::QsaSelect(ops::QsaSelect { block, .. })
        | Op::AttentionPrefill(ops::AttentionPrefill { page: block, .. }) => block,
        _ => 1,
    };
    let gemm_tile = match &spec.tuning {
        Tuning::Gemm(t) => Some(t.tile_tokens),
        Tuning::GemmQ8(t) => Some(t.tile_tokens),
        _ => None,
    };
    let v = match (name, gemm_tile) {
        // A GEMM's chunk: a whole tile of tokens and a partial one, so that both the
        // second row of blocks and the guards of the last tile run.
        ("tokens", Some(tile)) => tile + GEMM_PARTIAL_TOKENS,
        // Two prompt chunks of 37 (two sequences, each after a cached prefix, TEST_POS):
        // partial query and key tiles, and the causal diagonal inside a key tile.
        ("tokens", None) if matches!(spec.op, Op::AttentionPrefill(_)) => 2 * 37,
        ("seqs", _) if matches!(spec.op, Op::AttentionPrefill(_)) => 2,
        // A batch's GEMV: whole 8-column tiles and a partial one, columns past it unread.
        ("tokens", None) if matches!(spec.op, Op::BatchGemv(_)) => 27,
        // A chunk's routing: more tokens than a wave of the block routes at once.
        ("tokens", None) if matches!(spec.op, Op::MoeGroup(_)) => 37,
        ("rows" | "tokens", _) => 3,
        ("n_ctx", _) => TEST_CTX,
        ("n_blocks", _) => TEST_CTX.div_ceil(block),
        // A batch: each of the three tokens its own sequence in its own cache slot (QSA's
        // selection reads one sequence).
        ("seqs", _) if !matches!(spec.op, Op::Attention(ops::Attention { sparse: true, .. })) => 3,
        // Paged KV: a pool of as many pages as the slots' page tables name (each page
        // once, in a scrambled order: see `random_bytes`).
        ("cache_rows", _) => TEST_SLOTS * TEST_CTX.div_ceil(block) * block,
        ("summary_rows" | "table_entries", _) => TEST_SLOTS * TEST_CTX.div_ceil(block),
        ("budget", _) => TEST_BUDGET,
        ("slots", _) => TEST_SLOTS,
        _ => 1,
    };
    let max = spec.scalars.iter().find(|s| s.name == name).map_or(v, |s| s.max);
    v.min(max)
}

fn random_bytes(spec: &KernelRecord, buffer: usize, elems: u64, rng: &mut ChaCha8Rng) -> Result<Vec<u8>, RunError> {
    let b = &spec.buffers[buffer];
    let n = elems as usize;
    // An int8 product's quantized input: quants and (scale, sum) must agree, so both come
    // from the same random activations.
    if matches!(spec.op, Op::Gemv(_) | Op::BatchGemv(_) | Op::ExpertGemv(_) | Op::Gemm(_) | Op::ExpertGemm(_))
        && (b.name == "xq" || b.name == "xd")
    {
        let floats = if b.name == "xq" { n } else { n * 16 };
        let x = random::random_floats(&mut ChaCha8Rng::seed_from_u64(0xac71), floats, 1.0);
        let (xq, xd) = crate::backend::cpu::quantize_q8(&x);
        return Ok(if b.name == "xq" { xq } else { xd.iter().flat_map(|v| v.to_le_bytes()).collect() });
    }
    // Sparse attention's block lists: TEST_BUDGET blocks per (token, KV head), every
    // other one back from the token's newest, in ascending order.
    if let Op::Attention(ops::Attention { kv_heads, block, sparse: true, .. }) = spec.op
        && (b.name == "list" || b.name == "count")
    {
        let n_blocks = test_scalar(spec, "n_blocks") as usize;
        let rows = strata_compiler::plan::MAX_WINDOW as usize * kv_heads as usize;
        let mut list = vec![0i32; rows * n_blocks];
        let mut count = vec![0i32; rows];
        for t in 0..test_scalar(spec, "tokens") as usize {
            let newest = (TEST_POS as usize + t) / block as usize;
            for kvh in 0..kv_heads as usize {
                let mut chosen: Vec<i32> =
                    (0..TEST_BUDGET as usize).filter_map(|i| newest.checked_sub(2 * i)).map(|b| b as i32).collect();
                chosen.sort_unstable();
                let row = (t * kv_heads as usize + kvh) * n_blocks;
                list[row..row + chosen.len()].copy_from_slice(&chosen);
                count[t * kv_heads as usize + kvh] = chosen.len() as i32;
            }
        }
        let ints = if b.name == "list" { list } else { count };
        return Ok(ints.iter().take(n).flat_map(|v| v.to_le_bytes()).collect());
    }
    // An expert product's routing: a window of `window` tokens routed by random logits,
    // the experts spread over the test's slots.
    if let Op::ExpertGemv(ops::ExpertGemv { window, used, experts, .. }) = spec.op
        && (b.name == "route" || b.name == "slot_of")
    {
        let mut routing = ChaCha8Rng::seed_from_u64(0x0e4e);
        if b.name == "slot_of" {
            return Ok((0..n).flat_map(|_| (routing.random_range(0..TEST_SLOTS) as i32).to_le_bytes()).collect());
        }
        let logits = random::random_floats(&mut routing, (window * experts) as usize, 1.0);
        let layout = strata_compiler::ops::RouteLayout::new(experts, used);
        let mut route = vec![0i32; n];
        let mut weights = vec![0f32; (strata_compiler::plan::MAX_WINDOW * used) as usize];
        crate::backend::cpu::moe_route(&logits, experts as usize, layout, &mut route, &mut weights);
        return Ok(route.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    // A grouped expert product's grouping: the test's tokens routed by random logits,
    // experts 0 and 1 favoured (every token takes them where it takes two: more choices
    // than a tile holds), the experts spread over the test's slots.
    if let Op::ExpertGemm(ops::ExpertGemm { used, experts, .. }) = spec.op
        && matches!(b.name.as_str(), "offsets" | "order" | "slot_of")
    {
        let mut routing = ChaCha8Rng::seed_from_u64(0x0e4f);
        if b.name == "slot_of" {
            return Ok((0..n).flat_map(|_| (routing.random_range(0..TEST_SLOTS) as i32).to_le_bytes()).collect());
        }
        let tokens = test_scalar(spec, "tokens");
        let mut logits = random::random_floats(&mut routing, (tokens * experts) as usize, 1.0);
        for row in logits.chunks_mut(experts as usize) {
            row.iter_mut().take(2).for_each(|x| *x += 4.0);
        }
        let (_, offsets, order) = crate::backend::cpu::moe_group(&logits, experts as usize, used as usize);
        let ints = if b.name == "offsets" { offsets } else { order };
        return Ok(ints.iter().take(n).flat_map(|v| v.to_le_bytes()).collect());
    }
    // The KV page tables: every page of the pool once, shuffled, so that no sequence's
    // positions lie in order and a page's rows are found only through the table.
    if b.name == "pages" {
        let mut pages: Vec<i32> = (0..n as i32).collect();
        rand::seq::SliceRandom::shuffle(pages.as_mut_slice(), &mut ChaCha8Rng::seed_from_u64(0x9a6e));
        return Ok(pages.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    // The merge's split counts: 1 to the most there are; its partial states
    // [max, sum, acc[head]] with positive sums, as attention writes them (a sum near zero
    // would make the merge divide by one: cancellation the kernels never see).
    if let (Op::AttentionMerge(ops::AttentionMerge { head_dim, .. }), Tuning::Attention(t)) = (&spec.op, &spec.tuning) {
        if b.name == "splits" {
            return Ok((0..n).flat_map(|_| (rng.random_range(1..=t.splits) as i32).to_le_bytes()).collect());
        }
        if b.name == "partial" {
            let mut states = random::random_floats(rng, n, 1.0);
            for sum in states.iter_mut().skip(1).step_by(*head_dim as usize + 2) {
                *sum = sum.abs() + 0.5;
            }
            return Ok(states.iter().flat_map(|v| v.to_le_bytes()).collect());
        }
    }
    Ok(match b.elem {
        Elem::F32 => random::random_floats(rng, n, 1.0).iter().flat_map(|v| v.to_le_bytes()).collect(),
        Elem::F16 => (0..n).flat_map(|_| f16::from_f32(rng.random_range(-1.0f32..1.0)).to_le_bytes()).collect(),
        Elem::I32 => {
            let bound = match spec.op {
                Op::Embed(ops::Embed { vocab, .. }) if b.name == "ids" => vocab,
                _ => 1,
            };
            let pos = test_pos(spec);
            // A batch's cache slots: the last first, so that no sequence reads slot 0's rows.
            let slot = |i: usize| (TEST_SLOTS as usize - 1 - i % TEST_SLOTS as usize) as i32;
            (0..n)
                .flat_map(|i| {
                    match b.name.as_str() {
                        "pos" => pos,
                        "slots" => slot(i),
                        _ => rng.random_range(0..bound) as i32,
                    }
                    .to_le_bytes()
                })
                .collect()
        }
        Elem::U8 => {
            let ty = spec.op.def().weights().unwrap_or(GgmlType::F32);
            let mut out = vec![0u8; n];
            random::random_blocks(ty, rng, &mut out, 0.05)
                .map_err(|e| RunError::Other(format!("kernel {}: test input: {e}", spec.name)))?;
            out
        }
    })
}

fn values(elem: Elem, bytes: &[u8]) -> Vec<f64> {
    match elem {
        Elem::F32 => bytes.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        Elem::F16 => bytes.chunks_exact(2).map(|c| f64::from(f16::from_le_bytes([c[0], c[1]]).to_f32())).collect(),
        Elem::I32 => bytes.chunks_exact(4).map(|c| f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        Elem::U8 => bytes.iter().map(|&b| f64::from(b)).collect(),
    }
}

/// Tests one kernel on `device` against the CPU reference, with `deadline` for the
/// device to finish.
pub fn test_kernel(
    device: &mut dyn Backend,
    spec: &KernelRecord,
    deadline: Duration,
    seed: u64,
) -> Result<Outcome, RunError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut cpu = Cpu::new();
    let scalars: Vec<(&str, u32)> =
        spec.scalars.iter().map(|s| (s.name.as_str(), test_scalar(spec, &s.name))).collect();
    let scalar = |name: &str| scalars.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v);
    let mut named_dev = Vec::new();
    let mut named_cpu = Vec::new();
    let mut outputs = Vec::new();
    let mut counts = Vec::new();
    for (i, b) in spec.buffers.iter().enumerate() {
        if b.name == ERROR_BUFFER {
            continue;
        }
        let elems = match &b.extent {
            Extent::Fixed(n) => *n,
            Extent::PerArg { arg, per_row } => u64::from(scalar(arg)) * per_row,
        };
        // A workspace starts zeroed, as the model hands it over, and is no output: only
        // its counts are read back, which the kernel must leave zero.
        let bytes = match b.workspace {
            true => vec![0; usize::try_from(elems * b.elem.bytes()).map_err(|e| RunError::Other(e.to_string()))?],
            false => random_bytes(spec, i, elems, &mut rng)?,
        };
        let (d, c) = (device.alloc(bytes.len())?, cpu.alloc(bytes.len())?);
        device.write(d, 0, &bytes)?;
        cpu.write(c, 0, &bytes)?;
        named_dev.push((b.name.as_str(), Arg::Buf(d, 0)));
        named_cpu.push((b.name.as_str(), Arg::Buf(c, 0)));
        if b.workspace {
            if b.elem == Elem::I32 {
                counts.push((b.name.clone(), d, bytes.len()));
            }
        } else if b.writes {
            outputs.push((b.name.clone(), b.elem, d, c, bytes.len()));
        }
    }
    for (name, v) in &scalars {
        named_dev.push((name, Arg::U32(*v)));
        named_cpu.push((name, Arg::U32(*v)));
    }
    cpu.call(spec, &named_cpu)?;
    device.sync()?;
    let start = Instant::now();
    device.call(spec, &named_dev)?;
    if !device.sync_within(deadline)? {
        return Err(RunError::Hang { kernel: spec.name.clone(), seconds: deadline.as_secs_f64() });
    }
    let time = start.elapsed();
    let tolerance = device.tolerance(spec);
    let mut max_error = 0f64;
    let mut first_bad = None;
    // A kernel that also quantizes its output `y` (a fused quantizer): its quants must be
    // exactly those of its own `y`, which is compared with the reference like any output
    // (quantizing the reference's `y` instead could flip a quant at a rounding boundary).
    let fused_q8 = matches!(
        spec.op,
        Op::AddRmsNorm(ops::AddRmsNorm { q8: true, .. })
            | Op::SiluMul(ops::SiluMul { q8: true, .. })
            | Op::AttentionMerge(ops::AttentionMerge { q8: true, .. })
    );
    let mut device_out = std::collections::HashMap::new();
    for (name, _, d, _, len) in &outputs {
        let mut got = vec![0u8; *len];
        device.read(*d, 0, &mut got)?;
        device_out.insert(name.clone(), got);
    }
    let own_q8 = fused_q8.then(|| {
        let y: Vec<f32> = device_out[if device_out.contains_key("y") { "y" } else { "out" }]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (xq, xd) = crate::backend::cpu::quantize_q8(&y);
        (xq, xd.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
    });
    for (name, elem, _, c, len) in outputs {
        let got = &device_out[&name];
        let want = match (&own_q8, name.as_str()) {
            (Some((xq, _)), "xq") => xq.clone(),
            (Some((_, xd)), "xd") => xd.clone(),
            _ => {
                let mut want = vec![0u8; len];
                cpu.read(c, 0, &mut want)?;
                want
            }
        };
        let exact = own_q8.is_some() && (name == "xq" || name == "xd");
        let tolerance = if exact { 0.0 } else { tolerance };
        let (got, want) = (values(elem, got), values(elem, &want));
        let scale = want.iter().filter(|v| v.is_finite()).fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let err = if g == w {
                0.0
            } else if g.is_nan() != w.is_nan() || !g.is_finite() || !w.is_finite() {
                f64::INFINITY
            } else {
                (g - w).abs() / scale
            };
            if err.is_nan() {
                continue; // both NaN
            }
            max_error = max_error.max(err);
            if err > tolerance && first_bad.is_none() {
                first_bad = Some((name.clone(), i, *g, *w));
            }
        }
    }
    for (name, d, len) in counts {
        let mut got = vec![0u8; len];
        device.read(d, 0, &mut got)?;
        let left = values(Elem::I32, &got).into_iter().enumerate().find(|(_, v)| *v != 0.0);
        if let Some((i, v)) = left {
            max_error = f64::INFINITY;
            first_bad = first_bad.or(Some((name, i, v, 0.0)));
        }
    }
    Ok(Outcome { kernel: spec.name.clone(), max_error, tolerance, first_bad, time })
}

/// Runs every kernel's test; stops at the first error that is not a mismatch (a hang,
/// a fault). `each` sees every outcome as it comes.
pub fn run(
    device: &mut dyn Backend,
    kernels: &[KernelRecord],
    deadline: Duration,
    each: &mut dyn FnMut(&Outcome),
) -> Result<Vec<Outcome>, RunError> {
    let mut outcomes = Vec::with_capacity(kernels.len());
    for (i, spec) in kernels.iter().enumerate() {
        let outcome = test_kernel(device, spec, deadline, 0x5eed + i as u64)?;
        each(&outcome);
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Where a pass of these artifacts on this device is recorded: keyed by the module and
/// every kernel record (launch geometry is part of what was tested), device and driver.
pub fn pass_record(manifest: &Manifest, device: &DeviceInfo) -> PathBuf {
    let mut h = Sha256::new();
    let kernels = serde_json::to_string(&manifest.kernels).unwrap_or_default();
    for part in [&manifest.module.binary_sha256, &kernels, &device.name, &device.arch, &device.driver] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let key: String = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    crate::artifacts::cache_dir().join("selftest").join(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_compiler::plan::rules;
    use strata_compiler::target;

    /// A GEMM's test chunk ends in a partial tile of tokens after a whole one, on every
    /// target; other ops keep their three tokens.
    #[test]
    fn gemm_test_chunks_end_in_a_partial_tile() {
        for target in target::known() {
            let gemm = ops::Gemm { quant: GgmlType::Q4_0, rows: 4096, cols: 4096 };
            let k = rules::kernel(Op::Gemm(gemm), &target);
            let tile = match &k.tuning {
                Tuning::Gemm(t) => t.tile_tokens,
                Tuning::GemmQ8(t) => t.tile_tokens,
                _ => panic!("{}: {:?}", k.name, k.tuning),
            };
            let tokens = test_scalar(&k, "tokens");
            assert!(tokens > tile && !tokens.is_multiple_of(tile), "{}: {tokens}", target.name);
            let embed = rules::kernel(
                Op::Embed(ops::Embed { quant: GgmlType::Q4_0, cols: 64, vocab: 10, scale: 1.0 }),
                &target,
            );
            assert_eq!(test_scalar(&embed, "tokens"), 3);
        }
    }
}
