//! The plan and the forward pass agree: every kernel a pass's steps launch, for every
//! window the plan compiles, dense or sparse, whatever logits it leaves, is planned. (The
//! plan holds more: both variants of a producer that can quantize its output, each
//! tensor's own decode product beside the stacked one, softmax.)

use std::collections::BTreeSet;

use strata_compiler::forward::{Compiled, Forward, Logits, Matrix, Pass, Step};
use strata_compiler::model::{Family, ModelDesc};
use strata_compiler::ops::Op;
use strata_compiler::pack::Pack;
use strata_compiler::plan::{self, Int8Dot, KernelRecord, Options, Tuning, rules};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::Preset;
use strata_compiler::target::Target;
use strata_tests::{synthetic_pack, synthetic_pack_of};

/// The plan's records, asked as the runtime asks its compiled kernels.
struct Planned<'a>(&'a [KernelRecord]);

impl Compiled for Planned<'_> {
    fn int8(&mut self, op: &Op) -> bool {
        let name = op.kernel_name();
        self.0
            .iter()
            .any(|k| k.name == name && matches!(k.tuning, Tuning::GemvMma(_) | Tuning::GemvQ8(_) | Tuning::GemmQ8(_)))
    }

    fn has(&mut self, op: &Op) -> bool {
        let name = op.kernel_name();
        self.0.iter().any(|k| k.name == name)
    }
}

fn check(bytes: Vec<u8>, target: &str, int8: Int8Dot) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pack.gguf");
    std::fs::write(&path, bytes).expect("written");
    let pack = Pack::open(&path).expect("opens");
    let desc = ModelDesc::from_pack(&pack).expect("a model");
    let target = Target::load(target).expect("known");
    let options = Options { verify_window: 16, int8, ..Options::default() };
    let plan = plan::plan(&desc, &pack, &target, &options).expect("plans");
    let forward = Forward::new(&desc, rules::qsa_block(&target));
    let layers = forward.layers(&desc, &pack).expect("every tensor");
    let matrix = |name: &str| {
        let t = pack.tensor(name)?;
        Some(Matrix::new(t.ty, t.shape[1] as u32, t.shape[0] as u32))
    };
    let output = matrix("output.weight").or_else(|| matrix("token_embd.weight")).expect("an output");
    let embedding = pack.tensor("token_embd.weight").expect("an embedding").ty;
    let mut launched = BTreeSet::new();
    // Windows of GEMVs, and prompt chunks on the matrix units (dense packs).
    let chunks: &[u32] = if desc.experts.is_none() { &[17, 512] } else { &[] };
    for tokens in (1..=16).chain(chunks.iter().copied()) {
        let gemm = tokens > 16;
        // A window of one sequence, or (GEMV windows) a batch of one token a sequence.
        let batches: &[u32] = if gemm || tokens == 1 { &[1] } else { &[1, tokens] };
        for &seqs in batches {
            for sparse_from in [None, Some(1)].into_iter().filter(|s| !gemm || s.is_none()) {
                for logits in [Logits::None, Logits::Last, Logits::All] {
                    let pass = Pass { tokens, seqs, logits, sparse_from, layers: &layers, output, embedding, gemm };
                    for step in forward.steps(&pass, &mut Planned(&plan.kernels)) {
                        if let Step::Launch { op, .. } = step {
                            launched.insert(op.kernel_name());
                        }
                    }
                }
            }
        }
    }
    launched.insert(forward.argmax().kernel_name());
    let planned: BTreeSet<String> = plan.kernels.iter().map(|k| k.name.clone()).collect();
    assert!(launched.len() > 10, "{}: {launched:?}", target.name);
    let missing: Vec<_> = launched.difference(&planned).collect();
    assert!(missing.is_empty(), "{}: launched but not planned: {missing:?}", target.name);
}

#[test]
fn every_step_is_planned() {
    use GgmlType as G;
    let mix_a = [G::IQ1_M, G::IQ2_XS, G::IQ3_XXS, G::IQ3_S, G::Q4_0, G::Q4_1, G::Q8_0, G::Q4_K, G::Q6_K];
    let mut qwen2 = Preset::TinyLlama.shape();
    (qwen2.family, qwen2.layers) = (Family::Qwen2, 2);
    for target in ["sm_90", "gfx1100", "gfx90a"] {
        for int8 in [Int8Dot::Auto, Int8Dot::Always] {
            check(synthetic_pack(Preset::TinyLlama, 2, &mix_a), target, int8);
            check(synthetic_pack(Preset::TinyQwen3, 2, &[G::Q8_0]), target, int8);
            check(synthetic_pack(Preset::TinyQwen3Moe, 2, &[G::IQ2_XS, G::Q4_K]), target, int8);
            check(synthetic_pack_of(&qwen2, &[G::Q4_0]), target, int8);
        }
    }
}

/// The output projection's GEMM only ever multiplies a batch of decode steps (a prompt
/// chunk's logits are its last token's), so on `mma.sync` targets it takes a batch's
/// narrow tiles, while the layers' GEMMs keep a prompt chunk's; elsewhere, and where the
/// options set the tiles, it keeps the prompt's.
#[test]
fn the_output_gemm_takes_a_batch_s_tiles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pack.gguf");
    std::fs::write(&path, synthetic_pack(Preset::TinyLlama, 2, &[GgmlType::Q4_0])).expect("written");
    let pack = Pack::open(&path).expect("opens");
    let desc = ModelDesc::from_pack(&pack).expect("a model");
    let output = pack.tensor("output.weight").or_else(|| pack.tensor("token_embd.weight")).expect("an output");
    let output = Op::from(strata_compiler::ops::Gemm {
        quant: output.ty,
        rows: output.shape[1] as u32,
        cols: output.shape[0] as u32,
    })
    .kernel_name();
    let tiles = |target: &str, options: &Options| {
        let target = Target::load(target).expect("known");
        let plan = plan::plan(&desc, &pack, &target, options).expect("plans");
        let tile = |k: &KernelRecord| match &k.tuning {
            Tuning::GemmQ8(t) => [t.tile_rows, t.tile_tokens],
            Tuning::Gemm(t) => [t.tile_rows, t.tile_tokens],
            _ => [0, 0],
        };
        let gemms: Vec<&KernelRecord> = plan.kernels.iter().filter(|k| matches!(k.op, Op::Gemm(_))).collect();
        let head = gemms.iter().find(|k| k.name == output).map(|k| tile(k)).expect("the output's GEMM");
        let layers: BTreeSet<[u32; 2]> = gemms.iter().filter(|k| k.name != output).map(|k| tile(k)).collect();
        (head, layers)
    };
    let int8 = Options { int8: Int8Dot::Always, ..Options::default() };
    let (head, layers) = tiles("sm_90", &int8);
    assert_eq!(head, rules::BATCH_GEMM_TILE);
    assert!(!layers.is_empty() && !layers.contains(&rules::BATCH_GEMM_TILE), "{layers:?}");
    let (head, _) = tiles("gfx1100", &int8);
    assert_ne!(head, rules::BATCH_GEMM_TILE, "no int8 GEMM there");
    let asked = Options { gemm_tile: Some([64, 64]), ..int8.clone() };
    assert_eq!(tiles("sm_90", &asked).0, [64, 64], "the options set every GEMM's tiles");
}
