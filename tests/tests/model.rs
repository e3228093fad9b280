//! The model description of each family, and the errors for packs that are not models.

use strata_compiler::model::{Family, ModelDesc, Role};
use strata_compiler::pack::{Array, Pack, Value};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::{self, Preset, Tokenizer, Types};
use strata_tests::synthetic_pack;

fn desc(bytes: Vec<u8>) -> Result<ModelDesc, String> {
    let pack = Pack::from_bytes("test.gguf", bytes).map_err(|e| e.to_string())?;
    ModelDesc::from_pack(&pack).map_err(|e| e.to_string())
}

#[test]
fn synthetic_presets_describe_their_shapes() {
    for (preset, family) in [
        (Preset::TinyLlama, Family::Llama),
        (Preset::TinyQwen3, Family::Qwen3),
        (Preset::TinyQwen3Moe, Family::Qwen3Moe),
        (Preset::TinyGemma3, Family::Gemma3),
    ] {
        let shape = preset.shape();
        let d = desc(synthetic_pack(preset, 3, &[GgmlType::Q4_K])).expect("valid");
        assert_eq!(d.family, family);
        assert_eq!((d.layers, d.embd, d.heads, d.kv_heads), (3, shape.embd, shape.heads, shape.kv_heads));
        assert_eq!((d.head_dim_k, d.head_dim_v, d.rope_dims), (shape.head_dim, shape.head_dim, shape.head_dim));
        assert_eq!((d.rope_base, d.rms_eps, d.context), (shape.rope_base, shape.rms_eps, shape.context));
        assert_eq!(d.vocab, 257, "the byte-level tokenizer has 257 tokens");
        assert_eq!(d.experts, shape.experts);
        assert_eq!(d.tied_output, shape.tied_output);
    }
}

/// Gemma 3's sliding window as llama.cpp reads it: the window, every n-th layer global
/// (6 unless the pattern key says otherwise; a flag a layer also works), the local
/// layers' own rope base; its extra norms are expected tensors; a final soft-capping it
/// does not implement is refused by name.
#[test]
fn gemma3_reads_its_sliding_window_and_refuses_soft_capping() {
    let plan = |shape: &synth::Shape| {
        let types = Types { weights: vec![GgmlType::Q8_0], embedding: GgmlType::Q8_0, output: GgmlType::Q8_0 };
        synth::plan(shape, &types, &Tokenizer::byte_level(), "gemma3").expect("valid")
    };
    let tiny = Preset::TinyGemma3.shape();
    let d = desc(plan(&tiny).writer.to_bytes(|_, _| {})).expect("valid gemma3");
    let sliding = d.sliding.clone().expect("a window");
    assert_eq!((sliding.of_layer(0), sliding.of_layer(2)), (Some(16), None));
    assert_eq!((sliding.window, sliding.rope_base, sliding.local), (16, 10_000.0, vec![true, true, false]));
    assert_eq!(d.attention_scale(), 0.125, "1/sqrt(head length 64)");
    let names: Vec<String> = d.expected_tensors().into_iter().map(|t| t.name).collect();
    for name in ["blk.2.post_attention_norm.weight", "blk.2.post_ffw_norm.weight", "blk.2.attn_q_norm.weight"] {
        assert!(names.iter().any(|n| n == name), "{name}");
    }

    let mut eight = synth::Shape { layers: 8, ..tiny.clone() };
    eight.sliding_window = (512, 0);
    let mut planned = plan(&eight);
    planned.writer.kv("gemma3.rope.freq_base_swa", Value::F32(20_000.0));
    let d = desc(planned.writer.to_bytes(|_, _| {})).expect("valid");
    let sliding = d.sliding.expect("a window");
    assert_eq!(sliding.local, [true, true, true, true, true, false, true, true], "every sixth layer global");
    assert_eq!(sliding.rope_base, 20_000.0);

    let mut planned = plan(&tiny);
    planned.writer.kv("gemma3.attention.sliding_window_pattern", Value::Array(Array::Bool(vec![false, true, false])));
    let d = desc(planned.writer.to_bytes(|_, _| {})).expect("valid");
    assert_eq!(d.sliding.expect("a window").local, [false, true, false]);

    let mut planned = plan(&tiny);
    planned.writer.kv("gemma3.attention.sliding_window_pattern", Value::Array(Array::Bool(vec![true])));
    assert_eq!(
        desc(planned.writer.to_bytes(|_, _| {})).unwrap_err(),
        "test.gguf: key gemma3.attention.sliding_window_pattern: expected 3 booleans, one a layer, or an integer"
    );
    let mut planned = plan(&tiny);
    planned.writer.kv("gemma3.final_logit_softcapping", Value::F32(30.0));
    assert_eq!(
        desc(planned.writer.to_bytes(|_, _| {})).unwrap_err(),
        "test.gguf: key gemma3.final_logit_softcapping: 30 is not supported (logit soft-capping)"
    );
    let planned = plan(&synth::Shape { sliding_window: (0, 0), ..tiny });
    let d = desc(planned.writer.to_bytes(|_, _| {})).expect("valid");
    assert_eq!(d.sliding, None, "no window key: every layer global, as llama.cpp reads it");
}

#[test]
fn qwen3moe_expert_tensors_are_three_dimensional() {
    let d = desc(synthetic_pack(Preset::TinyQwen3Moe, 1, &[GgmlType::IQ2_XS])).expect("valid");
    let experts = d.experts.expect("moe");
    let down = d.expected_tensors().into_iter().find(|t| t.name == "blk.0.ffn_down_exps.weight").expect("listed");
    assert_eq!(down.role, Role::Experts);
    assert_eq!(down.shape, vec![u64::from(experts.ffn), u64::from(d.embd), u64::from(experts.count)]);
}

#[test]
fn qwen2_needs_biases() {
    let mut shape = Preset::TinyLlama.shape();
    shape.family = Family::Qwen2;
    shape.layers = 1;
    let types = Types { weights: vec![GgmlType::Q8_0], embedding: GgmlType::Q8_0, output: GgmlType::Q8_0 };
    let mut planned = synth::plan(&shape, &types, &Tokenizer::byte_level(), "qwen2").expect("valid");
    let bytes = planned.writer.to_bytes(|_, _| {});
    let d = desc(bytes).expect("valid qwen2");
    assert_eq!(d.family, Family::Qwen2);
    planned.writer.retain_tensors(|t| t.name != "blk.0.attn_k.bias");
    let e = desc(planned.writer.to_bytes(|_, _| {})).unwrap_err();
    assert_eq!(e, "test.gguf: tensor blk.0.attn_k.bias: missing (architecture qwen2 needs it, shape [128])");
}

fn planned_tiny() -> synth::Planned {
    let mut shape = Preset::TinyLlama.shape();
    shape.layers = 1;
    let types = Types { weights: vec![GgmlType::Q4_0], embedding: GgmlType::Q8_0, output: GgmlType::Q6_K };
    synth::plan(&shape, &types, &Tokenizer::byte_level(), "t").expect("valid")
}

#[test]
fn packs_that_are_not_runnable_models_say_why() {
    type Breaking = Box<dyn Fn(&mut synth::Planned)>;
    let cases: Vec<(&str, Breaking)> = vec![
        (
            "test.gguf: key general.architecture: \"gemma2\" is not supported (supported: llama, qwen2, qwen3, qwen3moe, gemma3)",
            Box::new(|p| {
                p.writer.kv("general.architecture", Value::String("gemma2".into()));
            }),
        ),
        (
            "test.gguf: key qwen3.block_count: missing (required for architecture qwen3)",
            Box::new(|p| {
                p.writer.kv("general.architecture", Value::String("qwen3".into()));
            }),
        ),
        (
            "test.gguf: key llama.block_count: expected an unsigned integer below 2^32, found string \"two\"",
            Box::new(|p| {
                p.writer.kv("llama.block_count", Value::String("two".into()));
            }),
        ),
        (
            "test.gguf: tensor blk.0.ffn_up.weight: missing (architecture llama needs it, shape [256, 512])",
            Box::new(|p| {
                p.writer.retain_tensors(|t| t.name != "blk.0.ffn_up.weight");
            }),
        ),
        (
            "test.gguf: tensor blk.0.ffn_gate.weight: shape [256, 512], expected [256, 1024]",
            Box::new(|p| {
                p.writer.kv("llama.feed_forward_length", Value::U32(1024));
            }),
        ),
        (
            "test.gguf: key llama.attention.head_count_kv: 3 does not divide the 4 query heads",
            Box::new(|p| {
                p.writer.kv("llama.attention.head_count_kv", Value::U32(3));
            }),
        ),
        (
            "test.gguf: key llama.vocab_size: is 300, but token_embd.weight has 257 rows",
            Box::new(|p| {
                p.writer.kv("llama.vocab_size", Value::U32(300));
            }),
        ),
        (
            "test.gguf: key llama.rope.scaling.type: \"longrope\" is not supported (supported: none, linear, yarn)",
            Box::new(|p| {
                p.writer.kv("llama.rope.scaling.type", Value::String("longrope".into()));
            }),
        ),
        (
            "test.gguf: key llama.rope.scaling.factor: -2 is out of range (allowed: a finite value above 0 and at most 1e4)",
            Box::new(|p| {
                p.writer.kv("llama.rope.scaling.factor", Value::F32(-2.0));
            }),
        ),
        (
            "test.gguf: tensor rope_freqs.weight: shape [8], expected [32]",
            Box::new(|p| {
                p.writer.tensor("rope_freqs.weight", GgmlType::F32, &[8]).expect("whole blocks");
            }),
        ),
    ];
    for (expected, breaking) in cases {
        let mut planned = planned_tiny();
        breaking(&mut planned);
        assert_eq!(desc(planned.writer.to_bytes(|_, _| {})).unwrap_err(), expected);
    }
}

#[test]
fn unsupported_tensor_types_are_named() {
    let mut planned = planned_tiny();
    let tensors = planned.writer.tensors().to_vec();
    planned.writer.retain_tensors(|_| false);
    for t in tensors {
        let ty = if t.name == "blk.0.attn_q.weight" { GgmlType::TQ2_0 } else { t.ty };
        planned.writer.tensor(&t.name, ty, &t.shape).expect("whole blocks");
    }
    let e = desc(planned.writer.to_bytes(|_, _| {})).unwrap_err();
    assert!(e.starts_with("test.gguf: tensor blk.0.attn_q.weight: type TQ2_0 is not supported"), "{e}");
}

/// Hyperparameters out of their ranges are refused with the key, the value and the
/// range: NaN, infinite, zero and negative epsilons and RoPE bases (which would reach the
/// kernels as `NaNf` / `inff` literals), a zero context (once silently raised to 1), and
/// head counts and lengths no kernel can take.
#[test]
fn hyperparameters_are_checked_against_their_ranges() {
    let eps = "llama.attention.layer_norm_rms_epsilon";
    let base = "llama.rope.freq_base";
    let float_range = |key: &str, v: &str, max: &str| {
        format!("test.gguf: key {key}: {v} is out of range (allowed: a finite value above 0 and at most {max})")
    };
    let mut cases: Vec<(String, &str, Value)> = Vec::new();
    for (v, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (0.0, "0"), (-1e-5, "-0.000009999999747378752")] {
        cases.push((float_range(eps, shown, "1e0"), eps, Value::F32(v)));
        cases.push((float_range(base, shown, "1e12"), base, Value::F32(v)));
    }
    let int_range = |key: &str, v: u32, lo: u32, hi: u32| {
        format!("test.gguf: key llama.{key}: {v} is out of range (allowed: {lo} to {hi})")
    };
    cases.extend([
        (int_range("context_length", 0, 1, 2147483647), "llama.context_length", Value::U32(0)),
        (int_range("context_length", u32::MAX, 1, 2147483647), "llama.context_length", Value::U32(u32::MAX)),
        (int_range("attention.key_length", 4096, 1, 1024), "llama.attention.key_length", Value::U32(4096)),
        (int_range("attention.value_length", 0, 1, 1024), "llama.attention.value_length", Value::U32(0)),
        (int_range("attention.head_count", 5000, 1, 4096), "llama.attention.head_count", Value::U32(5000)),
        (int_range("embedding_length", 1 << 21, 1, 1 << 20), "llama.embedding_length", Value::U32(1 << 21)),
    ]);
    for (expected, key, value) in cases {
        let mut planned = planned_tiny();
        planned.writer.kv(key, value);
        assert_eq!(desc(planned.writer.to_bytes(|_, _| {})).unwrap_err(), expected);
    }
}

/// Tensors the family does not use are refused by name: a Gemma 3 pack relabelled
/// `llama` has extra norms, and would otherwise run and print garbage.
/// The rope a pack asks for is read from its keys (llama.cpp's default type is linear),
/// and `rope_freqs.weight` only where llama.cpp reads it (the llama family).
#[test]
fn rope_scaling_is_read_and_frequency_factors_belong_to_llama() {
    use strata_compiler::model::RopeScaling;
    let with = |kvs: &[(&str, Value)]| {
        let mut planned = planned_tiny();
        for (k, v) in kvs {
            planned.writer.kv(k, v.clone());
        }
        desc(planned.writer.to_bytes(|_, _| {})).expect("a model")
    };
    assert_eq!(with(&[]).rope_scaling, RopeScaling::None);
    assert_eq!(
        with(&[("llama.rope.scaling.factor", Value::F32(2.0))]).rope_scaling,
        RopeScaling::Linear { factor: 2.0 }
    );
    assert_eq!(with(&[("llama.rope.scale_linear", Value::F32(4.0))]).rope_scaling, RopeScaling::Linear { factor: 4.0 });
    let yarn =
        [("llama.rope.scaling.type", Value::String("yarn".into())), ("llama.rope.scaling.factor", Value::F32(4.0))];
    assert_eq!(with(&yarn).rope_scaling, RopeScaling::Yarn { factor: 4.0, original_context: 4096 });
    let none =
        [("llama.rope.scaling.type", Value::String("none".into())), ("llama.rope.scaling.factor", Value::F32(8.0))];
    assert_eq!(with(&none).rope_scaling, RopeScaling::None);
    assert_eq!(with(&[("llama.rope.scaling.attn_factor", Value::F32(0.5))]).rope_attn_factor, 0.5);

    let mut planned = planned_tiny();
    planned.writer.tensor("rope_freqs.weight", GgmlType::F32, &[32]).expect("whole blocks");
    assert!(desc(planned.writer.to_bytes(|_, _| {})).expect("a model").rope_freq_factors);
    let shape = Preset::TinyQwen3.shape();
    let types = Types { weights: vec![GgmlType::Q8_0], embedding: GgmlType::Q8_0, output: GgmlType::Q8_0 };
    let mut qwen = synth::plan(&shape, &types, &Tokenizer::byte_level(), "q").expect("valid");
    qwen.writer.tensor("rope_freqs.weight", GgmlType::F32, &[32]).expect("whole blocks");
    let e = desc(qwen.writer.to_bytes(|_, _| {})).unwrap_err();
    assert!(e.starts_with("test.gguf: tensor rope_freqs.weight: architecture qwen3 does not use it"), "{e}");
}

#[test]
fn tensors_the_family_does_not_use_are_refused() {
    let mut planned = planned_tiny();
    for name in ["blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"] {
        planned.writer.tensor(name, GgmlType::F32, &[256]).expect("whole blocks");
    }
    let e = desc(planned.writer.to_bytes(|_, _| {})).unwrap_err();
    assert_eq!(
        e,
        "test.gguf: tensor blk.0.post_attention_norm.weight: architecture llama does not use it (2 unexpected \
         tensor(s): blk.0.post_attention_norm.weight, blk.0.post_ffw_norm.weight); is the pack's \
         general.architecture right?"
    );
}
