//! Mixture-of-experts packs (qwen3moe) on the CPU backend: the routing and grouping
//! references, prompts in 16-token windows (float experts) and in chunks on the grouped
//! expert GEMMs (int8 experts, resident), the greedy output with every expert resident and with an expert cache holding 25% or 50%
//! of them (either policy, with speculative verify windows, with QSA, on the int8 and the
//! float expert paths), the cache's counters, and the refusal of budgets that cannot hold
//! one layer's experts. The device check (`scripts/device/moe-check.sh`) compares the same
//! placements on CUDA with this reference.

use std::path::{Path, PathBuf};

use strata_compiler::ops::RouteLayout;
use strata_compiler::plan::{Int8Dot, MAX_WINDOW, Tuning};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::Preset;
use strata_runtime::backend::cpu::{moe_group, moe_route, route_weights, top_experts};
use strata_runtime::generate;
use strata_runtime::model::{CacheSize, ExpertOptions, KvBudget, Policy, QsaConfig};
use strata_runtime::sampler::{Sampler, SamplerConfig};
use strata_runtime::session::{self, BackendChoice, OpenOptions};
use strata_runtime::speculative::SpeculativeConfig;
use strata_tests::synthetic_pack;

fn write_pack(dir: &Path, name: &str, weights: &[GgmlType]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, synthetic_pack(Preset::TinyQwen3Moe, 2, weights)).expect("write pack");
    path
}

fn options(cache: CacheSize, policy: Policy, int8: Int8Dot, spec: u32) -> OpenOptions {
    OpenOptions {
        backend: BackendChoice::Cpu,
        ctx: Some(96),
        int8,
        spec: SpeculativeConfig { window: spec, ..SpeculativeConfig::OFF },
        experts: ExpertOptions { cache, policy, vram_budget_mib: None },
        ..OpenOptions::default()
    }
}

/// The greedy continuation of a fixed prompt, and the cache's counters over it.
fn greedy(pack: &Path, opts: &OpenOptions) -> (Vec<u32>, strata_runtime::model::ExpertStats) {
    let mut s = session::open(pack, opts, &mut |_| {}).expect("opens on the CPU");
    let prompt: Vec<u32> = (0..21).map(|i| (i * 53 + 7) % 256).collect();
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let mut out = Vec::new();
    generate::generate(&mut s, &prompt, 20, true, &mut sampler, &mut |_, t| {
        out.push(t);
        true
    })
    .expect("generates");
    let stats = s.model.take_expert_stats().expect("a mixture-of-experts pack");
    (out, stats)
}

#[test]
fn routing_takes_the_largest_logits_and_lists_the_union() {
    let experts = 8;
    let layout = RouteLayout::new(experts, 2);
    // Token 0 ties experts 3 and 5 (the lower wins), token 1 shares expert 3.
    let logits = [
        0.0, 1.0, 0.5, 2.0, -1.0, 2.0, 0.0, 0.0, //
        0.0, 0.0, 0.0, 1.5, 0.0, 0.0, 3.0, 0.0,
    ];
    assert_eq!(top_experts(&logits[..8], 2), vec![3, 5]);
    assert_eq!(top_experts(&logits[8..], 2), vec![14 - 8, 3]);
    let w = route_weights(&logits[8..], &[6, 3]);
    assert!((w[0] + w[1] - 1.0).abs() < 1e-6 && w[0] > w[1]);
    let mut route = vec![7i32; layout.len() as usize];
    let mut weights = vec![0f32; (MAX_WINDOW * 2) as usize];
    moe_route(&logits, experts as usize, layout, &mut route, &mut weights);
    assert_eq!(&route[..4], &[3, 3, 5, 6], "union size, then its experts ascending");
    let pick = |u: u32, t: u32| route[layout.pick(u, t) as usize];
    assert_eq!((pick(0, 0), pick(0, 1)), (0, 1), "expert 3: token 0's first choice, token 1's second");
    assert_eq!((pick(1, 0), pick(1, 1), pick(1, 2)), (1, -1, -1));
    assert_eq!((pick(2, 0), pick(2, 1)), (-1, 0));
    assert_eq!(weights[0], 0.5, "a tie splits evenly");
    assert_eq!(route[4], 7, "entries past the union stay as they were");
}

/// A prompt chunk's grouping (the `moe_group` reference): each token's choices and
/// weights as `moe_route` makes them, and every choice listed once, under its expert,
/// tokens ascending.
#[test]
fn grouping_lists_each_experts_choices_by_token() {
    let (experts, used, tokens) = (8usize, 3usize, 11usize);
    let logits: Vec<f32> = (0..tokens * experts).map(|i| ((i * 37 + 11) % 23) as f32 * 0.25 - 2.0).collect();
    let (weights, offsets, order) = moe_group(&logits, experts, used);
    assert_eq!((offsets.len(), offsets[0], offsets[experts]), (experts + 1, 0, (tokens * used) as i32));
    let mut seen = vec![false; tokens * used];
    for e in 0..experts {
        let list = &order[offsets[e] as usize..offsets[e + 1] as usize];
        assert!(list.windows(2).all(|w| w[0] < w[1]), "expert {e}: {list:?} ascending");
        for &c in list {
            let (t, j) = (c as usize / used, c as usize % used);
            assert_eq!(top_experts(&logits[t * experts..(t + 1) * experts], used)[j], e, "choice {c}");
            assert!(!std::mem::replace(&mut seen[c as usize], true), "choice {c} listed twice");
        }
    }
    assert!(seen.iter().all(|&s| s), "every choice is listed");
    for t in 0..tokens {
        let row = &logits[t * experts..(t + 1) * experts];
        assert_eq!(weights[t * used..(t + 1) * used], route_weights(row, &top_experts(row, used))[..]);
    }
}

#[test]
fn greedy_output_is_the_same_with_every_expert_resident_and_with_a_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, types, int8) in [
        ("moe-int8.gguf", &[GgmlType::IQ2_XS, GgmlType::IQ1_M, GgmlType::Q4_K][..], Int8Dot::Auto),
        ("moe-float.gguf", &[GgmlType::Q5_K, GgmlType::Q3_K, GgmlType::IQ4_XS][..], Int8Dot::Never),
    ] {
        let pack = write_pack(dir.path(), name, types);
        let (resident, stats) = greedy(&pack, &options(CacheSize::Auto, Policy::Lfu, int8, 0));
        assert_eq!(resident.len(), 20);
        assert_eq!((stats.hit_rate(), stats.uploaded), (1.0, 0), "{name}: nothing streams when all are resident");
        // 16 experts in all (2 layers of 8, 2 used a token): 4 slots take passes of 2
        // tokens, 8 slots passes of 4.
        for (cache, policy, spec) in [
            (CacheSize::Percent(25.0), Policy::Lfu, 0),
            (CacheSize::Percent(25.0), Policy::Lru, 0),
            (CacheSize::Percent(50.0), Policy::Lfu, 4),
        ] {
            let (cached, stats) = greedy(&pack, &options(cache, policy, int8, spec));
            assert_eq!(cached, resident, "{name}: {cache:?} {policy:?} --spec {spec}");
            assert!(stats.lookups > 0 && stats.hits < stats.lookups, "{name}: {stats:?}");
            assert!(stats.uploaded > 0 && stats.tokens >= 20, "{name}: {stats:?}");
        }
    }
}

/// QSA's sparse decode passes (past the first two layers, so a three-layer pack) route
/// and stream experts as the dense ones do.
#[test]
fn sparse_attention_and_the_expert_cache_work_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("moe3.gguf");
    std::fs::write(&path, synthetic_pack(Preset::TinyQwen3Moe, 3, &[GgmlType::Q4_0, GgmlType::IQ2_XS]))
        .expect("write pack");
    let with_qsa = |cache| OpenOptions {
        qsa: QsaConfig { enabled: true, budget: 32, block: None },
        ..options(cache, Policy::Lfu, Int8Dot::Auto, 0)
    };
    let (resident, _) = greedy(&path, &with_qsa(CacheSize::Auto));
    let (cached, stats) = greedy(&path, &with_qsa(CacheSize::Percent(25.0)));
    assert_eq!(cached, resident);
    assert!(stats.lookups > stats.hits, "{stats:?}");
}

#[test]
fn a_budget_below_one_layers_experts_is_refused_with_sizes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = write_pack(dir.path(), "moe.gguf", &[GgmlType::Q4_0]);
    // One token uses 2 experts of a layer; 1 slot cannot hold them.
    let opts = options(CacheSize::Percent(100.0 / 16.0), Policy::Lfu, Int8Dot::Auto, 0);
    let err = session::open(&pack, &opts, &mut |_| {}).err().expect("refused").to_string();
    assert!(err.contains("holds 1 experts") && err.contains("need 2") && err.contains("MiB"), "{err}");
    // A cache too small for a verify window of 4 (8 experts) refuses --spec 4.
    let opts = options(CacheSize::Percent(25.0), Policy::Lfu, Int8Dot::Auto, 4);
    let err = session::open(&pack, &opts, &mut |_| {}).err().expect("refused").to_string();
    assert!(err.contains("--spec 4") && err.contains("passes of 2"), "{err}");
    assert!("25%".parse::<CacheSize>().is_ok() && "0%".parse::<CacheSize>().is_err());
    assert!("512".parse::<CacheSize>() == Ok(CacheSize::Mib(512)) && "lots".parse::<CacheSize>().is_err());
}

/// A pack's compiled kernels (sm_90, `--spec 4`, int8 as `int8` says) on the CPU
/// backend: the model with verify windows up to `window` and prompt chunks of `prefill`,
/// its experts placed as `cache` says.
fn compiled_model(
    path: &Path,
    int8: Int8Dot,
    cache: CacheSize,
) -> (Vec<strata_compiler::plan::KernelRecord>, impl Fn(u32, u32) -> strata_runtime::model::Model) {
    use strata_compiler::model::ModelDesc;
    use strata_compiler::pack::Pack;
    use strata_compiler::plan::{self, Options};
    use strata_compiler::target::Target;
    use strata_runtime::backend::cpu::Cpu;
    use strata_runtime::kernels::Kernels;
    use strata_runtime::model::Model;

    let pack = Pack::open(path).expect("opens");
    let desc = ModelDesc::from_pack(&pack).expect("a model");
    let target = Target::load("sm_90").expect("known");
    let options = Options { verify_window: 4, int8, ..Options::default() };
    let compiled = plan::plan(&desc, &pack, &target, &options).expect("plans").kernels;
    let kernels = compiled.clone();
    let load = move |window: u32, prefill: u32| {
        let kernels = Kernels::compiled(kernels.iter().cloned());
        let experts = ExpertOptions { cache, ..ExpertOptions::default() };
        Model::load(
            &pack,
            Box::new(Cpu::new()),
            kernels,
            96,
            window,
            prefill,
            1,
            KvBudget::PerSlot,
            &experts,
            &mut |_, _| {},
        )
        .expect("loads")
    };
    (compiled, load)
}

/// The last logits after reading `prompt` in the model's prompt passes.
fn last_logits(model: &mut strata_runtime::model::Model, prompt: &[u32]) -> Vec<f32> {
    use strata_runtime::model::Logits;
    for pass in model.prompt_passes(prompt.len()) {
        let logits = if pass.end == prompt.len() { Logits::Last } else { Logits::None };
        model.forward(&prompt[pass], logits).expect("reads the prompt");
    }
    model.logits(1).expect("logits")
}

fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

/// A mixture of experts also gets a prompt window beside the verify windows (16), which
/// a cached placement reads prompts in (here half the experts cached: a 16-token
/// window's 8 experts fit): 16-token passes and the last tokens in verify windows, whose
/// last logits equal those of one window pass a token (the CPU backend running the
/// compiled kernels' records). A `--prefill` narrower than the prompt window, or one it
/// has no kernels for, keeps the verify windows.
#[test]
fn prompts_are_read_in_the_prompt_window_then_verify_windows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pack(dir.path(), "moe.gguf", &[GgmlType::IQ2_XS, GgmlType::Q4_K]);
    let (compiled, load) = compiled_model(&path, Int8Dot::Auto, CacheSize::Percent(50.0));
    let windows: std::collections::BTreeSet<u32> = compiled
        .iter()
        .filter_map(|k| match k.op {
            strata_compiler::ops::Op::ExpertGemv(g) => Some(g.window),
            _ => None,
        })
        .collect();
    assert_eq!(windows.into_iter().collect::<Vec<_>>(), [1, 2, 3, 4, MAX_WINDOW]);
    let prompt: Vec<u32> = (0..37).map(|i| (i * 53 + 7) % 256).collect();
    let mut wide = load(4, 512);
    assert_eq!((wide.window(), wide.chunk()), (4, MAX_WINDOW));
    assert_eq!(wide.prompt_passes(37), [0..16, 16..32, 32..36, 36..37]);
    for narrow in [4, 6] {
        let model = load(4, narrow);
        assert_eq!(model.chunk(), 4, "--prefill {narrow}");
    }
    let mut one = load(1, 1);
    assert_eq!(one.prompt_passes(3), [0..1, 1..2, 2..3]);
    let most = largest_difference(&last_logits(&mut wide, &prompt), &last_logits(&mut one, &prompt));
    assert!(most < 1e-3, "the prompt window's logits differ from single-token passes' by {most}");
}

/// Resident experts read a prompt in chunks of `--prefill` tokens (up to
/// MAX_EXPERT_CHUNK) on the grouped expert GEMMs, int8 (IQ2_XS gate·up rows of 74 bytes:
/// staged at their own phase) or f16, whatever the chunk: the last logits of chunks of
/// 512, 7 and 16 tokens equal those of one window pass a token.
#[test]
fn prompts_of_resident_experts_take_the_grouped_expert_gemms() {
    use strata_compiler::plan::rules::MAX_EXPERT_CHUNK;

    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pack(dir.path(), "moe.gguf", &[GgmlType::IQ2_XS, GgmlType::Q4_K]);
    // Large: the experts' products int8, the small dense ones float in decode and prompt
    // alike (under Auto on sm_90 they are int8 in decode, and the f16 GEMM where their rows
    // are not whole 16-byte pieces).
    for int8 in [Int8Dot::Large, Int8Dot::Never] {
        let (compiled, load) = compiled_model(&path, int8, CacheSize::Auto);
        let gemm = compiled.iter().find(|k| k.name == "expert_gemm_iq2_xs_8x512x256_k2").expect("planned");
        assert_eq!(matches!(gemm.tuning, Tuning::GemmQ8(_)), int8 == Int8Dot::Large, "{:?}", gemm.tuning);
        assert!(compiled.iter().any(|k| k.name == "moe_group_8x2"), "the grouping is planned");
        let prompt: Vec<u32> = (0..37).map(|i| (i * 53 + 7) % 256).collect();
        let mut one = load(1, 1);
        let reference = last_logits(&mut one, &prompt);
        let mut whole = load(4, 4096);
        assert_eq!((whole.window(), whole.chunk()), (4, MAX_EXPERT_CHUNK));
        assert_eq!(whole.prompt_passes(37), vec![std::ops::Range { start: 0, end: 37 }]);
        let mut seven = load(4, 7);
        assert_eq!(seven.prompt_passes(37), [0..7, 7..14, 14..21, 21..28, 28..35, 35..37]);
        for (chunk, model) in [(512, &mut whole), (7, &mut seven), (16, &mut load(4, 16))] {
            let most = largest_difference(&last_logits(model, &prompt), &reference);
            assert!(most < 1e-3, "{int8:?}, chunks of {chunk}: logits differ from single-token passes' by {most}");
        }
    }
}
