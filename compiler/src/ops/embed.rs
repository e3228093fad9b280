//! `embed`: token embedding rows gathered and dequantized.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, c_float, fixed, fixed_len, launch, per, rows, scalar, untuned};
use crate::plan::rules::{ELEMENTWISE_THREADS, MAX_TOKENS};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::quant::GgmlType;
use crate::target::Target;

/// Gathers and dequantizes rows of the token-embedding table, times `scale`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Embed {
    /// Table type.
    pub quant: GgmlType,
    /// Embedding width.
    pub cols: u32,
    /// Table rows.
    pub vocab: u32,
    /// What every element is multiplied by (Gemma's `sqrt(cols)`).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub scale: f32,
}

fn one() -> f32 {
    1.0
}

fn is_one(v: &f32) -> bool {
    *v == 1.0
}

impl KernelOp for Embed {
    fn kernel_name(&self) -> String {
        let Embed { quant, cols, vocab, scale } = self;
        let scaled = if is_one(scale) { "" } else { "_scaled" };
        format!("embed_{}_{vocab}x{cols}{scaled}", quant.name().to_ascii_lowercase())
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let Embed { quant, cols, vocab, .. } = *self;
        let chunks = cols.div_ceil(32);
        let threads = chunks.next_multiple_of(target.device.wave_size).min(ELEMENTWISE_THREADS);
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(0);
        untuned(
            launch(target, [Dim::Fixed(chunks.div_ceil(threads)), rows("tokens"), Dim::Fixed(1)], threads, 0),
            vec![
                buffer("table", Elem::U8, fixed_len(u64::from(vocab) * row_bytes), false),
                buffer("ids", Elem::I32, per("tokens", 1), false),
                buffer("y", Elem::F32, per("tokens", cols), true),
            ],
            vec![scalar("tokens", MAX_TOKENS)],
        )
    }

    fn check(&self, _k: &KernelRecord, c: &mut Checker) {
        let Embed { quant, cols, vocab, scale } = *self;
        super::rmsnorm::float_literal_check(c, "scale", scale);
        let chunks = u64::from(cols / 32);
        let covered = c.grid_x().saturating_mul(u64::from(c.kernel.launch.threads));
        if cols % 32 != 0 || covered < chunks {
            c.fail("chunks covered per row", covered.to_string(), format!("rows have {chunks} chunks of 32"));
        }
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(u64::MAX);
        c.extents.push(("table", u64::from(vocab).saturating_mul(row_bytes)));
    }

    fn weights(&self) -> Option<GgmlType> {
        Some(self.quant)
    }

    fn tolerance(&self) -> f64 {
        1e-5
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let Embed { quant, cols, vocab, scale } = *self;
        json!({
            "scale": (!is_one(&scale)).then(|| c_float(scale)),
            "quant": quant.name().to_ascii_lowercase(), "quant_name": quant.name(),
            "cols": cols, "vocab": vocab, "chunks": cols / 32,
            "row_bytes": quant.row_bytes(u64::from(cols)).unwrap_or(0),
            "table_len": fixed(k, "table"),
        })
    }
}
