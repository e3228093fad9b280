//! `argmax`: each row's largest value's index (greedy sampling on the device).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::softmax::{row_reduction_checks, row_reduction_launch};
use super::{Checker, KernelOp, Parts, buffer, per, scalar, untuned};
use crate::plan::rules::MAX_ROWS;
use crate::plan::{Elem, KernelRecord, Options};
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
        untuned(
            // A value and an index a wave.
            row_reduction_launch(target, self.n, 8),
            vec![buffer("x", Elem::F32, per("rows", self.n), false), buffer("out", Elem::I32, per("rows", 1), true)],
            vec![scalar("rows", MAX_ROWS)],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        row_reduction_checks(k, c, 8);
    }

    fn tolerance(&self) -> f64 {
        // The same float operations as the CPU reference: bit for bit.
        0.0
    }

    fn context(&self, _k: &KernelRecord, _target: &Target) -> Value {
        json!({ "n": self.n })
    }
}
