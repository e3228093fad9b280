//! The real default model: SmolLM2-135M-Instruct Q4_1, fetched by scripts/fetch-model.sh.

use std::path::PathBuf;

use strata_compiler::inspect;
use strata_compiler::model::{Family, ModelDesc};
use strata_compiler::pack::Pack;

fn fixture_rows(name: &str) -> Vec<f32> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/smollm2").join(format!("{name}.f32"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn description_matches_the_published_config() {
    let Some(path) = strata_tests::smollm2() else { return };
    let pack = Pack::open(&path).expect("opens");
    let d = ModelDesc::from_pack(&pack).expect("runnable");
    assert_eq!(d.family, Family::Llama);
    assert_eq!((d.layers, d.embd, d.ffn, d.vocab, d.context), (30, 576, 1536, 49_152, 8192));
    assert_eq!((d.heads, d.kv_heads, d.head_dim_k, d.head_dim_v), (9, 3, 64, 64));
    assert_eq!((d.rope_base, d.rope_dims, d.rms_eps), (100_000.0, 64, 1e-5));
    assert!(d.tied_output && d.experts.is_none());

    let report = inspect::inspect(&pack);
    let by_type: Vec<(&str, usize)> = report.bytes_by_type.iter().map(|t| (t.ty.as_str(), t.tensors)).collect();
    assert_eq!(by_type, [("Q4_1", 210), ("Q8_0", 1), ("F32", 61)]);
    assert_eq!(report.tensors.len(), 272);
    let text = report.to_text();
    assert!(text.contains("tokenizer.ggml.merges") && text.contains("[48900 items]"), "{text}");
}

#[test]
fn rows_match_the_outside_reference_bit_for_bit() {
    let Some(path) = strata_tests::smollm2() else { return };
    let pack = Pack::open(&path).expect("opens");
    for name in ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight", "output_norm.weight"] {
        let expected = fixture_rows(name);
        let t = pack.tensor(name).expect("present");
        let rows = expected.len() / t.row_len() as usize;
        let bytes = &pack.data(t)[..rows * t.ty.row_bytes(t.row_len()).expect("whole blocks") as usize];
        let mut got = vec![0f32; expected.len()];
        t.ty.dequantize(bytes, &mut got).expect("supported");
        let same = got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name} differs from the gguf package");
    }
    // The inspect --dequant path writes the same values, rows in file order.
    let mut out = Vec::new();
    let n = inspect::dequantize_tensor(&pack, "blk.0.attn_q.weight", &mut out).expect("written");
    assert_eq!(n, 576 * 576);
    assert_eq!(out.len(), 576 * 576 * 4);
    let expected: Vec<u8> = fixture_rows("blk.0.attn_q.weight").iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(&out[..expected.len()], &expected[..]);
}

/// Prompts read in chunks of 1 (GEMV windows), 7, 64 and 512 tokens (GEMMs and the
/// prefill attention) give the same greedy text on the CPU backend.
#[test]
fn greedy_text_is_the_same_for_every_prefill_chunk() {
    use strata_runtime::generate;
    use strata_runtime::sampler::{Sampler, SamplerConfig};
    use strata_runtime::session::{self, BackendChoice, OpenOptions};
    let Some(model) = strata_tests::smollm2() else { return };
    let prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n    \
                  return fibonacci(n - 1) + fibonacci(n - 2)\n\n\ndef factorial(n):\n    \"\"\"Return n factorial, \
                  computed iteratively so that large inputs do not overflow the stack.\"\"\"\n";
    let mut texts = Vec::new();
    for prefill in [1, 7, 64, 512] {
        let opts = OpenOptions { backend: BackendChoice::Cpu, ctx: Some(256), prefill, ..OpenOptions::default() };
        let mut s = session::open(&model, &opts, &mut |_| {}).expect("opens on the CPU");
        assert_eq!(s.model.chunk(), prefill, "prompt chunks of --prefill");
        let ids = s.tokenizer.encode(prompt, true);
        assert!(ids.len() > 64, "the prompt spans several chunks of 64 ({} tokens)", ids.len());
        let mut out = Vec::new();
        generate::generate(&mut s, &ids, 8, true, &mut Sampler::new(SamplerConfig::greedy()), &mut |_, t| {
            out.push(t);
            true
        })
        .expect("generates");
        texts.push((prefill, s.tokenizer.decode(&out)));
    }
    for (prefill, text) in &texts[1..] {
        assert_eq!(text, &texts[0].1, "prefill {prefill} against prefill 1");
    }
}
