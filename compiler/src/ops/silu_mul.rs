//! `silu_mul`: the gated FFN's activation, optionally over stacked gate·up rows (the
//! experts' product) and quantizing its output for the int8 down projection.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, launch, per, rows, scalar, untuned};
use crate::plan::rules::{ELEMENTWISE_THREADS, MAX_TOKENS};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// `y[i] = silu(gate[i]) · up[i]` over rows of `n`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiluMul {
    /// Row length.
    pub n: u32,
    /// Also writes `y` quantized to int8, as [`super::AddRmsNorm`]'s `q8`.
    #[serde(default)]
    pub q8: bool,
    /// Gate and up are one input `gate_up` whose rows are `[gate (n) | up (n)]`, as
    /// the experts' stacked gate·up product writes them.
    #[serde(default)]
    pub paired: bool,
}

impl KernelOp for SiluMul {
    fn kernel_name(&self) -> String {
        let SiluMul { n, q8, paired } = self;
        format!("silu_mul{}{}_{n}", if *paired { "_paired" } else { "" }, if *q8 { "_q8" } else { "" })
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let SiluMul { n, q8, paired } = *self;
        let threads = ELEMENTWISE_THREADS.min(n.next_multiple_of(target.device.wave_size));
        let grid = [Dim::Fixed(n.div_ceil(threads)), rows("tokens"), Dim::Fixed(1)];
        let mut buffers = if paired {
            vec![buffer("gate_up", Elem::F32, per("tokens", 2 * n), false)]
        } else {
            vec![buffer("gate", Elem::F32, per("tokens", n), false), buffer("up", Elem::F32, per("tokens", n), false)]
        };
        buffers.push(buffer("y", Elem::F32, per("tokens", n), true));
        if q8 {
            buffers.push(buffer("xq", Elem::U8, per("tokens", n), true));
            buffers.push(buffer("xd", Elem::F32, per("tokens", n / 16), true));
        }
        untuned(launch(target, grid, threads, 0), buffers, vec![scalar("tokens", MAX_TOKENS)])
    }

    fn check(&self, _k: &KernelRecord, c: &mut Checker) {
        c.covers(u64::from(self.n), c.grid_x());
        if self.q8 && !self.n.is_multiple_of(32) {
            c.fail("row length", self.n.to_string(), "its int8 quants are whole 32-element chunks".into());
        }
    }

    fn tolerance(&self) -> f64 {
        1e-5
    }

    fn context(&self, _k: &KernelRecord, _target: &Target) -> Value {
        json!({ "n": self.n, "q8": self.q8, "paired": self.paired })
    }
}
