//! Tuning rules: every decision about threads, tiles and launch geometry, per target.
//!
//! Rules read only the op's shapes and the target's facts, so a plan is reproducible
//! and each decision can be read here in one place. `strata-compile --tune` (a later
//! issue) may replace a rule's choice with a measured one; these defaults must already
//! be good.

use super::{Buffer, Dim, DotPath, Elem, Extent, GemvTuning, KernelSpec, Launch, Op, Scalar, Tuning};
use crate::target::Target;

/// Waves per block for GEMV and attention: four waves hide latency well on every
/// shipped target while leaving room for several blocks per SM / CU.
pub const WAVES_PER_BLOCK: u32 = 4;
/// Threads of elementwise kernels.
pub const ELEMENTWISE_THREADS: u32 = 256;
/// Largest runtime row count of block-per-row kernels (grid x; the host refuses more).
pub const MAX_ROWS: u32 = 1 << 20;
/// Largest token count of elementwise kernels, which put tokens on grid y (65535 at most).
pub const MAX_TOKENS: u32 = 65_535;
/// Largest context (KV positions) a kernel accepts.
pub const MAX_CONTEXT: u32 = 1 << 20;
/// Floats per 32-element chunk in a GEMV's shared input tile: 32 plus 4 of padding,
/// so each chunk starts 16-byte aligned (read as float4) and the eight lanes of a
/// 128-bit access phase, reading chunks 36 words apart, hit all 32 banks once.
pub const CHUNK_STRIDE: u32 = 36;

/// The full kernel record for `op` on `target`.
pub fn kernel(op: Op, target: &Target) -> KernelSpec {
    let wave = target.device.wave_size;
    let name = op.kernel_name();
    let rows = |name: &str| Dim::Runtime { arg: name.into(), per_block: 1 };
    let buffer = |name: &str, elem, extent, writes| Buffer { name: name.into(), elem, extent, writes };
    let per = |arg: &str, per_row: u32| Extent::PerArg { arg: arg.into(), per_row: u64::from(per_row) };
    let scalar = |name: &str, max| Scalar { name: name.into(), max };
    let launch = |grid: [Dim; 3], threads: u32, shared_bytes: u32| Launch {
        grid,
        threads,
        waves: threads / wave,
        wave_size: wave,
        shared_bytes,
    };
    let block_per_row = |n: u32, cap: u32| round_up(n.div_ceil(4), wave).clamp(wave, cap.max(wave));

    let (launch, tuning, buffers, scalars) = match &op {
        Op::Gemv { quant, rows: r, cols, window } => {
            let t = gemv(*r, *cols, *window, target);
            let threads = t.waves * wave;
            let tile_chunks = t.tile_cols / 32;
            let mut shared = window * tile_chunks * t.chunk_stride * 4;
            if t.split > 1 {
                shared += t.waves * window * 4;
            }
            let row_bytes = quant.row_bytes(u64::from(*cols)).unwrap_or(0);
            let grid = [Dim::Fixed(r.div_ceil(t.rows_per_block)), Dim::Fixed(1), Dim::Fixed(1)];
            (
                launch(grid, threads, shared),
                Tuning::Gemv(t),
                vec![
                    buffer("w", Elem::U8, Extent::Fixed(u64::from(*r) * row_bytes), false),
                    buffer("x", Elem::F32, Extent::Fixed(u64::from(window * cols)), false),
                    buffer("y", Elem::F32, Extent::Fixed(u64::from(window * r)), true),
                ],
                vec![],
            )
        }
        Op::RmsNorm { n, .. } => {
            let threads = block_per_row(*n, 256);
            (
                launch([rows("rows"), Dim::Fixed(1), Dim::Fixed(1)], threads, threads / wave * 4),
                Tuning::None {},
                vec![
                    buffer("x", Elem::F32, per("rows", *n), false),
                    buffer("w", Elem::F32, Extent::Fixed(u64::from(*n)), false),
                    buffer("y", Elem::F32, per("rows", *n), true),
                ],
                vec![scalar("rows", MAX_ROWS)],
            )
        }
        Op::AddRmsNorm { n, .. } => {
            let threads = block_per_row(*n, 256);
            (
                launch([rows("rows"), Dim::Fixed(1), Dim::Fixed(1)], threads, threads / wave * 4),
                Tuning::None {},
                vec![
                    buffer("a", Elem::F32, per("rows", *n), false),
                    buffer("b", Elem::F32, per("rows", *n), false),
                    buffer("w", Elem::F32, Extent::Fixed(u64::from(*n)), false),
                    buffer("sum", Elem::F32, per("rows", *n), true),
                    buffer("y", Elem::F32, per("rows", *n), true),
                ],
                vec![scalar("rows", MAX_ROWS)],
            )
        }
        Op::RopeStore { heads, kv_heads, head_dim, rope_dims, .. } => {
            let threads = round_up(head_dim / 2, wave).min(target.device.max_threads_per_block);
            let width = kv_heads * head_dim;
            (
                launch([Dim::Fixed(heads + kv_heads), rows("tokens"), Dim::Fixed(1)], threads, 0),
                Tuning::None {},
                vec![
                    buffer("q", Elem::F32, per("tokens", heads * head_dim), true),
                    buffer("k", Elem::F32, per("tokens", width), false),
                    buffer("v", Elem::F32, per("tokens", width), false),
                    buffer("k_cache", Elem::F16, per("n_ctx", width), true),
                    buffer("v_cache", Elem::F16, per("n_ctx", width), true),
                    buffer("cos_sin", Elem::F32, per("n_ctx", *rope_dims), false),
                    buffer("pos", Elem::I32, Extent::Fixed(1), false),
                ],
                vec![scalar("tokens", MAX_TOKENS), scalar("n_ctx", MAX_CONTEXT)],
            )
        }
        Op::SiluMul { n } | Op::Add { n, .. } => {
            let threads = ELEMENTWISE_THREADS.min(round_up(*n, wave));
            let grid = [Dim::Fixed(n.div_ceil(threads)), rows("tokens"), Dim::Fixed(1)];
            let (a, b) = if matches!(op, Op::SiluMul { .. }) { ("gate", "up") } else { ("a", "b") };
            let b_extent = if matches!(op, Op::Add { broadcast: true, .. }) {
                Extent::Fixed(u64::from(*n))
            } else {
                per("tokens", *n)
            };
            (
                launch(grid, threads, 0),
                Tuning::None {},
                vec![
                    buffer(a, Elem::F32, per("tokens", *n), false),
                    buffer(b, Elem::F32, b_extent, false),
                    buffer("y", Elem::F32, per("tokens", *n), true),
                ],
                vec![scalar("tokens", MAX_TOKENS)],
            )
        }
        Op::Embed { quant, cols, vocab } => {
            let chunks = cols.div_ceil(32);
            let threads = round_up(chunks, wave).min(ELEMENTWISE_THREADS);
            let row_bytes = quant.row_bytes(u64::from(*cols)).unwrap_or(0);
            (
                launch([Dim::Fixed(chunks.div_ceil(threads)), rows("tokens"), Dim::Fixed(1)], threads, 0),
                Tuning::None {},
                vec![
                    buffer("table", Elem::U8, Extent::Fixed(u64::from(*vocab) * row_bytes), false),
                    buffer("ids", Elem::I32, per("tokens", 1), false),
                    buffer("y", Elem::F32, per("tokens", *cols), true),
                ],
                vec![scalar("tokens", MAX_TOKENS)],
            )
        }
        Op::Attention { heads, kv_heads, head_dim, .. } => {
            let threads = WAVES_PER_BLOCK * wave;
            // Per wave: running max, running sum and a head-length accumulator.
            let shared = WAVES_PER_BLOCK * (2 + head_dim) * 4;
            (
                launch([Dim::Fixed(*heads), Dim::Fixed(1), Dim::Fixed(1)], threads, shared),
                Tuning::None {},
                vec![
                    buffer("q", Elem::F32, Extent::Fixed(u64::from(heads * head_dim)), false),
                    buffer("k_cache", Elem::F16, per("n_ctx", kv_heads * head_dim), false),
                    buffer("v_cache", Elem::F16, per("n_ctx", kv_heads * head_dim), false),
                    buffer("out", Elem::F32, Extent::Fixed(u64::from(heads * head_dim)), true),
                    buffer("pos", Elem::I32, Extent::Fixed(1), false),
                ],
                vec![scalar("t", MAX_TOKENS), scalar("n_ctx", MAX_CONTEXT)],
            )
        }
        Op::Softmax { n } | Op::Argmax { n } => {
            let threads = block_per_row(*n, 1024).min(target.device.max_threads_per_block);
            let argmax = matches!(op, Op::Argmax { .. });
            let shared = threads / wave * if argmax { 8 } else { 4 };
            let mut buffers = vec![buffer("x", Elem::F32, per("rows", *n), !argmax)];
            if argmax {
                buffers.push(buffer("out", Elem::I32, per("rows", 1), true));
            }
            (
                launch([rows("rows"), Dim::Fixed(1), Dim::Fixed(1)], threads, shared),
                Tuning::None {},
                buffers,
                vec![scalar("rows", MAX_ROWS)],
            )
        }
    };
    KernelSpec { name, op, launch, tuning, buffers, scalars }
}

/// GEMV tuning for `rows × cols` over `window` columns.
///
/// - Four waves per block; each row is reduced by `split` waves (intra-block split-K)
///   when there are too few rows to give every SM / CU two blocks, and the row has at
///   least `wave × split` chunks of 32 to share. No atomics: the split partial sums are
///   combined in a fixed order, so results are deterministic.
/// - The input window is staged in shared memory in tiles: as many 32-column chunks as
///   fit half the target's per-block shared memory for `window` columns (rounded down to
///   whole 256-column super-blocks), at least one super-block (or the whole row if
///   shorter). A target too small for that minimum fails the static check, naming the
///   kernel and the limit.
/// - Lane `l` of split part `p` accumulates chunks `c ≡ p·wave + l (mod split·wave)` in
///   ascending order whatever the tile size, so column `j` of a window is bit-identical
///   to the single-column GEMV of input `j`.
pub fn gemv(rows: u32, cols: u32, window: u32, target: &Target) -> GemvTuning {
    let wave = target.device.wave_size;
    let waves = WAVES_PER_BLOCK;
    let chunks = cols / 32;
    let min_blocks = 2 * target.device.compute_units;
    let mut split = 1;
    while split < waves && rows.div_ceil(waves / split) < min_blocks && chunks >= wave * split * 2 {
        split *= 2;
    }
    let budget = target.device.shared_bytes_per_block / 2;
    let fit = budget / (window * CHUNK_STRIDE * 4);
    let tile_chunks = if fit >= chunks { chunks } else { (fit / 8 * 8).max(8.min(chunks)) };
    GemvTuning {
        waves,
        split,
        rows_per_block: waves / split,
        tile_cols: tile_chunks * 32,
        chunk_stride: CHUNK_STRIDE,
        dot: DotPath::Float,
    }
}

fn round_up(n: u32, m: u32) -> u32 {
    n.div_ceil(m) * m
}
