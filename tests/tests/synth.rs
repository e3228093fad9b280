//! Synthetic packs: every supported type, deterministic output, shards, and clear
//! errors for types that do not fit a shape.

use strata_compiler::model::ModelDesc;
use strata_compiler::pack::Pack;
use strata_compiler::quant::{GgmlType, SUPPORTED};
use strata_compiler::synth::{self, Preset, SynthError, Tokenizer, Types};
use strata_tests::synthetic_pack;

#[test]
fn every_supported_type_makes_a_valid_pack_of_finite_weights() {
    for ty in SUPPORTED {
        let pack = Pack::from_bytes("t.gguf", synthetic_pack(Preset::TinyQwen3Moe, 1, &[ty])).expect("valid");
        let desc = ModelDesc::from_pack(&pack).expect("runnable");
        let q = pack.tensor("blk.0.attn_q.weight").expect("present");
        assert_eq!(q.ty, ty);
        let experts = pack.tensor("blk.0.ffn_up_exps.weight").expect("present");
        assert_eq!(experts.shape, vec![u64::from(desc.embd), 256, 8]);
        for t in pack.tensors() {
            let mut values = vec![0f32; t.elements() as usize];
            t.ty.dequantize(pack.data(t), &mut values).expect("whole blocks");
            assert!(values.iter().all(|v| v.is_finite()), "{}: {ty}", t.name);
            let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
            let expected = if t.name.ends_with("norm.weight") { 0.8..1.2 } else { 0.005..0.08 };
            assert!(expected.contains(&rms), "{} ({}): rms {rms}", t.name, t.ty);
        }
    }
}

#[test]
fn same_seed_same_pack() {
    let a = synthetic_pack(Preset::TinyLlama, 2, &[GgmlType::IQ2_XS, GgmlType::Q6_K]);
    let b = synthetic_pack(Preset::TinyLlama, 2, &[GgmlType::IQ2_XS, GgmlType::Q6_K]);
    assert_eq!(a, b);
    let shape = Preset::TinyLlama.shape();
    let types = Types { weights: vec![GgmlType::IQ2_XS], embedding: GgmlType::Q8_0, output: GgmlType::Q6_K };
    let planned = synth::plan(&shape, &types, &Tokenizer::byte_level(), "test").expect("valid");
    let seeded = |seed| planned.writer.to_bytes(|i, out| planned.fill(seed, i, out));
    assert_eq!(seeded(3), seeded(3));
    assert_ne!(seeded(3), seeded(4));
}

#[test]
fn split_and_single_files_hold_the_same_tensors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shape = Preset::TinyQwen3.shape();
    shape.layers = 3;
    let types =
        Types { weights: vec![GgmlType::IQ3_XXS, GgmlType::Q5_K], embedding: GgmlType::Q4_0, output: GgmlType::Q6_K };
    let tok = Tokenizer::byte_level();
    let single = dir.path().join("one.gguf");
    synth::write(&shape, &types, &tok, 9, &single, 1).expect("written");
    let written = synth::write(&shape, &types, &tok, 9, &dir.path().join("many.gguf"), 4).expect("written");
    assert_eq!(written.files.len(), 4);
    assert!(written.files[3].ends_with("many-00004-of-00004.gguf"));
    let (one, many) = (Pack::open(&single).expect("opens"), Pack::open(&written.files[2]).expect("opens"));
    assert_eq!(one.tensors().len(), many.tensors().len());
    assert_eq!(many.tensors().last().map(|t| t.shard), Some(3));
    for t in one.tensors() {
        let u = many.tensor(&t.name).expect("same names");
        assert_eq!((t.ty, &t.shape), (u.ty, &u.shape));
        assert_eq!(one.data(t), many.data(u), "{}", t.name);
    }
    assert_eq!(ModelDesc::from_pack(&one).expect("runnable"), ModelDesc::from_pack(&many).expect("runnable"));
}

#[test]
fn types_that_do_not_fit_the_shape_are_refused_clearly() {
    let shape = Preset::SmolLm2.shape();
    let types = Types { weights: vec![GgmlType::Q4_K], embedding: GgmlType::Q8_0, output: GgmlType::Q6_K };
    let e = synth::plan(&shape, &types, &Tokenizer::byte_level(), "t").unwrap_err();
    assert!(matches!(e, SynthError::Rows { ty: GgmlType::Q4_K, block: 256, row: 576, .. }), "{e}");
    assert!(e.to_string().starts_with("tensor blk.0.attn_q.weight: type Q4_K needs rows that are a multiple of 256"));
    let mut small = Preset::TinyLlama.shape();
    small.vocab = Some(100);
    let e = synth::plan(&small, &types, &Tokenizer::byte_level(), "t").unwrap_err();
    assert_eq!(e.to_string(), "vocabulary of 100 is smaller than the tokenizer's 257 tokens");
}

#[test]
fn copied_tokenizers_are_padded_to_the_vocabulary() {
    let Some(path) = strata_tests::smollm2() else { return };
    let source = Pack::open(&path).expect("opens");
    let tok = Tokenizer::from_pack(&source).expect("has a tokenizer");
    assert_eq!(tok.tokens(), 49_152);
    let mut shape = Preset::TinyLlama.shape();
    shape.vocab = Some(50_000);
    shape.layers = 1;
    let types = Types { weights: vec![GgmlType::Q4_0], embedding: GgmlType::Q4_0, output: GgmlType::Q6_K };
    let planned = synth::plan(&shape, &types, &tok, "t").expect("valid");
    let pack = Pack::from_bytes("t.gguf", planned.writer.to_bytes(|_, _| {})).expect("valid");
    let meta = pack.metadata();
    let tokens = meta.array("tokenizer.ggml.tokens").expect("array").expect("present");
    assert_eq!(tokens.len(), 50_000);
    assert_eq!(meta.array("tokenizer.ggml.token_type").expect("array").map(|a| a.len()), Some(50_000));
    assert_eq!(meta.array("tokenizer.ggml.merges").expect("array").map(|a| a.len()), Some(48_900));
    assert_eq!(meta.str("tokenizer.ggml.pre").expect("string"), Some("smollm"));
    assert_eq!(ModelDesc::from_pack(&pack).expect("runnable").vocab, 50_000);
}
