//! `argmax`: each row's largest value's index (greedy sampling on the device).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::softmax::row_reduction_checks;
use super::{Checker, KernelOp, Parts, block_per_row, buffer, launch, per, rows, scalar, untuned};
use crate::plan::rules::MAX_ROWS;
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// Index of the largest value of each row of `n` (first on ties).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Argmax {
    /// Row length.
    pub n: u32,
}

impl KernelOp for Argmax {
    fn kernel_name(&self) -> String {
        format!("argmax_{}", self.n)
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let threads = block_per_row(target, self.n, 1024).min(target.device.max_threads_per_block);
        untuned(
            // A value and an index a wave.
            launch(
                target,
                [rows("rows"), Dim::Fixed(1), Dim::Fixed(1)],
                threads,
                threads / target.device.wave_size * 8,
            ),
            vec![buffer("x", Elem::F32, per("rows", self.n), false), buffer("out", Elem::I32, per("rows", 1), true)],
            vec![scalar("rows", MAX_ROWS)],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        row_reduction_checks(k, c, 8);
    }

    fn context(&self, _k: &KernelRecord, _target: &Target) -> Value {
        json!({ "n": self.n })
    }
}
