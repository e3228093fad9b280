//! `softmax`: rows normalized in place (sampling's probabilities on the device).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, block_per_row, buffer, launch, per, rows, scalar, untuned};
use crate::plan::rules::MAX_ROWS;
use crate::plan::{Dim, Elem, KernelRecord, Launch, Options};
use crate::target::Target;

/// In-place softmax over rows of `n`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Softmax {
    /// Row length.
    pub n: u32,
}

impl KernelOp for Softmax {
    fn kernel_name(&self) -> String {
        format!("softmax_{}", self.n)
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        untuned(
            row_reduction_launch(target, self.n, 4),
            vec![buffer("x", Elem::F32, per("rows", self.n), true)],
            vec![scalar("rows", MAX_ROWS)],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        row_reduction_checks(k, c, 4);
    }

    fn tolerance(&self) -> f64 {
        1e-4
    }

    fn context(&self, _k: &KernelRecord, _target: &Target) -> Value {
        json!({ "n": self.n })
    }
}

/// A block a row of `n` (grid x, at most a runtime `rows`), striding over it, with
/// `bytes` of shared memory a wave to combine the waves' results.
pub(crate) fn row_reduction_launch(target: &Target, n: u32, bytes: u32) -> Launch {
    let threads = block_per_row(target, n, 1024).min(target.device.max_threads_per_block);
    launch(target, [rows("rows"), Dim::Fixed(1), Dim::Fixed(1)], threads, threads / target.device.wave_size * bytes)
}

/// A row reduction's block takes one row (grid x), strides over it, and combines its
/// waves through `bytes` of shared memory a wave.
pub(crate) fn row_reduction_checks(k: &KernelRecord, c: &mut Checker, bytes: u32) {
    let l = &k.launch;
    if l.grid[1] != Dim::Fixed(1) || l.grid[2] != Dim::Fixed(1) {
        c.fail("grid", format!("{:?}", l.grid), "one block a row, along x".into());
    }
    c.shared(l.waves * bytes, format!("{bytes} bytes for each of {} waves", l.waves));
}
