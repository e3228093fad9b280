//! `moe_group`: a prompt chunk's mixture-of-experts routing, its choices grouped by
//! expert for the grouped expert GEMMs ([`super::ExpertGemm`]).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, fixed_len, launch, per, scalar, untuned};
use crate::plan::rules::{MAX_EXPERT_CHUNK, MAX_EXPERTS};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// Routes up to [`MAX_EXPERT_CHUNK`] tokens as [`super::MoeRoute`] does (each token's
/// `used` experts of the largest router logits, ties to the lower expert, weighted by
/// the softmax over their logits: `weights[t·used + j]`) and groups the choices by
/// expert: `offsets[e]..offsets[e + 1]` are expert `e`'s positions in `order`, which
/// lists its choices `t·used + j` by ascending token.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeGroup {
    /// Experts per layer.
    pub experts: u32,
    /// Experts each token uses.
    pub used: u32,
}

/// Threads of the one block: as many waves as a block holds, a token a wave at a time.
fn threads(target: &Target) -> u32 {
    target.device.max_threads_per_block.min(1024)
}

/// Shared bytes: per expert its count and first position (one more), and the chunk's
/// choices, two bytes each.
fn shared_bytes(experts: u32, used: u32) -> u32 {
    (2 * experts + 1) * 4 + (MAX_EXPERT_CHUNK * used * 2).next_multiple_of(4)
}

impl KernelOp for MoeGroup {
    fn kernel_name(&self) -> String {
        format!("moe_group_{}x{}", self.experts, self.used)
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let MoeGroup { experts, used } = *self;
        let grid = [Dim::Fixed(1), Dim::Fixed(1), Dim::Fixed(1)];
        untuned(
            launch(target, grid, threads(target), shared_bytes(experts, used)),
            vec![
                buffer("logits", Elem::F32, per("tokens", experts), false),
                buffer("weights", Elem::F32, per("tokens", used), true),
                buffer("offsets", Elem::I32, fixed_len(experts + 1), true),
                buffer("order", Elem::I32, per("tokens", used), true),
            ],
            vec![scalar("tokens", MAX_EXPERT_CHUNK)],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let MoeGroup { experts, used } = *self;
        if used == 0 || used > experts.min(32) || experts > MAX_EXPERTS || experts > u32::from(u16::MAX) {
            c.fail("experts a token", format!("{used} of {experts}"), format!("1 to 32 of at most {MAX_EXPERTS}"));
        }
        if k.launch.grid != [Dim::Fixed(1), Dim::Fixed(1), Dim::Fixed(1)] {
            c.fail("grid", format!("{:?}", k.launch.grid), "one block groups the chunk".into());
        }
        c.shared(shared_bytes(experts, used), "each expert's count and start, and the chunk's choices".into());
        c.extents.push(("offsets", u64::from(experts) + 1));
    }

    fn tolerance(&self) -> f64 {
        // Expert positions exactly; weights through approximate exp.
        2e-6
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let MoeGroup { experts, used } = *self;
        json!({
            "experts": experts, "used": used, "max_chunk": MAX_EXPERT_CHUNK,
            "choices": (MAX_EXPERT_CHUNK * used).next_multiple_of(2),
            "per_lane": experts.div_ceil(k.launch.wave_size), "waves": k.launch.waves,
        })
    }
}
