//! `rmsnorm`: a row norm, or qwen3's per-head query and key norms in one launch.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, block_per_row, buffer, c_float, fixed_len, launch, per, rows, scalar, untuned};
use crate::plan::rules::{MAX_ROWS, NORM_THREADS};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// `y[r] = x[r] · w / sqrt(mean(x[r]²) + eps)` over rows of `n`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RmsNorm {
    /// Row length.
    pub n: u32,
    /// Epsilon.
    pub eps: f32,
    /// `[q, k]`: the rows are a token's `q` query heads then its `k` key heads (a
    /// decode step's Q·K·V product), `w` holds the query norm then the key norm, and
    /// each row takes its own: qwen3's per-head norms in one launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk: Option<[u32; 2]>,
}

impl KernelOp for RmsNorm {
    fn kernel_name(&self) -> String {
        match self.qk {
            None => format!("rmsnorm_{}", self.n),
            Some([q, k]) => format!("rmsnorm_qk{q}x{k}_{}", self.n),
        }
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let n = self.n;
        let threads = block_per_row(target, n, NORM_THREADS);
        let weights = if self.qk.is_some() { 2 * n } else { n };
        untuned(
            launch(
                target,
                [rows("rows"), Dim::Fixed(1), Dim::Fixed(1)],
                threads,
                threads / target.device.wave_size * 4,
            ),
            vec![
                buffer("x", Elem::F32, per("rows", n), false),
                buffer("w", Elem::F32, fixed_len(weights), false),
                buffer("y", Elem::F32, per("rows", n), true),
            ],
            vec![scalar("rows", MAX_ROWS)],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        norm_checks(k, c, self.n);
        float_literal_check(c, "epsilon", self.eps);
        c.extents.push(("w", u64::from(if self.qk.is_some() { 2 * self.n } else { self.n })));
    }

    fn tolerance(&self) -> f64 {
        1e-4
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let RmsNorm { n, eps, qk } = *self;
        json!({
            "n": n, "eps": c_float(eps), "per_thread": n.div_ceil(k.launch.threads),
            "qk": qk.is_some(), "q_heads": qk.map_or(0, |[q, _]| q), "period": qk.map_or(1, |[q, k]| q + k),
        })
    }
}

/// A constant rendered into a kernel as a C float literal must be finite and positive:
/// `NaNf` or `inff` would reach clang as an undeclared name (the model description
/// refuses such values first; this keeps any other caller from emitting them).
pub(crate) fn float_literal_check(c: &mut Checker, what: &str, v: f32) {
    if !(v.is_finite() && v > 0.0) {
        c.fail(what, v.to_string(), "a finite value above 0".into());
    }
}

/// Elements of a row a norm's thread keeps in registers, at most (with their weights:
/// twice as many registers).
pub const MAX_PER_THREAD: u32 = 32;

/// A norm's block takes one row (grid x), its threads hold a few elements each in
/// registers, and sums through one float a wave in shared memory.
pub(crate) fn norm_checks(k: &KernelRecord, c: &mut Checker, n: u32) {
    let l = &k.launch;
    if l.grid[1] != Dim::Fixed(1) || l.grid[2] != Dim::Fixed(1) {
        c.fail("grid", format!("{:?}", l.grid), "one block a row, along x".into());
    }
    let per_thread = n.div_ceil(l.threads.max(1));
    if per_thread > MAX_PER_THREAD {
        c.fail(
            "elements a thread keeps in registers",
            per_thread.to_string(),
            format!("at most {MAX_PER_THREAD} (rows of {n} over {} threads)", l.threads),
        );
    }
    c.shared(l.waves * 4, format!("the partial sums of {} waves", l.waves));
}
