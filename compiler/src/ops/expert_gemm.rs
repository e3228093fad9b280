//! `expert_gemm`: a prompt chunk's routed experts' products, grouped by expert, a mode of
//! the int8 GEMM template (`gemm_q8`): block (x, y) takes rows tile x of the y-th tile of
//! the chunk's choices as `moe_group` left them grouped by expert, so each expert's
//! matrix is read once a tile of the tokens that chose it.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::gemm::{Tiles, check_extents, check_tiles, q8_context};
use super::{Checker, ExpertInput, KernelOp, Parts, buffer, fixed_len, launch, launch_dynamic, per, scalar, untuned};
use crate::plan::rules::{self, MAX_EXPERT_CHUNK, MAX_EXPERT_SLOTS};
use crate::plan::{Dim, Elem, KernelRecord, Options, Tuning};
use crate::quant::GgmlType;
use crate::target::Target;

/// `y[t·used + j]` = the product of token `t`'s `j`-th chosen expert's matrix (at slot
/// `slot_of[expert]` of a pool) with its input row (the token's, or the choice's own),
/// for a chunk of `tokens` tokens grouped by `moe_group`: `offsets[e]..offsets[e + 1]`
/// are expert `e`'s positions in `order`, which holds the choices `t·used + j`. Only
/// the int8 path ([`rules::expert_gemm_q8`]): the plan takes it where that exists.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertGemm {
    /// Weight type.
    pub quant: GgmlType,
    /// Output features of one expert's matrix.
    pub rows: u32,
    /// Input features.
    pub cols: u32,
    /// Experts each token uses.
    pub used: u32,
    /// Experts per layer.
    pub experts: u32,
    /// Which input row a choice reads.
    pub input: ExpertInput,
}

impl ExpertGemm {
    /// Bytes of one expert's matrix in the pool.
    fn matrix_bytes(&self) -> u64 {
        u64::from(self.rows) * self.quant.row_bytes(u64::from(self.cols)).unwrap_or(0)
    }

    /// Input rows a token: its own (gate·up), or one a choice (down).
    fn inputs_per_token(&self) -> u32 {
        match self.input {
            ExpertInput::Token => 1,
            ExpertInput::Choice => self.used,
        }
    }

    /// The most tiles of `tile_tokens` choices a chunk groups into: its choices in whole
    /// tiles, and a part-filled tile for each expert at most.
    pub fn max_tiles(&self, tile_tokens: u32) -> u32 {
        let choices = MAX_EXPERT_CHUNK * self.used;
        choices.div_ceil(tile_tokens.max(1)) + self.experts.min(choices)
    }
}

impl KernelOp for ExpertGemm {
    fn kernel_name(&self) -> String {
        let ExpertGemm { quant, rows, cols, used, experts, input } = self;
        let input = match input {
            ExpertInput::Token => "",
            ExpertInput::Choice => "_choice",
        };
        let q = quant.name().to_ascii_lowercase();
        format!("expert_gemm{input}_{q}_{experts}x{rows}x{cols}_k{used}")
    }

    fn record(&self, target: &Target, options: &Options) -> Parts {
        let ExpertGemm { quant, rows, cols, used, experts, .. } = *self;
        let per_token = self.inputs_per_token();
        let buffers = vec![
            buffer("w", Elem::U8, per("slots", self.matrix_bytes() as u32), false),
            buffer("slot_of", Elem::I32, fixed_len(experts), false),
            buffer("offsets", Elem::I32, fixed_len(experts + 1), false),
            buffer("order", Elem::I32, per("tokens", used), false),
            buffer("xq", Elem::U8, per("tokens", per_token * cols), false),
            buffer("xd", Elem::F32, per("tokens", per_token * cols / 16), false),
            buffer("y", Elem::F32, per("tokens", used * rows), true),
        ];
        let scalars = vec![scalar("tokens", MAX_EXPERT_CHUNK), scalar("slots", MAX_EXPERT_SLOTS)];
        // Without an int8 path the record has no tuning: the check refuses it.
        let Some(t) = rules::expert_gemm_q8(target, options, quant, rows, cols) else {
            let grid = [Dim::Fixed(1), Dim::Fixed(1), Dim::Fixed(1)];
            return untuned(launch(target, grid, target.device.wave_size, 0), buffers, scalars);
        };
        let grid = [Dim::Fixed(rows.div_ceil(t.tile_rows)), Dim::Fixed(self.max_tiles(t.tile_tokens)), Dim::Fixed(1)];
        let shared = super::Gemm::q8_shared_bytes(quant, &t);
        Parts {
            launch: launch_dynamic(target, grid, t.waves * target.device.wave_size, shared),
            tuning: Tuning::GemmQ8(t),
            buffers,
            scalars,
        }
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let ExpertGemm { quant, rows, cols, used, experts, .. } = *self;
        if used == 0 || used > experts || experts > rules::MAX_EXPERTS {
            c.fail(
                "experts a token",
                format!("{used} of {experts}"),
                format!("1 to all of at most {} experts", rules::MAX_EXPERTS),
            );
        }
        if !matches!(k.tuning, Tuning::GemmQ8(_)) {
            c.tuning_missing("the experts' GEMM takes the int8 path only (the plan reads such chunks in windows)");
            return;
        }
        let Some(Tiles { rows: tile_rows, tokens: tile_tokens, blocks, .. }) = check_tiles(k, c, quant, cols) else {
            return;
        };
        if blocks != 0 {
            c.fail("stream-K blocks", blocks.to_string(), "none: a block a tile".into());
        }
        if c.grid_x().saturating_mul(u64::from(tile_rows)) < u64::from(rows) {
            c.fail("rows covered by the grid", c.grid_x().to_string(), format!("the matrix has {rows}"));
        }
        let tiles = self.max_tiles(tile_tokens);
        if k.launch.grid[1] != Dim::Fixed(tiles) {
            let want = format!("{tiles}: a chunk's choices grouped by expert in tiles of {tile_tokens}");
            c.fail("grid y", format!("{:?}", k.launch.grid[1]), want);
        }
        let per_token = self.inputs_per_token();
        let buffers = [("xq", per_token * cols), ("xd", per_token * cols / 16), ("order", used), ("y", used * rows)];
        check_extents(k, c, buffers.into_iter());
        c.extents.push(("slot_of", u64::from(experts)));
        c.extents.push(("offsets", u64::from(experts) + 1));
    }

    fn weights(&self) -> Option<GgmlType> {
        Some(self.quant)
    }

    fn tolerance(&self) -> f64 {
        2e-3
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let ExpertGemm { quant, rows, cols, used, experts, input } = *self;
        let Tuning::GemmQ8(t) = &k.tuning else { return json!({}) };
        let grouped = json!({
            "grouped": true, "experts": experts, "used": used, "choice_input": input == ExpertInput::Choice,
            "matrix_bytes": self.matrix_bytes(), "w_len": self.matrix_bytes(),
            "x_rows": if input == ExpertInput::Choice { format!("tokens * {used}u") } else { "tokens".into() },
        });
        super::merge(q8_context(k, quant, rows, cols, t), grouped)
    }

    fn uses_matrix_unit(&self) -> bool {
        true
    }

    fn template(&self, _k: &KernelRecord) -> Option<&'static str> {
        Some("gemm_q8")
    }
}
