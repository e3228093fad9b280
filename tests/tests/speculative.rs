//! Speculative decoding on the CPU backend: the verify-window GEMV contract for every
//! quant type; greedy output equal token for token to decoding without speculation, for
//! every window and drafter setting, on the real default model; draft-model packs
//! (accepted, and refused for another vocabulary); sampled speculation.

use std::path::Path;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use strata_compiler::ops::{self, Op};
use strata_compiler::pack::Pack;
use strata_compiler::plan::{Int8Dot, MAX_WINDOW, Options, Tuning, rules};
use strata_compiler::quant::{GgmlType, SUPPORTED, random_blocks, random_floats};
use strata_compiler::synth::{self, Preset, Types};
use strata_compiler::target::Target;
use strata_runtime::backend::cpu::{Cpu, quantize_q8};
use strata_runtime::backend::{Arg, Backend};
use strata_runtime::chat::{self, Message};
use strata_runtime::generate::{self, Stats};
use strata_runtime::sampler::{Sampler, SamplerConfig};
use strata_runtime::session::{self, BackendChoice, OpenOptions, Session};
use strata_runtime::speculative::SpeculativeConfig;

/// Column j of every verify window (T = 1..16) equals the single-token product of input
/// j bit for bit, for every quant type, on the float and the int8 path (the device check
/// runs the same contract on the GPU kernels, window and single token of one template).
#[test]
fn window_columns_equal_single_token_products() {
    let target = Target::load("sm_90").expect("known");
    let (rows, cols) = (3u32, 256u32);
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let x = random_floats(&mut rng, (MAX_WINDOW * cols) as usize, 1.0);
    let (xq, xd) = quantize_q8(&x);
    let mut cpu = Cpu::new();
    let upload = |cpu: &mut Cpu, bytes: &[u8]| {
        let b = cpu.alloc(bytes.len()).expect("host memory");
        cpu.write(b, 0, bytes).expect("in bounds");
        b
    };
    let floats = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let (xb, xqb, xdb) = (upload(&mut cpu, &floats(&x)), upload(&mut cpu, &xq), upload(&mut cpu, &floats(&xd)));
    let y = upload(&mut cpu, &vec![0; (MAX_WINDOW * rows * 4) as usize]);
    for quant in SUPPORTED {
        let mut w = vec![0u8; quant.row_bytes(u64::from(cols)).expect("whole blocks") as usize * rows as usize];
        random_blocks(quant, &mut rng, &mut w, 0.05).expect("valid blocks");
        let wb = upload(&mut cpu, &w);
        for int8 in [Int8Dot::Never, Int8Dot::Always] {
            let options = Options { int8, ..Options::default() };
            let run = |cpu: &mut Cpu, window: u32, column: u32| -> Vec<u32> {
                let spec = rules::kernel_with(Op::Gemv(ops::Gemv::new(quant, rows, cols, window)), &target, &options);
                let (q_at, d_at, x_at) =
                    ((column * cols) as usize, (column * cols / 16) as usize * 4, (column * cols * 4) as usize);
                let args: Vec<(&str, Arg)> = match spec.tuning {
                    Tuning::GemvMma(_) | Tuning::GemvQ8(_) => vec![
                        ("w", Arg::Buf(wb, 0)),
                        ("xq", Arg::Buf(xqb, q_at)),
                        ("xd", Arg::Buf(xdb, d_at)),
                        ("y", Arg::Buf(y, 0)),
                    ],
                    _ => vec![("w", Arg::Buf(wb, 0)), ("x", Arg::Buf(xb, x_at)), ("y", Arg::Buf(y, 0))],
                };
                cpu.call(&spec, &args).expect("runs");
                let mut out = vec![0u8; (window * rows * 4) as usize];
                cpu.read(y, 0, &mut out).expect("in bounds");
                out.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            };
            let single: Vec<Vec<u32>> = (0..MAX_WINDOW).map(|j| run(&mut cpu, 1, j)).collect();
            for window in 2..=MAX_WINDOW {
                let got = run(&mut cpu, window, 0);
                for (j, want) in single.iter().enumerate().take(window as usize) {
                    let column = &got[j * rows as usize..(j + 1) * rows as usize];
                    assert_eq!(column, &want[..], "{quant} {int8:?}: window {window}, column {j}");
                }
            }
        }
    }
}

/// A code edit (the answer copies the prompt's code, where n-gram drafts pay) and a
/// prose prompt. The CPU reference is slow (2 cores in CI): runs are short.
const PROMPTS: [(&str, bool); 2] = [
    (
        "Rename the variable `total` to `sum` in this function and return the whole function:\n\
         ```python\ndef add_all(values):\n    total = 0\n    for v in values:\n        total = total + v\n    \
         return total\n```",
        true,
    ),
    ("The capital of France is", false),
];

fn open(pack: &Path, spec: SpeculativeConfig, draft: Option<&Path>) -> Session {
    let opts = OpenOptions {
        backend: BackendChoice::Cpu,
        ctx: Some(512),
        prefill: 64,
        spec,
        draft_pack: draft.map(Path::to_path_buf),
        ..OpenOptions::default()
    };
    session::open(pack, &opts, &mut |_| {}).expect("opens on the CPU")
}

fn prompt_ids(s: &Session, text: &str, chat: bool) -> Vec<u32> {
    let text = if chat {
        let t = &s.tokenizer;
        let messages = [Message::new("user", text)];
        chat::render(t.chat_template().expect("template"), &messages, true, "", "").expect("renders")
    } else {
        text.to_string()
    };
    s.tokenizer.encode(&text, true)
}

fn run(s: &mut Session, prompt: &[u32], tokens: usize, sampler: SamplerConfig) -> (Vec<u32>, Stats) {
    let mut out = Vec::new();
    let mut sampler = Sampler::new(sampler);
    let stats = generate::generate(s, prompt, tokens, true, &mut sampler, &mut |_, id| {
        out.push(id);
        true
    })
    .expect("generates");
    (out, stats)
}

fn spec(window: u32, ngram: usize, draft_max: Option<usize>) -> SpeculativeConfig {
    SpeculativeConfig { window, ngram, draft_max }
}

#[test]
fn greedy_output_is_the_same_with_and_without_speculation() {
    let Some(model) = strata_tests::smollm2() else { return };
    // One session whose passes take up to 16 tokens; each run sets its own speculation.
    let mut s = open(&model, spec(16, 3, None), None);
    let settings = [
        spec(2, 3, None),
        spec(4, 3, None),
        spec(6, 3, None),
        spec(8, 3, None),
        spec(16, 3, None),
        spec(8, 2, Some(1)),
    ];
    let (text, chat) = PROMPTS[0];
    let prompt = prompt_ids(&s, text, chat);
    s.spec = SpeculativeConfig::OFF;
    let (plain, stats) = run(&mut s, &prompt, 32, SamplerConfig::greedy());
    assert_eq!(plain.len(), 32);
    assert_eq!(stats.spec.verified, 0, "no speculation when off");
    for cfg in settings {
        s.spec = cfg;
        let (fast, stats) = run(&mut s, &prompt, 32, SamplerConfig::greedy());
        assert_eq!(fast, plain, "{cfg:?} on {text:?}");
        assert!(stats.spec.accepted <= stats.spec.drafted);
        let most = cfg.most_drafts() as u64;
        assert!(stats.spec.drafted <= stats.spec.verified * most, "{cfg:?}: at most {most} drafts a pass");
        // Editing code repeats the prompt: the n-gram drafter finds drafts, some right.
        assert!(stats.spec.verified > 0 && stats.spec.accepted > 0, "{cfg:?}: {:?}", stats.spec);
    }
}

/// A two-layer model of random weights with the default model's vocabulary: a valid
/// draft pack that is mostly wrong.
fn weak_draft(dir: &Path, target: &Path) -> std::path::PathBuf {
    let target = Pack::open(target).expect("pack");
    let mut shape = Preset::TinyLlama.shape();
    shape.layers = 2;
    let tokenizer = synth::Tokenizer::from_pack(&target).expect("the default model has a tokenizer");
    let types = Types { weights: vec![GgmlType::Q8_0], embedding: GgmlType::Q8_0, output: GgmlType::Q8_0 };
    let planned = synth::plan(&shape, &types, &tokenizer, "draft").expect("valid");
    let path = dir.join("draft.gguf");
    std::fs::write(&path, planned.writer.to_bytes(|i, out| planned.fill(5, i, out))).expect("writes");
    path
}

#[test]
fn a_draft_model_keeps_greedy_output_and_another_vocabulary_is_refused() {
    let Some(model) = strata_tests::smollm2() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut plain = open(&model, SpeculativeConfig::OFF, None);
    let prompt = prompt_ids(&plain, PROMPTS[1].0, false);
    let (want, _) = run(&mut plain, &prompt, 24, SamplerConfig::greedy());

    // The model as its own draft: every draft is accepted.
    let mut same = open(&model, spec(5, 3, None), Some(&model));
    let (got, stats) = run(&mut same, &prompt, 24, SamplerConfig::greedy());
    assert_eq!(got, want);
    assert!(stats.spec.verified > 0 && stats.spec.accepted == stats.spec.drafted, "{:?}", stats.spec);

    // A random draft: mostly rejected, the output unchanged, and the draft length adapts
    // down (so fewer than 4 drafts a pass on average).
    let weak = weak_draft(dir.path(), &model);
    let mut wrong = open(&model, spec(5, 3, None), Some(&weak));
    let (got, stats) = run(&mut wrong, &prompt, 24, SamplerConfig::greedy());
    assert_eq!(got, want);
    assert!(stats.spec.acceptance() < 0.5, "{:?}", stats.spec);
    assert!(stats.spec.drafted < 4 * stats.spec.verified, "{:?}", stats.spec);

    // Another vocabulary (a byte-level tokenizer) is refused, naming why.
    let other = dir.path().join("other.gguf");
    let bytes = strata_tests::synthetic_pack(Preset::TinyLlama, 2, &[GgmlType::Q8_0]);
    std::fs::write(&other, bytes).expect("writes");
    let opts = OpenOptions {
        backend: BackendChoice::Cpu,
        ctx: Some(64),
        spec: spec(4, 3, None),
        draft_pack: Some(other),
        ..OpenOptions::default()
    };
    let e = session::open(&model, &opts, &mut |_| {}).err().expect("refused").to_string();
    assert!(e.contains("draft") && e.contains("vocabulary"), "{e}");
    // A draft pack without speculation is a mistake, said as such.
    let opts = OpenOptions { spec: SpeculativeConfig::OFF, draft_pack: Some(weak), ..opts };
    let e = session::open(&model, &opts, &mut |_| {}).err().expect("refused").to_string();
    assert!(e.contains("--spec"), "{e}");
}

#[test]
fn sampled_speculation_is_reproducible_and_accepts_an_identical_draft() {
    let Some(model) = strata_tests::smollm2() else { return };
    // The model as its own draft: the draft's distribution q equals the target's p at
    // every position (the verify window computes each row as decoding does), so
    // rejection sampling accepts every draft, with probability min(1, p/q) = 1.
    let mut s = open(&model, spec(4, 3, None), Some(&model));
    let prompt = prompt_ids(&s, PROMPTS[1].0, false);
    let cfg = SamplerConfig { temperature: 0.7, seed: 11, ..SamplerConfig::default() };
    let (a, stats) = run(&mut s, &prompt, 24, cfg.clone());
    let (b, _) = run(&mut s, &prompt, 24, cfg);
    assert_eq!(a, b, "the same seed draws the same tokens");
    assert_eq!(a.len(), 24);
    assert!(a.iter().all(|&id| (id as usize) < s.tokenizer.vocab_size()));
    assert!(stats.spec.verified > 0 && stats.spec.accepted == stats.spec.drafted, "{:?}", stats.spec);
}
