//! Snapshots of the compiler's pure stages: the plan of a pack and the rendered kernels,
//! for every op × representative quant types × every target. Output is deterministic,
//! so any change to a rule or a template shows up here for review.

use strata_compiler::emit::{self, Dialect};
use strata_compiler::model::ModelDesc;
use strata_compiler::ops::{self, Op};
use strata_compiler::pack::Pack;
use strata_compiler::plan::{self, KernelRecord, Options, Plan};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::Preset;
use strata_compiler::target::{self, Target};
use strata_tests::synthetic_pack;

fn plan_for(preset: Preset, weights: &[GgmlType], target: &Target, options: &Options) -> Plan {
    let pack = Pack::from_bytes("snapshot.gguf", synthetic_pack(preset, 1, weights)).expect("valid");
    let model = ModelDesc::from_pack(&pack).expect("runnable");
    plan::plan(&model, &pack, target, options).expect("plannable")
}

/// The text of `kernels` as `target`'s native dialect renders them, each under its name.
fn rendered(target: &Target, options: Options, kernels: Vec<KernelRecord>) -> String {
    let plan = Plan { target: target.name.clone(), options, kernels };
    let module = emit::emit(&plan, target, Dialect::native(target)).expect("renders");
    module.kernels.iter().map(|k| format!("=== {} ===\n{}\n", k.name, k.text)).collect()
}

/// Representative kernels: one GEMV shape per quant type at T = 1 and T = 2, and every
/// other op once.
fn representative(plan: &Plan) -> Vec<&str> {
    let mut seen = std::collections::BTreeSet::new();
    plan.kernels
        .iter()
        .filter(|k| match k.op {
            Op::Gemv(ops::Gemv { quant, rows, window, .. }) => {
                window <= 2 && rows == 256 && seen.insert((quant, window))
            }
            _ => true,
        })
        .map(|k| k.name.as_str())
        .collect()
}

#[test]
fn kernels_for_every_target() {
    let weights = [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::IQ1_M, GgmlType::IQ2_XS];
    for target in target::known() {
        let plan = plan_for(Preset::TinyQwen3, &weights, &target, &Options { verify_window: 2, ..Options::default() });
        let module = emit::emit(&plan, &target, Dialect::native(&target)).expect("renders");
        let keep = representative(&plan);
        let text: String = module
            .kernels
            .iter()
            .filter(|k| keep.contains(&k.name.as_str()))
            .map(|k| format!("=== {} ===\n{}\n", k.name, k.text))
            .collect();
        insta::assert_snapshot!(format!("kernels_{}", target.name), text);
    }
}

#[test]
fn int8_kernels_for_wave32_and_wave64_targets() {
    let weights = [GgmlType::Q4_0, GgmlType::IQ2_XS];
    for name in ["sm_90", "gfx1100", "gfx90a"] {
        let target = target::Target::load(name).expect("known");
        let options = Options { verify_window: 2, int8: plan::Int8Dot::Always, ..Options::default() };
        let plan = plan_for(Preset::TinyQwen3, &weights, &target, &options);
        let module = emit::emit(&plan, &target, Dialect::native(&target)).expect("renders");
        let keep = representative(&plan);
        let text: String = module
            .kernels
            .iter()
            .filter(|k| {
                let int8 = ["gemv_", "quantize_q8_", "add_rmsnorm_q8_", "silu_mul_q8_"];
                keep.contains(&k.name.as_str()) && int8.iter().any(|p| k.name.starts_with(p))
            })
            .map(|k| format!("=== {} ===\n{}\n", k.name, k.text))
            .collect();
        insta::assert_snapshot!(format!("int8_kernels_{name}"), text);
    }
}

/// A mixture-of-experts pack's own kernels, wave32 and wave64: routing, the expert products
/// on the int8 path (IQ2_XS) and the float path (Q5_K), windows 1 and 2, the paired SiLU
/// and the norm that sums the experts' outputs.
#[test]
fn expert_kernels_for_wave32_and_wave64_targets() {
    let weights = [GgmlType::IQ2_XS, GgmlType::Q5_K, GgmlType::Q4_0];
    for name in ["sm_90", "gfx1100", "gfx90a"] {
        let target = Target::load(name).expect("known");
        let plan =
            plan_for(Preset::TinyQwen3Moe, &weights, &target, &Options { verify_window: 2, ..Options::default() });
        let module = emit::emit(&plan, &target, Dialect::native(&target)).expect("renders");
        let moe = ["expert_gemv", "moe_", "silu_mul_paired", "add_rmsnorm_moe", "rmsnorm_qk"];
        let text: String = module
            .kernels
            .iter()
            .filter(|k| moe.iter().any(|p| k.name.starts_with(p)))
            .map(|k| format!("=== {} ===\n{}\n", k.name, k.text))
            .collect();
        insta::assert_snapshot!(format!("expert_kernels_{name}"), text);
    }
}

#[test]
fn preludes_and_checked_mode() {
    let weights = [GgmlType::Q8_0];
    for (name, checked) in [("sm_90", false), ("gfx1100", false), ("gfx90a", true)] {
        let target = Target::load(name).expect("known");
        let plan = plan_for(
            Preset::TinyLlama,
            &weights,
            &target,
            &Options { verify_window: 0, checked, ..Options::default() },
        );
        let module = emit::emit(&plan, &target, Dialect::native(&target)).expect("renders");
        let head = module.source.split("\n// ---- lookup tables").next().unwrap_or_default();
        insta::assert_snapshot!(format!("module_head_{name}{}", if checked { "_checked" } else { "" }), head);
    }
}

#[test]
fn cross_vendor_rendering_keeps_the_targets_tuning() {
    let target = Target::load("gfx1100").expect("known");
    let plan =
        plan_for(Preset::TinyLlama, &[GgmlType::IQ1_M], &target, &Options { verify_window: 0, ..Options::default() });
    let hip = emit::emit(&plan, &target, Dialect::Hip).expect("renders");
    let cuda = emit::emit(&plan, &target, Dialect::Cuda).expect("renders");
    // Same kernel bodies; only the prelude differs.
    assert_eq!(hip.kernels, cuda.kernels);
    assert!(cuda.source.contains("__nvvm_shfl_sync_bfly_f32") && !cuda.source.contains("ds_bpermute"));
    assert!(cuda.source.contains("#define STRATA_WAVE 32u"));
}

#[test]
fn plans_of_a_small_model() {
    for name in ["sm_90", "gfx90a"] {
        let target = Target::load(name).expect("known");
        let plan = plan_for(Preset::TinyLlama, &[GgmlType::Q4_K, GgmlType::IQ3_S], &target, &Options::default());
        insta::assert_json_snapshot!(format!("plan_tiny_llama_{name}"), plan);
    }
}

#[test]
fn rendering_is_deterministic() {
    let target = Target::load("gfx1030").expect("known");
    let plan = plan_for(Preset::TinyQwen3Moe, &[GgmlType::IQ2_S, GgmlType::Q5_K], &target, &Options::default());
    let a = emit::emit(&plan, &target, Dialect::Hip).expect("renders");
    let b = emit::emit(&plan, &target, Dialect::Hip).expect("renders");
    assert_eq!(a, b);
}

/// Prefill attention (flash attention on the matrix unit) for SmolLM2's and Llama-3-8B's
/// shapes, on mma.sync (sm_90) and without a matrix unit (gfx1030).
#[test]
fn prefill_attention_kernels() {
    for name in ["sm_90", "gfx1030"] {
        let target = Target::load(name).expect("known");
        let options = Options::default();
        let kernels = [(9, 3, 64), (32, 8, 128)]
            .map(|(heads, kv_heads, head_dim)| {
                let scale = 1.0 / (head_dim as f32).sqrt();
                plan::rules::kernel_with(
                    ops::AttentionPrefill { heads, kv_heads, head_dim, scale, window: 0, page: 16 }.into(),
                    &target,
                    &options,
                )
            })
            .to_vec();
        insta::assert_snapshot!(format!("prefill_attention_kernels_{name}"), rendered(&target, options, kernels));
    }
}

/// The host kernels of a pack for the x86_64-v4 host target (other host targets differ in
/// their instruction-set prelude and GEMM panel sizes, which the build test covers).
#[test]
fn host_kernels() {
    use strata_compiler::host::{self, HostTarget};
    let weights = [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::IQ1_M, GgmlType::IQ2_XS];
    let pack = Pack::from_bytes("snapshot.gguf", synthetic_pack(Preset::TinyQwen3, 1, &weights)).expect("valid");
    let target = HostTarget::load("x86_64-v4").expect("shipped");
    let (plan, module) =
        host::render(&pack, &target, &Options { verify_window: 2, ..Options::default() }).expect("renders");
    let keep = representative(&plan);
    let text: String = module
        .kernels
        .iter()
        .filter(|k| keep.contains(&k.name.as_str()))
        .map(|k| format!("=== {} ===\n{}\n", k.name, k.text))
        .collect();
    insta::assert_snapshot!("host_kernels_x86_64-v4", text);
}

/// The int8 matrix-unit GEMVs on sm_90 (Llama-8B's q and o shape): a verify window of 8
/// columns (inputs staged in shared memory), and a batch's GEMV of up to 32, whose
/// columns are a runtime scalar; and that batch's GEMV over Q·K·V stacked, which lays
/// out each matrix's outputs apart.
#[test]
fn matrix_unit_gemv_kernels() {
    let target = Target::load("sm_90").expect("known");
    let options = Options::default();
    let (quant, rows, cols) = (GgmlType::Q4_0, 4096, 4096);
    let max = plan::rules::BATCH_GEMV_COLUMNS;
    let kernels = [
        ops::Gemv::new(quant, rows, cols, 8).into(),
        ops::BatchGemv { quant, rows, cols, max, stack: ops::Stack::SINGLE }.into(),
        ops::BatchGemv { quant, rows: rows + 2048, cols, max, stack: ops::Stack::of(&[rows, 1024, 1024]) }.into(),
    ]
    .map(|op| plan::rules::kernel_with(op, &target, &options))
    .to_vec();
    insta::assert_snapshot!("matrix_unit_gemv_kernels_sm_90", rendered(&target, options, kernels));
}

/// A Q6_K output head's verify window on the matrix unit: half scales (two k = 16
/// products a chunk, each half's zero point out through its start) and slabs of one
/// 210-byte block at their phase in the pieces that hold them; a record that asks for the
/// column start, which half scales cannot take, fails the static check.
#[test]
fn matrix_unit_gemv_half_scales() {
    let target = Target::load("sm_90").expect("known");
    let options = Options { gemv_mma_half_scales: Some(true), ..Options::default() };
    let op = ops::Gemv::new(GgmlType::Q6_K, 4096, 4096, 8);
    let kernel = plan::rules::kernel_with(op.into(), &target, &options);
    let plan::Tuning::GemvMma(t) = &kernel.tuning else { panic!("matrix unit: {:?}", kernel.tuning) };
    assert_eq!((t.slab_bytes, t.zero_start), (210, false));
    let mut forced = kernel.clone();
    if let plan::Tuning::GemvMma(t) = &mut forced.tuning {
        t.zero_start = true;
    }
    let forced = plan::Plan { target: target.name.clone(), options: options.clone(), kernels: vec![forced] };
    let errors = strata_compiler::check::check(&forced, &target);
    assert!(errors.iter().any(|e| e.to_string().contains("zero-point start")), "{errors:?}");
    insta::assert_snapshot!("matrix_unit_gemv_half_scales_sm_90", rendered(&target, options, vec![kernel]));
}

/// The same verify window's GEMV reading its inputs from global memory
/// (`--gemv-mma-staged false`, as a batch's GEMV does).
#[test]
fn matrix_unit_gemv_unstaged_inputs() {
    let target = Target::load("sm_90").expect("known");
    let options = Options { gemv_mma_staged: Some(false), ..Options::default() };
    let op = ops::Gemv::new(GgmlType::Q4_0, 4096, 4096, 8).into();
    let kernels = vec![plan::rules::kernel_with(op, &target, &options)];
    insta::assert_snapshot!("matrix_unit_gemv_unstaged_inputs_sm_90", rendered(&target, options, kernels));
}

/// The verify window's GEMV making Q4_0's bytes signed (`--gemv-mma-zero-start false`)
/// instead of taking its zero point out through each column's starting sum, as the rule
/// does (`matrix_unit_gemv_kernels`); and the rule's batch GEMV, which never does.
#[test]
fn matrix_unit_gemv_zero_start() {
    let target = Target::load("sm_90").expect("known");
    let options = Options::default();
    let op = ops::Gemv::new(GgmlType::Q4_0, 4096, 4096, 8);
    let kernel = plan::rules::kernel_with(op.into(), &target, &options);
    assert!(matches!(&kernel.tuning, plan::Tuning::GemvMma(t) if t.zero_start), "{:?}", kernel.tuning);
    // One row group a wave (k and v's 1024 rows) keeps signed bytes.
    let one_group = plan::rules::kernel_with(ops::Gemv::new(GgmlType::Q4_0, 1024, 4096, 8).into(), &target, &options);
    assert!(matches!(&one_group.tuning, plan::Tuning::GemvMma(t) if t.wave_groups == 1 && !t.zero_start));
    let signed_bytes = Options { gemv_mma_zero_start: Some(false), ..Options::default() };
    let signed = plan::rules::kernel_with(op.into(), &target, &signed_bytes);
    assert!(matches!(&signed.tuning, plan::Tuning::GemvMma(t) if !t.zero_start), "{:?}", signed.tuning);
    let batch = ops::BatchGemv {
        quant: GgmlType::Q4_0,
        rows: 4096,
        cols: 4096,
        max: plan::rules::BATCH_GEMV_COLUMNS,
        stack: ops::Stack::SINGLE,
    };
    let mut unstaged = plan::rules::kernel_with(batch.into(), &target, &options);
    let plan::Tuning::GemvMma(t) = &mut unstaged.tuning else { panic!("matrix unit: {:?}", unstaged.tuning) };
    assert!(!t.zero_start, "inputs from global memory: no zero start");
    // A record that asks for it anyway (a hand-edited manifest) fails the static check.
    t.zero_start = true;
    let forced = plan::Plan { target: target.name.clone(), options: options.clone(), kernels: vec![unstaged] };
    let errors = strata_compiler::check::check(&forced, &target);
    assert!(errors.iter().any(|e| e.to_string().contains("zero-point start")), "{errors:?}");
    insta::assert_snapshot!("matrix_unit_gemv_signed_bytes_sm_90", rendered(&target, signed_bytes, vec![signed]));
}
