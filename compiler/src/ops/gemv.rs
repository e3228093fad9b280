//! `gemv`: a quantized matrix times a window of input columns, on the float path
//! (`templates/ops/gemv.cu.hbs`: weights dequantized, input tiles in shared memory),
//! the int8-dot path (`gemv_q8.cu.hbs`, input quantized by `quantize_q8`) or the int8
//! matrix unit (`gemv_mma.cu.hbs`, the same quantized input), as [`rules::gemv_mma`] and
//! [`rules::gemv_q8`] decide. The expert products ([`super::expert_gemv`]) are a mode
//! of the first two templates and share the checks and context here.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, fixed, fixed_len, launch, launch_dynamic};
use crate::plan::rules::{self, Q8_BLOCKS_PER_CU};
use crate::plan::{Dim, Elem, GemvMmaTuning, GemvQ8Tuning, GemvTuning, KernelRecord, Options, Tuning};
use crate::quant::GgmlType;
use crate::target::Target;

/// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `t < window`: a quantized matrix-vector
/// product over a window of `window` input columns (1 = plain decode; more = the
/// speculative verify window, reading the weights once for all columns).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gemv {
    /// Weight type.
    pub quant: GgmlType,
    /// Output features (weight rows).
    pub rows: u32,
    /// Input features (row length).
    pub cols: u32,
    /// Columns per launch.
    pub window: u32,
    /// The matrices stacked in `rows`, whose outputs a window lays out one after another.
    #[serde(default, skip_serializing_if = "Stack::is_single")]
    pub stack: Stack,
}

/// Where the second and the third of the matrices stacked in one product start (rows; 0:
/// no such matrix). Products that read the same input (Q·K·V, gate·up) are one launch
/// over their stacked rows; over several columns each matrix's outputs are laid out
/// `[t][its rows]` after the one before's, so that its consumers read each as if it were
/// made alone (`strata_out_at` in `common.cuh`). One column's layout is the plain one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stack(pub [u32; 2]);

impl Stack {
    /// One matrix.
    pub const SINGLE: Stack = Stack([0, 0]);

    /// The stack of matrices of these row counts, in order (two or three; one or more
    /// than three gives [`Stack::SINGLE`]).
    pub fn of(rows: &[u32]) -> Stack {
        match *rows {
            [a, _] => Stack([a, 0]),
            [a, b, _] => Stack([a, a + b]),
            _ => Stack::SINGLE,
        }
    }

    /// Whether this is one matrix.
    pub fn is_single(&self) -> bool {
        *self == Stack::SINGLE
    }

    /// The row counts of the stacked matrices, of `rows` in all.
    pub fn parts(&self, rows: u32) -> Vec<u32> {
        let mut starts: Vec<u32> = self.0.iter().copied().filter(|&s| s != 0).collect();
        starts.insert(0, 0);
        starts.push(rows);
        starts.windows(2).map(|w| w[1].saturating_sub(w[0])).collect()
    }

    /// The rows in a kernel name: `960`, or stacked `576_192_192`.
    pub fn rows_label(&self, rows: u32) -> String {
        self.parts(rows).iter().map(u32::to_string).collect::<Vec<_>>().join("_")
    }

    /// The template values `strata_out_at` takes.
    pub(crate) fn context(&self) -> Value {
        json!({ "s1": self.0[0], "s2": self.0[1] })
    }
}

impl Gemv {
    /// The product of one matrix (no stack).
    pub fn new(quant: GgmlType, rows: u32, cols: u32, window: u32) -> Gemv {
        Gemv { quant, rows, cols, window, stack: Stack::SINGLE }
    }
}

impl KernelOp for Gemv {
    fn kernel_name(&self) -> String {
        let Gemv { quant, rows, cols, window, stack } = self;
        let q = quant.name().to_ascii_lowercase();
        let rows = stack.rows_label(*rows);
        match window {
            1 => format!("gemv_{q}_{rows}x{cols}"),
            _ => format!("gemv_{q}_{rows}x{cols}_t{window}"),
        }
    }

    fn record(&self, target: &Target, options: &Options) -> Parts {
        let Gemv { quant, rows, cols, window, .. } = *self;
        let wave = target.device.wave_size;
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(0);
        let w = buffer("w", Elem::U8, fixed_len(u64::from(rows) * row_bytes), false);
        let y = buffer("y", Elem::F32, fixed_len(window * rows), true);
        let quantized = |w, y| {
            vec![
                w,
                buffer("xq", Elem::U8, fixed_len(window * cols), false),
                buffer("xd", Elem::F32, fixed_len(window * cols / 32 * 2), false),
                y,
            ]
        };
        if let Some(t) = rules::gemv_mma(quant, rows, cols, window, target, options) {
            let blocks = rules::mma_blocks(&t, quant, rows, window, target);
            let grid = [Dim::Fixed(blocks), Dim::Fixed(1), Dim::Fixed(1)];
            return Parts {
                launch: launch_dynamic(target, grid, t.waves * wave, mma_shared_bytes(&t, quant, window, wave)),
                tuning: Tuning::GemvMma(t),
                buffers: quantized(w, y),
                scalars: vec![],
            };
        }
        match rules::gemv_q8(quant, rows, cols, window, target, options) {
            Some(t) => {
                let blocks =
                    rows.div_ceil(t.rows_per_wave * t.waves).min(target.device.compute_units * Q8_BLOCKS_PER_CU);
                let grid = [Dim::Fixed(blocks), Dim::Fixed(1), Dim::Fixed(1)];
                let shared = q8_shared_bytes(&t);
                Parts {
                    launch: launch(target, grid, t.waves * wave, shared),
                    tuning: Tuning::GemvQ8(t),
                    buffers: quantized(w, y),
                    scalars: vec![],
                }
            }
            None => {
                let t = rules::gemv(rows, cols, window, target);
                let grid = [Dim::Fixed(rows.div_ceil(t.rows_per_block)), Dim::Fixed(1), Dim::Fixed(1)];
                Parts {
                    launch: launch(target, grid, t.waves * wave, float_shared_bytes(&t, window)),
                    tuning: Tuning::Gemv(t),
                    buffers: vec![w, buffer("x", Elem::F32, fixed_len(window * cols), false), y],
                    scalars: vec![],
                }
            }
        }
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let Gemv { quant, rows, cols, window, stack } = *self;
        c.window(window);
        check_stack(c, stack, rows);
        check_tuning(k, c, quant, rows, cols, window);
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(u64::MAX);
        c.extents.push(("w", u64::from(rows).saturating_mul(row_bytes)));
        c.extents.push(("y", u64::from(window * rows)));
    }

    fn weights(&self) -> Option<GgmlType> {
        Some(self.quant)
    }

    fn tolerance(&self) -> f64 {
        2e-4
    }

    fn context(&self, k: &KernelRecord, target: &Target) -> Value {
        let Gemv { quant, rows, cols, window, stack } = *self;
        let weights = json!({ "experts": false, "w_base": "", "w_len": format!("{}ull", fixed(k, "w")) });
        let ctx = super::merge(gemv_context(k, target, quant, rows, cols, window), weights);
        super::merge(ctx, stack.context())
    }

    fn template(&self, k: &KernelRecord) -> Option<&'static str> {
        Some(template(k))
    }

    fn uses_matrix_unit(&self, k: &KernelRecord) -> bool {
        matches!(k.tuning, Tuning::GemvMma(_))
    }
}

/// A stack's matrices must each have rows, in order, within the product's.
pub(crate) fn check_stack(c: &mut Checker, stack: Stack, rows: u32) {
    let [s1, s2] = stack.0;
    if !(s1 < rows && s2 < rows && (s2 == 0 || s1 != 0 && s1 < s2)) {
        c.fail(
            "the stacked matrices",
            format!("starting at rows {s1} and {s2}"),
            format!("in order within {rows} rows"),
        );
    }
}

/// The template of a GEMV record: by its tuning.
pub(crate) fn template(k: &KernelRecord) -> &'static str {
    match k.tuning {
        Tuning::GemvMma(_) => "gemv_mma",
        Tuning::GemvQ8(_) => "gemv_q8",
        _ => "gemv",
    }
}

/// Shared bytes of a matrix-unit GEMV of `window` columns: each wave's stages of a
/// panel's row slabs, then, where several waves split the rows, their sums (a group's
/// tile's 4 a lane).
pub(crate) fn mma_shared_bytes(t: &GemvMmaTuning, quant: GgmlType, window: u32, wave: u32) -> u32 {
    let sums = if t.waves > 1 { t.waves * t.wave_groups * window.div_ceil(8) * 4 * wave * 4 } else { 0 };
    t.waves * t.stages * mma_stage_bytes(t, quant, window) + sums
}

/// Bytes of one stage of a matrix-unit GEMV's wave: the panel's row slabs, then, where
/// the inputs are staged, each column's quants of the slab's chunks and then each
/// column's (scale, sum) pairs ([`MmaInputs`]).
fn mma_stage_bytes(t: &GemvMmaTuning, quant: GgmlType, window: u32) -> u32 {
    let inputs = if t.staged_inputs { MmaInputs::of(t, quant).bytes(window) } else { 0 };
    16 * t.wave_groups * t.slab_stride + inputs
}

/// Where a stage keeps a slab's inputs. A column's quants are `quant_stride` bytes apart,
/// 16 past its chunks, so that (slabs of a multiple of four chunks) the 8 columns a B
/// fragment reads at once fall in different banks; its scale pairs `scale_stride` apart,
/// likewise for the 4 columns whose scales a lane group reads.
struct MmaInputs {
    slab_chunks: u32,
    quant_stride: u32,
    scale_stride: u32,
}

impl MmaInputs {
    fn of(t: &GemvMmaTuning, quant: GgmlType) -> MmaInputs {
        let slab_chunks = t.slab_bytes / quant.block_bytes() as u32 * (quant.block_len() as u32 / 32);
        MmaInputs { slab_chunks, quant_stride: 32 * slab_chunks + 16, scale_stride: 8 * slab_chunks + 16 }
    }

    fn bytes(&self, window: u32) -> u32 {
        window * (self.quant_stride + self.scale_stride)
    }
}

/// Shared bytes of a float-path GEMV: the window's staged input tile (padded chunks),
/// and the split-K partial sums.
pub(crate) fn float_shared_bytes(t: &GemvTuning, window: u32) -> u32 {
    let table = window * (t.tile_cols / 32) * t.chunk_stride * 4;
    table + if t.split > 1 { t.waves * window * 4 } else { 0 }
}

/// Shared bytes of an int8-dot GEMV: each wave's row slabs, 16-byte aligned, and the
/// lookup grid.
pub(crate) fn q8_shared_bytes(t: &GemvQ8Tuning) -> u32 {
    t.waves * t.rows_per_wave * t.slab_bytes.next_multiple_of(16) + t.table_bytes
}

/// The checks of either GEMV path's tuning and input extents (GEMV and expert products).
pub(crate) fn check_tuning(k: &KernelRecord, c: &mut Checker, quant: GgmlType, rows: u32, cols: u32, window: u32) {
    let l = &k.launch;
    let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(u64::MAX);
    let inputs = input_rows(k, window);
    match &k.tuning {
        Tuning::Gemv(g) => {
            if g.tile_cols == 0 || g.tile_cols % 32 != 0 || g.tile_cols > cols {
                c.fail(
                    "the input tile",
                    format!("{} columns", g.tile_cols),
                    format!("it must be whole 32-column chunks of the {cols}-column row"),
                );
            }
            if g.split == 0 || g.waves % g.split != 0 || g.rows_per_block * g.split != g.waves || g.waves != l.waves {
                c.fail(
                    "the wave split",
                    format!("{} waves, {} per row, {} rows per block", g.waves, g.split, g.rows_per_block),
                    "waves must divide evenly into rows".into(),
                );
            }
            let needed = float_shared_bytes(g, window);
            if needed != l.shared_bytes {
                c.fail(
                    "declared shared memory",
                    format!("{} bytes", l.shared_bytes),
                    format!("a {window}-column window table of {} columns needs {needed} bytes", g.tile_cols),
                );
            }
            let grid_x = c.grid_x();
            if grid_x.saturating_mul(u64::from(g.rows_per_block.max(1))) < u64::from(rows) {
                c.fail(
                    "rows covered by the grid",
                    (grid_x * u64::from(g.rows_per_block)).to_string(),
                    format!("the matrix has {rows}"),
                );
            }
            c.extents.push(("x", u64::from(inputs * cols)));
        }
        Tuning::GemvQ8(g) => {
            let (block_bytes, block_chunks) = (quant.block_bytes() as u32, quant.block_len() as u32 / 32);
            let v = g.vector_bytes;
            if ![2, 4, 8, 16].contains(&v)
                || !row_bytes.is_multiple_of(u64::from(v))
                || g.slab_bytes == 0
                || g.slab_bytes % v != 0
                || g.slab_bytes % block_bytes != 0
                || g.slab_chunks != g.slab_bytes / block_bytes * block_chunks
                || g.slab_chunks % l.wave_size != 0
                || g.loads * v * l.wave_size < g.slab_bytes
            {
                c.fail(
                    "the weight slab",
                    format!(
                        "{} bytes in {v}-byte loads, {} chunks, {} loads a lane",
                        g.slab_bytes, g.slab_chunks, g.loads
                    ),
                    format!(
                        "a slab is whole {block_bytes}-byte blocks and whole loads dividing the {row_bytes}-byte \
                         rows, with chunks a multiple of the wave"
                    ),
                );
            }
            // Each wave's slab starts 16-byte aligned (the decoders' aligned loads).
            let table = rules::lookup_table(quant).map_or(0, |(_, elem, len)| elem * len);
            let slabs = g.waves * g.rows_per_wave * g.slab_bytes.next_multiple_of(16);
            if g.waves != l.waves || g.table_bytes != table || slabs + table != l.shared_bytes {
                c.fail(
                    "declared shared memory",
                    format!("{} bytes for {} waves", l.shared_bytes, l.waves),
                    format!(
                        "{} waves of {} {}-byte slabs, 16-byte aligned, and a {table}-byte lookup grid need {}",
                        g.waves,
                        g.rows_per_wave,
                        g.slab_bytes,
                        slabs + table
                    ),
                );
            }
            // Blocks step over the row groups, so any grid of at least one block covers them.
            let grid_x = c.grid_x();
            if g.rows_per_wave == 0 || grid_x == 0 {
                c.fail(
                    "rows per wave and blocks",
                    format!("{} rows a wave, {grid_x} blocks", g.rows_per_wave),
                    "at least one of each".into(),
                );
            }
            c.extents.push(("xq", u64::from(inputs * cols)));
            c.extents.push(("xd", u64::from(inputs * cols / 32 * 2)));
        }
        Tuning::GemvMma(g) => {
            let block_bytes = quant.block_bytes() as u32;
            let slabs = row_bytes.div_ceil(u64::from(g.slab_bytes.max(1)));
            if window == 0
                || window > rules::BATCH_GEMV_COLUMNS
                || g.wave_slabs == 0
                || u64::from(g.waves) != slabs.div_ceil(u64::from(g.wave_slabs))
                || g.slab_bytes == 0
                || g.slab_bytes % 2 != 0
                || g.slab_bytes % block_bytes != 0
                || g.slab_stride < 16 * rules::mma_slab_pieces(g.slab_bytes)
                || g.slab_stride % 32 != 16
                || g.stages < 2
                || g.wave_groups == 0
                || g.staged_inputs
                    && !((g.slab_bytes / block_bytes * (quant.block_len() as u32 / 32)).is_multiple_of(2)
                        && cols.is_multiple_of(64))
                || !row_bytes.is_multiple_of(16)
            {
                c.fail(
                    "the matrix-unit slabs",
                    format!(
                        "{window} columns, {}-byte slabs {} bytes apart, {} stages, {} waves of {} slabs, \
                         {} groups a wave",
                        g.slab_bytes, g.slab_stride, g.stages, g.waves, g.wave_slabs, g.wave_groups
                    ),
                    format!(
                        "at most four 8-column tiles; slabs of whole {block_bytes}-byte blocks, 2-byte aligned, in \
                         the 16-byte pieces of the {row_bytes}-byte rows, an odd number of pieces apart, at least two \
                         in flight; \
                         the waves' slabs covering the row's {slabs}, each wave's at least one; at least one group a wave; \
                         staged inputs in whole 16-byte pieces of two chunks' scales"
                    ),
                );
            }
            let halves = crate::ops::gemm::q8_decoder_terms(quant).1;
            if g.zero_start && !(g.staged_inputs && rules::fragment_zero(quant).is_some() && !halves) {
                c.fail(
                    "the zero-point start",
                    format!("{quant}, inputs {}", if g.staged_inputs { "staged" } else { "from global memory" }),
                    "a type with a zero point, one scale a chunk and staged inputs (their chunk sums beside the \
                     scales)"
                        .into(),
                );
            }
            let shared = mma_shared_bytes(g, quant, window, l.wave_size);
            if g.waves != l.waves || shared != l.shared_bytes || !l.dynamic_shared || c.grid_x() == 0 {
                c.fail(
                    "declared shared memory",
                    format!("{} bytes for {} waves, {} blocks", l.shared_bytes, l.waves, c.grid_x()),
                    format!(
                        "{} waves of {} stages of {} slabs and their sums need {shared}, dynamic",
                        g.waves,
                        g.stages,
                        16 * g.wave_groups
                    ),
                );
            }
            c.extents.push(("xq", u64::from(inputs * cols)));
            c.extents.push(("xd", u64::from(inputs * cols / 32 * 2)));
        }
        _ => c.tuning_missing("a GEMV needs GEMV tuning"),
    }
}

/// Input rows of a window's product: one a column, or for an expert product reading
/// each choice's own activation, one a choice.
fn input_rows(k: &KernelRecord, window: u32) -> u32 {
    match &k.op {
        crate::ops::Op::ExpertGemv(e) if e.input == super::ExpertInput::Choice => window * e.used,
        _ => window,
    }
}

/// The template context both GEMV templates read, by tuning (expert products too).
pub(crate) fn gemv_context(
    k: &KernelRecord,
    target: &Target,
    quant: GgmlType,
    rows: u32,
    cols: u32,
    window: u32,
) -> Value {
    let l = &k.launch;
    let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(0);
    match &k.tuning {
        Tuning::GemvMma(t) => {
            let inputs = MmaInputs::of(t, quant);
            let column_pieces = 2 * inputs.slab_chunks + inputs.slab_chunks / 2;
            let (offset, halves) = crate::ops::gemm::q8_decoder_terms(quant);
            let pieces = rules::mma_slab_pieces(t.slab_bytes);
            let mut context = json!({
            "offset": offset,
            "quant": quant.name().to_ascii_lowercase(),
            "quant_name": quant.name(),
            "rows": rows, "cols": cols, "window": window, "row_bytes": row_bytes,
            "chunks": cols / 32, "tiles": window.div_ceil(8),
            "slab_bytes": t.slab_bytes, "slab_pieces": pieces, "slab_stride": t.slab_stride,
            "slab_chunks": t.slab_bytes / quant.block_bytes() as u32 * (quant.block_len() as u32 / 32),
            "row_pieces": row_bytes / 16, "slabs": (row_bytes as u32).div_ceil(t.slab_bytes),
            "copies": (16 * t.wave_groups * pieces).div_ceil(target.device.wave_size),
            "stages": t.stages, "wait": t.stages - 1, "waves": t.waves, "wave_slabs": t.wave_slabs,
            "split": t.waves > 1, "wave_groups": t.wave_groups, "panel_rows": 16 * t.wave_groups,
            // Chunks unrolled: at least two, so a chunk's input loads are issued before the
            // last one's products (four groups at 32 columns, branch-free: 36.1 -> 33.5 µs on
            // an H100). A type with half scales unrolls four (Q6_K: a half block's four
            // chunks share the loads of its high bits, pairs of them their low nibbles';
            // eight held more registers and took more instructions a weight).
            "panels": rows.div_ceil(16 * t.wave_groups),
            "unroll": if halves { 4 } else { (4 / t.wave_groups).max(2) },
            // The zero point taken out through each column's starting sum: its chunk sums
            // are loaded beside the scales.
            "zero_start": t.zero_start.then(|| rules::fragment_zero(quant)).flatten(),
            "blocks": match l.grid[0] { Dim::Fixed(n) => n, Dim::Runtime { .. } => 0 },
            "xq_len": fixed(k, "xq"), "xd_len": fixed(k, "xd"), "y_len": fixed(k, "y"),
            "stage_bytes": mma_stage_bytes(t, quant, window), "staged": t.staged_inputs,
            "inputs_at": 16 * t.wave_groups * t.slab_stride,
            "scales_at": 16 * t.wave_groups * t.slab_stride + window * inputs.quant_stride,
            "quant_stride": inputs.quant_stride, "scale_stride": inputs.scale_stride,
            "quant_pieces": 2 * inputs.slab_chunks, "column_pieces": column_pieces,
            "input_copies": (window * column_pieces).div_ceil(target.device.wave_size),
            });
            // Half scales (Q6_K): two k = 16 products a chunk, the zero point out through each
            // half's start; slabs at a phase in their pieces (whole blocks, not whole pieces).
            let halves_context = json!({
                "halves": halves, "zero": rules::fragment_zero(quant).unwrap_or(0),
                "whole_slabs": halves && (cols / 32).is_multiple_of(inputs.slab_chunks),
                "phased": t.slab_bytes % 16 != 0,
            });
            if let (Some(all), Value::Object(more)) = (context.as_object_mut(), halves_context) {
                all.extend(more);
            }
            context
        }
        Tuning::GemvQ8(t) => {
            let table = rules::lookup_table(quant);
            json!({
                "quant": quant.name().to_ascii_lowercase(),
                "quant_name": quant.name(),
                "rows": rows, "cols": cols, "window": window, "row_bytes": row_bytes,
                "chunks": cols / 32, "vector_bytes": t.vector_bytes,
                "vector": match t.vector_bytes { 16 => "strata_u4", 8 => "strata_u2", 4 => "u32", _ => "u16" },
                "row_vecs": row_bytes / u64::from(t.vector_bytes),
                "slab_bytes": t.slab_bytes, "slab_vecs": t.slab_bytes / t.vector_bytes, "slab_chunks": t.slab_chunks,
                "slab_stride": t.slab_bytes.next_multiple_of(16),
                "table": table.map(|(name, _, _)| name),
                "table_type": table.map(|(_, bytes, _)| if bytes == 8 { "u64" } else { "u32" }),
                "table_len": table.map(|(_, _, n)| n),
                "slabs": (row_bytes as u32).div_ceil(t.slab_bytes),
                "rows_per_wave": t.rows_per_wave, "groups": rows.div_ceil(t.rows_per_wave),
                "blocks": match l.grid[0] { Dim::Fixed(n) => n, Dim::Runtime { .. } => 0 },
                "loads": t.loads, "chunks_per_lane": t.slab_chunks / target.device.wave_size,
                "xq_len": fixed(k, "xq"), "xd_len": fixed(k, "xd"), "y_len": fixed(k, "y"),
            })
        }
        Tuning::Gemv(t) => json!({
            "quant": quant.name().to_ascii_lowercase(),
            "quant_name": quant.name(),
            "rows": rows, "cols": cols, "window": window,
            "row_bytes": row_bytes,
            "block_len": quant.block_len(), "block_bytes": quant.block_bytes(),
            "chunks": cols / 32,
            "tile_cols": t.tile_cols, "tile_chunks": t.tile_cols / 32, "chunk_stride": t.chunk_stride,
            "tile_floats": t.tile_cols / 32 * t.chunk_stride,
            "split": t.split, "split_k": t.split > 1, "rows_per_block": t.rows_per_block,
            "lanes": t.split * target.device.wave_size,
            "x_len": fixed(k, "x"), "y_len": fixed(k, "y"),
        }),
        _ => json!({}),
    }
}

#[cfg(test)]
mod tests {
    /// `strata_mma_i8_started` with Q4_0's zero point: a column's start
    /// `fma(-8, sum, 1.5 * 2^23)` is exact and its bits plus the raw nibbles' integer sum
    /// are the bits of the bias plus the signed weights' sum, for every chunk sum of int8
    /// activations (|sum| <= 32 * 127) and every raw sum (nibbles 0..15): the outputs
    /// equal those of bytes made signed, bit for bit.
    #[test]
    fn a_zero_point_leaves_through_the_start_exactly() {
        const BIAS_BITS: i32 = 0x4B40_0000;
        let bias = f32::from_bits(BIAS_BITS as u32);
        let zero = crate::plan::rules::fragment_zero(crate::quant::GgmlType::Q4_0).expect("Q4_0 has one");
        let (most_sum, most_raw) = (32 * 127, 32 * 15 * 128);
        for sum in (-most_sum..=most_sum).step_by(7).chain([-most_sum, most_sum]) {
            let start = (-(zero as f32)).mul_add(sum as f32, bias);
            assert_eq!(start, bias - (zero as i32 * sum) as f32, "sum {sum}: the start is exact");
            for raw in (-most_raw..=most_raw).step_by(997).chain([-most_raw, most_raw]) {
                let ended = f32::from_bits((start.to_bits() as i32 + raw) as u32);
                assert_eq!(ended, bias + (raw - zero as i32 * sum) as f32, "sum {sum} raw {raw}");
            }
        }
    }

    /// `strata_mma_i8_biased` (templates/matrix/mma_sync.cuh): an int8 chunk's sum read
    /// as the float 1.5 * 2^23 + sum, then `fma(c, d, -1.5 * 2^23 * d)`, must equal the
    /// `d * (float)sum` it replaces bit for bit, for every f16 scale and every sum a
    /// chunk can reach (|sum| <= 32 * 128 * 127), or the matrix-unit GEMV's outputs change.
    /// Zeros may differ in sign only: each output's sum starts at +0, which adding a zero
    /// of either sign leaves +0.
    #[test]
    fn the_biased_int8_sum_scales_bit_for_bit_as_a_converted_one() {
        const BIAS_BITS: i32 = 0x4B40_0000;
        let bias = f32::from_bits(BIAS_BITS as u32);
        assert_eq!(bias, 12_582_912.0);
        let most = 32 * 128 * 127;
        for bits in (0..0x7C00u16).step_by(13).flat_map(|b| [b, b | 0x8000]) {
            let d = half::f16::from_bits(bits).to_f32();
            let nd = -bias * d;
            for sum in (-most..=most).step_by(509).chain([-most, -1, 0, 1, most]) {
                let biased = f32::from_bits((BIAS_BITS + sum) as u32);
                let got = biased.mul_add(d, nd);
                let want = d * sum as f32;
                assert!(got.to_bits() == want.to_bits() || got == 0.0 && want == 0.0, "d {d} sum {sum}");
            }
        }
    }
}
