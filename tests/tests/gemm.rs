//! The GEMM kernels with the real toolchain: every supported quant type's GEMM compiles
//! for all nine targets with no spills (AMD: no scratch) and passes the static check,
//! and gfx1100's (WMMA, emulated on NVIDIA) also in the CUDA dialect; snapshots of the
//! generated kernel text per matrix unit.

use strata_compiler::artifacts::launch_disagreements;
use strata_compiler::build::{self, Resources};
use strata_compiler::emit::{self, Dialect};
use strata_compiler::ops::{self, Op};
use strata_compiler::plan::{Int8Dot, KernelRecord, Options, Plan, Tuning, rules};
use strata_compiler::quant::{GgmlType, SUPPORTED};
use strata_compiler::target::{self, Target, Vendor};
use strata_tests::toolchain;

/// One GEMM of every supported type (256 x 512) and a Llama-8B down projection
/// (Q4_0, 4096 x 14336), planned for `target` with `options`.
fn gemm_plan(target: &Target, options: &Options) -> Plan {
    let mut ops: Vec<Op> = SUPPORTED.iter().map(|&quant| ops::Gemm { quant, rows: 256, cols: 512 }.into()).collect();
    ops.push(ops::Gemm { quant: GgmlType::Q4_0, rows: 4096, cols: 14_336 }.into());
    let kernels = ops.into_iter().map(|op| rules::kernel_with(op, target, options)).collect();
    Plan { target: target.name.clone(), options: options.clone(), kernels }
}

/// Builds `plan` rendered in `dialect` for `device` and returns each kernel's resources,
/// after the checks `strata-compile` makes: the static check, the compiled launch
/// geometry against the records, no spills or scratch where they are read back, and
/// the compiler's shared memory within the plan's figure.
fn build_checked(plan: &Plan, target: &Target, dialect: Dialect, device: &Target) -> Vec<(KernelRecord, Resources)> {
    let Some(tools) = toolchain() else { return Vec::new() };
    let errors = strata_compiler::check::check(plan, target);
    assert!(errors.is_empty(), "{}: {errors:?}", target.name);
    let module = emit::emit(plan, target, dialect).expect("renders");
    let dir = tempfile::tempdir().expect("tempdir");
    let built = build::build(&module, device, &tools, dir.path())
        .unwrap_or_else(|e| panic!("{} ({:?} on {}): {e}", target.name, dialect, device.name));
    let wrong = launch_disagreements(&plan.kernels, target.device.wave_size, &built.geometry);
    assert!(wrong.is_empty(), "{}: {wrong:?}", target.name);
    plan.kernels
        .iter()
        .map(|k| {
            let r = built.resources.get(&k.name).cloned().unwrap_or(Resources::CheckedAtLoad);
            assert_eq!(r.spills().filter(|s| *s > 0), None, "{} {}: {r:?}", target.name, k.name);
            if let Resources::CodeObject { lds_bytes, occupancy, .. } = r {
                // A dynamic array is sized at launch: the code object declares none of it.
                let declared = if k.launch.dynamic_shared { 0 } else { k.launch.shared_bytes };
                assert!((declared..=declared + 32).contains(&lds_bytes), "{} {}: {r:?}", target.name, k.name);
                assert!(occupancy > 0, "{} {}: {r:?}", target.name, k.name);
            }
            (k.clone(), r)
        })
        .collect()
}

#[test]
fn every_types_gemm_compiles_for_every_target_without_spills() {
    for target in target::known() {
        // --checked builds (every access tested) on one target per matrix unit; the int8
        // GEMM of every type that has one where the target does (`--int8 always`: the
        // test matrices are below the size where it is chosen by default), and sm_90's
        // f16 GEMMs of those types too (`--int8 never`).
        let checked_too = ["sm_90", "gfx1100", "gfx90a", "gfx1030"].contains(&target.name.as_str());
        let int8 = if target.name == "sm_90" { &[Int8Dot::Always, Int8Dot::Never][..] } else { &[Int8Dot::Always][..] };
        for (checked, &int8) in
            [false, true].into_iter().filter(|c| !c || checked_too).flat_map(|c| int8.iter().map(move |i| (c, i)))
        {
            let plan = gemm_plan(&target, &Options { checked, int8, ..Options::default() });
            for (k, r) in build_checked(&plan, &target, Dialect::native(&target), &target) {
                let unit = match &k.tuning {
                    Tuning::Gemm(t) => t.unit,
                    Tuning::GemmQ8(t) => t.unit,
                    _ => panic!("{}: {:?}", k.name, k.tuning),
                };
                assert_eq!(unit, rules::matrix_unit(&target), "{}", k.name);
                if k.name == "gemm_q4_0_4096x14336" && !checked {
                    eprintln!("{} {}: {:?} {} threads, {r:?}", target.name, k.name, k.tuning, k.launch.threads);
                }
            }
        }
    }
}

/// Cross-vendor execution: gfx1100's GEMMs (WMMA tiles, emulated by the CUDA prelude)
/// and gfx1030's (plain FMA) rendered in CUDA compile to PTX for sm_90.
#[test]
fn wave32_amd_gemms_compile_in_the_cuda_dialect() {
    let device = Target::load("sm_90").expect("known");
    for name in ["gfx1100", "gfx1030"] {
        let target = Target::load(name).expect("known");
        assert!(target.runs_on_cuda());
        let plan = gemm_plan(&target, &Options::default());
        let hip = emit::emit(&plan, &target, Dialect::Hip).expect("renders");
        let cuda = emit::emit(&plan, &target, Dialect::Cuda).expect("renders");
        assert_eq!(hip.kernels, cuda.kernels, "{name}: same kernel bodies in both dialects");
        if name == "gfx1100" {
            assert!(hip.source.contains("__builtin_amdgcn_wmma_f32_16x16x16_f16_w32"));
            assert!(cuda.source.contains("__nvvm_shfl_sync_idx_i32") && !cuda.source.contains("__builtin_amdgcn"));
        }
        build_checked(&plan, &target, Dialect::Cuda, &device);
    }
}

/// The generated GEMM kernel text per matrix unit: mma.sync (sm_90), WMMA (gfx1100),
/// MFMA (gfx90a) and none (gfx1030), a K-quant, a legacy type and an i-quant (on sm_90
/// the int8 GEMM for Q4_0, signed, and IQ2_XS, half scales with a lookup grid; the small
/// Q4_K matrix stays on the f16 GEMM by the size rule, `--int8 large`), a matrix that fills
/// whole tiles and one that does not.
#[test]
fn gemm_kernel_snapshots() {
    for name in ["sm_90", "gfx1100", "gfx90a", "gfx1030"] {
        let target = Target::load(name).expect("known");
        let ops: [Op; 3] = [
            ops::Gemm { quant: GgmlType::Q4_0, rows: 4096, cols: 14_336 }.into(),
            ops::Gemm { quant: GgmlType::Q4_K, rows: 1000, cols: 512 }.into(),
            ops::Gemm { quant: GgmlType::IQ2_XS, rows: 4096, cols: 4096 }.into(),
        ];
        let options = Options { int8: Int8Dot::Large, ..Options::default() };
        let kernels = ops.into_iter().map(|op| rules::kernel_with(op, &target, &options)).collect();
        let plan = Plan { target: target.name.clone(), options, kernels };
        let module = emit::emit(&plan, &target, Dialect::native(&target)).expect("renders");
        let unit = module.source.split("// ---- strata matrix unit").nth(1).and_then(|s| s.split("\n// ----").next());
        let mut text = format!("// ---- strata matrix unit{}\n", unit.expect("the matrix unit is in the module"));
        for k in &module.kernels {
            text += &format!("=== {} ===\n{}\n", k.name, k.text);
        }
        insta::assert_snapshot!(format!("gemm_kernels_{name}"), text);
    }
}

/// A mixture of experts' prompt chunk on sm_90: the grouping, and the grouped expert
/// GEMM, down (each choice's own row) of IQ2_XS rows of 222 bytes, staged at their phase.
/// AMD targets take the f16 grouped GEMM (no int8 GEMM there), tiles of a wave's width.
#[test]
fn expert_gemm_kernel_snapshot() {
    let target = Target::load("sm_90").expect("known");
    let down = ops::ExpertGemm {
        quant: GgmlType::IQ2_XS,
        rows: 2048,
        cols: 768,
        used: 8,
        experts: 128,
        input: ops::ExpertInput::Choice,
    };
    let ops: [Op; 2] = [ops::MoeGroup { experts: 128, used: 8 }.into(), down.into()];
    let kernels = ops.into_iter().map(|op| rules::kernel(op, &target)).collect();
    let plan = Plan { target: target.name.clone(), options: Options::default(), kernels };
    let module = emit::emit(&plan, &target, Dialect::native(&target)).expect("renders");
    let text: String = module.kernels.iter().map(|k| format!("=== {} ===\n{}\n", k.name, k.text)).collect();
    insta::assert_snapshot!("expert_gemm_kernels_sm_90", text);
    let amd = rules::kernel(down.into(), &Target::load("gfx1100").expect("known"));
    assert!(matches!(&amd.tuning, Tuning::Gemm(t) if t.tile_tokens == 32 && t.blocks == 0), "{:?}", amd.tuning);
}

/// Every target's tiles: the matrix unit its vendor has, whole waves, dynamic shared
/// memory within the opt-in limit, the largest tile whatever the matrix, and raw weights
/// staged a super-step of whole blocks at a time, more of them where copies are
/// asynchronous.
#[test]
fn gemm_tiles_fit_every_target() {
    for target in target::known() {
        let big = rules::kernel(ops::Gemm { quant: GgmlType::Q4_0, rows: 14_336, cols: 4096 }.into(), &target);
        let small = rules::kernel(ops::Gemm { quant: GgmlType::Q4_0, rows: 1024, cols: 4096 }.into(), &target);
        for k in [&big, &small] {
            assert!(k.launch.dynamic_shared, "{} {}", target.name, k.name);
            assert!(k.launch.shared_bytes <= target.device.shared_limit(true), "{} {}", target.name, k.name);
            assert!(k.launch.threads <= 256 && k.launch.threads % target.device.wave_size == 0);
        }
        // The largest tile that fits, whatever the matrix (measured: docs/PERFORMANCE.md).
        let tile = |k: &KernelRecord| match &k.tuning {
            Tuning::Gemm(t) => [t.tile_rows, t.tile_tokens],
            Tuning::GemmQ8(t) => [t.tile_rows, t.tile_tokens],
            _ => [0, 0],
        };
        assert_eq!((tile(&small), tile(&big)), ([128, 128], [128, 128]), "{}", target.name);
        let super_blocks = rules::kernel(ops::Gemm { quant: GgmlType::Q6_K, rows: 4096, cols: 4096 }.into(), &target);
        let stages = |k: &KernelRecord| match &k.tuning {
            Tuning::Gemm(t) => (t.raw_k, t.raw_stages),
            Tuning::GemmQ8(t) => (t.raw_k, t.raw_stages),
            _ => (0, 0),
        };
        let most = if target.features.cp_async { 3 } else { 2 };
        for (k, fewest_features) in [(&big, 128), (&super_blocks, 256)] {
            let (raw_k, raw_stages) = stages(k);
            assert!(raw_k >= fewest_features && (2..=most).contains(&raw_stages), "{} {}", target.name, k.name);
        }
        if target.name == "sm_90" {
            // The int8 GEMM (both types have an int8 decoder): Q4_0 in two stages of 256
            // features, so that two blocks fit an SM; Q6_K's 210-byte blocks fit one.
            assert!(matches!(big.tuning, Tuning::GemmQ8(_)), "{:?}", big.tuning);
            assert_eq!((stages(&big), stages(&super_blocks)), ((256, 2), (256, 3)));
            assert!(2 * big.launch.shared_bytes <= target.device.shared_limit(true));
        }
        let nvidia = target.vendor == Vendor::Nvidia;
        assert_eq!(nvidia, rules::matrix_unit(&target) == strata_compiler::plan::MatrixUnit::MmaSync);
    }
}
