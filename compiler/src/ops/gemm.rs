//! `gemm`: a quantized matrix times the columns of a prompt chunk (or any window wider
//! than the GEMV's), on the target's matrix unit: tiles of weights dequantized to f16
//! and tiles of the input converted to f16 in shared memory, multiplied by
//! `strata_mma16` (`templates/matrix/<unit>.cuh`) with f32 accumulators. The raw weight
//! blocks are staged in shared memory a few steps ahead of their decode.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, fixed, fixed_len, launch_dynamic, per, scalar};
use crate::plan::rules::{self, MAX_TOKENS};
use crate::plan::{Dim, Elem, Extent, GemmTuning, KernelRecord, Options, Tuning};
use crate::quant::GgmlType;
use crate::target::Target;

/// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `t < tokens` (a runtime count): the product
/// the GEMV computes for a window, for any number of columns.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gemm {
    /// Weight type.
    pub quant: GgmlType,
    /// Output features (weight rows).
    pub rows: u32,
    /// Input features (row length).
    pub cols: u32,
}

/// Shared-memory stages of the f16 tiles: the waves multiply one while the next is stored.
pub const STAGES: u32 = 2;

impl Gemm {
    /// Shared bytes of a tuning for weights of `quant`: the weight and input tiles in
    /// f16, rows padded, in [`STAGES`] buffers, then `raw_stages` super-steps of raw
    /// weight rows ([`Gemm::raw_slot`] bytes each).
    pub fn shared_bytes(quant: GgmlType, t: &GemmTuning) -> u32 {
        STAGES * (t.tile_rows + t.tile_tokens) * (t.tile_k + t.pad) * 2
            + t.raw_stages * t.tile_rows * Gemm::raw_slot(quant, t.raw_k)
    }

    /// Bytes of one row's staged super-step of `raw_k` features: the 16-byte pieces
    /// that cover its blocks wherever they start (16-byte copies keep the phase, so
    /// the blocks keep their alignment).
    pub fn raw_slot(quant: GgmlType, raw_k: u32) -> u32 {
        let span = u64::from(raw_k) / quant.block_len().max(1) as u64 * quant.block_bytes() as u64;
        u32::try_from((span + 15).next_multiple_of(16)).unwrap_or(u32::MAX)
    }

    /// The part of a block's tile one wave multiplies, (rows, tokens): 64 rows by a
    /// wave's width of tokens, so that every matrix unit keeps 64 accumulators a lane
    /// (16x16 tiles hold 256 / wave each), enough reuse of each loaded fragment without
    /// pressing on the registers.
    pub fn wave_tile(wave_size: u32) -> (u32, u32) {
        (64, wave_size)
    }
}

impl KernelOp for Gemm {
    fn kernel_name(&self) -> String {
        let Gemm { quant, rows, cols } = self;
        format!("gemm_{}_{rows}x{cols}", quant.name().to_ascii_lowercase())
    }

    fn record(&self, target: &Target, options: &Options) -> Parts {
        let Gemm { quant, rows, cols } = *self;
        let t = rules::gemm(target, options, quant, cols);
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(0);
        let grid = [
            Dim::Fixed(rows.div_ceil(t.tile_rows)),
            Dim::Runtime { arg: "tokens".into(), per_block: t.tile_tokens },
            Dim::Fixed(1),
        ];
        Parts {
            launch: launch_dynamic(target, grid, t.waves * target.device.wave_size, Gemm::shared_bytes(quant, &t)),
            tuning: Tuning::Gemm(t),
            buffers: vec![
                buffer("w", Elem::U8, fixed_len(u64::from(rows) * row_bytes), false),
                buffer("x", Elem::F32, per("tokens", cols), false),
                buffer("y", Elem::F32, per("tokens", rows), true),
            ],
            scalars: vec![scalar("tokens", MAX_TOKENS)],
        }
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let Gemm { quant, rows, cols } = *self;
        let Tuning::Gemm(t) = &k.tuning else {
            c.tuning_missing("a GEMM needs its tiles");
            return;
        };
        let shared = Gemm::shared_bytes(quant, t);
        if shared != k.launch.shared_bytes || !k.launch.dynamic_shared {
            c.shared(shared, "the weight and input tiles and the raw weights' stages (dynamic)".into());
        }
        let whole_blocks = t.raw_k.is_multiple_of(t.tile_k.max(1))
            && u64::from(t.raw_k).is_multiple_of(quant.block_len().max(1) as u64)
            && cols.is_multiple_of(t.raw_k.max(1));
        if !whole_blocks || t.raw_stages < 2 {
            c.fail(
                "the raw weights' super-steps",
                format!("{} features, {} stages", t.raw_k, t.raw_stages),
                format!("whole {} blocks, whole steps, dividing {cols} columns; 2 stages at least", quant.name()),
            );
        }
        for (what, n) in [("tile rows", t.tile_rows), ("tile tokens", t.tile_tokens)] {
            if n == 0 || !n.is_multiple_of(16) {
                c.fail(what, n.to_string(), "tiles are whole 16x16 matrix-unit tiles".into());
            }
        }
        if t.tile_k == 0 || !t.tile_k.is_multiple_of(32) || !cols.is_multiple_of(t.tile_k) {
            c.fail(
                "the features of a step",
                t.tile_k.to_string(),
                format!("whole 32-chunks dividing the {cols} columns"),
            );
        }
        if !(t.tile_k + t.pad).is_multiple_of(8) {
            let stride = t.tile_k + t.pad;
            c.fail("the staged row stride", format!("{stride} halves"), "16-byte rows (a multiple of 8)".into());
        }
        let (wave_rows, wave_tokens) = Gemm::wave_tile(k.launch.wave_size);
        let tiled = t.tile_rows.is_multiple_of(wave_rows) && t.tile_tokens.is_multiple_of(wave_tokens);
        let waves = (t.tile_rows / wave_rows) * (t.tile_tokens / wave_tokens);
        if !tiled || t.waves != waves || k.launch.waves != waves {
            c.fail(
                "waves per block",
                format!("{} (launch {})", t.waves, k.launch.waves),
                format!("{}x{} tiles in {wave_rows}x{wave_tokens} per wave", t.tile_rows, t.tile_tokens),
            );
        }
        if c.grid_x().saturating_mul(u64::from(t.tile_rows)) < u64::from(rows) {
            c.fail("rows covered by the grid", c.grid_x().to_string(), format!("the matrix has {rows}"));
        }
        let per_block = match &k.launch.grid[1] {
            Dim::Runtime { arg, per_block } if arg == "tokens" => *per_block,
            _ => 0,
        };
        if per_block != t.tile_tokens {
            c.fail("tokens per block of grid y", per_block.to_string(), format!("tiles of {} tokens", t.tile_tokens));
        }
        for (name, per_row) in [("x", cols), ("y", rows)] {
            let extent = k.buffers.iter().find(|b| b.name == name).map(|b| &b.extent);
            let ok = matches!(extent, Some(Extent::PerArg { arg, per_row: n }) if arg == "tokens" && *n == u64::from(per_row));
            if !ok {
                c.fail(&format!("the extent of {name}"), format!("{extent:?}"), format!("{per_row} floats per token"));
            }
        }
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(u64::MAX);
        c.extents.push(("w", u64::from(rows).saturating_mul(row_bytes)));
    }

    fn weights(&self) -> Option<GgmlType> {
        Some(self.quant)
    }

    fn tolerance(&self) -> f64 {
        // f16 operands (11-bit significands), f32 accumulation.
        2e-3
    }

    fn context(&self, k: &KernelRecord, target: &Target) -> Value {
        let Gemm { quant, rows, cols } = *self;
        let Tuning::Gemm(t) = &k.tuning else { return json!({}) };
        let threads = k.launch.threads.max(1);
        let (wave_rows, wave_tokens) = Gemm::wave_tile(k.launch.wave_size);
        let w_tasks = t.tile_rows * (t.tile_k / 32);
        let x_vectors = t.tile_tokens * (t.tile_k / 4);
        let raw_slot = Gemm::raw_slot(quant, t.raw_k);
        let raw_tasks = t.tile_rows * (raw_slot / 16);
        json!({
            "quant": quant.name().to_ascii_lowercase(), "quant_name": quant.name(), "unit": t.unit.name(),
            "rows": rows, "cols": cols, "row_bytes": quant.row_bytes(u64::from(cols)).unwrap_or(0),
            "block_len": quant.block_len(), "block_bytes": quant.block_bytes(),
            "tile_rows": t.tile_rows, "tile_tokens": t.tile_tokens, "tile_k": t.tile_k,
            "stride": t.tile_k + t.pad, "w_len": fixed(k, "w"), "steps": cols / t.tile_k.max(32),
            "raw_stages": t.raw_stages, "raw_steps": cols / t.raw_k.max(32), "per_raw": t.raw_k / t.tile_k.max(32),
            "raw_span": u64::from(t.raw_k) / quant.block_len().max(1) as u64 * quant.block_bytes() as u64,
            "raw_slot": raw_slot, "raw_pieces": raw_slot / 16, "raw_tasks": raw_tasks,
            "raw_per_thread": raw_tasks.div_ceil(threads), "raw_ragged": !raw_tasks.is_multiple_of(threads),
            // Background copies all issue at once; copies that are loads and stores two at a
            // time, so that their registers stay few.
            "raw_unroll": if target.features.cp_async { raw_tasks.div_ceil(threads) } else { 2 },
            "chunks_per_step": t.tile_k / 32,
            "wave_rows": wave_rows, "wave_tokens": wave_tokens, "waves_t": (t.tile_tokens / wave_tokens).max(1),
            "wm": wave_rows / 16, "wn": wave_tokens / 16, "k16": t.tile_k / 16, "chunk_vectors": t.tile_k / 4,
            "w_tasks": w_tasks, "w_per_thread": w_tasks.div_ceil(threads), "w_ragged": !w_tasks.is_multiple_of(threads),
            "x_per_thread": x_vectors.div_ceil(threads), "x_vectors": x_vectors,
            "x_ragged": !x_vectors.is_multiple_of(threads),
        })
    }

    fn uses_matrix_unit(&self) -> bool {
        true
    }
}
