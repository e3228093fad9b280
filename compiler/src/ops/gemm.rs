//! `gemm`: a quantized matrix times the columns of a prompt chunk (or any window wider
//! than the GEMV's), on the target's matrix unit: tiles of weights dequantized to f16
//! and tiles of the input converted to f16 in shared memory, multiplied by
//! `strata_mma16` (`templates/matrix/<unit>.cuh`) with f32 accumulators.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, fixed, fixed_len, launch, per, scalar};
use crate::plan::rules::{self, MAX_TOKENS};
use crate::plan::{Dim, Elem, GemmTuning, KernelRecord, Options, Tuning};
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

impl Gemm {
    /// Shared bytes of a tuning: the weight and input tiles in f16, rows padded.
    pub fn shared_bytes(t: &GemmTuning) -> u32 {
        (t.tile_rows + t.tile_tokens) * (t.tile_k + t.pad) * 2
    }
}

impl KernelOp for Gemm {
    fn kernel_name(&self) -> String {
        let Gemm { quant, rows, cols } = self;
        format!("gemm_{}_{rows}x{cols}", quant.name().to_ascii_lowercase())
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let Gemm { quant, rows, cols } = *self;
        let t = rules::gemm(rows, cols, target);
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(0);
        let grid = [
            Dim::Fixed(rows.div_ceil(t.tile_rows)),
            Dim::Runtime { arg: "tokens".into(), per_block: t.tile_tokens },
            Dim::Fixed(1),
        ];
        Parts {
            launch: launch(target, grid, t.waves * target.device.wave_size, Gemm::shared_bytes(&t)),
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
        if Gemm::shared_bytes(t) != k.launch.shared_bytes {
            c.shared(Gemm::shared_bytes(t), "the weight and input tiles".into());
        }
        if c.grid_x().saturating_mul(u64::from(t.tile_rows)) < u64::from(rows) {
            c.fail("rows covered by the grid", c.grid_x().to_string(), format!("the matrix has {rows}"));
        }
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(u64::MAX);
        c.extents.push(("w", u64::from(rows).saturating_mul(row_bytes)));
    }

    fn tolerance(&self) -> f64 {
        // f16 operands (11-bit significands), f32 accumulation.
        2e-3
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let Gemm { quant, rows, cols } = *self;
        let Tuning::Gemm(t) = &k.tuning else { return json!({}) };
        json!({
            "quant": quant.name().to_ascii_lowercase(), "quant_name": quant.name(),
            "rows": rows, "cols": cols, "row_bytes": quant.row_bytes(u64::from(cols)).unwrap_or(0),
            "tile_rows": t.tile_rows, "tile_tokens": t.tile_tokens, "tile_k": t.tile_k,
            "stride": t.tile_k + t.pad, "w_len": fixed(k, "w"),
        })
    }

    fn uses_matrix_unit(&self) -> bool {
        true
    }
}
