//! `strata-compile` and `strata-run` as users call them: real processes, real files.

use std::path::Path;
use std::process::{Command, Output};

fn compile(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata-compile")).args(args).output().expect("runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn synth(dir: &Path, extra: &[&str]) -> String {
    let out = dir.join("moe.gguf");
    let out = out.to_str().expect("utf-8 path");
    let mut args = vec!["synth", "--preset", "tiny-qwen3moe", "--type", "IQ1_M,IQ2_XS", "--out", out, "--seed", "5"];
    args.extend_from_slice(extra);
    let o = compile(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

#[test]
fn synth_then_inspect_as_text_and_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = synth(dir.path(), &[]);
    let text = compile(&["inspect", &path]);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("architecture: qwen3moe"), "{text}");
    assert!(text.contains("experts 8 (used 2), expert ffn 256"), "{text}");
    assert!(text.contains("blk.1.ffn_down_exps.weight"), "{text}");

    let json = compile(&["inspect", &path, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(v["model"]["family"], "qwen3moe");
    assert_eq!(v["model"]["experts"]["count"], 8);
    assert_eq!(v["tensors"].as_array().map(Vec::len), Some(27));
    let types: Vec<&str> =
        v["bytes_by_type"].as_array().expect("array").iter().filter_map(|t| t["type"].as_str()).collect();
    for ty in ["IQ1_M", "IQ2_XS", "Q8_0", "Q6_K", "F32"] {
        assert!(types.contains(&ty), "{types:?}");
    }
}

#[test]
fn dequant_writes_rows_in_file_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = synth(dir.path(), &[]);
    let out = dir.path().join("q.f32");
    let o = compile(&["inspect", &path, "--tensor", "blk.0.attn_q.weight", "--dequant", out.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&out).expect("written");
    // tiny-qwen3moe: 4 heads of 64 over a 256-wide embedding.
    assert_eq!(bytes.len(), 256 * 256 * 4);
    let pack = strata_compiler::pack::Pack::open(Path::new(&path)).expect("opens");
    let t = pack.tensor("blk.0.attn_q.weight").expect("present");
    let mut values = vec![0f32; 256 * 256];
    t.ty.dequantize(pack.data(t), &mut values).expect("supported");
    let expected: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(bytes, expected);

    let o = compile(&["inspect", &path, "--tensor", "nope", "--dequant", out.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no tensor named \"nope\""), "{}", stderr(&o));
}

#[test]
fn split_packs_inspect_from_any_shard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = synth(dir.path(), &["--split", "3"]);
    let shards: Vec<&str> = paths.lines().collect();
    assert_eq!(shards.len(), 3);
    let o = compile(&["inspect", shards[1], "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["files"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["tensors"].as_array().map(Vec::len), Some(27));
}

#[test]
fn bad_input_is_one_clear_line_and_a_failing_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.gguf");
    let o = compile(&["inspect", missing.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("missing.gguf: cannot read"), "{e}");

    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0\x01\0\0\0\0\0\0\0\x00\0\0\0\0\0\0\0").expect("written");
    let o = compile(&["inspect", bad.to_str().expect("utf-8")]);
    let e = stderr(&o);
    assert_eq!((o.status.code(), e.lines().count()), (Some(1), 1), "{e}");
    assert!(e.contains("bad.gguf: tensor count: count 1 cannot fit"), "{e}");

    let o = compile(&["synth", "--preset", "tiny-llama", "--type", "Q9_9", "--out", "x.gguf"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown or unsupported type \"Q9_9\""), "{}", stderr(&o));

    let out = dir.path().join("k.gguf");
    let o = compile(&["synth", "--preset", "smollm2-135m", "--type", "Q4_K", "--out", out.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("type Q4_K needs rows that are a multiple of 256, but rows have 576"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn targets_are_listed() {
    let o = compile(&["targets"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for t in ["gfx1100", "gfx1030", "gfx90a", "gfx942", "sm_80", "sm_86", "sm_89", "sm_90", "sm_120"] {
        assert!(text.lines().any(|l| l.starts_with(t)), "{t} missing from:\n{text}");
    }
    assert!(text.contains("gfx1100  amd       32"), "{text}");
}

#[test]
fn compile_writes_a_manifest_and_refuses_bad_targets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = synth(dir.path(), &[]);
    let out = dir.path().join("art");
    let out = out.to_str().expect("utf-8");

    let o = compile(&["--pack", &pack, "--target", "gfx9999", "--out", out]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unknown target \"gfx9999\" (known: gfx1100"), "{}", stderr(&o));

    let o = compile(&["--pack", &pack, "--target", "gfx90a", "--run-on", "sm_90", "--out", out]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("gfx90a's kernels (wave 64) cannot run on sm_90"), "{}", stderr(&o));

    let o = compile(&["--pack", &pack, "--target", "sm_90"]);
    assert_eq!(o.status.code(), Some(2), "clap refuses a missing --out");

    if strata_tests::toolchain().is_none() {
        return;
    }
    let o = compile(&["--pack", &pack, "--target", "gfx1100", "--out", out, "--spec", "6"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("kernels for gfx1100 (HIP built for gfx1100)"), "{}", stderr(&o));
    let manifest = std::fs::read_to_string(Path::new(out).join("manifest.toml")).expect("written");
    assert!(manifest.contains("name = \"gemv_iq1_m_256x256_t6\""), "window 6 planned");
    assert!(manifest.contains("vgprs = "), "AMD resources recorded");
    let o = compile(&["--pack", &pack, "--target", "gfx1100", "--out", out, "--spec", "6"]);
    assert!(stderr(&o).starts_with("up to date:"), "{}", stderr(&o));
}

#[test]
fn emit_only_writes_the_module_and_its_records_without_a_toolchain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = synth(dir.path(), &[]);
    let out = dir.path().join("emitted");
    let out_arg = out.to_str().expect("utf-8");
    // sm_120 cannot be built by Debian's clang-19, but it can be rendered and checked.
    let o = compile(&["--pack", &path, "--target", "sm_120", "--spec", "3", "--emit-only", "--out", out_arg]);
    assert!(o.status.success(), "{}", stderr(&o));
    let module = std::fs::read_to_string(out.join("module.cu")).expect("module written");
    let records: toml::Value =
        toml::from_str(&std::fs::read_to_string(out.join("plan.toml")).expect("records")).expect("plan.toml is TOML");
    let kernels = records["kernels"].as_array().expect("kernel records");
    assert!(!kernels.is_empty());
    for k in kernels {
        let name = k["name"].as_str().expect("a name");
        assert!(module.contains(&format!("void {name}(")), "{name} is not in the module");
    }
    assert_eq!(records["options"]["verify_window"].as_integer(), Some(3));
    assert!(!out.join("manifest.toml").exists(), "no artifacts without a build");
}
