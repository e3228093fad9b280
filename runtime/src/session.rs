//! Opening a pack for running: choose the backend, find or compile the artifacts,
//! self-test them on the device, upload the weights and read the tokenizer. The command
//! line and the server both start here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use strata_compiler::artifacts::Stage;
use strata_compiler::model::ModelDesc;
use strata_compiler::pack::Pack;
use strata_compiler::plan::{Int8Dot, MAX_WINDOW, Options};
use strata_compiler::target::Target;

use crate::artifacts::{self, Artifacts};
use crate::backend::cpu::Cpu;
use crate::backend::cuda::{self, Cuda};
use crate::backend::hip::Hip;
use crate::backend::{Backend, DeviceInfo, RunError};
use crate::kernels::Kernels;
use crate::model::{ExpertOptions, Model, Placement, QsaConfig};
use crate::selftest::{self, Outcome};
use crate::spec::SpecConfig;
use crate::spec::draft::DraftModel;
use crate::tokenizer::Tokenizer;

/// Which backend to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// CUDA if a device is present, else HIP, else the CPU.
    Auto,
    /// The CPU reference.
    Cpu,
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
    /// Compiled artifacts; compiled for the device into the cache when absent.
    pub artifacts: Option<PathBuf>,
    /// Context length; the pack's training context when absent.
    pub ctx: Option<u32>,
    /// Prefill chunk: tokens per forward pass while reading a prompt (capped by the
    /// largest compiled window on a GPU).
    pub prefill: u32,
    /// Self-test policy.
    pub selftest: SelfTest,
    /// How long one kernel may run before it counts as a hang.
    pub deadline: Duration,
    /// Sequences held at once (KV caches), for serving several clients.
    pub slots: usize,
    /// Int8-dot GEMVs, for kernels planned here: on the CPU, and when compiling into the
    /// cache (compiled artifacts carry their own choice).
    pub int8: Int8Dot,
    /// Speculative decoding; its window must be compiled (`strata-compile --spec`).
    pub spec: SpecConfig,
    /// A draft model's pack for speculative decoding (else the n-gram drafter).
    pub draft_pack: Option<PathBuf>,
    /// The draft pack's compiled artifacts (compiled into the cache when absent).
    pub draft_artifacts: Option<PathBuf>,
    /// Query-aware sparse attention for decode passes past the budget.
    pub qsa: QsaConfig,
    /// Where a mixture-of-experts pack's experts go.
    pub experts: ExpertOptions,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            backend: BackendChoice::Auto,
            artifacts: None,
            ctx: None,
            prefill: 64,
            selftest: SelfTest::Auto,
            deadline: Duration::from_secs(10),
            slots: 1,
            int8: Int8Dot::Auto,
            spec: SpecConfig::OFF,
            draft_pack: None,
            draft_artifacts: None,
            qsa: QsaConfig::OFF,
            experts: ExpertOptions::default(),
        }
    }
}

/// What opening reports as it goes.
pub enum Event<'a> {
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
    pub spec: SpecConfig,
    /// The draft model, where speculation uses one.
    pub draft: Option<DraftModel>,
}

/// Opens the first backend `choice` allows.
pub fn open_backend(choice: BackendChoice) -> Result<Box<dyn Backend>, RunError> {
    match choice {
        BackendChoice::Cpu => Ok(Box::new(Cpu::new())),
        BackendChoice::Cuda => Ok(Box::new(Cuda::new(0)?)),
        BackendChoice::Hip => Ok(Box::new(Hip::new(0)?)),
        BackendChoice::Auto => {
            if cuda::driver_present()
                && let Ok(c) = Cuda::new(0)
            {
                return Ok(Box::new(c));
            }
            if let Ok(h) = Hip::new(0) {
                return Ok(Box::new(h));
            }
            Ok(Box::new(Cpu::new()))
        }
    }
}

/// Loads and self-tests the artifacts for a GPU backend.
pub fn prepare_device(
    pack: &Pack,
    backend: &mut dyn Backend,
    opts: &OpenOptions,
    report: &mut dyn FnMut(Event<'_>),
) -> Result<Artifacts, RunError> {
    let device = backend.info();
    let art = match &opts.artifacts {
        Some(dir) => artifacts::open(dir, pack, &device)?,
        None => {
            let spec = opts.spec.window.max(Options::default().spec);
            artifacts::compile_for_device(
                pack,
                &device,
                Options { int8: opts.int8, spec, qsa_block: opts.qsa.block, ..Options::default() },
                &mut |s| report(Event::Compile(s)),
            )?
        }
    };
    report(Event::Artifacts(&art.dir));
    let specs: Vec<_> = art.manifest.kernels.iter().map(|k| k.spec.clone()).collect();
    backend.load(&art.module, &specs)?;
    let record = selftest::pass_record(&art.manifest, &device);
    if opts.selftest == SelfTest::Auto && record.exists() {
        report(Event::SelfTestCached);
    } else {
        let outcomes = selftest::run(backend, &specs, opts.deadline, &mut |o| report(Event::SelfTest(o)))?;
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
    let pack = Pack::open(pack_path).map_err(|e| RunError::Other(e.to_string()))?;
    let desc = ModelDesc::from_pack(&pack).map_err(|e| RunError::Other(e.to_string()))?;
    let tokenizer =
        Tokenizer::from_pack(&pack).map_err(|e| RunError::Other(format!("{}: {e}", pack_path.display())))?;
    if opts.draft_pack.is_some() && !opts.spec.enabled() {
        return Err(RunError::Other("a draft pack drafts for speculative decoding: add --spec T (2 to 16)".into()));
    }
    let mut backend = open_backend(opts.backend)?;
    let device = backend.info();
    report(Event::Device(&device));
    let n_ctx = opts.ctx.unwrap_or(desc.context).max(1);
    // One pass takes a prefill chunk or a verify window, whichever is wider.
    let wanted = opts.prefill.max(opts.spec.window).max(1);
    let (kernels, window, art) = if device.backend == "cpu" {
        let target = Target::load("sm_90").map_err(|e| RunError::Other(e.to_string()))?;
        (Kernels::planned(target, opts.int8).with_qsa_block(opts.qsa.block), wanted, None)
    } else {
        let art = prepare_device(&pack, backend.as_mut(), opts, report)?;
        let compiled = art.manifest.options.spec.clamp(1, MAX_WINDOW);
        if opts.spec.window > compiled {
            return Err(RunError::Other(format!(
                "--spec {} needs verify windows of {} tokens; {} has them up to {compiled}: compile with strata-compile --spec {}",
                opts.spec.window,
                opts.spec.window,
                art.dir.display(),
                opts.spec.window
            )));
        }
        let kernels = Kernels::compiled(art.manifest.kernels.iter().map(|k| k.spec.clone()));
        (kernels, wanted.min(compiled), Some(art))
    };
    let mut model = Model::load(&pack, backend, kernels, n_ctx, window, opts.slots, &opts.experts, &mut |d, t| {
        report(Event::Upload(d, t))
    })?;
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
    let draft = match &opts.draft_pack {
        Some(path) => {
            let draft_opts = OpenOptions {
                artifacts: opts.draft_artifacts.clone(),
                ctx: Some(n_ctx),
                spec: SpecConfig::OFF,
                draft_pack: None,
                draft_artifacts: None,
                qsa: QsaConfig::OFF,
                ..opts.clone()
            };
            let drafter = open(path, &draft_opts, report).map_err(|e| RunError::Other(format!("draft pack: {e}")))?;
            Some(DraftModel::new(drafter, &tokenizer, opts.slots)?)
        }
        None => None,
    };
    Ok(Session { model, tokenizer: Arc::new(tokenizer), device, artifacts: art, spec: opts.spec, draft })
}
