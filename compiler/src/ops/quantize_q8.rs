//! `quantize_q8`: rows quantized to int8 once for every int8-dot product that reads them.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, launch, per, rows, scalar, untuned};
use crate::plan::rules::{ELEMENTWISE_THREADS, MAX_ROWS};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// Quantizes rows of `cols` floats to int8 per 32-element chunk (scale = max |x| / 127,
/// round half away from zero), with each chunk's scale and sum of quants: the input of
/// the int8-dot GEMVs, made once and read by every product of the same input.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuantizeQ8 {
    /// Row length.
    pub cols: u32,
}

impl KernelOp for QuantizeQ8 {
    fn kernel_name(&self) -> String {
        format!("quantize_q8_{}", self.cols)
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        // One thread per 32-element chunk; rows on grid x, chunk groups on grid y.
        let chunks = self.cols / 32;
        let threads = chunks.next_multiple_of(target.device.wave_size).min(ELEMENTWISE_THREADS);
        untuned(
            launch(target, [rows("rows"), Dim::Fixed(chunks.div_ceil(threads)), Dim::Fixed(1)], threads, 0),
            vec![
                buffer("x", Elem::F32, per("rows", self.cols), false),
                buffer("xq", Elem::U8, per("rows", self.cols), true),
                buffer("xd", Elem::F32, per("rows", chunks * 2), true),
            ],
            vec![scalar("rows", MAX_ROWS)],
        )
    }

    fn check(&self, _k: &KernelRecord, c: &mut Checker) {
        let chunks = u64::from(self.cols / 32);
        let covered = c.grid_y().saturating_mul(u64::from(c.kernel.launch.threads));
        if !self.cols.is_multiple_of(32) || covered < chunks {
            c.fail("chunks covered per row", covered.to_string(), format!("rows have {chunks} chunks of 32"));
        }
    }

    fn tolerance(&self) -> f64 {
        // The same float operations as the CPU reference: bit for bit.
        0.0
    }

    fn context(&self, _k: &KernelRecord, _target: &Target) -> Value {
        json!({ "cols": self.cols, "chunks": self.cols / 32 })
    }
}
