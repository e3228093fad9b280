//! The runtime's own logic on the CPU backend: windows, chunked prefill, the captured
//! decode step, the self-test harness, and the artifact refusals (which need no GPU:
//! they compare the manifest with the device's description).

use std::path::Path;

use strata_compiler::artifacts::{Request, compile};
use strata_compiler::emit::Dialect;
use strata_compiler::model::ModelDesc;
use strata_compiler::ops::Op;
use strata_compiler::pack::Pack;
use strata_compiler::plan::{self, Int8Dot, MAX_WINDOW, Options};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::Preset;
use strata_compiler::target::Target;
use strata_runtime::artifacts;
use strata_runtime::backend::DeviceInfo;
use strata_runtime::backend::cpu::Cpu;
use strata_runtime::generate;
use strata_runtime::kernels::Kernels;
use strata_runtime::model::{ExpertOptions, KvBudget, Logits, Model};
use strata_runtime::selftest;
use strata_runtime::session::{self, BackendChoice, OpenOptions, Session};
use strata_runtime::speculative::SpeculativeConfig;
use strata_tests::{synthetic_pack, toolchain};

fn write_pack(dir: &Path, preset: Preset, weights: &[GgmlType]) -> std::path::PathBuf {
    let path = dir.join(format!("{}.gguf", preset.name()));
    std::fs::write(&path, synthetic_pack(preset, 2, weights)).expect("write pack");
    path
}

fn open_cpu(pack: &Path, prefill: u32) -> Session {
    open_cpu_with(pack, prefill, Int8Dot::Auto)
}

/// A CPU session reading prompts in chunks of `prefill`: GEMV windows up to 16 (verify
/// windows as wide as the chunk, with no drafts: no speculation), GEMMs and the prefill
/// attention beyond.
fn open_cpu_with(pack: &Path, prefill: u32, int8: Int8Dot) -> Session {
    let spec = SpeculativeConfig { window: prefill.min(MAX_WINDOW), draft_max: Some(0), ..SpeculativeConfig::OFF };
    let opts =
        OpenOptions { backend: BackendChoice::Cpu, ctx: Some(64), prefill, int8, spec, ..OpenOptions::default() };
    session::open(pack, &opts, &mut |_| {}).expect("opens on the CPU")
}

/// The same top tokens at every position, their logits within `tol`.
fn assert_close(a: &[generate::Scored], b: &[generate::Scored], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, ((ta, top_a), (tb, top_b))) in a.iter().zip(b).enumerate() {
        assert_eq!((ta, top_a[0].0), (tb, top_b[0].0), "{what}: position {i}");
        for ((ia, la), (ib, lb)) in top_a.iter().zip(top_b) {
            assert!(ia != ib || (la - lb).abs() <= tol, "{what}: position {i}, token {ia}: {la} vs {lb}");
        }
    }
}

#[test]
fn int8_products_quantize_each_input_once_and_stay_close_to_float() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = write_pack(dir.path(), Preset::TinyLlama, &[GgmlType::Q4_0, GgmlType::IQ2_XS, GgmlType::Q6_K]);
    let tokens: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 256).collect();
    let float = generate::score(&mut open_cpu_with(&pack, 4, Int8Dot::Never), &tokens, 4).expect("scores");
    let mut s = open_cpu_with(&pack, 4, Int8Dot::Always);
    let int8 = generate::score(&mut s, &tokens, 4).expect("scores");
    // Window 1 and window 4 read the same quantized inputs: identical results.
    assert_eq!(int8, generate::score(&mut open_cpu_with(&pack, 1, Int8Dot::Always), &tokens, 4).expect("scores"));
    // 8-bit activations move the logits a little, not a lot.
    for ((_, top_f), (_, top_q)) in float.iter().zip(&int8) {
        let (f, q) = (top_f[0].1, top_q.iter().find(|(id, _)| *id == top_f[0].0).map_or(f32::NAN, |p| p.1));
        assert!((f - q).abs() < 0.05 * f.abs().max(1.0), "top logit {f} vs {q}");
    }
    assert_ne!(float, int8, "the int8 path ran");

    // The per-kernel benchmark times every single-token product and each quantizer.
    let report = s.model.bench_kernels(2).expect("benchmarks");
    assert!(report.copy_bytes_per_s > 0.0);
    let names: Vec<&str> = report.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(names.iter().any(|n| n.starts_with("quantize_q8_")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("gemv_iq2_xs_")), "{names:?}");
    assert!(report.kernels.iter().all(|k| k.bytes > 0 && k.seconds > 0.0));

    // With windows: every per-tensor product shape at windows 1 to 16, window 1 first,
    // each window reading the weights once and its own columns.
    let report = s.model.bench_kernels_with(1, true, strata_runtime::bench::GEMM_TOKENS).expect("benchmarks windows");
    assert!(!report.windows.is_empty());
    for sweep in &report.windows {
        let windows: Vec<u32> = sweep.timings.iter().map(|k| k.window).collect();
        assert_eq!(windows, (1..=16).collect::<Vec<u32>>(), "{}", sweep.base);
        assert!(sweep.timings.windows(2).all(|p| p[1].bytes > p[0].bytes), "{}", sweep.base);
    }

    // Prompt chunks wider than the windows plan the GEMMs, which the benchmark times at
    // the width asked for (a verify window's: their weights rotate as the GEMVs' do).
    let mut s = open_cpu_with(&pack, 64, Int8Dot::Always);
    let prompt: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % 256).collect();
    generate::score(&mut s, &prompt, 4).expect("scores");
    let report = s.model.bench_kernels_with(1, false, 8).expect("benchmarks GEMMs");
    assert!(!report.gemms.is_empty());
    assert!(report.gemms.iter().all(|g| g.tokens == 8 && g.seconds > 0.0), "{:?}", report.gemms);
}

#[test]
fn prefill_chunking_and_graph_replay_do_not_change_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    for preset in [Preset::TinyLlama, Preset::TinyQwen3] {
        let pack = write_pack(dir.path(), preset, &[GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::IQ4_XS]);
        let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % 256).collect();
        let scored: Vec<_> = [1, 4, 64]
            .into_iter()
            .map(|window| generate::score(&mut open_cpu(&pack, window), &tokens, 4).expect("scores"))
            .collect();
        assert_eq!(scored[0], scored[1], "{}: window 1 vs 4", preset.name());
        // Chunks of 64: GEMMs (the same products) and the prefill attention (one exact
        // softmax instead of split states merged): the same tokens, logits to rounding.
        assert_close(&scored[0], &scored[2], 1e-4, &format!("{}: window 1 vs chunk 64", preset.name()));

        // The captured decode step replays the same tokens as plain forward passes.
        let mut s = open_cpu(&pack, 8);
        let mut greedy = Vec::new();
        let mut next = tokens[0];
        for _ in 0..12 {
            next = s.model.decode_greedy(next).expect("decodes");
            greedy.push(next);
        }
        let mut seq = vec![tokens[0]];
        seq.extend_from_slice(&greedy[..11]);
        let forced = generate::score(&mut s, &seq, 1).expect("scores");
        let argmax: Vec<u32> = forced.iter().map(|(_, top)| top[0].0).collect();
        assert_eq!(argmax, greedy, "{}: replayed decode step vs forward passes", preset.name());
    }
}

#[test]
fn selftest_harness_runs_every_kernel_of_a_plan() {
    // The device side is a second CPU backend here; on a GPU it is the GPU. What this
    // proves is that every op gets valid random inputs and in-bounds arguments.
    let bytes = synthetic_pack(Preset::TinyQwen3, 2, &[GgmlType::Q4_0, GgmlType::IQ2_XS]);
    let pack = Pack::from_bytes("qwen3", bytes).expect("pack");
    let model = ModelDesc::from_pack(&pack).expect("model");
    let target = Target::load("gfx1100").expect("target");
    for int8 in [Int8Dot::Auto, Int8Dot::Always] {
        let plan = plan::plan(&model, &pack, &target, &Options { int8, ..Options::default() }).expect("plan");
        let mut device = Cpu::new();
        let outcomes = selftest::run(&mut device, &plan.kernels, std::time::Duration::from_secs(10), &mut |_| {})
            .expect("every kernel runs");
        assert_eq!(outcomes.len(), plan.kernels.len());
        assert!(outcomes.iter().all(selftest::Outcome::passed));
        assert!(outcomes.iter().all(|o| o.max_error == 0.0), "the same reference twice is exact");
    }
}

#[test]
fn artifacts_for_another_pack_or_target_are_refused() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let llama = write_pack(dir.path(), Preset::TinyLlama, &[GgmlType::Q8_0]);
    let qwen3 = write_pack(dir.path(), Preset::TinyQwen3, &[GgmlType::Q8_0]);
    let (llama, qwen3) = (Pack::open(&llama).expect("pack"), Pack::open(&qwen3).expect("pack"));
    let h100 = DeviceInfo {
        backend: "cuda",
        name: "NVIDIA H100".into(),
        arch: "sm_90".into(),
        driver: "CUDA driver 13.0".into(),
        memory: 80 << 30,
        dialect: Some(Dialect::Cuda),
    };
    let build = |target: &str, run_on: Option<&str>| {
        let out = dir.path().join(format!("{target}-{}", run_on.unwrap_or("native")));
        let target = Target::load(target).expect("target");
        let run_on = run_on.map(|t| Target::load(t).expect("target"));
        let req = Request {
            pack: &llama,
            target: &target,
            options: Options::default(),
            allow_spills: false,
            run_on: run_on.as_ref(),
            out: &out,
        };
        compile(&req, &tools, &mut |_| {}).expect("compiles");
        out
    };
    let sm90 = build("sm_90", None);
    assert!(artifacts::open(&sm90, &llama, &h100).is_ok());
    let e = artifacts::open(&sm90, &qwen3, &h100).expect_err("another pack").to_string();
    assert!(e.contains("artifacts are for another pack (tiny-llama.gguf"), "{e}");

    let gfx = build("gfx1100", None);
    let e = artifacts::open(&gfx, &llama, &h100).expect_err("another target").to_string();
    assert!(e.contains("artifacts are for gfx1100; this device is sm_90 (NVIDIA H100)"), "{e}");

    // gfx1100's kernels rendered in CUDA for sm_90 do run here (cross-vendor execution).
    let cross = build("gfx1100", Some("sm_90"));
    assert!(artifacts::open(&cross, &llama, &h100).is_ok());
    let rx7900 = DeviceInfo {
        backend: "hip",
        name: "Radeon RX 7900 XTX".into(),
        arch: "gfx1100".into(),
        dialect: Some(Dialect::Hip),
        ..h100
    };
    let e = artifacts::open(&cross, &llama, &rx7900).expect_err("CUDA module on HIP").to_string();
    assert!(e.contains("artifacts are for gfx1100 (built for sm_90); this device is gfx1100"), "{e}");
    assert!(artifacts::open(&gfx, &llama, &rx7900).is_ok());
}

/// `--spec 0` (the default) runs every pack: no quant type needs speculative decoding or
/// the int8 path, which are optional (the report's engine refused `--spec 0` for IQ packs).
#[test]
fn every_quant_type_decodes_without_speculation_or_int8() {
    let dir = tempfile::tempdir().expect("tempdir");
    for pack in strata_tests::every_type_packs(dir.path()) {
        for int8 in [Int8Dot::Auto, Int8Dot::Never] {
            let mut s = open_cpu_with(&pack, 4, int8);
            assert!(!s.spec.enabled());
            let mut sampler = strata_runtime::sampler::Sampler::new(Default::default());
            let mut ids = Vec::new();
            generate::generate(&mut s, &[1, 2, 3], 4, true, &mut sampler, &mut |_, id| {
                ids.push(id);
                true
            })
            .expect("decodes");
            assert_eq!(ids.len(), 4, "{}", pack.display());
        }
    }
}

/// A CPU session of `slots` sequence slots, batches of up to `slots` (windows as wide).
fn open_slots(pack: &Path, slots: usize) -> Session {
    let spec = SpeculativeConfig { window: slots as u32, draft_max: Some(0), ..SpeculativeConfig::OFF };
    let opts =
        OpenOptions { backend: BackendChoice::Cpu, ctx: Some(64), prefill: 8, slots, spec, ..OpenOptions::default() };
    session::open(pack, &opts, &mut |_| {}).expect("opens on the CPU")
}

fn greedy(logits: &[f32]) -> u32 {
    strata_runtime::sampler::top_k(logits, 1)[0].0
}

/// A batch of decode steps (one pass, one column a sequence, each attending over its own
/// cache at its own position) gives each sequence the tokens and logits it gets decoding
/// alone, whichever sequences share the pass: dense, Qwen3's head norms, Gemma 3's local
/// layers, a mixture of experts.
#[test]
fn a_batch_of_sequences_decodes_as_each_does_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let presets = [Preset::TinyLlama, Preset::TinyQwen3, Preset::TinyGemma3, Preset::TinyQwen3Moe];
    for preset in presets {
        let pack = write_pack(dir.path(), preset, &[GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::IQ4_XS]);
        let open = || open_slots(&pack, 4);
        // Four prompts of different lengths, each read into its own slot: the first token.
        let prompts: Vec<Vec<u32>> = [3usize, 7, 12, 20]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n as u32).map(|j| (j * 37 + 11 * i as u32 + 5) % 256).collect())
            .collect();
        let read = |s: &mut Session| -> Vec<u32> {
            let mut first = Vec::new();
            for (slot, prompt) in prompts.iter().enumerate() {
                s.model.select(slot).expect("a slot");
                s.model.reset();
                for pass in s.model.prompt_passes(prompt.len()) {
                    s.model.forward(&prompt[pass], strata_runtime::model::Logits::Last).expect("reads");
                }
                first.push(s.model.argmax(1).expect("argmax")[0]);
            }
            first
        };
        let steps = 6;
        // Alone: each sequence decoded by itself, logits kept at every step.
        let mut s = open();
        let first = read(&mut s);
        let (mut alone, mut alone_logits) = (Vec::new(), Vec::new());
        for (slot, &token) in first.iter().enumerate() {
            s.model.select(slot).expect("a slot");
            let (mut seq, mut rows, mut next) = (vec![token], Vec::new(), token);
            for _ in 0..steps {
                s.model.decode(next).expect("decodes");
                let logits = s.model.logits(1).expect("logits");
                next = greedy(&logits);
                seq.push(next);
                rows.push(logits);
            }
            alone.push(seq);
            alone_logits.push(rows);
        }
        // Batched: sequence i joins at step i, so batches of 1 to 4 with different members.
        let mut s = open();
        assert_eq!(read(&mut s), first, "{}: the prompts' first tokens", preset.name());
        let mut batched: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
        for step in 0..steps + 3 {
            let members: Vec<usize> = (0..4).filter(|&i| step >= i && batched[i].len() <= steps).collect();
            let batch: Vec<(usize, u32)> = members.iter().map(|&i| (i, *batched[i].last().unwrap())).collect();
            if step % 2 == 0 {
                let next = s.model.decode_batch_greedy(&batch).expect("a batch decodes");
                for (&i, t) in members.iter().zip(next) {
                    batched[i].push(t);
                }
            } else {
                s.model.decode_batch(&batch).expect("a batch decodes");
                let vocab = s.model.desc.vocab as usize;
                let logits = s.model.logits(batch.len() as u32).expect("logits");
                for (row, &i) in members.iter().enumerate() {
                    let logits = &logits[row * vocab..(row + 1) * vocab];
                    let at = batched[i].len() - 1;
                    let want = &alone_logits[i][at];
                    let most = want.iter().zip(logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(most <= 1e-5, "{}: sequence {i}, step {at}: logits differ by {most}", preset.name());
                    batched[i].push(greedy(logits));
                }
            }
        }
        assert_eq!(batched, alone, "{}: batched vs alone", preset.name());
    }
}

/// Several prompts read together (`Model::read_prompts`: passes holding runs of equal
/// length of each, on the GEMMs with the prefill attention of several sequences, or in
/// GEMV windows with split attention) leave each sequence's cache as reading its prompt
/// alone does: the last prompt tokens, decoded in one batch, give each sequence the
/// logits (to rounding: other GEMM widths) and first token it gets alone, and exactly
/// those where the prompts fit a window and share window passes. Dense, Gemma 3's local
/// layers, a mixture of experts; windows of 4 and of 16.
#[test]
fn prompts_read_together_leave_each_cache_as_reading_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lens = [5usize, 9, 17, 30, 1, 12];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n as u32).map(|j| (j * 29 + 13 * i as u32 + 3) % 256).collect())
        .collect();
    for preset in [Preset::TinyLlama, Preset::TinyGemma3, Preset::TinyQwen3Moe] {
        let pack = write_pack(dir.path(), preset, &[GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::IQ4_XS]);
        for window in [4u32, 16] {
            let name = format!("{} window {window}", preset.name());
            let open = || {
                let spec = SpeculativeConfig { window, draft_max: Some(0), ..SpeculativeConfig::OFF };
                let opts = OpenOptions {
                    backend: BackendChoice::Cpu,
                    ctx: Some(64),
                    prefill: 32,
                    slots: lens.len(),
                    spec,
                    ..OpenOptions::default()
                };
                session::open(&pack, &opts, &mut |_| {}).expect("opens on the CPU").model
            };
            let vocab;
            // Alone: each prompt but its last token in its own chunks, then that token.
            let mut alone = Vec::new();
            {
                let mut m = open();
                assert!(m.prompt_seqs() >= lens.len() as u32, "{name}: {} sequences a pass", m.prompt_seqs());
                vocab = m.desc.vocab as usize;
                for (slot, prompt) in prompts.iter().enumerate() {
                    m.select(slot).expect("a slot");
                    let body = &prompt[..prompt.len() - 1];
                    for pass in m.prompt_passes(body.len()) {
                        m.forward(&body[pass], Logits::None).expect("reads");
                    }
                    m.decode(prompt[prompt.len() - 1]).expect("decodes");
                    alone.push(m.logits(1).expect("logits"));
                }
            }
            // Together: every prompt's body in shared passes, the last tokens in one batch.
            let mut m = open();
            let bodies: Vec<(usize, &[u32])> =
                prompts.iter().enumerate().map(|(slot, p)| (slot, &p[..p.len() - 1])).collect();
            m.read_prompts(&bodies, m.chunk()).expect("the prompts are read together");
            for (slot, prompt) in prompts.iter().enumerate() {
                assert_eq!(m.pos_of(slot) as usize, prompt.len() - 1, "{name}: slot {slot}");
            }
            let batch: Vec<(usize, u32)> = prompts.iter().enumerate().map(|(slot, p)| (slot, p[p.len() - 1])).collect();
            m.decode_batch(&batch).expect("a batch decodes");
            let rows = m.logits(batch.len() as u32).expect("logits");
            for (slot, row) in rows.chunks_exact(vocab).enumerate() {
                let most = alone[slot].iter().zip(row).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(most <= 1e-3, "{name}: sequence {slot}: logits differ by {most}");
                assert_eq!(greedy(row), greedy(&alone[slot]), "{name}: sequence {slot}'s first token");
            }
            // The prompts whose bodies fit a window, read together in window passes: each
            // row as reading it alone computes it, bit for bit.
            let mut m = open();
            let short: Vec<usize> = (0..prompts.len()).filter(|&i| prompts[i].len() <= window as usize + 1).collect();
            let bodies: Vec<(usize, &[u32])> =
                short.iter().map(|&i| (i, &prompts[i][..prompts[i].len() - 1])).collect();
            m.read_prompts(&bodies, window).expect("the short prompts are read together");
            let batch: Vec<(usize, u32)> = short.iter().map(|&i| (i, prompts[i][prompts[i].len() - 1])).collect();
            m.decode_batch(&batch).expect("a batch decodes");
            let rows = m.logits(batch.len() as u32).expect("logits");
            for (&i, row) in short.iter().zip(rows.chunks_exact(vocab)) {
                assert!(row == alone[i].as_slice(), "{name}: sequence {i}'s logits, read in a shared window pass");
            }
            // Refused: a slot named twice, a prompt past the context.
            let e = m.read_prompts(&[(0, &[1, 2]), (0, &[3])], 32).expect_err("twice").to_string();
            assert!(e.contains("twice"), "{e}");
            let e = m.read_prompts(&[(1, &[1; 65])], 32).expect_err("too long").to_string();
            assert!(e.contains("the context is full"), "{e}");
        }
    }
}

/// `bench --batch --profile`'s step, run launch by launch with a timing mark after each,
/// is the batched step: every launch named with a time, the argmax last, the same next
/// tokens as the step replayed from its graph, and the sequences left where that step
/// leaves them (the next step agrees too).
#[test]
fn a_profiled_batch_step_is_the_batched_step_launch_by_launch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = write_pack(dir.path(), Preset::TinyLlama, &[GgmlType::Q4_0]);
    let (seqs, pp) = (3, 5);
    // Each slot reads a prompt of its own: its first token.
    let start = |s: &mut Session| -> Vec<(usize, u32)> {
        (0..seqs)
            .map(|slot| {
                let prompt: Vec<u32> = (0..pp as u32).map(|j| (j * 37 + 11 * slot as u32 + 5) % 256).collect();
                s.model.select(slot).expect("a slot");
                s.model.reset();
                for pass in s.model.prompt_passes(prompt.len()) {
                    s.model.forward(&prompt[pass], Logits::Last).expect("reads");
                }
                (slot, s.model.argmax(1).expect("argmax")[0])
            })
            .collect()
    };
    let step = |s: &mut Session, batch: &[(usize, u32)]| -> Vec<(usize, u32)> {
        let next = s.model.decode_batch_greedy(batch).expect("a batch decodes");
        batch.iter().zip(next).map(|(&(slot, _), t)| (slot, t)).collect()
    };
    let mut replayed = open_slots(&pack, seqs);
    let batch = start(&mut replayed);
    let once = step(&mut replayed, &batch);
    let twice = step(&mut replayed, &once);

    let mut profiled = open_slots(&pack, seqs);
    assert_eq!(start(&mut profiled), batch);
    let times = profiled.model.profile_batch(&batch).expect("profiles");
    assert!(times.len() > 10, "{} launches", times.len());
    assert!(times.iter().all(|(name, secs)| !name.is_empty() && secs.is_finite() && *secs >= 0.0));
    assert!(times.last().is_some_and(|(name, _)| name.starts_with("argmax")), "{:?}", times.last());
    assert!(times.iter().any(|(name, _)| name.starts_with("gemv_q4_0")), "the products are launched");
    let tokens = profiled.model.argmax(seqs as u32).expect("the step's logits");
    let mine: Vec<(usize, u32)> = batch.iter().zip(tokens).map(|(&(slot, _), t)| (slot, t)).collect();
    assert_eq!(mine, once, "the profiled step's tokens");
    assert!((0..seqs).all(|slot| profiled.model.pos_of(slot) as usize == pp + 1), "one position each");
    assert_eq!(step(&mut profiled, &mine), twice, "the step after it");
}

/// A batch wider than the widest window runs its products on the prompt chunk's GEMMs,
/// in one pass, with sequences joining between passes and a different set each pass:
/// each sequence's logits stay those of decoding alone (within float rounding: the
/// GEMMs may sum in another order), and so do its greedy tokens. Dense, Gemma 3's local
/// layers, a mixture of experts (its grouped expert GEMMs).
#[test]
fn a_batch_wider_than_the_window_runs_on_the_gemms_as_each_sequence_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    for preset in [Preset::TinyLlama, Preset::TinyGemma3, Preset::TinyQwen3Moe] {
        let pack = write_pack(dir.path(), preset, &[GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::IQ4_XS]);
        wide_batches_decode_as_alone(&pack, preset.name());
    }
}

fn wide_batches_decode_as_alone(pack: &Path, name: &str) {
    let seqs = 20usize;
    // Windows of 16 (as 20 slots ask), chunks of 32: batches of up to 32 on the GEMMs.
    let open = || {
        let spec = SpeculativeConfig { window: 2, draft_max: Some(0), ..SpeculativeConfig::OFF };
        let opts = OpenOptions {
            backend: BackendChoice::Cpu,
            ctx: Some(64),
            prefill: 32,
            slots: seqs,
            spec,
            ..OpenOptions::default()
        };
        session::open(pack, &opts, &mut |_| {}).expect("opens on the CPU").model
    };
    let model = open();
    assert_eq!(model.window(), MAX_WINDOW);
    assert!(model.batch_width() >= seqs as u32, "{name}: batch width {}", model.batch_width());
    // The engine's passes: up to two windows' worth in window passes, more on the GEMMs
    // (a batch of 17 to 20 below takes them because it is decoded in one call).
    assert_eq!(model.batch_passes(16), vec![0..16], "16 or fewer: a window pass");
    assert_eq!(model.batch_passes(seqs), vec![0..16, 16..seqs], "up to 32: window passes");
    assert_eq!(model.batch_passes(36), vec![0..18, 18..36], "past 32: GEMM passes sized alike");
    batches_decode_as_alone(&open, seqs, name);
}

/// A batch of more sequences than the window whose products have batch GEMVs (Q4_0
/// and Q8_0 planned for sm_90, run by the CPU references): 17 to 32 sequences decode
/// in one pass of them (the output projection's GEMM beside them), each as it decodes
/// alone; more in wide passes sized alike, which take them too where they hold 32 or
/// fewer (a batch width of 32 here).
#[test]
fn a_batch_wider_than_the_window_takes_the_batch_gemvs_as_each_sequence_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = write_pack(dir.path(), Preset::TinyLlama, &[GgmlType::Q4_0, GgmlType::Q8_0]);
    let pack = Pack::open(&pack).expect("opens");
    let desc = ModelDesc::from_pack(&pack).expect("a model");
    let target = Target::load("sm_90").expect("known");
    // Int8 products however small the matrices (the rule's default leaves tiny ones float).
    let options = Options { verify_window: MAX_WINDOW, int8: Int8Dot::Always, ..Options::default() };
    let plan = plan::plan(&desc, &pack, &target, &options).expect("plans");
    let batch_gemvs = plan.kernels.iter().filter(|k| matches!(k.op, Op::BatchGemv(_))).count();
    assert!(batch_gemvs >= 4, "the layers' products have batch GEMVs: {batch_gemvs}");
    let seqs = 20usize;
    let open = || {
        let kernels = Kernels::compiled(plan.kernels.clone());
        let (kv, experts) = (KvBudget::PerSlot, ExpertOptions::default());
        Model::load(&pack, Box::new(Cpu::new()), kernels, 64, MAX_WINDOW, 32, seqs, kv, &experts, &mut |_, _| {})
            .expect("loads on the CPU")
    };
    let model = open();
    assert_eq!(model.batch_passes(16), vec![0..16], "16 or fewer: a window pass");
    assert_eq!(model.batch_passes(seqs), vec![0..seqs], "up to 32: one pass of batch GEMVs");
    assert_eq!(
        model.batch_passes(36),
        vec![0..18, 18..36],
        "past 32: wide passes of up to the batch width, sized alike"
    );
    batches_decode_as_alone(&open, seqs, "tiny-llama on batch GEMVs");
}

/// SmolLM2's shape in Q4_1: its 576-column rows (360 bytes) are not whole 16-byte pieces,
/// so only the down projection has a batch GEMV, under half of a layer's weight bytes; a
/// batch of 17 to 32 then takes window passes rather than one pass whose other products
/// are GEMMs (slower on an H100, docs/PERFORMANCE.md).
#[test]
fn a_batch_takes_window_passes_where_batch_gemvs_hold_under_half_the_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = write_pack(dir.path(), Preset::SmolLm2, &[GgmlType::Q4_1]);
    let pack = Pack::open(&pack).expect("opens");
    let desc = ModelDesc::from_pack(&pack).expect("a model");
    let target = Target::load("sm_90").expect("known");
    let options = Options { verify_window: MAX_WINDOW, int8: Int8Dot::Always, ..Options::default() };
    let plan = plan::plan(&desc, &pack, &target, &options).expect("plans");
    let batch_gemvs: Vec<_> = plan.kernels.iter().filter(|k| matches!(k.op, Op::BatchGemv(_))).collect();
    assert!(
        !batch_gemvs.is_empty() && batch_gemvs.iter().all(|k| k.name.contains("576x1536")),
        "the down projection alone has a batch GEMV: {:?}",
        batch_gemvs.iter().map(|k| &k.name).collect::<Vec<_>>()
    );
    let kernels = Kernels::compiled(plan.kernels.clone());
    let (kv, experts) = (KvBudget::PerSlot, ExpertOptions::default());
    let model = Model::load(&pack, Box::new(Cpu::new()), kernels, 64, MAX_WINDOW, 32, 20, kv, &experts, &mut |_, _| {})
        .expect("loads on the CPU");
    assert_eq!(model.batch_passes(20), vec![0..16, 16..20], "two window passes");
}

/// Decodes `seqs` sequences alone, then in batches wider than the window (17 to `seqs`
/// a pass, sequences joining and leaving), and compares tokens and logits.
fn batches_decode_as_alone(open: &dyn Fn() -> Model, seqs: usize, name: &str) {
    let start = |m: &mut Model, slot: usize| {
        m.select(slot).expect("a slot");
        m.reset();
        m.forward(&[slot as u32 + 1, 7, 9, slot as u32 * 3], Logits::Last).expect("reads");
        m.argmax(1).expect("argmax")[0]
    };
    let steps = 4;
    let mut s = open();
    let vocab = s.desc.vocab as usize;
    let mut alone = Vec::new();
    for slot in 0..seqs {
        let (mut seq, mut rows) = (vec![start(&mut s, slot)], Vec::new());
        for _ in 0..steps {
            s.decode(*seq.last().expect("a token")).expect("decodes");
            let logits = s.logits(1).expect("logits");
            seq.push(greedy(&logits));
            rows.push(logits);
        }
        alone.push((seq, rows));
    }
    // Batched: the last three prompts are read between passes; once all have started,
    // every pass leaves out a few (17 to 20 sequences), greedy on the device and from
    // the logits in turn; what is left after decodes alone.
    let mut s = open();
    let mut batched: Vec<Vec<u32>> = (0..seqs - 3).map(|slot| vec![start(&mut s, slot)]).collect();
    for step in 0..2 * steps {
        if batched.len() < seqs {
            batched.push(vec![start(&mut s, batched.len())]);
        }
        let skip = if batched.len() == seqs { step % 7 } else { seqs };
        let members: Vec<usize> = (0..batched.len()).filter(|&i| i % 7 != skip && batched[i].len() <= steps).collect();
        if members.len() <= MAX_WINDOW as usize {
            break;
        }
        let batch: Vec<(usize, u32)> = members.iter().map(|&i| (i, *batched[i].last().expect("a token"))).collect();
        if step % 2 == 0 {
            for (&i, next) in members.iter().zip(s.decode_batch_greedy(&batch).expect("a wide batch decodes")) {
                batched[i].push(next);
            }
            continue;
        }
        s.decode_batch(&batch).expect("a wide batch decodes");
        let logits = s.logits(batch.len() as u32).expect("logits");
        for (&i, row) in members.iter().zip(logits.chunks_exact(vocab)) {
            let at = batched[i].len() - 1;
            let most = alone[i].1[at].iter().zip(row).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(most <= 1e-3, "{name}: sequence {i}, step {at}: logits differ by {most}");
            batched[i].push(greedy(row));
        }
    }
    for (i, seq) in batched.iter_mut().enumerate() {
        s.select(i).expect("a slot");
        while seq.len() <= steps {
            let next = s.decode_greedy(*seq.last().expect("a token")).expect("decodes");
            seq.push(next);
        }
    }
    let alone: Vec<Vec<u32>> = alone.into_iter().map(|(seq, _)| seq).collect();
    assert_eq!(batched, alone, "{name}");
    let over: Vec<(usize, u32)> = (0..=s.batch_width() as usize).map(|i| (i % seqs, 1)).collect();
    let e = s.decode_batch_greedy(&over).expect_err("a batch past the width is refused").to_string();
    assert!(e.contains("a batch takes 1 to"), "{e}");
}

/// Batches of 80 different sets of slots replay the one graph captured for their size
/// (the slots are read from the device at each replay), and each sequence decodes as it
/// does alone.
#[test]
fn batches_of_other_slots_replay_their_size_s_graph_as_each_sequence_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pack = write_pack(dir.path(), Preset::TinyLlama, &[GgmlType::Q4_0, GgmlType::Q8_0]);
    let open = || open_slots(&pack, 8);
    // 80 sets of two or more of the 8 slots; each slot takes part in about 40.
    let sets: Vec<Vec<usize>> = (3u32..256)
        .filter(|m| m.count_ones() >= 2)
        .step_by(2)
        .take(80)
        .map(|m| (0..8).filter(|i| m & (1 << i) != 0).collect())
        .collect();
    let steps: Vec<usize> = (0..8).map(|i| sets.iter().filter(|s| s.contains(&i)).count()).collect();
    let start = |s: &mut Session, slot: usize| {
        s.model.select(slot).expect("a slot");
        s.model.reset();
        s.model.forward(&[slot as u32 + 1, 7, 9], strata_runtime::model::Logits::Last).expect("reads");
        s.model.argmax(1).expect("argmax")[0]
    };
    let mut s = open();
    let alone: Vec<Vec<u32>> = (0..8)
        .map(|slot| {
            let mut seq = vec![start(&mut s, slot)];
            for _ in 0..steps[slot] {
                let next = s.model.decode_greedy(*seq.last().unwrap()).expect("decodes");
                seq.push(next);
            }
            seq
        })
        .collect();
    let mut s = open();
    let mut batched: Vec<Vec<u32>> = (0..8).map(|slot| vec![start(&mut s, slot)]).collect();
    for set in &sets {
        let batch: Vec<(usize, u32)> = set.iter().map(|&i| (i, *batched[i].last().unwrap())).collect();
        for (&i, next) in set.iter().zip(s.model.decode_batch_greedy(&batch).expect("a batch decodes")) {
            batched[i].push(next);
        }
    }
    assert_eq!(batched, alone);
}
