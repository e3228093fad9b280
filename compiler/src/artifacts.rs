//! Artifacts: runs plan → emit → check → build for one pack and target and writes the
//! result with its manifest.
//!
//! Layout of an artifact directory:
//! - `manifest.toml`: pack fingerprint, target, toolchain, options, and per kernel its
//!   op, parameters, launch rule, arguments, resources and source hash;
//! - `module.cu` / `module.hip`: the translation unit that was compiled;
//! - `module.ptx` / `module.hsaco`: the compiled module;
//! - `src/<kernel>.cu|hip`: each kernel's own generated text, which compiler errors and
//!   `--checked` reports point into.
//!
//! Building is skipped when the directory already holds a build of the same module
//! source with the same toolchain (a content hash).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::build::{self, BuildError, Resources, Toolchain};
use crate::check::{self, CheckError};
use crate::digest::{hex, sha256_hex};
use crate::emit::{self, Dialect, EmitError, Module};
use crate::model::ModelDesc;
use crate::ops::Op;
use crate::pack::{Pack, PackError};
use crate::plan::{self, KernelRecord, Options, Plan, PlanError};
use crate::target::Target;

/// Manifest format version; bumped when the layout changes incompatibly, or the kernels'
/// interface with the runtime does (2: paged KV caches, read through a page table).
pub const FORMAT: u32 = 2;
/// The manifest's file name.
pub const MANIFEST: &str = "manifest.toml";

/// What was compiled, from what, for what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format version.
    pub format: u32,
    /// `strata-compile VERSION`.
    pub compiler: String,
    /// The pack the kernels were planned for.
    pub pack: PackRecord,
    /// The target and how its module was built.
    pub target: TargetRecord,
    /// Options of the compilation.
    pub options: Options,
    /// The compiled module.
    pub module: ModuleRecord,
    /// Every kernel, sorted by name.
    pub kernels: Vec<BuiltKernel>,
}

/// Identifies the pack.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackRecord {
    /// First file's name (informational).
    pub file: String,
    /// Total bytes of the pack's files.
    pub bytes: u64,
    /// [`Pack::fingerprint`].
    pub fingerprint: String,
}

/// The target the kernels were planned for, and the build.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetRecord {
    /// Target name (whose limits and tuning the kernels follow).
    pub name: String,
    /// Wave size the kernels were written for.
    pub wave_size: u32,
    /// Source dialect of the module.
    pub dialect: Dialect,
    /// Architecture the module was compiled for (differs from the target's for
    /// cross-vendor builds and for NVIDIA targets newer than clang).
    pub built_for: String,
}

impl TargetRecord {
    /// `CUDA` or `HIP`.
    pub fn dialect_name(&self) -> &'static str {
        match self.dialect {
            Dialect::Cuda => "CUDA",
            Dialect::Hip => "HIP",
            Dialect::Host => "host C++",
        }
    }
}

/// The compiled module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleRecord {
    /// Source file name.
    pub source: String,
    /// Binary file name.
    pub binary: String,
    /// SHA-256 of the binary.
    pub binary_sha256: String,
    /// Content hash of everything that decides the binary (source, toolchain, flags).
    pub build_key: String,
    /// The toolchain that built it.
    pub toolchain: String,
    /// The compiler command.
    pub command: Vec<String>,
}

/// One kernel of the module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuiltKernel {
    /// The planned kernel: op, parameters, launch rule, arguments.
    #[serde(flatten)]
    pub kernel: KernelRecord,
    /// Its own source file.
    pub source: String,
    /// SHA-256 of its source text.
    pub source_sha256: String,
    /// Resources read back from the compiled module.
    pub resources: Resources,
}

/// A compilation request.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    /// The pack.
    pub pack: &'a Pack,
    /// The target whose limits and tuning the kernels follow.
    pub target: &'a Target,
    /// Plan options.
    pub options: Options,
    /// Accept spills and scratch in GEMV kernels.
    pub allow_spills: bool,
    /// Cross-vendor execution: render in CUDA and build for this NVIDIA target instead
    /// of the target's own vendor (wave32 targets only).
    pub run_on: Option<&'a Target>,
    /// Output directory.
    pub out: &'a Path,
}

/// Progress of a compilation, for the command line to show.
#[derive(Clone, Debug, PartialEq)]
pub enum Stage {
    /// Planning kernels.
    Plan,
    /// Rendering `n` kernels.
    Emit(usize),
    /// Checking `n` kernels against the target.
    Check(usize),
    /// Compiling `n` kernels with the named tool.
    Build(usize, String),
    /// The directory already holds this build.
    UpToDate,
    /// Writing artifacts.
    Write,
}

/// Why a compilation failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The pack is not a runnable model.
    #[error(transparent)]
    Pack(#[from] PackError),
    /// The pack cannot be planned.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Kernels break the target's limits.
    #[error("{} kernel(s) do not fit {target}:\n{}", errors.len(), errors.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Check {
        /// The target.
        target: String,
        /// Every violation.
        errors: Vec<CheckError>,
    },
    /// A template failed to render.
    #[error(transparent)]
    Emit(#[from] EmitError),
    /// Compilation failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Cross-vendor execution asked for something that cannot run.
    #[error("{0}")]
    Cross(String),
    /// Reading or writing artifacts failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> CompileError + '_ {
    move |e| CompileError::Io { path: path.to_path_buf(), message: e.to_string() }
}

/// A plan rendered and checked for its target: everything before the build.
#[derive(Debug)]
pub struct Rendered<'a> {
    /// The kernels.
    pub plan: Plan,
    /// Their source, in `dialect`.
    pub module: Module,
    /// The language the module is written in.
    pub dialect: Dialect,
    /// The device the module is built for: the target, or the NVIDIA target it runs on.
    pub device: &'a Target,
}

/// Plans, renders and checks the kernels of one pack for one target: what is written
/// without a toolchain (`strata-compile --emit-only`), and the first stages of [`compile`].
pub fn render<'a>(req: &Request<'a>, progress: &mut dyn FnMut(Stage)) -> Result<Rendered<'a>, CompileError> {
    progress(Stage::Plan);
    let model = ModelDesc::from_pack(req.pack)?;
    let plan = plan::plan(&model, req.pack, req.target, &req.options)?;

    let (dialect, device) = match req.run_on {
        None => (Dialect::native(req.target), req.target),
        Some(nvidia) => {
            if !req.target.runs_on_cuda() || nvidia.vendor != crate::target::Vendor::Nvidia {
                return Err(CompileError::Cross(format!(
                    "{}'s kernels (wave {}) cannot run on {}: cross-vendor execution needs a wave32 target and an NVIDIA device",
                    req.target.name, req.target.device.wave_size, nvidia.name
                )));
            }
            (Dialect::Cuda, nvidia)
        }
    };

    progress(Stage::Emit(plan.kernels.len()));
    let module = emit::emit(&plan, req.target, dialect)?;

    progress(Stage::Check(plan.kernels.len()));
    let errors = check::check(&plan, req.target);
    if !errors.is_empty() {
        return Err(CompileError::Check { target: req.target.name.clone(), errors });
    }
    Ok(Rendered { plan, module, dialect, device })
}

/// Writes what [`render`] made, for reading without a build: the module source and
/// the plan's kernel records (`plan.toml`).
pub fn write_rendered(rendered: &Rendered<'_>, out: &Path) -> Result<(), CompileError> {
    std::fs::create_dir_all(out).map_err(io_error(out))?;
    let source = out.join(format!("module.{}", rendered.dialect.extension()));
    std::fs::write(&source, &rendered.module.source).map_err(io_error(&source))?;
    let records = out.join("plan.toml");
    let text = toml::to_string(&rendered.plan)
        .map_err(|e| CompileError::Io { path: records.clone(), message: e.to_string() })?;
    std::fs::write(&records, text).map_err(io_error(&records))
}

/// Plans, renders, checks, builds and writes the artifacts of one pack for one target.
pub fn compile(
    req: &Request<'_>,
    tools: &Toolchain,
    progress: &mut dyn FnMut(Stage),
) -> Result<Manifest, CompileError> {
    let Rendered { plan, module, dialect, device } = render(req, progress)?;
    let out = req.out;
    std::fs::create_dir_all(out.join("src")).map_err(io_error(out))?;
    let arch = build::build_arch(device, tools);
    let build_key = {
        let mut h = Sha256::new();
        for part in [module.source.as_str(), &tools.identity(), &arch, &format!("{:?}", device.build.ptx_isa)] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        hex(&h.finalize())
    };
    let (binary_name, binary_sha256, resources, command) = match previous_build(out, &build_key) {
        Some(previous) => {
            progress(Stage::UpToDate);
            let resources = previous.kernels.into_iter().map(|k| (k.kernel.name, k.resources)).collect();
            (previous.module.binary, previous.module.binary_sha256, resources, previous.module.command)
        }
        None => {
            progress(Stage::Build(plan.kernels.len(), tools.clang_version.clone()));
            let built = build::build(&module, device, tools, out)?;
            let disagree = launch_disagreements(&plan.kernels, req.target.device.wave_size, &built.geometry);
            if !disagree.is_empty() {
                return Err(CompileError::Check { target: device.name.clone(), errors: disagree });
            }
            (built.file_name, sha256_hex(&built.binary), built.resources, built.command)
        }
    };

    // What the compiler actually allocated must fit too (it may pad shared arrays).
    let over: Vec<CheckError> = plan
        .kernels
        .iter()
        .filter_map(|k| match resources.get(&k.name) {
            // Static allocations only: a dynamic array is sized at launch, by the record.
            Some(Resources::CodeObject { lds_bytes, .. } | Resources::Ptxas { shared_bytes: lds_bytes, .. })
                if *lds_bytes + if k.launch.dynamic_shared { k.launch.shared_bytes } else { 0 }
                    > device.device.shared_limit(k.launch.dynamic_shared) =>
            {
                let limit = device.device.shared_limit(k.launch.dynamic_shared);
                Some(CheckError {
                    kernel: k.name.clone(),
                    what: "shared memory allocated by the compiler".into(),
                    value: format!("{lds_bytes} bytes"),
                    limit: format!("{} allows {limit} bytes per block", device.name),
                })
            }
            _ => None,
        })
        .collect();
    if !over.is_empty() {
        return Err(CompileError::Check { target: device.name.clone(), errors: over });
    }
    if !req.allow_spills {
        for k in plan
            .kernels
            .iter()
            .filter(|k| matches!(k.op, Op::Gemv(_) | Op::BatchGemv(_) | Op::ExpertGemv(_) | Op::Gemm(_)))
        {
            if let Some(spilled) = resources.get(&k.name).and_then(Resources::spills).filter(|s| *s > 0) {
                return Err(BuildError::Spills {
                    kernel: k.name.clone(),
                    what: format!("{spilled} bytes of spills, scratch or stack"),
                }
                .into());
            }
        }
    }

    progress(Stage::Write);
    let ext = dialect.extension();
    let mut kernels = Vec::with_capacity(plan.kernels.len());
    for (spec, src) in plan.kernels.into_iter().zip(&module.kernels) {
        let source = format!("src/{}.{ext}", spec.name);
        let path = out.join(&source);
        std::fs::write(&path, &src.text).map_err(io_error(&path))?;
        let resources = resources.get(&spec.name).cloned().unwrap_or(Resources::CheckedAtLoad);
        kernels.push(BuiltKernel { kernel: spec, source, source_sha256: src.hash.clone(), resources });
    }
    let source_path = out.join(format!("module.{ext}"));
    std::fs::write(&source_path, &module.source).map_err(io_error(&source_path))?;
    let manifest = Manifest {
        format: FORMAT,
        compiler: format!("strata-compile {}", env!("CARGO_PKG_VERSION")),
        pack: PackRecord {
            file: req.pack.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            bytes: req.pack.file_bytes(),
            fingerprint: req.pack.fingerprint(),
        },
        target: TargetRecord {
            name: req.target.name.clone(),
            wave_size: req.target.device.wave_size,
            dialect,
            built_for: arch,
        },
        options: req.options.clone(),
        module: ModuleRecord {
            source: format!("module.{ext}"),
            binary: binary_name,
            binary_sha256,
            build_key,
            toolchain: tools.identity(),
            command,
        },
        kernels,
    };
    let text = toml::to_string(&manifest)
        .map_err(|e| CompileError::Io { path: out.join(MANIFEST), message: e.to_string() })?;
    std::fs::write(out.join(MANIFEST), text).map_err(io_error(&out.join(MANIFEST)))?;
    Ok(manifest)
}

/// Kernels whose compiled code assumes another wave size or block size than the launch
/// record the host launches them by (both come from one `KernelRecord`; this proves the
/// compiler kept them). `wave_size` is the plan's: the target's, also when its kernels
/// run on another device.
pub fn launch_disagreements(
    kernels: &[KernelRecord],
    wave_size: u32,
    geometry: &BTreeMap<String, build::Geometry>,
) -> Vec<CheckError> {
    kernels
        .iter()
        .filter_map(|k| {
            let built = geometry.get(&k.name).copied().unwrap_or(build::Geometry { wave_size: 0, max_threads: 0 });
            let wanted = build::Geometry { wave_size, max_threads: k.launch.threads };
            (built != wanted).then(|| CheckError {
                kernel: k.name.clone(),
                what: "compiled launch geometry (wave size, threads per block)".into(),
                value: format!("{}, {}", built.wave_size, built.max_threads),
                limit: format!("the launch record says {wave_size}, {}", k.launch.threads),
            })
        })
        .collect()
}

/// Reads `dir/manifest.toml`.
pub fn read_manifest(dir: &Path) -> Result<Manifest, CompileError> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(io_error(&path))?;
    toml::from_str(&text).map_err(|e| CompileError::Io { path, message: e.to_string() })
}

/// The previous manifest in `dir`, if it records a build with this key whose binary is
/// still there, unchanged.
fn previous_build(dir: &Path, build_key: &str) -> Option<Manifest> {
    let m = read_manifest(dir).ok()?;
    let binary = std::fs::read(dir.join(&m.module.binary)).ok()?;
    (m.format == FORMAT && m.module.build_key == build_key && sha256_hex(&binary) == m.module.binary_sha256)
        .then_some(m)
}
