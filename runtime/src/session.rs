//! Opening a pack for running: choose the backend, find or compile the artifacts,
//! self-test them on the device, upload the weights and read the tokenizer. The command
//! line and the server both start here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use strata_compiler::artifacts::Stage;
use strata_compiler::build::Toolchain;
use strata_compiler::host::HostTarget;
use strata_compiler::model::ModelDesc;
use strata_compiler::pack::Pack;
use strata_compiler::plan::{ERROR_BUFFER, Int8Dot, MAX_WINDOW, Options};
use strata_compiler::target::Target;

use crate::artifacts::{self, Artifacts};
use crate::backend::cpu::Cpu;
use crate::backend::cuda::{self, Cuda};
use crate::backend::hip::{self, Hip};
use crate::backend::host;
use crate::backend::{Backend, DeviceEntry, DeviceInfo, RunError};
use crate::kernels::Kernels;
use crate::model::{ExpertOptions, KvBudget, Model, Placement, QsaConfig};
use crate::selftest::{self, Outcome};
use crate::speculative::SpeculativeConfig;
use crate::speculative::draft::DraftModel;
use crate::tokenizer::Tokenizer;

/// Which backend to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// CUDA if a device is present, else HIP, else the host's generated kernels.
    Auto,
    /// The CPU reference.
    Cpu,
    /// Kernels generated for the host CPU's target (`strata_compiler::host`).
    Host,
    /// An NVIDIA GPU.
    Cuda,
    /// An AMD GPU.
    Hip,
}

/// When the self-test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelfTest {
    /// On the first load of these artifacts on this device (the pass is cached).
    Auto,
    /// On every load.
    Always,
}

/// How to open a pack.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Backend.
    pub backend: BackendChoice,
    /// The GPU to run on, by its index on the backend (default: the first supported).
    pub device: Option<usize>,
    /// Compiled artifacts; compiled for the device into the cache when absent.
    pub artifacts: Option<PathBuf>,
    /// Context length; the pack's training context when absent.
    pub ctx: Option<u32>,
    /// Prefill chunk: tokens per forward pass while reading a prompt (GEMMs on the
    /// matrix units where wider than the verify window; a mixture of experts reads its
    /// prompt in verify-window passes).
    pub prefill: u32,
    /// Self-test policy.
    pub selftest: SelfTest,
    /// How long one kernel may run before it counts as a hang.
    pub deadline: Duration,
    /// How long a start may go without progress before the start-up watchdog (run by the
    /// caller, see `watchdog`) ends it, naming the stage.
    pub startup_timeout: Duration,
    /// Sequences held at once, for serving several clients.
    pub slots: usize,
    /// The KV pool the slots take pages from (`--kv-budget`; by default a whole context
    /// for each slot).
    pub kv: KvBudget,
    /// Int8-dot GEMVs, for kernels planned here: on the CPU, and when compiling into the
    /// cache (compiled artifacts carry their own choice).
    pub int8: Int8Dot,
    /// Speculative decoding; its window must be compiled (`strata-compile --spec`).
    pub spec: SpeculativeConfig,
    /// A draft model's pack for speculative decoding (else the n-gram drafter).
    pub draft_pack: Option<PathBuf>,
    /// The draft pack's compiled artifacts (compiled into the cache when absent).
    pub draft_artifacts: Option<PathBuf>,
    /// Query-aware sparse attention for decode passes past the budget.
    pub qsa: QsaConfig,
    /// Where a mixture-of-experts pack's experts go.
    pub experts: ExpertOptions,
    /// Greedy picks refuse non-finite logits and name the first non-finite layer (also
    /// on with artifacts compiled `--checked`).
    pub checked: bool,
    /// Host backend workers (one per physical core when absent).
    pub threads: Option<usize>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            backend: BackendChoice::Auto,
            device: None,
            artifacts: None,
            ctx: None,
            prefill: strata_compiler::plan::rules::GEMM_CHUNK,
            selftest: SelfTest::Auto,
            deadline: Duration::from_secs(10),
            startup_timeout: Duration::from_secs(300),
            slots: 1,
            kv: KvBudget::PerSlot,
            int8: Int8Dot::Auto,
            spec: SpeculativeConfig::OFF,
            draft_pack: None,
            draft_artifacts: None,
            qsa: QsaConfig::OFF,
            experts: ExpertOptions::default(),
            checked: false,
            threads: None,
        }
    }
}

/// What opening reports as it goes. Every event is progress, for a start-up watchdog.
pub enum Event<'a> {
    /// A stage of the start begins: `pack` (pack and tokenizer), `device`, `artifacts`,
    /// `self-test`, `upload`, `warm-up`.
    Stage(&'static str),
    /// A device that is present but that strata has no target for, passed over.
    Unsupported(&'a DeviceEntry),
    /// `--backend auto` did not use a GPU backend (`"CUDA"` or `"HIP"`), and why: its
    /// driver library is missing, no supported device is present, or its start failed
    /// (with the driver's message). One per backend passed over, before the fallback.
    Skipped(&'static str, &'a str),
    /// The device chosen.
    Device(&'a DeviceInfo),
    /// A compilation stage (compiling into the cache).
    Compile(Stage),
    /// Artifacts in use.
    Artifacts(&'a Path),
    /// One kernel's self-test result.
    SelfTest(&'a Outcome),
    /// The self-test was skipped: these artifacts passed on this device before.
    SelfTestCached,
    /// Weights uploaded so far and in all.
    Upload(u64, u64),
    /// Where a mixture-of-experts pack's experts went.
    Experts(&'a Placement),
}

/// A model ready to run, with its tokenizer.
pub struct Session {
    /// The model on its backend.
    pub model: Model,
    /// The pack's tokenizer (shared: a server tokenizes on other threads).
    pub tokenizer: Arc<Tokenizer>,
    /// The device.
    pub device: DeviceInfo,
    /// The artifacts in use (none on the CPU).
    pub artifacts: Option<Artifacts>,
    /// Speculative decoding's settings.
    pub spec: SpeculativeConfig,
    /// The draft model, where speculation uses one.
    pub draft: Option<DraftModel>,
}

/// Opens the first backend `choice` allows, on device `device` of it or else its first
/// supported device; present devices without a target are reported and passed over.
pub fn open_backend(
    choice: BackendChoice,
    device: Option<usize>,
    threads: Option<usize>,
    report: &mut dyn FnMut(Event<'_>),
) -> Result<Box<dyn Backend>, RunError> {
    let host = || -> Result<Box<dyn Backend>, RunError> {
        let target = HostTarget::detect().ok_or_else(|| {
            RunError::NoDevice(format!(
                "host backend: this CPU ({}) has none of the host targets' features ({}); use --backend cpu",
                std::env::consts::ARCH,
                strata_compiler::host::known_names().join(", ")
            ))
        })?;
        Ok(Box::new(host::open(target, threads)?))
    };
    let cuda = |report: &mut dyn FnMut(Event<'_>)| -> Result<Box<dyn Backend>, RunError> {
        Ok(Box::new(Cuda::new(pick("CUDA", &cuda::devices()?, device, report)?)?))
    };
    let hip = |report: &mut dyn FnMut(Event<'_>)| -> Result<Box<dyn Backend>, RunError> {
        Ok(Box::new(Hip::new(pick("HIP", &hip::devices()?, device, report)?)?))
    };
    match choice {
        BackendChoice::Cpu => Ok(Box::new(Cpu::new())),
        BackendChoice::Host => host(),
        BackendChoice::Cuda => cuda(report),
        BackendChoice::Hip => hip(report),
        BackendChoice::Auto => {
            // Each GPU backend in turn; the reason one is passed over is reported, so a
            // fallback to the CPU says why.
            if !cuda::driver_present() {
                report(Event::Skipped("CUDA", "driver library libcuda.so.1 not found"));
            } else {
                match cuda(report) {
                    Ok(c) => return Ok(c),
                    Err(e) => report(Event::Skipped("CUDA", &skip_reason("CUDA", &e))),
                }
            }
            match hip(report) {
                Ok(h) => return Ok(h),
                Err(e) => report(Event::Skipped("HIP", &skip_reason("HIP", &e))),
            }
            // The host's kernels where its CPU has a target and clang is here to build
            // them, else the reference.
            if HostTarget::detect().is_some() && Toolchain::discover().is_ok() {
                return host();
            }
            Ok(Box::new(Cpu::new()))
        }
    }
}

/// Why `backend` was passed over, from its refusal: the message without its backend
/// prefix; a failed driver call reads as a failure at init.
fn skip_reason(backend: &str, e: &RunError) -> String {
    match e {
        RunError::NoDevice(m) => {
            let m = m.strip_prefix(backend).and_then(|m| m.strip_prefix(" backend: ")).unwrap_or(m);
            m.split_once(" on this machine").map_or(m, |(head, _)| head).to_string()
        }
        _ => format!("failed at init: {e}"),
    }
}

/// The ordinal to open among `found`: `wanted` if present and supported, else the first
/// supported one. Passed-over unsupported devices are reported.
pub fn pick(
    backend: &str,
    found: &[DeviceEntry],
    wanted: Option<usize>,
    report: &mut dyn FnMut(Event<'_>),
) -> Result<usize, RunError> {
    let describe = |d: &DeviceEntry| format!("device {} ({}, {})", d.ordinal, d.name, d.arch);
    let list = || found.iter().map(describe).collect::<Vec<_>>().join("; ");
    if let Some(n) = wanted {
        let d = found.get(n).ok_or_else(|| {
            RunError::NoDevice(format!(
                "{backend} backend: --device {n} asked for, {} present: {}",
                found.len(),
                list()
            ))
        })?;
        if !d.supported() {
            return Err(RunError::NoDevice(format!(
                "{backend} backend: {} is not supported: strata has no target for {} (strata-compile targets lists them)",
                describe(d),
                d.arch
            )));
        }
        return Ok(n);
    }
    for d in found {
        if d.supported() {
            return Ok(d.ordinal);
        }
        report(Event::Unsupported(d));
    }
    Err(RunError::NoDevice(if found.is_empty() {
        format!("{backend} backend: no device present")
    } else {
        format!("{backend} backend: no supported device: {} (strata-compile targets lists the supported ones)", list())
    }))
}

/// The GEMV windows a batch of decode steps of `slots` sequences asks for: one column a
/// sequence, up to [`MAX_WINDOW`] (wider batches decode in several passes).
fn batch_window(slots: usize) -> u32 {
    u32::try_from(slots).unwrap_or(u32::MAX).min(MAX_WINDOW)
}

/// Loads and self-tests the artifacts for a GPU backend.
pub fn prepare_device(
    pack: &Pack,
    backend: &mut dyn Backend,
    opts: &OpenOptions,
    report: &mut dyn FnMut(Event<'_>),
) -> Result<Artifacts, RunError> {
    let device = backend.info();
    report(Event::Stage("artifacts"));
    let art = match &opts.artifacts {
        Some(dir) => artifacts::open(dir, pack, &device)?,
        None => {
            let spec = opts.spec.window.max(Options::default().verify_window).max(batch_window(opts.slots));
            artifacts::compile_for_device(
                pack,
                &device,
                Options { int8: opts.int8, verify_window: spec, qsa_block: opts.qsa.block, ..Options::default() },
                &mut |s| report(Event::Compile(s)),
            )?
        }
    };
    report(Event::Artifacts(&art.dir));
    let specs: Vec<_> = art.manifest.kernels.iter().map(|k| k.kernel.clone()).collect();
    backend.load(&art.module, &specs)?;
    if specs.iter().any(|k| k.buffers.iter().any(|b| b.name == ERROR_BUFFER)) {
        // Now, not on first use: that may be inside a graph capture, where HIP refuses
        // allocations.
        backend.error_buffer()?;
    }
    let record = selftest::pass_record(&art.manifest, &device);
    if opts.selftest == SelfTest::Auto && record.exists() {
        report(Event::SelfTestCached);
    } else {
        report(Event::Stage("self-test"));
        // On the host, the ops without a generated kernel run the reference itself.
        let tested: Vec<_> = if device.backend == "host" {
            specs.iter().filter(|k| strata_compiler::host::has_kernel(k)).cloned().collect()
        } else {
            specs.clone()
        };
        let outcomes = selftest::run(backend, &tested, opts.deadline, &mut |o| report(Event::SelfTest(o)))?;
        if let Some(bad) = outcomes.iter().find(|o| !o.passed()) {
            return Err(RunError::Other(format!("self-test failed, refusing to serve: {}", bad.failure())));
        }
        if let Some(dir) = record.parent() {
            // A failure to record only costs a repeated self-test next time.
            let _ = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&record, device.name.as_bytes()));
        }
    }
    Ok(art)
}

/// Opens `pack` for running as `opts` say.
pub fn open(pack_path: &Path, opts: &OpenOptions, report: &mut dyn FnMut(Event<'_>)) -> Result<Session, RunError> {
    report(Event::Stage("pack"));
    let pack = Pack::open(pack_path).map_err(|e| RunError::Other(e.to_string()))?;
    let desc = ModelDesc::from_pack(&pack).map_err(|e| RunError::Other(e.to_string()))?;
    let tokenizer =
        Tokenizer::from_pack(&pack).map_err(|e| RunError::Other(format!("{}: {e}", pack_path.display())))?;
    if opts.draft_pack.is_some() && !opts.spec.enabled() {
        return Err(RunError::Other("a draft pack drafts for speculative decoding: add --spec T (2 to 16)".into()));
    }
    report(Event::Stage("device"));
    let mut backend = open_backend(opts.backend, opts.device, opts.threads, report)?;
    let device = backend.info();
    report(Event::Device(&device));
    let n_ctx = opts.ctx.unwrap_or(desc.context);
    // GEMV windows up to the verify window (compiled, on a GPU); prompt chunks of
    // --prefill tokens beside them. A mixture of experts reads its prompt in windows.
    let (kernels, window, art) = if device.backend == "cpu" {
        let target = Target::load("sm_90").map_err(|e| RunError::Other(e.to_string()))?;
        let window = match desc.experts {
            Some(_) => opts.prefill.max(opts.spec.window).min(MAX_WINDOW),
            None => opts.spec.window,
        };
        let window = window.max(batch_window(opts.slots));
        // The reference keeps small matrices' products float by default (NVIDIA's int8
        // everywhere is a speed choice the oracle need not make).
        let int8 = if opts.int8 == Int8Dot::Auto { Int8Dot::Large } else { opts.int8 };
        (Kernels::planned(target, int8).with_qsa_block(opts.qsa.block), window.max(1), None)
    } else {
        let art = prepare_device(&pack, backend.as_mut(), opts, report)?;
        let compiled = art.manifest.options.verify_window.clamp(1, MAX_WINDOW);
        if opts.spec.window > compiled {
            return Err(RunError::Other(format!(
                "--spec {} needs verify windows of {} tokens; {} has them up to {compiled}: compile with strata-compile --spec {}",
                opts.spec.window,
                opts.spec.window,
                art.dir.display(),
                opts.spec.window
            )));
        }
        let kernels = Kernels::compiled(art.manifest.kernels.iter().map(|k| k.kernel.clone()));
        (kernels, compiled, Some(art))
    };
    report(Event::Stage("upload"));
    let mut model = Model::load(
        &pack,
        backend,
        kernels,
        n_ctx,
        window,
        opts.prefill,
        opts.slots,
        opts.kv,
        &opts.experts,
        &mut |d, t| report(Event::Upload(d, t)),
    )?;
    if let Some(p) = model.expert_placement() {
        report(Event::Experts(p));
        if opts.spec.enabled() && model.window() < opts.spec.window {
            return Err(RunError::Other(format!(
                "--spec {} verifies {} tokens in one pass, but the expert cache holds one layer's experts for passes of {} at most: raise --expert-cache or lower --spec",
                opts.spec.window,
                opts.spec.window,
                model.window()
            )));
        }
    }
    model.set_qsa(opts.qsa)?;
    model.set_checked(opts.checked || art.as_ref().is_some_and(|a| a.manifest.options.checked));
    report(Event::Stage("warm-up"));
    warm_up(&mut model, tokenizer.bos().unwrap_or(0), opts.spec.window)
        .map_err(|e| RunError::Other(format!("warm-up token failed, refusing to serve: {e}")))?;
    let draft = match &opts.draft_pack {
        Some(path) => {
            let draft_opts = OpenOptions {
                artifacts: opts.draft_artifacts.clone(),
                ctx: Some(n_ctx),
                spec: SpeculativeConfig::OFF,
                draft_pack: None,
                draft_artifacts: None,
                qsa: QsaConfig::OFF,
                // The draft's own caches: a whole context a slot (it is small).
                kv: KvBudget::PerSlot,
                ..opts.clone()
            };
            let drafter = open(path, &draft_opts, report).map_err(|e| RunError::Other(format!("draft pack: {e}")))?;
            Some(DraftModel::new(drafter, &tokenizer, opts.slots)?)
        }
        None => None,
    };
    Ok(Session { model, tokenizer: Arc::new(tokenizer), device, artifacts: art, spec: opts.spec, draft })
}

/// One token through every path a request takes first, so that a start ends ready or
/// with the failure: the decode step (captured as a graph on a GPU) and, with
/// speculation, the verify window; then the sequence is emptied again.
fn warm_up(model: &mut Model, token: u32, spec_window: u32) -> Result<(), RunError> {
    let next = model.decode_greedy(token)?;
    if spec_window > 1 {
        model.verify_greedy(&vec![next; spec_window as usize])?;
    }
    model.reset();
    model.take_expert_stats();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found() -> Vec<DeviceEntry> {
        let entry = |ordinal, name: &str, arch: &str| DeviceEntry { ordinal, name: name.into(), arch: arch.into() };
        vec![entry(0, "AMD Radeon Graphics", "gfx1036"), entry(1, "Radeon RX 7900 XTX", "gfx1100")]
    }

    #[test]
    fn an_unsupported_device_is_named_and_passed_over() {
        let mut skipped = Vec::new();
        let mut report = |e: Event<'_>| {
            if let Event::Unsupported(d) = e {
                skipped.push(d.arch.clone());
            }
        };
        assert_eq!(pick("HIP", &found(), None, &mut report).expect("one is supported"), 1);
        assert_eq!(skipped, ["gfx1036"]);
        assert_eq!(pick("HIP", &found(), Some(1), &mut |_| {}).expect("supported"), 1);
    }

    #[test]
    fn asking_for_an_unsupported_or_absent_device_is_refused_with_the_list() {
        let e = pick("HIP", &found(), Some(0), &mut |_| {}).unwrap_err().to_string();
        assert_eq!(
            e,
            "HIP backend: device 0 (AMD Radeon Graphics, gfx1036) is not supported: strata has no target for gfx1036 (strata-compile targets lists them)"
        );
        let e = pick("HIP", &found(), Some(2), &mut |_| {}).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "HIP backend: --device 2 asked for, 2 present: device 0 (AMD Radeon Graphics, gfx1036); device 1"
            ),
            "{e}"
        );
        let e = pick("HIP", &found()[..1], None, &mut |_| {}).unwrap_err().to_string();
        assert!(e.starts_with("HIP backend: no supported device: device 0 (AMD Radeon Graphics, gfx1036)"), "{e}");
        assert_eq!(pick("CUDA", &[], None, &mut |_| {}).unwrap_err().to_string(), "CUDA backend: no device present");
    }
}
