//! The typed model description of a pack, and the tensors each family must have.
//!
//! Keys follow llama.cpp's naming (`{arch}.block_count`, `{arch}.attention.head_count`,
//! ...); defaults are the ones llama.cpp applies when a key is absent.

mod limits;

pub use limits::{
    MAX_CONTEXT, MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, MAX_RMS_EPS, MAX_ROPE_BASE, MAX_WIDTH,
};

use serde::Serialize;

use crate::ops::{Activation, RopeStyle};
use crate::pack::{Pack, PackError, PackErrorKind, Value};
use crate::quant::GgmlType;

/// The model families strata runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Llama 2/3, SmolLM2, Mistral-style dense models.
    Llama,
    /// Qwen2 / Qwen2.5: Llama plus q/k/v biases.
    Qwen2,
    /// Qwen3 dense: per-head RMSNorm on q and k.
    Qwen3,
    /// Qwen3 mixture of experts (Qwen3-30B-A3B, Qwen3-Coder).
    Qwen3Moe,
    /// Gemma 3: scaled embeddings, norms after attention and the FFN as well as before,
    /// GeGLU, per-head q/k norms, sliding-window layers beside global ones.
    Gemma3,
}

impl Family {
    /// Every family, in the order error messages list them.
    pub const ALL: [Family; 5] = [Family::Llama, Family::Qwen2, Family::Qwen3, Family::Qwen3Moe, Family::Gemma3];

    /// The `general.architecture` string.
    pub fn arch(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3moe",
            Family::Gemma3 => "gemma3",
        }
    }

    /// The family named by a `general.architecture` string.
    pub fn from_arch(arch: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.arch() == arch)
    }

    /// Whether the FFN is a mixture of experts.
    pub fn is_moe(self) -> bool {
        self == Family::Qwen3Moe
    }

    /// How RoPE pairs a head's elements: llama's GGUF conversion permutes q/k rows for
    /// adjacent pairs; the Qwen and Gemma families rotate halves (GPT-NeoX).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Family::Llama => RopeStyle::Normal,
            Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3 => RopeStyle::Neox,
        }
    }

    /// Whether the Q, K and V projections add a bias (`attn_{q,k,v}.bias`).
    pub fn qkv_bias(self) -> bool {
        self == Family::Qwen2
    }

    /// Whether queries and keys are RMS-normed per head (`attn_{q,k}_norm`) before RoPE.
    pub fn qk_norm(self) -> bool {
        matches!(self, Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3)
    }

    /// Whether attention's and the FFN's outputs are RMS-normed before they join the
    /// residual stream (`post_attention_norm`, `post_ffw_norm`).
    pub fn post_norms(self) -> bool {
        self == Family::Gemma3
    }

    /// The gate's activation in the FFN.
    pub fn activation(self) -> Activation {
        if self == Family::Gemma3 { Activation::GeluTanh } else { Activation::Silu }
    }

    /// What the embedding rows are multiplied by: `sqrt(embd)` for Gemma, as llama.cpp
    /// computes it in f32.
    pub fn embedding_scale(self, embd: u32) -> f32 {
        if self == Family::Gemma3 { (embd as f32).sqrt() } else { 1.0 }
    }
}

/// Sliding-window attention: local layers see only the latest `window` positions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlidingWindow {
    /// Positions a local layer's query sees, its own included (`attention.sliding_window`).
    pub window: u32,
    /// RoPE base of the local layers (`rope.freq_base_swa`, else 10000); their angles
    /// are never scaled.
    pub rope_base: f32,
    /// Which layers are local (`attention.sliding_window_pattern`: a flag a layer, or
    /// every n-th layer global; llama.cpp's default for Gemma 3 is 6).
    pub local: Vec<bool>,
}

impl SlidingWindow {
    /// Layer `l`'s window, if it is a local layer.
    pub fn of_layer(&self, l: u32) -> Option<u32> {
        self.local.get(l as usize).copied().unwrap_or(false).then_some(self.window)
    }
}

/// Mixture-of-experts shape.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Experts {
    /// Experts per layer.
    pub count: u32,
    /// Experts each token is routed to.
    pub used: u32,
    /// FFN width of one expert.
    pub ffn: u32,
}

/// How a position's angle departs from `position × base^(−2i/dims)`, as llama.cpp reads
/// `{arch}.rope.scaling.*` for the families strata runs (its default type is linear).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// Angles as they are (type "none", or a factor of 1).
    None,
    /// Positions divided by `factor` (position interpolation).
    Linear {
        /// `rope.scaling.factor` (or the older `rope.scale_linear`).
        factor: f32,
    },
    /// YaRN: each pair's angle blends the interpolated one (divided by `factor`) and
    /// the original, by how many turns the pair makes over `original_context`
    /// positions (betas 32 and 1, as llama.cpp fixes them); cos and sin are scaled by
    /// `1 + 0.1·ln(factor)`.
    Yarn {
        /// `rope.scaling.factor`.
        factor: f32,
        /// `rope.scaling.original_context_length` (default: the training context).
        original_context: u32,
    },
}

impl RopeScaling {
    fn is_none(&self) -> bool {
        *self == RopeScaling::None
    }
}

/// Everything about a model's shape that kernels and the runtime specialize on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelDesc {
    /// Model family.
    pub family: Family,
    /// Transformer blocks.
    pub layers: u32,
    /// Embedding (hidden) width.
    pub embd: u32,
    /// Dense FFN width (for MoE packs, the key's value if present, else 0).
    pub ffn: u32,
    /// Attention (query) heads.
    pub heads: u32,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: u32,
    /// Key (and query) length per head.
    pub head_dim_k: u32,
    /// Value length per head.
    pub head_dim_v: u32,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// Dimensions of each head that RoPE rotates.
    pub rope_dims: u32,
    /// Long-context scaling of the angles.
    #[serde(skip_serializing_if = "RopeScaling::is_none")]
    pub rope_scaling: RopeScaling,
    /// `rope.scaling.attn_factor`: cos and sin are multiplied by it (1: unchanged).
    #[serde(skip_serializing_if = "is_one")]
    pub rope_attn_factor: f32,
    /// Whether `rope_freqs.weight` divides each pair's frequency (Llama 3.1 and later).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rope_freq_factors: bool,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Training context length.
    pub context: u32,
    /// Vocabulary size (rows of the embedding).
    pub vocab: u32,
    /// Mixture-of-experts shape, for MoE families.
    pub experts: Option<Experts>,
    /// Whether the output projection reuses the token embedding.
    pub tied_output: bool,
    /// Sliding-window attention of the local layers, where the family has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sliding: Option<SlidingWindow>,
}

/// What a tensor is for: decides how it is generated, planned and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Token embedding table (gathered by row).
    Embedding,
    /// RMSNorm weight.
    Norm,
    /// Weight of a linear layer (a GEMV at decode).
    Linear,
    /// Output projection to the vocabulary.
    Output,
    /// Bias of a linear layer.
    Bias,
    /// MoE router weight.
    Router,
    /// Stacked expert weights, `[in, out, experts]`.
    Experts,
    /// RoPE frequency factors, one a rotated pair (`rope_freqs.weight`).
    RopeFactors,
}

/// The tensor of Llama 3.1+ RoPE frequency factors.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// One tensor a family needs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExpectedTensor {
    /// Tensor name.
    pub name: String,
    /// Shape in ggml order.
    pub shape: Vec<u64>,
    /// What it is for.
    pub role: Role,
}

impl ModelDesc {
    /// Attention's score scale: `1/sqrt(head length)`, except Gemma 3 27B (62 layers),
    /// which scales by `1/sqrt(embd / heads)` as llama.cpp does.
    pub fn attention_scale(&self) -> f32 {
        let dim =
            if self.family == Family::Gemma3 && self.layers == 62 { self.embd / self.heads } else { self.head_dim_k };
        1.0 / (dim as f32).sqrt()
    }

    /// Reads the description from the pack's metadata and checks every tensor the
    /// family needs is present with the right shape.
    pub fn from_pack(pack: &Pack) -> Result<ModelDesc, PackError> {
        let desc = Self::from_metadata(pack)?;
        desc.check_tensors(pack)?;
        Ok(desc)
    }

    fn from_metadata(pack: &Pack) -> Result<ModelDesc, PackError> {
        let arch = pack.architecture()?;
        let family = Family::from_arch(arch).ok_or_else(|| {
            let known: Vec<_> = Family::ALL.iter().map(|f| f.arch()).collect();
            pack.error(PackErrorKind::key(
                "general.architecture",
                format!("{arch:?} is not supported (supported: {})", known.join(", ")),
            ))
        })?;
        let m = pack.metadata();
        let err = |k| pack.error(k);
        let key = |k: &str| format!("{arch}.{k}");
        let required_u32 = |k: &str| -> Result<u32, PackError> {
            let name = key(k);
            m.u32(&name)
                .map_err(err)?
                .ok_or_else(|| err(PackErrorKind::key(&name, format!("missing (required for architecture {arch})"))))
        };
        let optional_u32 = |k: &str| m.u32(&key(k)).map_err(err);
        // A required or optional integer key, checked against its range.
        let ranged = |k: &str, v: u32, lo: u32, hi: u32| limits::int_in(&key(k), v, lo, hi).map_err(err);

        let layers = ranged("block_count", required_u32("block_count")?, 1, MAX_LAYERS)?;
        // Every layer has tensors of its own: a count beyond the table is corrupt, and
        // refusing it here keeps the expected-tensor list bounded by the file.
        if layers as usize > pack.tensors().len() {
            return Err(err(PackErrorKind::key(
                &key("block_count"),
                format!("{layers} layers, but the pack has only {} tensors", pack.tensors().len()),
            )));
        }
        let embd = ranged("embedding_length", required_u32("embedding_length")?, 1, MAX_WIDTH)?;
        let heads = ranged("attention.head_count", required_u32("attention.head_count")?, 1, MAX_HEADS)?;
        let kv_heads =
            ranged("attention.head_count_kv", kv_heads(pack, &key("attention.head_count_kv"), heads)?, 1, MAX_HEADS)?;
        if heads % kv_heads != 0 {
            return Err(err(PackErrorKind::key(
                &key("attention.head_count_kv"),
                format!("{kv_heads} does not divide the {heads} query heads"),
            )));
        }
        let head_dim_k = match optional_u32("attention.key_length")? {
            Some(v) => v,
            None if embd % heads == 0 => embd / heads,
            None => {
                return Err(err(PackErrorKind::key(
                    &key("attention.key_length"),
                    format!("missing, and embedding_length {embd} is not a multiple of head_count {heads}"),
                )));
            }
        };
        let head_dim_k = ranged("attention.key_length", head_dim_k, 1, MAX_HEAD_DIM)?;
        let head_dim_v = optional_u32("attention.value_length")?.unwrap_or(head_dim_k);
        let head_dim_v = ranged("attention.value_length", head_dim_v, 1, MAX_HEAD_DIM)?;
        let rope_dims = optional_u32("rope.dimension_count")?.unwrap_or(head_dim_k);
        if rope_dims > head_dim_k || rope_dims % 2 != 0 {
            return Err(err(PackErrorKind::key(
                &key("rope.dimension_count"),
                format!("{rope_dims} must be even and at most the head length {head_dim_k}"),
            )));
        }
        let base_key = key("rope.freq_base");
        let rope_base =
            limits::positive_in(&base_key, m.f64(&base_key).map_err(err)?.unwrap_or(10_000.0), MAX_ROPE_BASE)
                .map_err(err)?;
        let eps_key = key("attention.layer_norm_rms_epsilon");
        let rms_eps = m
            .f64(&eps_key)
            .map_err(err)?
            .ok_or_else(|| err(PackErrorKind::key(&eps_key, format!("missing (required for architecture {arch})"))))?;
        let rms_eps = limits::positive_in(&eps_key, rms_eps, MAX_RMS_EPS).map_err(err)?;
        let context = ranged("context_length", required_u32("context_length")?, 1, MAX_CONTEXT)?;
        let (rope_scaling, rope_attn_factor) = rope_scaling(pack, arch, context)?;
        // Llama 3.1+ frequency factors: llama.cpp reads them for the llama family only
        // (elsewhere the tensor is unexpected, and refused as such).
        let rope_freq_factors = family == Family::Llama && pack.tensor(ROPE_FREQS).is_some();
        let ffn = if family.is_moe() {
            match optional_u32("feed_forward_length")? {
                Some(v) => ranged("feed_forward_length", v, 0, MAX_WIDTH)?,
                None => 0,
            }
        } else {
            ranged("feed_forward_length", required_u32("feed_forward_length")?, 1, MAX_WIDTH)?
        };
        let experts = if family.is_moe() {
            let count = ranged("expert_count", required_u32("expert_count")?, 1, MAX_EXPERTS)?;
            let used = ranged("expert_used_count", required_u32("expert_used_count")?, 1, MAX_EXPERTS)?;
            if used > count {
                return Err(err(PackErrorKind::key(
                    &key("expert_used_count"),
                    format!("{used} is more than expert_count {count}"),
                )));
            }
            let ffn = ranged("expert_feed_forward_length", required_u32("expert_feed_forward_length")?, 1, MAX_WIDTH)?;
            Some(Experts { count, used, ffn })
        } else {
            None
        };
        let embedding = pack
            .tensor("token_embd.weight")
            .ok_or_else(|| err(PackErrorKind::tensor("token_embd.weight", "missing")))?;
        let vocab = match embedding.shape.get(1).map(|&v| u32::try_from(v)) {
            Some(Ok(v)) if embedding.shape.len() == 2 => v,
            _ => {
                return Err(err(PackErrorKind::tensor(
                    "token_embd.weight",
                    format!("shape {:?}, expected [{embd}, vocab]", embedding.shape),
                )));
            }
        };
        if let Some(declared) = optional_u32("vocab_size")?
            && declared != vocab
        {
            return Err(err(PackErrorKind::key(
                &key("vocab_size"),
                format!("is {declared}, but token_embd.weight has {vocab} rows"),
            )));
        }
        Ok(ModelDesc {
            family,
            layers,
            embd,
            ffn,
            heads,
            kv_heads,
            head_dim_k,
            head_dim_v,
            rope_base,
            rope_dims,
            rope_scaling,
            rope_attn_factor,
            rope_freq_factors,
            rms_eps,
            context,
            vocab,
            experts,
            tied_output: pack.tensor("output.weight").is_none(),
            sliding: if family == Family::Gemma3 { gemma3_sliding(pack, arch, layers)? } else { None },
        })
    }

    /// Every tensor this model needs, with shapes, in llama.cpp's names and order.
    pub fn expected_tensors(&self) -> Vec<ExpectedTensor> {
        let (e, v) = (u64::from(self.embd), u64::from(self.vocab));
        let (heads, kv_heads) = (u64::from(self.heads), u64::from(self.kv_heads));
        let (dk, dv) = (u64::from(self.head_dim_k), u64::from(self.head_dim_v));
        let (q, k, vv, o) = (heads * dk, kv_heads * dk, kv_heads * dv, heads * dv);
        let mut out = Vec::new();
        let mut add = |name: String, shape: &[u64], role| {
            out.push(ExpectedTensor { name, shape: shape.to_vec(), role });
        };
        add("token_embd.weight".into(), &[e, v], Role::Embedding);
        for i in 0..self.layers {
            let b = |s: &str| format!("blk.{i}.{s}");
            add(b("attn_norm.weight"), &[e], Role::Norm);
            add(b("attn_q.weight"), &[e, q], Role::Linear);
            add(b("attn_k.weight"), &[e, k], Role::Linear);
            add(b("attn_v.weight"), &[e, vv], Role::Linear);
            if self.family.qkv_bias() {
                add(b("attn_q.bias"), &[q], Role::Bias);
                add(b("attn_k.bias"), &[k], Role::Bias);
                add(b("attn_v.bias"), &[vv], Role::Bias);
            }
            if self.family.qk_norm() {
                add(b("attn_q_norm.weight"), &[u64::from(self.head_dim_k)], Role::Norm);
                add(b("attn_k_norm.weight"), &[u64::from(self.head_dim_k)], Role::Norm);
            }
            add(b("attn_output.weight"), &[o, e], Role::Linear);
            if self.family.post_norms() {
                add(b("post_attention_norm.weight"), &[e], Role::Norm);
            }
            add(b("ffn_norm.weight"), &[e], Role::Norm);
            match self.experts {
                None => {
                    let f = u64::from(self.ffn);
                    add(b("ffn_gate.weight"), &[e, f], Role::Linear);
                    add(b("ffn_up.weight"), &[e, f], Role::Linear);
                    add(b("ffn_down.weight"), &[f, e], Role::Linear);
                    if self.family.post_norms() {
                        add(b("post_ffw_norm.weight"), &[e], Role::Norm);
                    }
                }
                Some(x) => {
                    let (n, f) = (u64::from(x.count), u64::from(x.ffn));
                    add(b("ffn_gate_inp.weight"), &[e, n], Role::Router);
                    add(b("ffn_gate_exps.weight"), &[e, f, n], Role::Experts);
                    add(b("ffn_up_exps.weight"), &[e, f, n], Role::Experts);
                    add(b("ffn_down_exps.weight"), &[f, e, n], Role::Experts);
                }
            }
        }
        add("output_norm.weight".into(), &[e], Role::Norm);
        if !self.tied_output {
            add("output.weight".into(), &[e, v], Role::Output);
        }
        // Last: a synthetic pack with factors has every other tensor where one without has.
        if self.rope_freq_factors {
            add(ROPE_FREQS.into(), &[u64::from(self.rope_dims / 2)], Role::RopeFactors);
        }
        out
    }

    /// Checks that every expected tensor is present with its shape and a type strata
    /// can compute with.
    /// Tensors the family does not use are refused by name: a pack of another family
    /// relabelled (a Gemma 3 pack as `llama`) would otherwise run without its extra
    /// norms and print plausible garbage.
    pub fn check_tensors(&self, pack: &Pack) -> Result<(), PackError> {
        let expected = self.expected_tensors();
        self.check_expected(pack, &expected)?;
        let known: std::collections::HashSet<&str> = expected.iter().map(|t| t.name.as_str()).collect();
        let extra: Vec<&str> =
            pack.tensors().iter().map(|t| t.name.as_str()).filter(|name| !known.contains(name)).collect();
        if let Some(first) = extra.first() {
            let shown: Vec<String> = extra.iter().take(4).map(|n| n.escape_debug().to_string()).collect();
            let more = if extra.len() > shown.len() {
                format!(" and {} more", extra.len() - shown.len())
            } else {
                String::new()
            };
            return Err(pack.error(PackErrorKind::tensor(
                first,
                format!(
                    "architecture {} does not use it ({} unexpected tensor(s): {}{more}); is the pack's general.architecture right?",
                    self.family.arch(),
                    extra.len(),
                    shown.join(", ")
                ),
            )));
        }
        Ok(())
    }

    fn check_expected(&self, pack: &Pack, expected: &[ExpectedTensor]) -> Result<(), PackError> {
        for expected in expected {
            let err = |what: String| pack.error(PackErrorKind::tensor(&expected.name, what));
            let Some(t) = pack.tensor(&expected.name) else {
                return Err(err(format!(
                    "missing (architecture {} needs it, shape {:?})",
                    self.family.arch(),
                    expected.shape
                )));
            };
            if t.shape != expected.shape {
                return Err(err(format!("shape {:?}, expected {:?}", t.shape, expected.shape)));
            }
            if !t.ty.is_supported() {
                return Err(err(format!(
                    "type {} is not supported (supported: {})",
                    t.ty,
                    crate::quant::supported_list()
                )));
            }
            if matches!(expected.role, Role::Norm | Role::Bias | Role::RopeFactors) && t.ty != GgmlType::F32 {
                return Err(err(format!("type {}, expected F32 for a {:?} tensor", t.ty, expected.role)));
            }
        }
        Ok(())
    }
}

fn is_one(v: &f32) -> bool {
    *v == 1.0
}

/// Largest RoPE scaling factor accepted (real models use 2 to 64).
const MAX_ROPE_FACTOR: f64 = 1e4;

/// The rope scaling a pack's metadata asks for, as llama.cpp reads it: the type
/// (`rope.scaling.type`, "linear" when absent), the factor (`rope.scaling.factor`, else
/// `rope.scale_linear`; absent or 0 means 1), YaRN's original context and the attention
/// factor. A type strata does not implement is refused by name.
fn rope_scaling(pack: &Pack, arch: &str, context: u32) -> Result<(RopeScaling, f32), PackError> {
    let m = pack.metadata();
    let err = |k| pack.error(k);
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let factor_key = [key("factor"), format!("{arch}.rope.scale_linear")]
        .into_iter()
        .find(|k| m.get(k).is_some())
        .unwrap_or_else(|| key("factor"));
    let factor = match m.f64(&factor_key).map_err(err)? {
        None => 1.0,
        Some(0.0) => 1.0,
        Some(f) => limits::positive_in(&factor_key, f, MAX_ROPE_FACTOR).map_err(err)?,
    };
    let attn_key = key("attn_factor");
    let attn = match m.f64(&attn_key).map_err(err)? {
        None => 1.0,
        Some(a) => limits::positive_in(&attn_key, a, 100.0).map_err(err)?,
    };
    let type_key = key("type");
    let scaling = match m.str(&type_key).map_err(err)?.unwrap_or("linear") {
        "none" => RopeScaling::None,
        "linear" if factor == 1.0 => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor },
        "yarn" => {
            let ctx_key = key("original_context_length");
            let original = m.u32(&ctx_key).map_err(err)?.unwrap_or(context);
            let original_context = limits::int_in(&ctx_key, original, 1, MAX_CONTEXT).map_err(err)?;
            RopeScaling::Yarn { factor, original_context }
        }
        other => {
            return Err(err(PackErrorKind::key(
                &type_key,
                format!("{other:?} is not supported (supported: none, linear, yarn)"),
            )));
        }
    };
    Ok((scaling, attn))
}

/// Gemma 3's sliding window as llama.cpp reads it (none without a window key), and a
/// refusal of the final logit soft-capping it would apply and strata does not.
fn gemma3_sliding(pack: &Pack, arch: &str, layers: u32) -> Result<Option<SlidingWindow>, PackError> {
    let m = pack.metadata();
    let err = |k| pack.error(k);
    let cap_key = format!("{arch}.final_logit_softcapping");
    if let Some(cap) = m.f64(&cap_key).map_err(err)?
        && cap != 0.0
    {
        return Err(err(PackErrorKind::key(&cap_key, format!("{cap} is not supported (logit soft-capping)"))));
    }
    let window_key = format!("{arch}.attention.sliding_window");
    let window = match m.u32(&window_key).map_err(err)? {
        None | Some(0) => return Ok(None),
        Some(w) => limits::int_in(&window_key, w, 1, MAX_CONTEXT).map_err(err)?,
    };
    let pattern_key = format!("{arch}.attention.sliding_window_pattern");
    let local: Vec<bool> = match m.array(&pattern_key) {
        Ok(Some(flags)) => {
            let flags: Vec<Option<bool>> = (0..flags.len())
                .map(|i| {
                    flags.get(i).and_then(|v| match v {
                        Value::Bool(b) => Some(b),
                        _ => None,
                    })
                })
                .collect();
            match flags.iter().copied().collect::<Option<Vec<bool>>>() {
                Some(flags) if flags.len() == layers as usize => flags,
                _ => {
                    return Err(err(PackErrorKind::key(
                        &pattern_key,
                        format!("expected {layers} booleans, one a layer, or an integer"),
                    )));
                }
            }
        }
        _ => {
            // Every n-th layer is global, the others local (0: every layer local).
            let n = m.u32(&pattern_key).map_err(err)?.unwrap_or(6);
            (0..layers).map(|l| n == 0 || l % n < n - 1).collect()
        }
    };
    let base_key = format!("{arch}.rope.freq_base_swa");
    let rope_base = limits::positive_in(&base_key, m.f64(&base_key).map_err(err)?.unwrap_or(10_000.0), MAX_ROPE_BASE)
        .map_err(err)?;
    Ok(Some(SlidingWindow { window, rope_base, local }))
}

/// `head_count_kv`: a number, or a per-layer array whose entries must all agree.
fn kv_heads(pack: &Pack, key: &str, default: u32) -> Result<u32, PackError> {
    let m = pack.metadata();
    if let Ok(Some(array)) = m.array(key) {
        let values: Vec<_> = (0..array.len()).filter_map(|i| array.get(i)).map(|v| v.as_u64()).collect();
        return match values.first() {
            Some(Some(first)) if values.iter().all(|v| *v == Some(*first)) => {
                u32::try_from(*first).map_err(|_| pack.error(PackErrorKind::key(key, format!("{first} is too large"))))
            }
            _ => Err(pack.error(PackErrorKind::key(key, "per-layer KV head counts that differ are not supported"))),
        };
    }
    Ok(m.u32(key).map_err(|k| pack.error(k))?.unwrap_or(default))
}
