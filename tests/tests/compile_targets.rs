//! strata-compile end to end with the real toolchain: every kernel of packs holding
//! every supported quant type compiles for all nine targets; AMD code objects have no
//! spills or scratch; limits are enforced with errors that name kernel, limit, value.

use std::path::Path;

use strata_compiler::artifacts::{self, CompileError, Request, Stage};
use strata_compiler::build::{Resources, Toolchain};
use strata_compiler::ops::{self, Op};
use strata_compiler::pack::Pack;
use strata_compiler::plan::{Int8Dot, MatrixUnit, Options, Tuning, rules};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::Preset;
use strata_compiler::target::{self, Target, Vendor};
use strata_tests::{every_type_packs, synthetic_pack, toolchain};

fn compile(
    pack: &Pack,
    target: &Target,
    options: Options,
    out: &Path,
    tools: &Toolchain,
) -> Result<artifacts::Manifest, CompileError> {
    let req = Request { pack, target, options, allow_spills: false, run_on: None, out };
    artifacts::compile(&req, tools, &mut |_| {})
}

#[test]
fn every_kernel_compiles_for_every_target_without_spills() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let packs: Vec<Pack> = every_type_packs(dir.path()).iter().map(|p| Pack::open(p).expect("opens")).collect();
    let mut types = std::collections::BTreeSet::new();
    for target in target::known() {
        for (i, pack) in packs.iter().enumerate() {
            let out = dir.path().join(format!("{}-{i}", target.name));
            let m = compile(pack, &target, Options::default(), &out, &tools)
                .unwrap_or_else(|e| panic!("{}: {e}", target.name));
            assert!(out.join(&m.module.binary).exists());
            assert_eq!(m.pack.fingerprint, pack.fingerprint());
            let ptx = (target.vendor == Vendor::Nvidia)
                .then(|| std::fs::read_to_string(out.join(&m.module.binary)).expect("PTX text"));
            for k in &m.kernels {
                // The host launches a kernel as a programmatic dependent exactly where its
                // code waits for its inputs.
                let waits =
                    ptx.as_deref().is_some_and(|ptx| ptx_entry(ptx, &k.kernel.name).contains("griddepcontrol.wait"));
                assert_eq!(waits, k.kernel.launch.grid_dependency, "{} {}", target.name, k.kernel.name);
                assert_eq!(waits, target.features.grid_dependency, "{} {}", target.name, k.kernel.name);
                assert!(out.join(&k.source).exists(), "{}", k.source);
                if let Op::Gemv(ops::Gemv { quant, .. }) | Op::ExpertGemv(ops::ExpertGemv { quant, .. }) = k.kernel.op {
                    types.insert(quant);
                }
                match (&target.vendor, &k.resources) {
                    (Vendor::Amd, r @ Resources::CodeObject { lds_bytes, .. }) => {
                        assert_eq!(r.spills(), Some(0), "{} {}: {r:?}", target.name, k.kernel.name);
                        // The plan's figure is exact up to the compiler's alignment of arrays;
                        // a dynamic array is sized at launch, so the code object declares none.
                        let declared = if k.kernel.launch.dynamic_shared { 0 } else { k.kernel.launch.shared_bytes };
                        assert!(
                            (declared..=declared + 32).contains(lds_bytes),
                            "{} {}: {r:?}",
                            target.name,
                            k.kernel.name
                        );
                    }
                    (Vendor::Nvidia, Resources::CheckedAtLoad | Resources::Ptxas { .. }) => {}
                    (_, r) => panic!("{} {}: unexpected resources {r:?}", target.name, k.kernel.name),
                }
            }
        }
    }
    assert_eq!(types.len(), strata_compiler::quant::SUPPORTED.len(), "GEMVs of every type: {types:?}");
}

/// The verify windows the GEMVs of `m` were compiled for.
fn gemv_windows(m: &artifacts::Manifest) -> std::collections::BTreeSet<u32> {
    m.kernels
        .iter()
        .filter_map(|k| if let Op::Gemv(ops::Gemv { window, .. }) = k.kernel.op { Some(window) } else { None })
        .collect()
}

/// gfx1100's shipped facts with `edits` (text replacements) applied, as a target file in `dir`.
fn gfx1100_with(dir: &Path, edits: &[(&str, &str)]) -> Target {
    let mut text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../targets/gfx1100.toml"))
        .expect("shipped");
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    let path = dir.join("gfx1100-edited.toml");
    std::fs::write(&path, text).expect("written");
    Target::load(path.to_str().expect("utf-8")).expect("valid")
}

/// The PTX of one kernel: from its `.entry` to the next one.
fn ptx_entry<'a>(ptx: &'a str, name: &str) -> &'a str {
    let start = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name} in the PTX"));
    let rest = &ptx[start + 1..];
    &rest[..rest.find(".entry ").unwrap_or(rest.len())]
}

/// Issue 10's bar: every kernel of every test pack (every quant type, dense and MoE, the
/// real SmolLM2), with verify windows up to 16 and QSA, compiles for the four AMD
/// targets, plain and `--checked`, without a byte of spills or scratch, and its code object
/// was compiled for the wave size and block size its launch record says (`compile`
/// refuses otherwise).
#[test]
fn test_packs_compile_for_amd_with_windows_to_16_also_checked() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut paths = every_type_packs(dir.path());
    // mix-c's types are mix-b's, whose windows to 16 this already compiles as expert
    // products: its own would add minutes of CI, not kernels of another kind.
    paths.truncate(2);
    paths.extend(strata_tests::smollm2());
    let packs: Vec<Pack> = paths.iter().map(|p| Pack::open(p).expect("opens")).collect();
    for target in target::known().into_iter().filter(|t| t.vendor == Vendor::Amd) {
        for (i, pack) in packs.iter().enumerate() {
            for checked in [false, true] {
                let out = dir.path().join(format!("{}-{i}-{checked}", target.name));
                let options = Options { verify_window: 16, checked, ..Options::default() };
                let m = compile(pack, &target, options, &out, &tools)
                    .unwrap_or_else(|e| panic!("{} {}: {e}", target.name, paths[i].display()));
                assert_eq!(gemv_windows(&m), (1..=16).collect(), "{}", target.name);
                assert!(m.kernels.iter().any(|k| matches!(k.kernel.op, Op::QsaScore(_))));
                for k in &m.kernels {
                    let r = &k.resources;
                    let fits = matches!(r, Resources::CodeObject { occupancy, .. } if *occupancy > 0);
                    assert!(fits && r.spills() == Some(0), "{} {}: {r:?}", target.name, k.kernel.name);
                    let takes_errors = k.kernel.buffers.last().is_some_and(|b| b.name == "strata_err");
                    assert_eq!(takes_errors, checked, "{} {}", target.name, k.kernel.name);
                }
            }
        }
    }
}

/// A host that believes in another wave size than the device code was compiled for (a
/// known cause of launch failures on wave32 RDNA) is caught at compile time: gfx1100's
/// facts with a 64-lane wave plan 64-lane kernels, clang compiles gfx1100 code for 32.
#[test]
fn a_wave_size_the_code_was_not_compiled_for_is_refused() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = Pack::open(&every_type_packs(dir.path())[0]).expect("opens");
    let target = gfx1100_with(dir.path(), &[("wave_size = 32", "wave_size = 64")]);
    let e = compile(&pack, &target, Options::default(), &dir.path().join("out"), &tools).unwrap_err().to_string();
    assert!(e.contains("compiled launch geometry (wave size, threads per block) is 32, "), "{e}");
    assert!(e.contains("but the launch record says 64, "), "{e}");
}

/// Windows up to 16 on NVIDIA (AMD: above).
#[test]
fn windows_up_to_16_fit_sm_90() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = Pack::open(&every_type_packs(dir.path())[0]).expect("opens");
    let target = Target::load("sm_90").expect("known");
    let m = compile(&pack, &target, Options { verify_window: 16, ..Options::default() }, &dir.path().join("o"), &tools)
        .expect("compiles");
    assert_eq!(gemv_windows(&m), (1..=16).collect());
}

/// Q·K·V and gate·up stacked in every verify window (and, on the matrix unit, a batch's
/// GEMV): a pack of one type stacks them, and their kernels compile for every target,
/// with no spills on AMD.
#[test]
fn stacked_products_compile_for_every_target() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q4_0.gguf");
    std::fs::write(&path, synthetic_pack(Preset::TinyLlama, 1, &[GgmlType::Q4_0])).expect("written");
    let pack = Pack::open(&path).expect("opens");
    let options = Options { verify_window: 4, ..Options::default() };
    for target in target::known() {
        let out = dir.path().join(&target.name);
        let m =
            compile(&pack, &target, options.clone(), &out, &tools).unwrap_or_else(|e| panic!("{}: {e}", target.name));
        let stacked: Vec<_> = m
            .kernels
            .iter()
            .filter(|k| match &k.kernel.op {
                Op::Gemv(g) => !g.stack.is_single(),
                Op::BatchGemv(b) => !b.stack.is_single(),
                _ => false,
            })
            .collect();
        // Windows 2 to 4 of Q·K·V and of gate·up.
        assert!(stacked.len() >= 6, "{}: {} stacked kernels", target.name, stacked.len());
        for k in stacked {
            if let r @ Resources::CodeObject { .. } = &k.resources {
                assert_eq!(r.spills(), Some(0), "{} {}: {r:?}", target.name, k.kernel.name);
            }
        }
    }
}

#[test]
fn int8_gemvs_compile_for_every_target_without_spills_also_checked() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    // mix-a holds the nine types with an int8 decoder.
    let pack = Pack::open(&every_type_packs(dir.path())[0]).expect("opens");
    for target in target::known() {
        for checked in [false, true] {
            let out = dir.path().join(format!("{}-{checked}", target.name));
            let options = Options { verify_window: 2, checked, int8: Int8Dot::Always, ..Options::default() };
            let m = compile(&pack, &target, options, &out, &tools).unwrap_or_else(|e| panic!("{}: {e}", target.name));
            let int8: std::collections::BTreeSet<_> = m
                .kernels
                .iter()
                .filter_map(|k| match (&k.kernel.op, &k.kernel.tuning) {
                    (Op::Gemv(ops::Gemv { quant, .. }), Tuning::GemvMma(_) | Tuning::GemvQ8(_)) => Some(*quant),
                    _ => None,
                })
                .collect();
            assert_eq!(int8.len(), strata_compiler::plan::rules::INT8_DOT.len(), "{}: {int8:?}", target.name);
            assert!(m.kernels.iter().any(|k| matches!(k.kernel.op, Op::QuantizeQ8(_))));
            for k in &m.kernels {
                let spills = k.resources.spills().filter(|s| *s > 0);
                assert_eq!(spills, None, "{} {}: {:?}", target.name, k.kernel.name, k.resources);
            }
        }
    }
}

/// The matrix-unit GEMVs, asked for from one column: every `mma.sync` target takes them
/// for Q4_0 and Q8_0 in windows of one and two tiles and in a batch's GEMV of four,
/// without spills, checked builds too; a target without `mma.sync` (gfx1100) keeps the
/// int8-dot GEMV and has no batch GEMV.
#[test]
fn matrix_unit_gemvs_compile_for_every_mma_sync_target() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = Pack::open(&every_type_packs(dir.path())[0]).expect("opens");
    for target in target::known() {
        let mma = rules::matrix_unit(&target) == MatrixUnit::MmaSync;
        if !mma && target.name != "gfx1100" {
            continue;
        }
        for checked in [false, true].into_iter().filter(|c| !c || target.name == "sm_90") {
            let out = dir.path().join(format!("mma-{}-{checked}", target.name));
            let options = Options {
                verify_window: 9,
                checked,
                int8: Int8Dot::Always,
                gemv_mma_from: Some(1),
                ..Options::default()
            };
            let m = compile(&pack, &target, options, &out, &tools).unwrap_or_else(|e| panic!("{}: {e}", target.name));
            // (batch's GEMV, type, columns) of every kernel on the matrix unit.
            let taken: std::collections::BTreeSet<_> = m
                .kernels
                .iter()
                .filter_map(|k| match (&k.kernel.op, &k.kernel.tuning) {
                    (Op::Gemv(ops::Gemv { quant, window, .. }), Tuning::GemvMma(_)) => Some((false, *quant, *window)),
                    (Op::BatchGemv(ops::BatchGemv { quant, max, .. }), Tuning::GemvMma(_)) => {
                        Some((true, *quant, *max))
                    }
                    _ => None,
                })
                .collect();
            for quant in [GgmlType::Q4_0, GgmlType::Q8_0] {
                for window in [1, 8, 9] {
                    assert_eq!(
                        taken.contains(&(false, quant, window)),
                        mma,
                        "{} {quant:?} window {window}",
                        target.name
                    );
                }
                let widest = (true, quant, rules::BATCH_GEMV_COLUMNS);
                assert_eq!(taken.contains(&widest), mma, "{} {quant:?}: a batch's GEMV", target.name);
            }
            for k in &m.kernels {
                let spills = k.resources.spills().filter(|s| *s > 0);
                assert_eq!(spills, None, "{} {}: {:?}", target.name, k.kernel.name, k.resources);
            }
        }
    }
}

#[test]
fn checked_builds_take_the_error_buffer() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = Pack::open(&every_type_packs(dir.path())[1]).expect("opens");
    for name in ["gfx1100", "sm_90"] {
        let target = Target::load(name).expect("known");
        let out = dir.path().join(name);
        let m =
            compile(&pack, &target, Options { verify_window: 2, checked: true, ..Options::default() }, &out, &tools)
                .expect("compiles");
        assert!(m.kernels.iter().all(|k| k.kernel.buffers.last().is_some_and(|b| b.name == "strata_err")));
        let source = std::fs::read_to_string(out.join(&m.module.source)).expect("written");
        assert!(source.contains("#define STRATA_CHECKED 1"));
        // Device code is always optimized: HIP's own default is -O0, which ROCm 7 is
        // known to miscompile.
        assert!(m.module.command.iter().any(|a| a == "-O3"), "{:?}", m.module.command);
        assert!(!m.module.command.iter().any(|a| a == "-O0"), "{:?}", m.module.command);
    }
}

#[test]
fn same_inputs_do_not_rebuild() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = Pack::open(&every_type_packs(dir.path())[0]).expect("opens");
    let target = Target::load("gfx1030").expect("known");
    let out = dir.path().join("art");
    let req = Request {
        pack: &pack,
        target: &target,
        options: Options::default(),
        allow_spills: false,
        run_on: None,
        out: &out,
    };
    let mut stages = Vec::new();
    let first = artifacts::compile(&req, &tools, &mut |s| stages.push(s)).expect("compiles");
    assert!(stages.iter().any(|s| matches!(s, Stage::Build(..))));
    stages.clear();
    let second = artifacts::compile(&req, &tools, &mut |s| stages.push(s)).expect("compiles");
    assert!(stages.contains(&Stage::UpToDate) && !stages.iter().any(|s| matches!(s, Stage::Build(..))));
    assert_eq!(first, second);
    assert_eq!(artifacts::read_manifest(&out).expect("readable"), first);
}

#[test]
fn limits_are_compile_errors_that_name_kernel_limit_and_value() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = Pack::open(&every_type_packs(dir.path())[0]).expect("opens");
    // A custom target: gfx1100 with 8 KiB of LDS per work-group.
    let target = gfx1100_with(
        dir.path(),
        &[
            ("shared_bytes_per_block = 65536", "shared_bytes_per_block = 8192"),
            ("shared_bytes_opt_in = 65536", "shared_bytes_opt_in = 8192"),
        ],
    );
    let out = dir.path().join("ok");
    let windows = |verify_window| Options { verify_window, prefill: false, ..Options::default() };
    compile(&pack, &target, windows(4), &out, &tools).expect("spec 4 fits 8 KiB");
    // The prompt-chunk kernels' tiles do not.
    let e = compile(&pack, &target, Options::default(), &dir.path().join("no"), &tools).unwrap_err().to_string();
    assert!(e.contains("kernel gemm_") && e.contains("but gfx1100 allows 8192 bytes per block"), "{e}");
    let e = compile(&pack, &target, windows(16), &dir.path().join("no"), &tools).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("kernel gemv_q4_0_256x512_t16: shared memory per block is 18432 bytes, but gfx1100 allows 8192 bytes per block"),
        "{text}"
    );
    assert!(!dir.path().join("no").join("manifest.toml").exists(), "nothing is written for a failed check");
    let e = compile(&pack, &target, Options { verify_window: 17, ..Options::default() }, &out, &tools).unwrap_err();
    assert_eq!(e.to_string(), "--spec 17 is out of range (0 or 1 for off, 2 to 16)");
}

#[test]
fn compiler_errors_name_the_kernel_and_its_source_line() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let text = "STRATA_KERNEL(64) void broken_kernel(float* y) {\n    y[0] = undeclared_thing;\n}\n";
    let module = strata_compiler::emit::Module {
        dialect: strata_compiler::emit::Dialect::Cuda,
        source: format!(
            "#define STRATA_KERNEL(n) extern \"C\" __attribute__((global))\n#line 1 \"broken_kernel.cu\"\n{text}"
        ),
        kernels: vec![],
    };
    let target = Target::load("sm_90").expect("known");
    let e = strata_compiler::build::build(&module, &target, &tools, dir.path()).unwrap_err();
    let message = e.to_string();
    assert!(message.starts_with("clang failed on broken_kernel:"), "{message}");
    assert!(message.contains("broken_kernel.cu:2:") && message.contains("y[0] = undeclared_thing;"), "{message}");
}

/// The prefill attention shapes of the test models: SmolLM2-135M (9/3 heads of 64),
/// Llama-3-8B (32/8 of 128), Qwen3-32B-like (32/4 of 128), Qwen3-0.6B (16/8 of 128) and
/// the tiny synthetic packs (4/2 of 64).
const PREFILL_SHAPES: [(u32, u32, u32); 5] = [(9, 3, 64), (32, 8, 128), (32, 4, 128), (16, 8, 128), (4, 2, 64)];

/// A plan of just the prefill attention kernels of [`PREFILL_SHAPES`] on `target`.
fn prefill_plan(target: &Target, checked: bool) -> strata_compiler::plan::Plan {
    let options = Options { checked, ..Options::default() };
    let kernels = PREFILL_SHAPES
        .iter()
        .map(|&(heads, kv_heads, head_dim)| {
            let scale = 1.0 / (head_dim as f32).sqrt();
            let op = ops::AttentionPrefill { heads, kv_heads, head_dim, scale, window: 0, page: 16 };
            let mut k = strata_compiler::plan::rules::kernel_with(op.into(), target, &options);
            if checked {
                k.buffers.push(strata_compiler::plan::Buffer {
                    name: strata_compiler::plan::ERROR_BUFFER.into(),
                    elem: strata_compiler::plan::Elem::I32,
                    extent: strata_compiler::plan::Extent::Fixed(8),
                    writes: true,
                    workspace: false,
                });
            }
            k
        })
        .collect();
    strata_compiler::plan::Plan { target: target.name.clone(), options, kernels }
}

/// Prefill attention (flash attention on the matrix unit) passes the static check and
/// compiles for the NVIDIA targets (mma.sync) and gfx1030 (no matrix unit), plain and
/// `--checked`, for every test model's shape; AMD code objects without spills or scratch
/// and with their LDS as declared.
#[test]
fn prefill_attention_compiles_for_every_shape() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["sm_80", "sm_86", "sm_89", "sm_90", "sm_120", "gfx1100", "gfx1030", "gfx90a", "gfx942"] {
        let target = Target::load(name).expect("known");
        for checked in [false, true] {
            let plan = prefill_plan(&target, checked);
            let errors = strata_compiler::check::check(&plan, &target);
            assert!(errors.is_empty(), "{name}: {errors:?}");
            let module = strata_compiler::emit::emit(&plan, &target, strata_compiler::emit::Dialect::native(&target))
                .expect("renders");
            let out = dir.path().join(format!("{name}-{checked}"));
            std::fs::create_dir_all(&out).expect("made");
            let built =
                strata_compiler::build::build(&module, &target, &tools, &out).unwrap_or_else(|e| panic!("{name}: {e}"));
            for k in &plan.kernels {
                let r = &built.resources[&k.name];
                eprintln!("{name} {} (shared {} bytes declared): {r:?}", k.name, k.launch.shared_bytes);
                assert!(r.spills().is_none_or(|s| s == 0), "{name} {}: {r:?}", k.name);
                if let Resources::CodeObject { lds_bytes, .. } = r {
                    let declared = k.launch.shared_bytes;
                    assert!((declared..=declared + 32).contains(lds_bytes), "{name} {}: {r:?}", k.name);
                }
            }
        }
    }
}
