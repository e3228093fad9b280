//! The rotary-embedding table: (cos, sin) for every position and rotated pair, computed
//! once on the host so every backend rotates by exactly the same angles. Every rope
//! variant a pack can ask for (frequency factors, linear and YaRN scaling, an attention
//! factor) is decided here, so no kernel knows of them.

use strata_compiler::model::{ModelDesc, ROPE_FREQS, RopeScaling};
use strata_compiler::pack::Pack;

use crate::backend::RunError;

/// How a pack's positions become angles: what [`table`] needs of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// `rope.freq_base`.
    pub base: f32,
    /// Rotated dimensions of a head (twice the pairs).
    pub dims: u32,
    /// Long-context scaling.
    pub scaling: RopeScaling,
    /// `rope.scaling.attn_factor`.
    pub attn_factor: f32,
    /// Per pair, the divisor of its frequency (`rope_freqs.weight`); empty: none.
    pub freq_factors: Vec<f32>,
}

impl Rope {
    /// The model's rope, with the frequency factors read from its pack.
    pub fn of(desc: &ModelDesc, freq_factors: Vec<f32>) -> Rope {
        Rope {
            base: desc.rope_base,
            dims: desc.rope_dims,
            scaling: desc.rope_scaling,
            attn_factor: desc.rope_attn_factor,
            freq_factors,
        }
    }

    /// The rope of a model's sliding-window layers (Gemma 3): their own base, angles
    /// never scaled nor divided by factors (llama.cpp's `freq_scale_swa` is 1).
    pub fn local(desc: &ModelDesc) -> Option<Rope> {
        let s = desc.sliding.as_ref()?;
        Some(Rope {
            base: s.rope_base,
            dims: desc.rope_dims,
            scaling: RopeScaling::None,
            attn_factor: desc.rope_attn_factor,
            freq_factors: Vec::new(),
        })
    }

    /// (cos, sin) of pair `i` at position `p`, as llama.cpp's rope computes them:
    /// the frequency `base^(−2i/dims)` divided by the pair's factor; with linear
    /// scaling the position divided by the factor; with YaRN the interpolated and the
    /// original angle blended by the pair's ramp, and the magnitude scaled.
    fn angle(&self, p: u32, i: u32) -> (f64, f64) {
        let dims = f64::from(self.dims);
        let factor = self.freq_factors.get(i as usize).map_or(1.0, |&f| f64::from(f));
        let extrap = f64::from(p) * f64::from(self.base).powf(-2.0 * f64::from(i) / dims) / factor;
        let mut scale = f64::from(self.attn_factor);
        let theta = match self.scaling {
            RopeScaling::None => extrap,
            RopeScaling::Linear { factor } => extrap / f64::from(factor),
            RopeScaling::Yarn { factor, original_context } => {
                let factor = f64::from(factor);
                let (low, high) = yarn_corrections(self.dims, original_context, self.base);
                let ramp = 1.0 - ((f64::from(i) - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                // llama.cpp sets the attention factor to get_mscale(factor) / (1 + 0.1 ln factor)
                // and its rope multiplies (1 + 0.1 ln factor) back: the net is get_mscale.
                let mscale = |s: f64| if s <= 1.0 { 1.0 } else { 0.1 * s.ln() + 1.0 };
                scale *= mscale(factor);
                let interp = extrap / factor;
                interp * (1.0 - ramp) + extrap * ramp
            }
        };
        (theta.cos() * scale, theta.sin() * scale)
    }
}

/// The pack's `rope_freqs.weight` (F32, one factor a pair, checked by the model
/// description), if the model has one; a factor that is not positive is refused by name
/// (non-finite ones are refused at load already).
pub fn freq_factors(pack: &Pack, desc: &ModelDesc) -> Result<Vec<f32>, RunError> {
    let Some(t) = desc.rope_freq_factors.then(|| pack.tensor(ROPE_FREQS)).flatten() else {
        return Ok(Vec::new());
    };
    let factors: Vec<f32> =
        pack.data(t).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    match factors.iter().position(|f| f.is_nan() || *f <= 0.0) {
        Some(i) => Err(RunError::Other(format!(
            "tensor {ROPE_FREQS}: factor {i} is {}; frequency factors must be above 0",
            factors[i]
        ))),
        None => Ok(factors),
    }
}

/// YaRN's correction range in pairs: the pairs that make more than 32 turns over the
/// original context keep their angle, those under 1 turn are interpolated, and the rest
/// blend (ggml's `rope_yarn_corr_dims` with beta fast 32, slow 1).
fn yarn_corrections(dims: u32, original_context: u32, base: f32) -> (f64, f64) {
    let dims_f = f64::from(dims);
    let corr = |turns: f64| {
        dims_f * (f64::from(original_context) / (turns * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * f64::from(base).ln())
    };
    let low = corr(32.0).floor().max(0.0);
    let high = corr(1.0).ceil().min(dims_f - 1.0);
    (low, high)
}

/// `n_ctx × rope.dims` f32 values as little-endian bytes: for position `p` and pair `i`,
/// `cos`, `sin` of its angle (see [`Rope`]). Without scaling or factors the angle is
/// `p·base^(−2i/dims)` exactly.
/// A table that cannot be allocated is an error naming its size, not an abort.
pub fn table(n_ctx: u32, rope: &Rope) -> Result<Vec<u8>, RunError> {
    let pairs = rope.dims / 2;
    let len = (n_ctx as usize).saturating_mul(rope.dims as usize).saturating_mul(4);
    let mut out = Vec::new();
    out.try_reserve_exact(len).map_err(|_| {
        RunError::Other(format!(
            "the RoPE table of {n_ctx} positions × {} dims ({len} bytes) cannot be allocated",
            rope.dims
        ))
    })?;
    for p in 0..n_ctx {
        for i in 0..pairs {
            let (cos, sin) = rope.angle(p, i);
            out.extend_from_slice(&(cos as f32).to_le_bytes());
            out.extend_from_slice(&(sin as f32).to_le_bytes());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(dims: u32) -> Rope {
        Rope { base: 10_000.0, dims, scaling: RopeScaling::None, attn_factor: 1.0, freq_factors: Vec::new() }
    }

    fn at(t: &[u8], dims: u32, p: u32, i: u32) -> (f32, f32) {
        let o = ((p * dims + 2 * i) * 4) as usize;
        let f = |o: usize| f32::from_le_bytes(t[o..o + 4].try_into().expect("4 bytes"));
        (f(o), f(o + 4))
    }

    #[test]
    fn unscaled_angles_are_position_times_frequency() {
        let t = table(8, &plain(8)).expect("table");
        let theta = 5.0f64 * 10_000f64.powf(-2.0 * 3.0 / 8.0);
        assert_eq!(at(&t, 8, 5, 3), (theta.cos() as f32, theta.sin() as f32));
    }

    #[test]
    fn linear_scaling_and_factors_divide_the_angle() {
        let linear = Rope { scaling: RopeScaling::Linear { factor: 4.0 }, ..plain(8) };
        let factors = Rope { freq_factors: vec![1.0, 2.0, 4.0, 8.0], ..plain(8) };
        let (base, lin, fac) =
            (table(16, &plain(8)).expect("t"), table(16, &linear).expect("t"), table(16, &factors).expect("t"));
        for i in 0..4 {
            assert_eq!(at(&lin, 8, 12, i), at(&base, 8, 3, i), "position 12 / 4 = 3");
        }
        // Pair 2's frequency over 4: position 8 turns as far as position 2 did.
        assert_eq!(at(&fac, 8, 8, 2), at(&base, 8, 2, 2));
        let scaled = Rope { attn_factor: 0.5, ..plain(8) };
        let (c, s) = at(&table(4, &scaled).expect("t"), 8, 3, 1);
        let (c0, s0) = at(&base, 8, 3, 1);
        assert!((c - c0 / 2.0).abs() < 1e-7 && (s - s0 / 2.0).abs() < 1e-7);
    }

    #[test]
    fn yarn_keeps_fast_pairs_interpolates_slow_ones_and_scales_magnitude() {
        // 128 dims, base 1e6, trained on 4096 positions, stretched 4x (Qwen-style).
        let yarn = Rope { base: 1e6, scaling: RopeScaling::Yarn { factor: 4.0, original_context: 4096 }, ..plain(128) };
        let (low, high) = yarn_corrections(128, 4096, 1e6);
        assert!(0.0 < low && low < high && high < 63.0, "{low} {high}");
        let unscaled = Rope { base: 1e6, ..plain(128) };
        let mscale = 1.0 + 0.1 * 4f64.ln();
        let (p, fast, slow) = (1000, 0, 63);
        let (c, s) = yarn.angle(p, fast);
        let (c0, s0) = unscaled.angle(p, fast);
        assert!((c - c0 * mscale).abs() < 1e-12 && (s - s0 * mscale).abs() < 1e-12, "the fastest pair keeps its angle");
        let (c, _) = yarn.angle(4 * p, slow);
        let (c0, _) = unscaled.angle(p, slow);
        assert!((c - c0 * mscale).abs() < 1e-9, "the slowest pair is interpolated: 4p turns as p did");
    }
}
