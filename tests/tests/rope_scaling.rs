//! Rope variants against llama.cpp (`tests/fixtures/rope_llamacpp.json`, written by
//! `scripts/reference/rope_reference.py`): synthetic tiny llama packs with Llama 3.1+
//! frequency factors, YaRN and linear scaling, over a 600-token prompt, on the CPU
//! backend. Each variant's logits match llama.cpp's for that variant, and the plain rope
//! (the same weights without the variant) misses them by several times as much: the
//! variant is read, not ignored.

use serde_json::Value;
use sha2::{Digest, Sha256};
use strata_compiler::model::RopeScaling;
use strata_compiler::pack::Pack;
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::{self, Preset, Tokenizer, Types};
use strata_runtime::generate::{self, Scored};
use strata_runtime::session::{self, BackendChoice, OpenOptions};

/// The pack `rope_reference.py` made with `flags` (strata-compile synth --preset tiny-llama
/// --type Q8_0 --seed 7 --tokenizer-from SmolLM2), written to `dir`.
fn pack(dir: &std::path::Path, name: &str, flags: &[String], smollm2: &std::path::Path) -> std::path::PathBuf {
    let mut shape = Preset::TinyLlama.shape();
    match flags {
        [] => {}
        [f] if f == "--rope-freqs" => shape.rope_freq_factors = true,
        [f, v] if f == "--rope-scaling" => {
            let parts: Vec<&str> = v.split(':').collect();
            let factor: f32 = parts[1].parse().expect("factor");
            shape.rope_scaling = match parts[0] {
                "linear" => RopeScaling::Linear { factor },
                _ => RopeScaling::Yarn { factor, original_context: parts[2].parse().expect("context") },
            };
        }
        other => panic!("flags {other:?}"),
    }
    let tokenizer = Tokenizer::from_pack(&Pack::open(smollm2).expect("SmolLM2 opens")).expect("a tokenizer");
    let types = Types { weights: vec![GgmlType::Q8_0], embedding: GgmlType::Q8_0, output: GgmlType::Q6_K };
    let path = dir.join(format!("{name}.gguf"));
    synth::write(&shape, &types, &tokenizer, 7, &path, 1).expect("written");
    path
}

/// Top-5 logits at every position of `tokens`, on the CPU reference.
fn score(path: &std::path::Path, tokens: &[u32]) -> Vec<Scored> {
    let opts = OpenOptions { backend: BackendChoice::Cpu, ctx: Some(1024), prefill: 128, ..OpenOptions::default() };
    let mut s = session::open(path, &opts, &mut |_| {}).expect("opens on the CPU");
    generate::score(&mut s, tokens, 5).expect("scores")
}

/// Mean and largest |ours − llama.cpp| over the fixture's logits that both top-5s hold,
/// and how many.
fn distance(ours: &[Scored], reference: &Value) -> (f64, f64, usize) {
    let (mut sum, mut max, mut n) = (0.0, 0.0f64, 0);
    for e in reference["positions"].as_array().expect("positions") {
        let (_, top) = &ours[e["position"].as_u64().expect("position") as usize];
        for pair in e["top"].as_array().expect("top") {
            let id = pair[0].as_u64().expect("id") as u32;
            if let Some((_, l)) = top.iter().find(|(t, _)| *t == id) {
                let d = (f64::from(*l) - pair[1].as_f64().expect("logit")).abs();
                (sum, max, n) = (sum + d, max.max(d), n + 1);
            }
        }
    }
    (sum / n.max(1) as f64, max, n)
}

#[test]
fn rope_variants_match_llama_cpp_and_the_plain_rope_does_not() {
    let Some(smollm2) = strata_tests::smollm2() else { return };
    let fixture: Value = serde_json::from_str(include_str!("../fixtures/rope_llamacpp.json")).expect("fixture parses");
    let dir = tempfile::tempdir().expect("tempdir");
    let packs = &fixture["packs"];
    let tokens: Vec<u32> = serde_json::from_value(packs["plain"]["prompt_tokens"].clone()).expect("tokens");
    let mut plain = None;
    for name in ["plain", "freqs", "yarn", "linear"] {
        let reference = &packs[name];
        let flags: Vec<String> = serde_json::from_value(reference["flags"].clone()).expect("flags");
        let path = pack(dir.path(), name, &flags, &smollm2);
        let digest: String =
            Sha256::digest(std::fs::read(&path).expect("read")).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            digest,
            reference["sha256"].as_str().expect("sha256"),
            "{name}: synth no longer writes the fixture's pack: rerun rope_reference.py"
        );
        assert_eq!(reference["prompt_tokens"], packs["plain"]["prompt_tokens"]);
        let ours = score(&path, &tokens);
        let (mean, max, n) = distance(&ours, reference);
        eprintln!("{name}: against llama.cpp, mean {mean:.4}, max {max:.4} over {n} logits");
        assert!(n > 100 && mean < 0.01 && max < 0.05, "{name}: mean {mean}, max {max} over {n}");
        // Greedy after the prompt, where llama.cpp's margin is clear.
        let step = &reference["steps"][0];
        let top = step["top"].as_array().expect("top");
        let margin = top[0][1].as_f64().expect("logit") - top[1][1].as_f64().expect("logit");
        if margin > 0.05 {
            assert_eq!(u64::from(ours[tokens.len() - 1].1[0].0), step["token"].as_u64().expect("token"), "{name}");
        }
        match &plain {
            None => plain = Some(ours),
            Some(plain) => {
                let (missed, _, _) = distance(plain, reference);
                eprintln!("{name}: the plain rope against it, mean {missed:.4}");
                assert!(
                    missed > 3.0 * mean && missed > 0.01,
                    "{name}: the plain rope is as close ({missed} vs {mean})"
                );
            }
        }
    }
}
