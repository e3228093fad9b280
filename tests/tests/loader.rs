//! Loading damaged or hostile packs on the CPU: allocations too large for memory, a
//! vocabulary past the embedding, non-finite weights, and non-finite logits under
//! `--checked` are errors that name what is wrong, never an abort or an exit-0 answer.

use std::path::{Path, PathBuf};
use std::time::Instant;

use strata_compiler::pack::{Array, Pack, Value, parse};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::{self, Preset, Tokenizer, Types};
use strata_runtime::session::{self, BackendChoice, OpenOptions};
use strata_runtime::tokenizer::Tokenizer as PackTokenizer;

/// A two-layer tiny llama (Q4_0 weights) with `edit` applied to its writer, as bytes.
fn pack_bytes(edit: impl Fn(&mut synth::Planned)) -> Vec<u8> {
    pack_bytes_of(2, edit)
}

fn pack_bytes_of(layers: u32, edit: impl Fn(&mut synth::Planned)) -> Vec<u8> {
    let mut shape = Preset::TinyLlama.shape();
    shape.layers = layers;
    let types = Types { weights: vec![GgmlType::Q4_0], embedding: GgmlType::Q8_0, output: GgmlType::Q6_K };
    let mut planned = synth::plan(&shape, &types, &Tokenizer::byte_level(), "t").expect("valid");
    edit(&mut planned);
    planned.writer.to_bytes(|i, out| planned.fill(1, i, out))
}

fn write(dir: &Path, bytes: &[u8]) -> PathBuf {
    let path = dir.join("p.gguf");
    std::fs::write(&path, bytes).expect("written");
    path
}

fn open(bytes: &[u8], ctx: Option<u32>, checked: bool) -> Result<session::Session, String> {
    open_slots(bytes, ctx, checked, 1)
}

fn open_slots(bytes: &[u8], ctx: Option<u32>, checked: bool, slots: usize) -> Result<session::Session, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = OpenOptions { backend: BackendChoice::Cpu, ctx, checked, slots, ..OpenOptions::default() };
    session::open(&write(dir.path(), bytes), &opts, &mut |_| {}).map_err(|e| e.to_string())
}

/// Overwrites `bytes` of tensor `name`'s data at `at`.
fn patch(pack: &mut [u8], name: &str, at: usize, bytes: &[u8]) {
    let t = parse(pack).expect("valid").tensors.into_iter().find(|t| t.name == name).expect("present");
    let start = t.offset as usize + at;
    pack[start..start + bytes.len()].copy_from_slice(bytes);
}

/// A context of 2^24 to 2^31-1 positions (the pack's own, or --ctx) is refused before
/// anything is allocated, naming the sizes and the budget; beyond 2^31-1 the range.
/// (Eight layers and eight slots: 2^24 positions then take 128 GiB of KV cache, more
/// than any test machine has available.)
#[test]
fn contexts_too_large_for_memory_are_errors() {
    for context in [1u32 << 24, 1 << 28, i32::MAX as u32] {
        let bytes = pack_bytes_of(8, |p| {
            p.writer.kv("llama.context_length", Value::U32(context));
        });
        let e = open_slots(&bytes, None, false, 8).err().expect("refused");
        assert!(
            e.starts_with(&format!("a context of {context} positions (--ctx, or the pack's context_length {context}")),
            "{e}"
        );
        assert!(
            e.contains("of KV cache") && e.contains("but the budget is") && e.contains("(available host memory)"),
            "{e}"
        );
    }
    let e = open(&pack_bytes(|_| {}), Some(u32::MAX), false).err().expect("refused");
    assert!(e.ends_with("is too large: at most 2147483647 positions"), "{e}");
    let e = open(&pack_bytes(|_| {}), Some(0), false).err().expect("refused");
    assert_eq!(e, "context, window and slots must be at least 1");
}

/// A vocabulary larger than the embedding is refused at load; a huge count of empty
/// tokens is refused before the tokenizer expands it.
#[test]
fn vocabularies_past_the_embedding_are_refused() {
    let bytes = pack_bytes(|p| {
        let tokens: Vec<String> = (0..300).map(|i| format!("t{i}")).collect();
        p.writer.kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    });
    let e = open(&bytes, Some(64), false).err().expect("refused");
    assert!(
        e.ends_with(
            "tokenizer: key tokenizer.ggml.tokens: holds 300 tokens, but token_embd.weight has only 257 rows (at most 257 tokens)"
        ),
        "{e}"
    );
    let bytes = pack_bytes(|p| {
        p.writer.kv("tokenizer.ggml.tokens", Value::Array(Array::String(vec![String::new(); 3_000_000])));
    });
    let pack = Pack::from_bytes("empty.gguf", bytes).expect("a valid container");
    let e = PackTokenizer::from_pack(&pack).expect_err("refused").to_string();
    assert!(e.contains("holds 3000000 tokens, but token_embd.weight has only 257 rows"), "{e}");
}

/// NaN or infinity in a norm weight or a block scale is found at load and named.
#[test]
fn non_finite_weights_are_refused_at_load() {
    let clean = pack_bytes(|_| {});
    assert!(open(&clean, Some(64), false).is_ok());
    let nan = f32::NAN.to_le_bytes();
    let cases: [(&str, usize, &[u8], &str); 3] = [
        ("blk.1.ffn_norm.weight", 4 * 5, &nan, "tensor blk.1.ffn_norm.weight: element 5 is NaN"),
        (
            "blk.0.attn_q.weight",
            18 * 3,
            &0x7C00u16.to_le_bytes(),
            "tensor blk.0.attn_q.weight: the scale of block 3 is inf",
        ),
        (
            "token_embd.weight",
            34 * 7,
            &0xFE00u16.to_le_bytes(),
            "tensor token_embd.weight: the scale of block 7 is NaN",
        ),
    ];
    for (name, at, bytes, expected) in cases {
        let mut pack = clean.clone();
        patch(&mut pack, name, at, bytes);
        let e = open(&pack, Some(64), false).err().expect("refused");
        assert!(e.contains(expected) && e.ends_with("the pack's weights are damaged (refusing to load)"), "{e}");
    }
}

/// Finite weights large enough to overflow: without checking the answer is silently
/// token 0; `--checked` refuses the non-finite logits and names layer 1, where the
/// overflowing norm is.
#[test]
fn checked_runs_name_the_first_non_finite_layer() {
    let mut pack = pack_bytes(|_| {});
    let huge: Vec<u8> = (0..256).flat_map(|_| f32::MAX.to_le_bytes()).collect();
    patch(&mut pack, "blk.1.ffn_norm.weight", 0, &huge);
    let mut s = open(&pack, Some(64), false).expect("opens unchecked");
    s.model.forward(&[1, 2, 3], strata_runtime::model::Logits::Last).expect("runs");
    assert_eq!(s.model.argmax(1).expect("unchecked argmax"), vec![0], "NaN logits pick token 0");
    let e = open(&pack, Some(64), true).err().expect("refused when checked");
    assert!(e.starts_with("warm-up token failed, refusing to serve: non-finite logits (row 0, token "), "{e}");
    assert!(e.contains(": first non-finite output in layer 1: kernel "), "{e}");
}

/// The cost of the non-finite scan against a whole CPU load of a SmolLM2-shaped pack
/// (Q4_0 and F16 weights): `cargo test -p strata-tests --test loader -- --ignored
/// --nocapture scan_cost`. A measurement, not a check.
#[test]
#[ignore]
fn scan_cost() {
    let dir = tempfile::tempdir().expect("tempdir");
    for ty in [GgmlType::Q4_0, GgmlType::F16] {
        let path = dir.path().join(format!("{ty}.gguf"));
        std::fs::write(&path, strata_tests::synthetic_pack(Preset::SmolLm2, 30, &[ty])).expect("written");
        let opts = OpenOptions { backend: BackendChoice::Cpu, ctx: Some(256), ..OpenOptions::default() };
        let median = |f: &mut dyn FnMut()| {
            let mut times: Vec<f64> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .collect();
            times.sort_by(f64::total_cmp);
            times[2]
        };
        let load = median(&mut || drop(session::open(&path, &opts, &mut |_| {}).expect("opens")));
        let pack = Pack::open(&path).expect("opens");
        let scan = median(&mut || strata_runtime::model::check_finite(&pack).expect("finite"));
        eprintln!(
            "{ty}: load {:.1} ms (scan included), scan {:.2} ms = {:.1}%",
            load * 1e3,
            scan * 1e3,
            100.0 * scan / load
        );
    }
}
