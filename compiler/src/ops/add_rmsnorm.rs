//! `add_rmsnorm`: the residual add and the next norm in one pass, optionally summing a
//! mixture-of-experts layer's outputs or norming the block's output first (Gemma), and
//! quantizing the result for int8 products.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::rmsnorm::{float_literal_check, norm_checks};
use super::{Checker, KernelOp, Parts, block_per_row, buffer, c_float, fixed_len, launch, per, rows, scalar, untuned};
use crate::plan::rules::{MAX_ROWS, NORM_THREADS};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// `sum[r] = a[r] + b[r]` (or `a[r] + rmsnorm(b[r]) · wb`), then `y[r] = rmsnorm(sum[r]) · w`:
/// the residual add and the next norm in one pass (one launch instead of two or three,
/// each row read once).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AddRmsNorm {
    /// Row length.
    pub n: u32,
    /// Epsilon.
    pub eps: f32,
    /// Also writes `y` quantized to int8 (as [`super::QuantizeQ8`] would), for int8-dot
    /// GEMVs that read it: one launch fewer.
    #[serde(default)]
    pub q8: bool,
    /// With `k` > 0, `b` is the experts' output of a mixture-of-experts layer:
    /// `b[r] = Σ_j weights[r][j] · parts[r·k + j]` (as [`super::MoeSum`]), summed here
    /// instead of by a launch of its own.
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub experts: u32,
    /// `b` is RMS-normed with its own weights `wb` before the add: Gemma's norm of a
    /// block's output, in the same pass.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub norm_b: bool,
}

impl KernelOp for AddRmsNorm {
    fn kernel_name(&self) -> String {
        let AddRmsNorm { n, q8, experts, norm_b, .. } = self;
        let moe = if *experts > 0 { format!("_moe{experts}") } else { String::new() };
        let post = if *norm_b { "_normed" } else { "" };
        format!("add{post}_rmsnorm{moe}{}_{n}", if *q8 { "_q8" } else { "" })
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let AddRmsNorm { n, q8, experts, norm_b, .. } = *self;
        let threads = block_per_row(target, n, NORM_THREADS);
        let mut buffers = vec![buffer("a", Elem::F32, per("rows", n), false)];
        if experts > 0 {
            buffers.push(buffer("parts", Elem::F32, per("rows", experts * n), false));
            buffers.push(buffer("weights", Elem::F32, per("rows", experts), false));
        } else {
            buffers.push(buffer("b", Elem::F32, per("rows", n), false));
        }
        if norm_b {
            buffers.push(buffer("wb", Elem::F32, fixed_len(n), false));
        }
        buffers.extend([
            buffer("w", Elem::F32, fixed_len(n), false),
            buffer("sum", Elem::F32, per("rows", n), true),
            buffer("y", Elem::F32, per("rows", n), true),
        ]);
        if q8 {
            buffers.push(buffer("xq", Elem::U8, per("rows", n), true));
            buffers.push(buffer("xd", Elem::F32, per("rows", n / 16), true));
        }
        let shared = threads / target.device.wave_size * 4;
        untuned(
            launch(target, [rows("rows"), Dim::Fixed(1), Dim::Fixed(1)], threads, shared),
            buffers,
            vec![scalar("rows", MAX_ROWS)],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        norm_checks(k, c, self.n);
        float_literal_check(c, "epsilon", self.eps);
        if self.q8 && !self.n.is_multiple_of(32) {
            c.fail("row length", self.n.to_string(), "its int8 quants are whole 32-element chunks".into());
        }
        c.extents.push(("w", u64::from(self.n)));
        if self.norm_b {
            c.extents.push(("wb", u64::from(self.n)));
            if self.experts > 0 {
                c.fail("normed addend", "the experts' sum".into(), "a block's output buffer".into());
            }
        }
    }

    fn tolerance(&self) -> f64 {
        1e-4
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let AddRmsNorm { n, eps, q8, experts, norm_b } = *self;
        let per_thread = n.div_ceil(k.launch.threads);
        json!({ "n": n, "eps": c_float(eps), "q8": q8, "experts": experts, "norm_b": norm_b, "per_thread": per_thread })
    }
}
