//! `moe_sum`: the experts' outputs combined with their routing weights (after the last
//! layer; elsewhere the next norm sums them, see [`super::add_rmsnorm`]).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, launch, per, rows, scalar, untuned};
use crate::plan::rules::{ELEMENTWISE_THREADS, MAX_TOKENS};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// `y[t][c] = Σ_j weights[t][j] · parts[t·used + j][c]` in ascending `j`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeSum {
    /// Row length.
    pub n: u32,
    /// Experts each token uses.
    pub used: u32,
}

impl KernelOp for MoeSum {
    fn kernel_name(&self) -> String {
        format!("moe_sum_{}_k{}", self.n, self.used)
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let MoeSum { n, used } = *self;
        let threads = ELEMENTWISE_THREADS.min(n.next_multiple_of(target.device.wave_size));
        untuned(
            launch(target, [Dim::Fixed(n.div_ceil(threads)), rows("tokens"), Dim::Fixed(1)], threads, 0),
            vec![
                buffer("parts", Elem::F32, per("tokens", used * n), false),
                buffer("weights", Elem::F32, per("tokens", used), false),
                buffer("y", Elem::F32, per("tokens", n), true),
            ],
            vec![scalar("tokens", MAX_TOKENS)],
        )
    }

    fn check(&self, _k: &KernelRecord, c: &mut Checker) {
        c.covers(u64::from(self.n), c.grid_x());
    }

    fn tolerance(&self) -> f64 {
        1e-6
    }

    fn context(&self, _k: &KernelRecord, _target: &Target) -> Value {
        json!({ "n": self.n, "used": self.used })
    }
}
