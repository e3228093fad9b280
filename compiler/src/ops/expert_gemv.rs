//! `expert_gemv`: a window's routed experts' products in one launch, a mode of the GEMV
//! templates (`ops/expert_select` finds each union entry's matrix in its pool).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::gemv::{check_tuning, float_shared_bytes, gemv_context, q8_shared_bytes};
use super::{Checker, KernelOp, Parts, RouteLayout, buffer, fixed_len, launch, per, scalar};
use crate::plan::rules::{self, MAX_EXPERT_SLOTS, Q8_BLOCKS_PER_CU};
use crate::plan::{Dim, Elem, KernelRecord, MAX_WINDOW, Options, Tuning};
use crate::quant::GgmlType;
use crate::target::Target;

/// The selected experts' products of a window in one launch: grid row `u` takes the
/// union's expert `u` (its matrix at slot `slot_of[expert]` of a pool of matrices)
/// and multiplies it with the input of every token that chose it, reading the
/// weights once for all of them; the result of token `t`'s choice `j` goes to row
/// `t·used + j` of `y`. The int8 path wherever the type and target have it
/// ([`Options::int8`] can turn it off): one launch reads the whole union's matrices,
/// however small each is.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertGemv {
    /// Weight type.
    pub quant: GgmlType,
    /// Output features of one expert's matrix.
    pub rows: u32,
    /// Input features.
    pub cols: u32,
    /// Tokens per launch.
    pub window: u32,
    /// Experts each token uses.
    pub used: u32,
    /// Experts per layer.
    pub experts: u32,
    /// Which input row a choice reads.
    pub input: ExpertInput,
}

/// The input row an expert product reads for token `t`'s choice `j`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertInput {
    /// Row `t`: the token's normed hidden state (gate·up).
    Token,
    /// Row `t·used + j`: the choice's own activation (down).
    Choice,
}

impl ExpertGemv {
    /// Bytes of one expert's matrix in the pool.
    fn matrix_bytes(&self) -> u64 {
        u64::from(self.rows) * self.quant.row_bytes(u64::from(self.cols)).unwrap_or(0)
    }
}

impl KernelOp for ExpertGemv {
    fn kernel_name(&self) -> String {
        let ExpertGemv { quant, rows, cols, window, used, experts, input } = self;
        let input = match input {
            ExpertInput::Token => "",
            ExpertInput::Choice => "_choice",
        };
        let q = quant.name().to_ascii_lowercase();
        format!("expert_gemv{input}_{q}_{experts}x{rows}x{cols}_k{used}_t{window}")
    }

    fn record(&self, target: &Target, options: &Options) -> Parts {
        let ExpertGemv { quant, rows, cols, window, used, experts, input } = *self;
        let wave = target.device.wave_size;
        let int8 = Options { int8: options.int8.max_for_experts(), ..options.clone() };
        let layout = RouteLayout::new(experts, used);
        let union = layout.union(window);
        let in_rows = match input {
            ExpertInput::Token => window,
            ExpertInput::Choice => window * used,
        };
        let mut buffers = vec![
            buffer("w", Elem::U8, per("slots", self.matrix_bytes() as u32), false),
            buffer("route", Elem::I32, fixed_len(layout.len()), false),
            buffer("slot_of", Elem::I32, fixed_len(experts), false),
        ];
        let (launch, tuning) = match rules::gemv_q8(quant, rows, cols, window, target, &int8) {
            Some(t) => {
                let cap = (target.device.compute_units * Q8_BLOCKS_PER_CU).div_ceil(union).max(1);
                let blocks = rows.div_ceil(t.rows_per_wave * t.waves).min(cap);
                buffers.extend([
                    buffer("xq", Elem::U8, fixed_len(in_rows * cols), false),
                    buffer("xd", Elem::F32, fixed_len(in_rows * cols / 32 * 2), false),
                ]);
                let grid = [Dim::Fixed(blocks), Dim::Fixed(union), Dim::Fixed(1)];
                (launch(target, grid, t.waves * wave, q8_shared_bytes(&t)), Tuning::GemvQ8(t))
            }
            None => {
                let t = rules::gemv(rows, cols, window, target);
                buffers.push(buffer("x", Elem::F32, fixed_len(in_rows * cols), false));
                let grid = [Dim::Fixed(rows.div_ceil(t.rows_per_block)), Dim::Fixed(union), Dim::Fixed(1)];
                (launch(target, grid, t.waves * wave, float_shared_bytes(&t, window)), Tuning::Gemv(t))
            }
        };
        buffers.push(buffer("y", Elem::F32, fixed_len(window * used * rows), true));
        Parts { launch, tuning, buffers, scalars: vec![scalar("slots", MAX_EXPERT_SLOTS)] }
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let ExpertGemv { quant, rows, cols, window, used, experts, .. } = *self;
        c.window(window);
        if used == 0 || used > experts || experts > rules::MAX_EXPERTS {
            c.fail(
                "experts a token",
                format!("{used} of {experts}"),
                format!("1 to all of at most {} experts", rules::MAX_EXPERTS),
            );
        }
        let union = RouteLayout::new(experts, used).union(window);
        if k.launch.grid[1] != Dim::Fixed(union) {
            c.fail(
                "grid y",
                format!("{:?}", k.launch.grid[1]),
                format!("a block row for each of the window's up to {union} routed experts"),
            );
        }
        check_tuning(k, c, quant, rows, cols, window);
        c.extents.push(("route", u64::from(RouteLayout::new(experts, used).len())));
        c.extents.push(("slot_of", u64::from(experts)));
        c.extents.push(("y", u64::from(window * used * rows)));
    }

    fn weights(&self) -> Option<GgmlType> {
        Some(self.quant)
    }

    fn tolerance(&self) -> f64 {
        2e-4
    }

    fn context(&self, k: &KernelRecord, target: &Target) -> Value {
        let ExpertGemv { quant, rows, cols, window, used, experts, input } = *self;
        let matrix_bytes = self.matrix_bytes();
        let layout = RouteLayout::new(experts, used);
        let weights = json!({
            "experts": experts, "used": used, "choice_input": input == ExpertInput::Choice,
            "matrix_bytes": matrix_bytes, "max_window": MAX_WINDOW,
            "pick_base": layout.pick(0, 0), "route_len": layout.len(),
            "w_base": format!("(u64)slot * {matrix_bytes}u + "),
            "w_len": format!("(u64)slots * {matrix_bytes}u"),
        });
        let ctx = super::merge(gemv_context(k, target, quant, rows, cols, window), weights);
        super::merge(ctx, super::Stack::SINGLE.context())
    }

    fn template(&self, k: &KernelRecord) -> Option<&'static str> {
        Some(super::gemv::template(k))
    }
}
