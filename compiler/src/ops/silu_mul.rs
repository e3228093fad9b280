//! `silu_mul`: the gated FFN's activation (SiLU, or Gemma's tanh GELU), optionally over
//! stacked gate·up rows (the experts' product) and quantizing its output for the int8
//! down projection.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, launch, per, rows, scalar, untuned};
use crate::plan::rules::{ELEMENTWISE_THREADS, MAX_TOKENS};
use crate::plan::{Dim, Elem, KernelRecord, Options};
use crate::target::Target;

/// The activation of a gated FFN's gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `x · sigmoid(x)` (SwiGLU).
    #[default]
    Silu,
    /// `x/2 · (1 + tanh(sqrt(2/π) · (x + 0.044715 x³)))`, ggml's `gelu` (GeGLU).
    GeluTanh,
}

impl Activation {
    /// The activation of `x`, in f32 as the kernels compute it.
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::GeluTanh => {
                let inner = 0.797_884_6 * (x + 0.044_715 * x * x * x);
                0.5 * x * (1.0 + inner.tanh())
            }
        }
    }

    fn is_silu(&self) -> bool {
        *self == Activation::Silu
    }
}

/// `y[i] = act(gate[i]) · up[i]` over rows of `n`.
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
    /// The gate's activation.
    #[serde(default, skip_serializing_if = "Activation::is_silu")]
    pub act: Activation,
}

impl KernelOp for SiluMul {
    fn kernel_name(&self) -> String {
        let SiluMul { n, q8, paired, act } = self;
        let kind = if act.is_silu() { "silu_mul" } else { "gelu_mul" };
        format!("{kind}{}{}_{n}", if *paired { "_paired" } else { "" }, if *q8 { "_q8" } else { "" })
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let SiluMul { n, q8, paired, .. } = *self;
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
        json!({ "n": self.n, "q8": self.q8, "paired": self.paired, "gelu": self.act == Activation::GeluTanh })
    }
}

#[cfg(test)]
mod tests {
    use super::Activation;

    /// ggml's tanh GELU at a few points (0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))),
    /// evaluated in f64), and SiLU.
    #[test]
    fn activations_match_their_formulas() {
        for (x, gelu) in [(0.0f32, 0.0f64), (1.0, 0.841_191_990), (-1.0, -0.158_808_009), (3.0, 2.996_362_608)] {
            assert!((f64::from(Activation::GeluTanh.apply(x)) - gelu).abs() < 1e-6, "gelu({x})");
        }
        assert_eq!(Activation::GeluTanh.apply(20.0), 20.0);
        assert!((Activation::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
    }
}
