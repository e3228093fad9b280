//! `batch_gemv`: a quantized matrix times up to `max` input columns, their count a
//! runtime scalar, on the int8 matrix unit (`templates/ops/gemv_mma.cu.hbs`, the window
//! GEMV's template with the window read at run time). A batch of decode steps wider than
//! the verify window takes it for its products: one launch reads the weights once for
//! all of its sequences, where the prompt chunk's GEMM pays for tiles sized for prompts.
//! Planned only where the window GEMV would take the matrix unit ([`rules::gemv_mma`]).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::gemv::{Stack, check_stack, check_tuning};
use super::{Checker, Gemv, KernelOp, Parts, scalar};
use crate::plan::rules;
use crate::plan::{KernelRecord, Options, Tuning};
use crate::quant::GgmlType;
use crate::target::Target;

/// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `t < tokens ≤ max`: the columns of a batch
/// of decode steps, one a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchGemv {
    /// Weight type.
    pub quant: GgmlType,
    /// Output features (weight rows).
    pub rows: u32,
    /// Input features (row length).
    pub cols: u32,
    /// Most columns a launch takes (its buffers' extents and the `tokens` scalar's bound).
    pub max: u32,
    /// The matrices stacked in `rows` ([`Gemv::stack`]), laid out by the run-time count.
    #[serde(default, skip_serializing_if = "Stack::is_single")]
    pub stack: Stack,
}

impl BatchGemv {
    /// The window GEMV of its most columns, whose kernel it is with the count read at
    /// run time.
    fn gemv(&self) -> Gemv {
        let BatchGemv { quant, rows, cols, max, stack } = *self;
        Gemv { quant, rows, cols, window: max, stack }
    }

    /// The tuning of its matrix-unit kernel, where `target` and `options` give one.
    pub fn tuning(&self, target: &Target, options: &Options) -> Option<crate::plan::GemvMmaTuning> {
        let BatchGemv { quant, rows, cols, max, .. } = *self;
        rules::gemv_mma(quant, rows, cols, max, target, options)
    }
}

impl KernelOp for BatchGemv {
    fn kernel_name(&self) -> String {
        let BatchGemv { quant, rows, cols, max, stack } = self;
        format!("batch_gemv_{}_{}x{cols}_n{max}", quant.name().to_ascii_lowercase(), stack.rows_label(*rows))
    }

    fn record(&self, target: &Target, options: &Options) -> Parts {
        // The window GEMV's record at its most columns, with the count as a scalar.
        // Where the matrix unit does not apply the plan leaves the op out; a record of
        // another GEMV path fails its check rather than launching.
        let mut parts = self.gemv().record(target, options);
        if !matches!(parts.tuning, Tuning::GemvMma(_)) {
            parts.tuning = Tuning::None {};
        }
        parts.scalars.push(scalar("tokens", self.max));
        parts
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let BatchGemv { quant, rows, cols, max, stack } = *self;
        check_stack(c, stack, rows);
        if !matches!(k.tuning, Tuning::GemvMma(_)) {
            c.tuning_missing("a batch's GEMV runs on the int8 matrix unit only");
            return;
        }
        if !(1..=rules::BATCH_GEMV_COLUMNS).contains(&max) {
            c.fail("the columns", max.to_string(), format!("a batch's GEMV takes 1 to {}", rules::BATCH_GEMV_COLUMNS));
        }
        check_tuning(k, c, quant, rows, cols, max);
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(u64::MAX);
        c.extents.push(("w", u64::from(rows).saturating_mul(row_bytes)));
        c.extents.push(("y", u64::from(max * rows)));
    }

    fn weights(&self) -> Option<GgmlType> {
        Some(self.quant)
    }

    fn tolerance(&self) -> f64 {
        self.gemv().tolerance()
    }

    fn context(&self, k: &KernelRecord, target: &Target) -> Value {
        super::merge(self.gemv().context(k, target), json!({ "columns": "tokens" }))
    }

    fn template(&self, _k: &KernelRecord) -> Option<&'static str> {
        Some("gemv_mma")
    }

    fn uses_matrix_unit(&self, _k: &KernelRecord) -> bool {
        true
    }
}
