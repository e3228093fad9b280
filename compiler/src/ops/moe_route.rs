//! `moe_route`: a window's mixture-of-experts routing, and where it leaves it
//! ([`RouteLayout`]) for the expert products and the host's expert cache.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, fixed_len, launch, per, scalar, untuned};
use crate::plan::rules::{MAX_EXPERTS, WAVES_PER_BLOCK};
use crate::plan::{Dim, Elem, KernelRecord, MAX_WINDOW, Options};
use crate::target::Target;

/// Mixture-of-experts routing of a window: each token's `used` experts of the largest
/// router logits (ties: the lower expert) with weights the softmax over those logits
/// (Qwen3-MoE's normalized top-k probabilities), and the window's union of chosen
/// experts in ascending order with, per union entry and token, which of the token's
/// choices it is. Layout: [`RouteLayout`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeRoute {
    /// Experts per layer.
    pub experts: u32,
    /// Experts each token uses.
    pub used: u32,
}

/// Where [`MoeRoute`] leaves the window's routing in its `route` buffer (i32):
/// `[0]` the union's size `U`; `[1 + u]` the union's experts, ascending; `[pick(u, t)]`
/// which of token `t`'s choices expert `u` is, or −1. Sized for [`MAX_WINDOW`] tokens,
/// so one record serves every window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteLayout {
    /// Experts each token uses.
    pub used: u32,
    /// The largest union: `min(MAX_WINDOW · used, experts)`.
    pub capacity: u32,
}

impl RouteLayout {
    /// The layout for a layer of `experts` experts, `used` a token.
    pub fn new(experts: u32, used: u32) -> RouteLayout {
        RouteLayout { used, capacity: (MAX_WINDOW * used).min(experts) }
    }

    /// Index of `pick(u, t)`.
    pub fn pick(&self, u: u32, t: u32) -> u32 {
        1 + self.capacity + u * MAX_WINDOW + t
    }

    /// i32s of the `route` buffer.
    pub fn len(&self) -> u32 {
        1 + self.capacity * (1 + MAX_WINDOW)
    }

    /// Always false: the count is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The largest union of a window of `window` tokens.
    pub fn union(&self, window: u32) -> u32 {
        (window * self.used).min(self.capacity)
    }
}

/// Shared bytes: per expert the tokens that chose it; per token its choices and their
/// logits; a bit per expert.
fn shared_bytes(experts: u32, used: u32) -> u32 {
    (experts + 2 * MAX_WINDOW * used + experts.div_ceil(32)) * 4
}

impl KernelOp for MoeRoute {
    fn kernel_name(&self) -> String {
        format!("moe_route_{}x{}", self.experts, self.used)
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let MoeRoute { experts, used } = *self;
        // A wave a token (its top-k by repeated wave argmax), as many waves as fit.
        let threads = (WAVES_PER_BLOCK * target.device.wave_size).min(target.device.max_threads_per_block);
        let layout = RouteLayout::new(experts, used);
        untuned(
            launch(target, [Dim::Fixed(1), Dim::Fixed(1), Dim::Fixed(1)], threads, shared_bytes(experts, used)),
            vec![
                buffer("logits", Elem::F32, per("tokens", experts), false),
                buffer("route", Elem::I32, fixed_len(layout.len()), true),
                buffer("weights", Elem::F32, fixed_len(MAX_WINDOW * used), true),
            ],
            vec![scalar("tokens", MAX_WINDOW)],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let MoeRoute { experts, used } = *self;
        if used == 0 || used > experts.min(32) || experts > MAX_EXPERTS {
            c.fail("experts a token", format!("{used} of {experts}"), format!("1 to 32 of at most {MAX_EXPERTS}"));
        }
        // One block routes the whole window.
        if k.launch.grid != [Dim::Fixed(1), Dim::Fixed(1), Dim::Fixed(1)] {
            c.fail("grid", format!("{:?}", k.launch.grid), "one block routes the window".into());
        }
        c.shared(shared_bytes(experts, used), "each expert's tokens, each token's choices and a bit an expert".into());
        c.extents.push(("route", u64::from(RouteLayout::new(experts, used).len())));
        c.extents.push(("weights", u64::from(MAX_WINDOW * used)));
    }

    fn tolerance(&self) -> f64 {
        // Expert ids exactly (one off in a list of 8 is 1e-1); weights through approximate exp.
        2e-6
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let MoeRoute { experts, used } = *self;
        let layout = RouteLayout::new(experts, used);
        json!({
            "experts": experts, "used": used, "max_window": MAX_WINDOW, "words": experts.div_ceil(32),
            "per_lane": experts.div_ceil(k.launch.wave_size), "capacity": layout.capacity,
            "route_len": layout.len(),
        })
    }
}
