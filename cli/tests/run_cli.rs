//! `strata-run` as users call it: real processes on real packs, on the CPU backend (CI
//! has no GPU; the GPU paths are exercised by scripts/device-check.sh).

use std::path::Path;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata-run")).args(args).output().expect("runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn synth(dir: &Path, preset: &str, name: &str) -> String {
    let out = dir.join(name);
    let out = out.to_str().expect("utf-8 path");
    let o = Command::new(env!("CARGO_BIN_EXE_strata-compile"))
        .args(["synth", "--preset", preset, "--type", "Q8_0,Q4_K", "--out", out, "--seed", "9"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", text(&o.stderr));
    out.to_string()
}

#[test]
fn generate_on_the_cpu_streams_text_and_reports_speed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = synth(dir.path(), "tiny-llama", "llama.gguf");
    let greedy = || {
        run(&[
            "generate",
            "--pack",
            &pack,
            "--backend",
            "cpu",
            "--prompt",
            "hello",
            "--max-tokens",
            "8",
            "--ignore-eos",
        ])
    };
    let o = greedy();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let e = text(&o.stderr);
    assert!(e.contains("prefill 5 tokens at") && e.contains("decode 7 tokens at"), "{e}");
    // Same seed and sampler settings give the same text; greedy is deterministic.
    let again = greedy();
    assert_eq!(o.stdout, again.stdout);
    let sampled = |seed: &str| {
        let args = ["generate", "--pack", &pack, "--backend", "cpu", "--prompt", "hello", "--max-tokens", "8"];
        run(&[&args[..], &["--ignore-eos", "--temperature", "1.5", "--top-k", "0", "--seed", seed]].concat()).stdout
    };
    assert_eq!(sampled("7"), sampled("7"));
}

#[test]
fn bad_input_gets_one_clear_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\0\0\0 not really").expect("write");
    let o = run(&["generate", "--pack", junk.to_str().expect("utf-8"), "--backend", "cpu", "--prompt", "x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).starts_with("strata-run: ") && text(&o.stderr).contains("junk.gguf"),
        "{}",
        text(&o.stderr)
    );

    // A mixture-of-experts pack runs; an expert budget below one layer's experts is refused
    // with the sizes.
    let moe = synth(dir.path(), "tiny-qwen3moe", "moe.gguf");
    let o = run(&["generate", "--pack", &moe, "--backend", "cpu", "--prompt", "x", "--max-tokens", "2"]);
    assert!(o.status.success() && text(&o.stderr).contains("experts: all 16 resident"), "{}", text(&o.stderr));
    let o = run(&["generate", "--pack", &moe, "--backend", "cpu", "--prompt", "x", "--expert-cache", "5%"]);
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(e.contains("holds 0 experts (0.0 MiB)") && e.contains("need 2") && e.contains("--expert-cache"), "{e}");

    let llama = synth(dir.path(), "tiny-llama", "llama.gguf");
    for (backend, want) in [("cuda", "no CUDA driver"), ("hip", "no HIP runtime")] {
        let o = run(&["generate", "--pack", &llama, "--backend", backend, "--prompt", "x"]);
        if o.status.success() {
            continue; // this machine has that GPU
        }
        let e = text(&o.stderr);
        assert!(e.contains(want) || e.contains("device"), "{e}");
        assert_eq!(e.trim().lines().count(), 1, "{e}");
    }
    let o =
        run(&["generate", "--pack", &llama, "--backend", "cpu", "--prompt", "x", "--ctx", "3", "--max-tokens", "9"]);
    assert!(o.status.success(), "a full context ends generation: {}", text(&o.stderr));
}

/// `--backend auto` that lands on the CPU says, one line each, why CUDA and HIP were not
/// used (here, with no GPU: their driver libraries are missing).
#[test]
fn auto_says_why_each_gpu_backend_was_passed_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llama = synth(dir.path(), "tiny-llama", "llama.gguf");
    let o = run(&["generate", "--pack", &llama, "--backend", "auto", "--prompt", "x", "--max-tokens", "2"]);
    let e = text(&o.stderr);
    assert!(o.status.success(), "{e}");
    if !e.contains(", cpu)") {
        return; // this machine has a GPU that auto chose
    }
    let skipped: Vec<_> = e.lines().filter(|l| l.starts_with("strata-run: --backend auto: ")).collect();
    assert_eq!(skipped.len(), 2, "{e}");
    assert!(skipped[0].contains("CUDA not used: ") && skipped[1].contains("HIP not used: "), "{e}");
    // A driver library missing, no (supported) device, or a failure at init.
    let reasons =
        ["libcuda.so.1 not found", "no HIP runtime", "no device present", "no supported device", "failed at init"];
    for line in &skipped {
        assert!(reasons.iter().any(|r| line.contains(r)), "{line}");
    }
    let device = e.lines().position(|l| l.starts_with("strata-run: device: ")).expect("device line");
    let last_skip = e.lines().position(|l| l.contains("HIP not used")).expect("skip line");
    assert!(last_skip < device, "reasons come before the fallback: {e}");
}

/// A start that goes quiet for longer than --startup-timeout ends with the stage it was
/// in (reading SmolLM2's tokenizer alone takes longer than the millisecond allowed here).
#[test]
fn a_stalled_start_names_its_stage() {
    let Some(model) = strata_tests::smollm2() else { return };
    let model = model.to_str().expect("utf-8");
    let o = run(&["generate", "--pack", model, "--backend", "cpu", "--prompt", "x", "--startup-timeout", "0.001"]);
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(e.contains("strata-run: start-up stalled: no progress in stage \""), "{e}");
    assert!(e.contains("(limit: --startup-timeout 0.001)"), "{e}");
}

#[test]
fn score_prints_the_top_logits_of_every_position_as_json() {
    let Some(model) = strata_tests::smollm2() else { return };
    let model = model.to_str().expect("utf-8");
    let o = run(&[
        "score",
        "--pack",
        model,
        "--backend",
        "cpu",
        "--prompt",
        "The capital of France is",
        "--top-k",
        "3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let positions = v["positions"].as_array().expect("positions");
    let tokens: Vec<u64> = positions.iter().map(|p| p["token"].as_u64().expect("token")).collect();
    assert_eq!(tokens, [504, 3575, 282, 4649, 314], "llama.cpp's ids for this prompt");
    for p in positions {
        let top = p["top_k"].as_array().expect("top_k");
        assert_eq!(top.len(), 3);
        let logits: Vec<f64> = top.iter().map(|x| x[1].as_f64().expect("logit")).collect();
        assert!(logits.windows(2).all(|w| w[0] >= w[1]), "{logits:?}");
    }
    // " Paris" follows "The capital of France is".
    assert_eq!(positions[4]["top_k"][0][0], 7042);

    let o = run(&[
        "generate",
        "--pack",
        model,
        "--backend",
        "cpu",
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "12",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("Paris"), "{}", text(&o.stdout));
    assert!(!text(&o.stdout).contains("<|im_"), "special tokens are not printed");
}

/// `bench --batch`: one line a batch size, its aggregate rate `each` times the batch's
/// rate a sequence; a batch larger than the slots is not asked for (the slots follow it).
#[test]
fn bench_batch_reports_each_batch_sizes_aggregate_rate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = synth(dir.path(), "tiny-llama", "llama.gguf");
    let o = run(&["bench", "--pack", &pack, "--backend", "cpu", "--batch", "1,3", "-p", "4", "-n", "4", "-r", "1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    for (line, n) in lines.iter().zip([1.0, 3.0]) {
        assert!(line.starts_with(&format!("pp4 tg4 x  {n} sequences: ")), "{line}");
        let numbers: Vec<f64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        let (aggregate, each) = (numbers[1], numbers[2]);
        assert!(aggregate > 0.0 && (aggregate / n - each).abs() < 0.1, "{line}");
    }
}

/// `--profile` follows each rate with its step's launches by kernel: their launches and
/// times add up to the step's, the costliest first.
#[test]
fn bench_batch_profile_breaks_a_step_down_by_kernel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = synth(dir.path(), "tiny-llama", "llama.gguf");
    let args =
        ["bench", "--pack", &pack, "--backend", "cpu", "--batch", "3", "-p", "4", "-n", "2", "-r", "1", "--profile"];
    let o = run(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("pp4 tg2 x  3 sequences: "), "{out}");
    let head: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(head[..6], ["step", "of", "3", "sequences,", "launch", "by"], "{out}");
    let (total, launches): (f64, usize) = (head[7].parse().expect("us"), head[10].parse().expect("launches"));
    let rows: Vec<(usize, f64)> = lines[3..]
        .iter()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[1].parse().expect("launches"), w[2].parse().expect("us"))
        })
        .collect();
    assert!(rows.len() > 5 && lines[3..].iter().any(|l| l.starts_with("argmax_")), "{out}");
    assert_eq!(rows.iter().map(|r| r.0).sum::<usize>(), launches, "{out}");
    let sum: f64 = rows.iter().map(|r| r.1).sum();
    assert!((sum - total).abs() <= 0.1 * rows.len() as f64 && total > 0.0, "{out}");
    assert!(rows.windows(2).all(|w| w[0].1 >= w[1].1), "costliest first: {out}");
}

#[test]
fn perplexity_of_a_text_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = synth(dir.path(), "tiny-llama", "llama.gguf");
    let file = dir.path().join("text.txt");
    std::fs::write(&file, "the quick brown fox jumps over the lazy dog. ".repeat(4)).expect("write");
    let file = file.to_str().expect("utf-8");
    let o = run(&["perplexity", "--pack", &pack, "--backend", "cpu", "--file", file, "--window", "64"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let ppl: f64 = out.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number");
    // Random weights over a 256-token byte vocabulary: finite and near the vocabulary size.
    assert!(ppl.is_finite() && ppl > 1.0, "{out}");
    assert!(out.contains("over 62 tokens (windows of 64)"), "{out}");
    let o = run(&["perplexity", "--pack", &pack, "--backend", "cpu", "--file", file, "--window", "4096"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("perplexity needs at least one window"), "{}", text(&o.stderr));
}

#[test]
fn selftest_needs_a_gpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = synth(dir.path(), "tiny-llama", "llama.gguf");
    let o = run(&["selftest", "--pack", &pack, "--backend", "cpu"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("with the CPU reference; none was found"), "{}", text(&o.stderr));
}

/// `generate --json-schema` writes JSON valid under the schema (on SmolLM2, sampled) and
/// reports the grammar's cost; `--grammar` takes a Lark grammar; a bad file, schema or
/// grammar is one clear line before anything is generated.
#[test]
fn generate_follows_a_json_schema_or_a_lark_grammar() {
    let Some(model) = strata_tests::smollm2() else { return };
    let model = model.to_str().expect("utf-8");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).expect("write");
        p.to_str().expect("utf-8").to_owned()
    };
    let schema = file(
        "person.json",
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["name", "age"], "additionalProperties": false}"#,
    );
    let generate = |extra: &[&str]| {
        let base = ["generate", "--pack", model, "--backend", "host", "--chat", "--prompt", "A person, as JSON."];
        run(&[&base[..], extra].concat())
    };
    for seed in ["1", "2"] {
        let o = generate(&["--json-schema", &schema, "--temperature", "1", "--seed", seed, "--max-tokens", "64"]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_str(text(&o.stdout).trim()).expect("JSON");
        assert!(v["name"].as_str().is_some_and(|n| n.chars().count() <= 16), "{v}");
        assert!(v["age"].as_u64().is_some_and(|a| a <= 99), "{v}");
        assert!(text(&o.stderr).contains("grammar: "), "{}", text(&o.stderr));
    }
    let lark = file("yes.lark", "start: (\"yes\" | \"no\") \"!\"\n");
    let o = generate(&["--grammar", &lark, "--temperature", "1", "--seed", "3"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(["yes!", "no!"].contains(&text(&o.stdout).trim()), "{}", text(&o.stdout));

    let missing = dir.path().join("missing.json");
    for (args, says) in [
        (vec!["--json-schema", missing.to_str().expect("utf-8")], "missing.json"),
        (vec!["--json-schema", &lark], "is not JSON"),
        (vec!["--json-schema", &file("bad.json", r#"{"type": "nosuchtype"}"#)], "nosuchtype"),
        (vec!["--grammar", &file("bad.lark", "start: nosuchrule\n")], "nosuchrule"),
        (vec!["--json-schema", &schema, "--ignore-eos"], "cannot be used with"),
    ] {
        let o = generate(&args);
        assert_eq!(o.status.code().map(|c| c != 0), Some(true), "{args:?}");
        let e = text(&o.stderr);
        assert!(e.contains(says), "{args:?}: {e}");
    }
}
