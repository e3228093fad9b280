//! `add`: elementwise sum of two rows a token, or a bias row added to every row; the
//! one op that may run in place (`y` = `a`).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, fixed_len, launch, per, rows, scalar, untuned};
use crate::plan::rules::{ELEMENTWISE_THREADS, MAX_TOKENS};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// `y[i] = a[i] + b[i]` over rows of `n`; with `broadcast`, `b` is one row added to
/// every row (biases).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Add {
    /// Row length.
    pub n: u32,
    /// Whether `b` is a single row.
    pub broadcast: bool,
}

impl KernelOp for Add {
    fn kernel_name(&self) -> String {
        match self.broadcast {
            false => format!("add_{}", self.n),
            true => format!("add_bias_{}", self.n),
        }
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let Add { n, broadcast } = *self;
        let threads = ELEMENTWISE_THREADS.min(n.next_multiple_of(target.device.wave_size));
        let grid = [Dim::Fixed(n.div_ceil(threads)), rows("tokens"), Dim::Fixed(1)];
        let b = if broadcast { fixed_len(n) } else { per("tokens", n) };
        untuned(
            launch(target, grid, threads, 0),
            vec![
                buffer("a", Elem::F32, per("tokens", n), false),
                buffer("b", Elem::F32, b, false),
                buffer("y", Elem::F32, per("tokens", n), true),
            ],
            vec![scalar("tokens", MAX_TOKENS)],
        )
    }

    fn check(&self, _k: &KernelRecord, c: &mut Checker) {
        c.covers(u64::from(self.n), c.grid_x());
        if self.broadcast {
            c.extents.push(("b", u64::from(self.n)));
        }
    }

    fn tolerance(&self) -> f64 {
        1e-5
    }

    fn context(&self, _k: &KernelRecord, _target: &Target) -> Value {
        let Add { n, broadcast } = *self;
        json!({ "n": n, "broadcast": broadcast, "b_index": if broadcast { "i" } else { "at" } })
    }

    fn in_place(&self) -> bool {
        true
    }
}
