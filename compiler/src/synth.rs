//! Synthetic packs: valid GGUF files of a family, real shapes and chosen quant types,
//! filled with random valid blocks. Decode speed depends on shapes and types, not on
//! values, so benchmarks and tests run on these where real weights cannot be fetched.
//!
//! Output is a pure function of the spec, the tokenizer and the seed: each tensor is
//! drawn from its own ChaCha8 stream, so parallel writing stays deterministic.

use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::model::{Experts, Family, ModelDesc, Role, RopeScaling};
use crate::pack::{Array, GgufWriter, Pack, Value};
use crate::quant::{GgmlType, QuantError, random_blocks};

/// Root-mean-square of generated linear weights (typical of trained LLMs).
const WEIGHT_RMS: f32 = 0.02;

/// A model shape to synthesize.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// Model family.
    pub family: Family,
    /// Transformer blocks.
    pub layers: u32,
    /// Hidden width.
    pub embd: u32,
    /// Dense FFN width (written as `feed_forward_length` for MoE too).
    pub ffn: u32,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Head length (keys and values).
    pub head_dim: u32,
    /// Vocabulary size; `None` takes the tokenizer's token count.
    pub vocab: Option<u32>,
    /// Training context length.
    pub context: u32,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// Long-context scaling of the angles (written as `rope.scaling.*`).
    pub rope_scaling: RopeScaling,
    /// Whether the pack carries Llama-3-style frequency factors (`rope_freqs.weight`,
    /// rising from 1 at the fastest pair to 8 at the slowest).
    pub rope_freq_factors: bool,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Mixture-of-experts shape.
    pub experts: Option<Experts>,
    /// Whether the output projection is tied to the embedding.
    pub tied_output: bool,
    /// Gemma 3's sliding window (`attention.sliding_window`; 0: none) and every how
    /// many layers one is global (`attention.sliding_window_pattern`; 0: the
    /// family's default, not written).
    pub sliding_window: (u32, u32),
}

/// Named real (and tiny test) shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// SmolLM2-135M (llama): 30 layers, 576 wide, 9/3 heads of 64.
    SmolLm2,
    /// Llama-3-8B (llama): 32 layers, 4096 wide, FFN 14336, 32/8 heads of 128.
    Llama8B,
    /// Llama-3.2-1B (llama): 16 layers, 2048 wide, FFN 8192, 32/8 heads of 64, tied
    /// output (the host backend's benchmark shape).
    Llama1B,
    /// Qwen3-0.6B (qwen3): 28 layers, 1024 wide, FFN 3072, 16/8 heads of 128.
    Qwen3Small,
    /// Qwen3-30B-A3B (qwen3moe): 48 layers, 2048 wide, 128 experts (8 used) of 768,
    /// 32/4 heads of 128.
    Qwen3Moe30B,
    /// A 2-layer llama whose widths are multiples of 256 (every quant type fits).
    TinyLlama,
    /// A 2-layer qwen3 whose widths are multiples of 256.
    TinyQwen3,
    /// A 2-layer qwen3moe (8 experts, 2 used) whose widths are multiples of 256.
    TinyQwen3Moe,
    /// Gemma 3 270M (gemma3): 18 layers, 640 wide, FFN 2048, 4/1 heads of 256, a
    /// sliding window of 512 on five layers in six.
    Gemma3_270M,
    /// A 3-layer gemma3 whose widths are multiples of 256: two local layers with a
    /// window of 16 positions, then a global one.
    TinyGemma3,
}

impl Preset {
    /// Every preset with its command-line name.
    pub const ALL: [(Preset, &'static str); 10] = [
        (Preset::SmolLm2, "smollm2-135m"),
        (Preset::Llama8B, "llama-8b"),
        (Preset::Llama1B, "llama-1b"),
        (Preset::Qwen3Small, "qwen3-0.6b"),
        (Preset::Qwen3Moe30B, "qwen3-30b-a3b"),
        (Preset::TinyLlama, "tiny-llama"),
        (Preset::TinyQwen3, "tiny-qwen3"),
        (Preset::TinyQwen3Moe, "tiny-qwen3moe"),
        (Preset::Gemma3_270M, "gemma3-270m"),
        (Preset::TinyGemma3, "tiny-gemma3"),
    ];

    /// The preset with command-line name `name`.
    pub fn from_name(name: &str) -> Option<Preset> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(p, _)| *p)
    }

    /// Command-line name.
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(p, _)| *p == self).map_or("", |(_, n)| n)
    }

    /// The shape, from each model's published configuration.
    pub fn shape(self) -> Shape {
        let dense = |family, layers, embd, ffn, heads, kv_heads, head_dim| Shape {
            family,
            layers,
            embd,
            ffn,
            heads,
            kv_heads,
            head_dim,
            vocab: None,
            context: 4096,
            rope_base: 10_000.0,
            rope_scaling: RopeScaling::None,
            rope_freq_factors: false,
            rms_eps: 1e-5,
            experts: None,
            tied_output: true,
            sliding_window: (0, 0),
        };
        match self {
            Preset::SmolLm2 => Shape {
                vocab: Some(49_152),
                context: 8192,
                rope_base: 100_000.0,
                ..dense(Family::Llama, 30, 576, 1536, 9, 3, 64)
            },
            Preset::Llama8B => Shape {
                vocab: Some(128_256),
                context: 131_072,
                rope_base: 500_000.0,
                tied_output: false,
                ..dense(Family::Llama, 32, 4096, 14_336, 32, 8, 128)
            },
            Preset::Llama1B => Shape {
                vocab: Some(128_256),
                context: 131_072,
                rope_base: 500_000.0,
                ..dense(Family::Llama, 16, 2048, 8192, 32, 8, 64)
            },
            Preset::Qwen3Small => Shape {
                vocab: Some(151_936),
                context: 40_960,
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                ..dense(Family::Qwen3, 28, 1024, 3072, 16, 8, 128)
            },
            Preset::Qwen3Moe30B => Shape {
                vocab: Some(151_936),
                context: 40_960,
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                experts: Some(Experts { count: 128, used: 8, ffn: 768 }),
                tied_output: false,
                ..dense(Family::Qwen3Moe, 48, 2048, 6144, 32, 4, 128)
            },
            Preset::TinyLlama => dense(Family::Llama, 2, 256, 512, 4, 2, 64),
            Preset::TinyQwen3 => Shape { rms_eps: 1e-6, ..dense(Family::Qwen3, 2, 256, 512, 4, 2, 64) },
            Preset::TinyQwen3Moe => Shape {
                rms_eps: 1e-6,
                experts: Some(Experts { count: 8, used: 2, ffn: 256 }),
                tied_output: false,
                ..dense(Family::Qwen3Moe, 2, 256, 768, 4, 2, 64)
            },
            Preset::Gemma3_270M => Shape {
                vocab: Some(262_144),
                context: 32_768,
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                sliding_window: (512, 0),
                ..dense(Family::Gemma3, 18, 640, 2048, 4, 1, 256)
            },
            Preset::TinyGemma3 => {
                Shape { rms_eps: 1e-6, sliding_window: (16, 3), ..dense(Family::Gemma3, 3, 256, 512, 4, 2, 64) }
            }
        }
    }
}

/// Which quant type each tensor gets.
#[derive(Clone, Debug, PartialEq)]
pub struct Types {
    /// Types for linear and expert weights, assigned in turn in tensor order, so a
    /// list gives one pack holding several types.
    pub weights: Vec<GgmlType>,
    /// Token embedding type.
    pub embedding: GgmlType,
    /// Output projection type (untied shapes only).
    pub output: GgmlType,
}

/// The tokenizer block of a pack: every `tokenizer.*` key.
#[derive(Clone, Debug, PartialEq)]
pub struct Tokenizer {
    entries: Vec<(String, Value)>,
}

/// llama.cpp token types (`llama_token_type`).
const TOKEN_CONTROL: i32 = 3;
const TOKEN_UNUSED: i32 = 5;

impl Tokenizer {
    /// Copies the tokenizer of an existing pack, so tools that load the synthetic pack
    /// tokenize exactly as they do for that one.
    pub fn from_pack(pack: &Pack) -> Option<Tokenizer> {
        let entries: Vec<_> = pack
            .metadata()
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .map(|(k, v)| (k.to_owned(), v.clone()))
            .collect();
        entries.iter().any(|(k, _)| k == "tokenizer.ggml.tokens").then_some(Tokenizer { entries })
    }

    /// A self-contained byte-level BPE vocabulary without merges: one token per byte
    /// (GPT-2's byte-to-character mapping) and `<|endoftext|>`.
    pub fn byte_level() -> Tokenizer {
        let mut tokens: Vec<String> = (0..=255u8).map(|b| gpt2_byte_char(b).to_string()).collect();
        let mut types = vec![1i32; 256];
        tokens.push("<|endoftext|>".into());
        types.push(TOKEN_CONTROL);
        let eos = Value::U32(256);
        Tokenizer {
            entries: vec![
                ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
                ("tokenizer.ggml.pre".into(), Value::String("default".into())),
                ("tokenizer.ggml.tokens".into(), Value::Array(Array::String(tokens))),
                ("tokenizer.ggml.token_type".into(), Value::Array(Array::I32(types))),
                ("tokenizer.ggml.merges".into(), Value::Array(Array::String(Vec::new()))),
                ("tokenizer.ggml.bos_token_id".into(), eos.clone()),
                ("tokenizer.ggml.eos_token_id".into(), eos),
                ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
            ],
        }
    }

    /// The same tokenizer with `template` as its chat template, for packs that exist to
    /// test what a template does (thinking blocks, tool calls).
    pub fn with_chat_template(mut self, template: &str) -> Tokenizer {
        self.entries.retain(|(k, _)| k != "tokenizer.chat_template");
        self.entries.push(("tokenizer.chat_template".into(), Value::String(template.into())));
        self
    }

    /// Number of tokens.
    pub fn tokens(&self) -> usize {
        self.entries
            .iter()
            .find(|(k, _)| k == "tokenizer.ggml.tokens")
            .and_then(|(_, v)| match v {
                Value::Array(a) => Some(a.len()),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// The entries, with per-token arrays padded by unused tokens up to `vocab`.
    fn padded(&self, vocab: usize) -> Vec<(String, Value)> {
        let have = self.tokens();
        let mut entries = self.entries.clone();
        for (key, value) in &mut entries {
            let Value::Array(array) = value else { continue };
            if array.len() != have || have >= vocab {
                continue;
            }
            let pad = have..vocab;
            match (key.as_str(), array) {
                ("tokenizer.ggml.tokens", Array::String(v)) => {
                    v.extend(pad.map(|i| format!("<|strata_pad_{i}|>")));
                }
                ("tokenizer.ggml.token_type", Array::I32(v)) => v.extend(pad.map(|_| TOKEN_UNUSED)),
                ("tokenizer.ggml.scores", Array::F32(v)) => v.extend(pad.map(|_| 0.0)),
                _ => {}
            }
        }
        entries
    }
}

/// GPT-2's printable stand-in for a byte: printable Latin-1 bytes map to themselves,
/// the others to code points from U+0100 on, in byte order.
pub fn gpt2_byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// Why a synthetic pack cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// A quant type whose block does not divide a tensor's rows.
    #[error(
        "tensor {tensor}: type {ty} needs rows that are a multiple of {block}, but rows have {row} elements (pick another type, or a shape whose widths are multiples of {block})"
    )]
    Rows {
        /// The tensor.
        tensor: String,
        /// The type asked for.
        ty: GgmlType,
        /// Its block length.
        block: usize,
        /// The row length.
        row: u64,
    },
    /// The vocabulary cannot hold the tokenizer.
    #[error("vocabulary of {vocab} is smaller than the tokenizer's {tokens} tokens")]
    Vocab {
        /// Vocabulary asked for.
        vocab: u32,
        /// Tokens in the tokenizer.
        tokens: usize,
    },
    /// No weight types were given.
    #[error("no weight types given")]
    NoTypes,
    /// A type strata cannot generate.
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// Writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// What was written.
#[derive(Clone, Debug)]
pub struct Written {
    /// The files, first shard first.
    pub files: Vec<PathBuf>,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data.
    pub data_bytes: u64,
}

/// A planned synthetic pack: metadata and typed tensor table, with each tensor's role.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The GGUF to write.
    pub writer: GgufWriter,
    roles: Vec<Role>,
}

impl Planned {
    /// Fills tensor `index` deterministically from `seed`: norm weights near one,
    /// everything else random valid blocks of realistic magnitude.
    pub fn fill(&self, seed: u64, index: usize, out: &mut [u8]) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(index as u64);
        if self.roles[index] == Role::RopeFactors {
            let n = out.len() / 4;
            for (i, chunk) in out.chunks_exact_mut(4).enumerate() {
                let factor = 1.0 + 7.0 * i as f32 / (n.max(2) - 1) as f32;
                chunk.copy_from_slice(&factor.to_le_bytes());
            }
        } else if self.roles[index] == Role::Norm {
            let noise = crate::quant::random_floats(&mut rng, out.len() / 4, 0.1);
            for (chunk, v) in out.chunks_exact_mut(4).zip(noise) {
                chunk.copy_from_slice(&(1.0 + v).to_le_bytes());
            }
        } else {
            // `plan` admitted only supported types, so this cannot fail.
            let _ = random_blocks(self.writer.tensors()[index].ty, &mut rng, out, WEIGHT_RMS);
        }
    }
}

/// Plans the GGUF: metadata and the typed tensor table, ready to be filled.
pub fn plan(shape: &Shape, types: &Types, tokenizer: &Tokenizer, name: &str) -> Result<Planned, SynthError> {
    let tokens = tokenizer.tokens();
    let vocab = shape.vocab.unwrap_or(tokens as u32);
    if (vocab as usize) < tokens {
        return Err(SynthError::Vocab { vocab, tokens });
    }
    let desc = ModelDesc {
        family: shape.family,
        layers: shape.layers,
        embd: shape.embd,
        ffn: shape.ffn,
        heads: shape.heads,
        kv_heads: shape.kv_heads,
        head_dim_k: shape.head_dim,
        head_dim_v: shape.head_dim,
        rope_base: shape.rope_base,
        rope_dims: shape.head_dim,
        rope_scaling: shape.rope_scaling,
        rope_attn_factor: 1.0,
        rope_freq_factors: shape.rope_freq_factors,
        rms_eps: shape.rms_eps,
        context: shape.context,
        vocab,
        experts: shape.experts,
        tied_output: shape.tied_output,
        sliding: None,
    };
    let arch = shape.family.arch();
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String(arch.into()))
        .kv("general.name", Value::String(name.into()))
        .kv("general.quantization_version", Value::U32(2));
    let key = |k: &str| format!("{arch}.{k}");
    for (k, v) in [
        ("block_count", shape.layers),
        ("context_length", shape.context),
        ("embedding_length", shape.embd),
        ("feed_forward_length", shape.ffn),
        ("attention.head_count", shape.heads),
        ("attention.head_count_kv", shape.kv_heads),
        ("attention.key_length", shape.head_dim),
        ("attention.value_length", shape.head_dim),
        ("rope.dimension_count", shape.head_dim),
        ("vocab_size", vocab),
    ] {
        w.kv(&key(k), Value::U32(v));
    }
    w.kv(&key("rope.freq_base"), Value::F32(shape.rope_base));
    match shape.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            w.kv(&key("rope.scaling.type"), Value::String("linear".into()))
                .kv(&key("rope.scaling.factor"), Value::F32(factor));
        }
        RopeScaling::Yarn { factor, original_context } => {
            w.kv(&key("rope.scaling.type"), Value::String("yarn".into()))
                .kv(&key("rope.scaling.factor"), Value::F32(factor))
                .kv(&key("rope.scaling.original_context_length"), Value::U32(original_context));
        }
    }
    w.kv(&key("attention.layer_norm_rms_epsilon"), Value::F32(shape.rms_eps));
    match shape.sliding_window {
        (0, _) => {}
        (window, 0) => {
            w.kv(&key("attention.sliding_window"), Value::U32(window));
        }
        (window, every) => {
            w.kv(&key("attention.sliding_window"), Value::U32(window))
                .kv(&key("attention.sliding_window_pattern"), Value::U32(every));
        }
    }
    if let Some(x) = shape.experts {
        w.kv(&key("expert_count"), Value::U32(x.count))
            .kv(&key("expert_used_count"), Value::U32(x.used))
            .kv(&key("expert_feed_forward_length"), Value::U32(x.ffn));
    }
    for (k, v) in tokenizer.padded(vocab as usize) {
        w.kv(&k, v);
    }

    let mut weights = types.weights.iter().cycle();
    let mut roles = Vec::new();
    let mut gate_exps = GgmlType::F32;
    for t in desc.expected_tensors() {
        let ty = match t.role {
            Role::Norm | Role::Bias | Role::Router | Role::RopeFactors => GgmlType::F32,
            Role::Embedding => types.embedding,
            Role::Output => types.output,
            // The experts' gate and up run as one stacked product: one type for both.
            Role::Experts if t.name.ends_with("ffn_up_exps.weight") => gate_exps,
            Role::Linear | Role::Experts => *weights.next().ok_or(SynthError::NoTypes)?,
        };
        if t.name.ends_with("ffn_gate_exps.weight") {
            gate_exps = ty;
        }
        if !ty.is_supported() {
            return Err(QuantError::Unsupported(ty).into());
        }
        if ty.row_bytes(t.shape[0]).is_none() {
            return Err(SynthError::Rows { tensor: t.name, ty, block: ty.block_len(), row: t.shape[0] });
        }
        w.tensor(&t.name, ty, &t.shape).map_err(|source| SynthError::Io { path: PathBuf::new(), source })?;
        roles.push(t.role);
    }
    Ok(Planned { writer: w, roles })
}

/// Writes a synthetic pack to `path` (or `shards` split files next to it) and returns
/// what was written.
pub fn write(
    shape: &Shape,
    types: &Types,
    tokenizer: &Tokenizer,
    seed: u64,
    path: &Path,
    shards: usize,
) -> Result<Written, SynthError> {
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("synthetic");
    let planned = plan(shape, types, tokenizer, &format!("strata synthetic {name}"))?;
    let writer = &planned.writer;
    let io = |source| SynthError::Io { path: path.to_path_buf(), source };
    let fill = |i: usize, out: &mut [u8]| planned.fill(seed, i, out);
    let files = if shards > 1 {
        let base = path.with_extension("");
        writer.write_split(&base, shards, fill).map_err(io)?
    } else {
        writer.write(path, fill).map_err(io)?;
        vec![path.to_path_buf()]
    };
    Ok(Written {
        files,
        tensors: writer.tensors().len(),
        data_bytes: writer.tensors().iter().filter_map(|t| t.bytes()).sum(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_byte_mapping_is_a_bijection_onto_printable_chars() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(gpt2_byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(gpt2_byte_char(b'A'), 'A');
        assert_eq!(gpt2_byte_char(b' '), '\u{120}');
        assert_eq!(gpt2_byte_char(b'\n'), '\u{10A}');
        assert_eq!(gpt2_byte_char(0), '\u{100}');
    }

    #[test]
    fn presets_round_trip_names() {
        for (p, n) in Preset::ALL {
            assert_eq!(Preset::from_name(n), Some(p));
            assert_eq!(p.name(), n);
        }
    }
}
