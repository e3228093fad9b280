//! `expert_gemm`: a prompt chunk's routed experts' products, grouped by expert, a mode of
//! the int8 GEMM template (`gemm_q8`): block (x, y) takes rows tile x of the y-th tile of
//! the chunk's choices as `moe_group` left them grouped by expert, so each expert's
//! matrix is read once a tile of the tokens that chose it.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::gemm::{Tiles, check_extents, check_tiles, f16_context, q8_context};
use super::{Checker, ExpertInput, Gemm, KernelOp, Parts, buffer, fixed_len, launch_dynamic, per, scalar};
use crate::plan::rules::{self, MAX_EXPERT_CHUNK, MAX_EXPERT_SLOTS};
use crate::plan::{Dim, Elem, KernelRecord, Options, Tuning};
use crate::quant::GgmlType;
use crate::target::Target;

/// `y[t·used + j]` = the product of token `t`'s `j`-th chosen expert's matrix (at slot
/// `slot_of[expert]` of a pool) with its input row (the token's, or the choice's own),
/// for a chunk of `tokens` tokens grouped by `moe_group`: `offsets[e]..offsets[e + 1]`
/// are expert `e`'s positions in `order`, which holds the choices `t·used + j`. The
/// int8 path where the type and target have it ([`rules::expert_gemm_q8`]), else the
/// f16 one ([`rules::expert_gemm`]).
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

    /// Whether a pool's matrices can take the grouped GEMM: each slot's copies start
    /// 16-byte aligned.
    pub fn fits(&self) -> bool {
        self.matrix_bytes() > 0 && self.matrix_bytes().is_multiple_of(16)
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
        let (tile_rows, tile_tokens, waves, shared, tuning) =
            match rules::expert_gemm_q8(target, options, quant, rows, cols) {
                Some(t) => (t.tile_rows, t.tile_tokens, t.waves, Gemm::q8_shared_bytes(quant, &t), Tuning::GemmQ8(t)),
                None => {
                    let t = rules::expert_gemm(target, options, quant, cols);
                    (t.tile_rows, t.tile_tokens, t.waves, Gemm::shared_bytes(quant, &t), Tuning::Gemm(t))
                }
            };
        let mut buffers = vec![
            buffer("w", Elem::U8, per("slots", self.matrix_bytes() as u32), false),
            buffer("slot_of", Elem::I32, fixed_len(experts), false),
            buffer("offsets", Elem::I32, fixed_len(experts + 1), false),
            buffer("order", Elem::I32, per("tokens", used), false),
        ];
        match tuning {
            Tuning::GemmQ8(_) => buffers.extend([
                buffer("xq", Elem::U8, per("tokens", per_token * cols), false),
                buffer("xd", Elem::F32, per("tokens", per_token * cols / 16), false),
            ]),
            _ => buffers.push(buffer("x", Elem::F32, per("tokens", per_token * cols), false)),
        }
        buffers.push(buffer("y", Elem::F32, per("tokens", used * rows), true));
        let grid = [Dim::Fixed(rows.div_ceil(tile_rows)), Dim::Fixed(self.max_tiles(tile_tokens)), Dim::Fixed(1)];
        Parts {
            launch: launch_dynamic(target, grid, waves * target.device.wave_size, shared),
            tuning,
            buffers,
            scalars: vec![scalar("tokens", MAX_EXPERT_CHUNK), scalar("slots", MAX_EXPERT_SLOTS)],
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
        let Some(Tiles { rows: tile_rows, tokens: tile_tokens, blocks, inputs }) = check_tiles(k, c, quant, cols)
        else {
            return;
        };
        if blocks != 0 {
            c.fail("stream-K blocks", blocks.to_string(), "none: a block a tile".into());
        }
        if !self.fits() {
            c.fail("an expert's matrix", format!("{} bytes", self.matrix_bytes()), "whole 16-byte pieces".into());
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
        let buffers =
            inputs.into_iter().map(|(name, n)| (name, n * per_token)).chain([("order", used), ("y", used * rows)]);
        check_extents(k, c, buffers);
        c.extents.push(("slot_of", u64::from(experts)));
        c.extents.push(("offsets", u64::from(experts) + 1));
    }

    fn weights(&self) -> Option<GgmlType> {
        Some(self.quant)
    }

    fn tolerance(&self) -> f64 {
        2e-3
    }

    fn context(&self, k: &KernelRecord, target: &Target) -> Value {
        let ExpertGemm { quant, rows, cols, used, experts, input } = *self;
        let own = match &k.tuning {
            Tuning::GemmQ8(t) => q8_context(k, quant, rows, cols, t),
            Tuning::Gemm(t) => f16_context(k, target, quant, rows, cols, t),
            _ => return json!({}),
        };
        let grouped = json!({
            "grouped": true, "experts": experts, "used": used, "choice_input": input == ExpertInput::Choice,
            "matrix_bytes": self.matrix_bytes(), "w_len": self.matrix_bytes(),
            "x_rows": if input == ExpertInput::Choice { format!("tokens * {used}u") } else { "tokens".into() },
        });
        super::merge(own, grouped)
    }

    fn uses_matrix_unit(&self, _k: &KernelRecord) -> bool {
        true
    }

    fn template(&self, k: &KernelRecord) -> Option<&'static str> {
        Some(if matches!(k.tuning, Tuning::GemmQ8(_)) { "gemm_q8" } else { "gemm" })
    }
}
