//! The host as a target: kernels for the CPU generated per pack from
//! `templates/host/ops/`, sharing the GPU's block decoders through the host prelude, built
//! by clang into a shared library and recorded in a manifest like a GPU module.
//!
//! The forward pass is planned by the GPU planner for its reference profile
//! ([`PLANNER`]), as the CPU reference has always been run: a host kernel reads its
//! record's op, buffers and scalars, never its launch geometry. The host backend runs a
//! kernel's [`Schedule`] on its workers; ops without a host template run the reference.

mod emit;
mod target;

use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

pub use self::emit::{HOST_OPS, emit, has_kernel};
pub use self::target::{HostTarget, HostTargetError, cpu_has, known_names};
use crate::artifacts::{
    BuiltKernel, CompileError, FORMAT, MANIFEST, Manifest, ModuleRecord, PackRecord, Stage, TargetRecord,
};
use crate::build::{BuildError, Resources, Toolchain};
use crate::digest::{hex, sha256_hex};
use crate::emit::Dialect;
use crate::model::ModelDesc;
use crate::ops::Op;
use crate::pack::Pack;
use crate::plan::{self, Int8Dot, Options};
use crate::quant::GgmlType;
use crate::target::Target;

/// The GPU target whose planner lays out the host's forward pass (its records' launch
/// geometry is not used on the host).
pub const PLANNER: &str = "sm_90";
/// How a host GEMM tiles its work, derived from the target's facts: a block of
/// [`panel_rows`] weight rows (one vector register of 32-bit lanes, a lane per row) is decoded a panel
/// of `chunks` chunks of 32 at a time into a buffer of half the L1 data cache, and the
/// columns are multiplied by it `tokens` at a time, their sums in registers beside the
/// panel's eight weight vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmPanel {
    /// Chunks of 32 features a panel holds (at most the matrix's).
    pub chunks: u32,
    /// Columns multiplied together.
    pub tokens: u32,
}

/// Weight rows of a GEMM panel's block on `target`: a vector register's 32-bit lanes (the
/// host prelude's `STRATA_PANEL_ROWS`).
pub fn panel_rows(target: &HostTarget) -> u32 {
    target.isa.vector_bytes / 4
}

/// The GEMM panel of `target` for a matrix of `cols` features.
pub fn gemm_panel(target: &HostTarget, cols: u32) -> GemmPanel {
    let fit = (target.cache.l1d_bytes / 2 / (panel_rows(target) * 32)).max(1);
    let tokens = if target.isa.vector_registers >= 32 { 8 } else { 4 };
    GemmPanel { chunks: fit.min((cols / 32).max(1)), tokens }
}

/// Key positions a prompt's attention scores at once (one softmax rescale per block).
pub const ATTENTION_BLOCK: u32 = 32;
/// The shared library's file name in an artifact directory.
pub const LIBRARY: &str = "module.so";

/// The types whose decoded int8 weights lie in 0..127 (nibbles as stored, the offset
/// applied through the quant sum), so their dot needs no sign moved.
pub fn unsigned_weights(quant: GgmlType) -> bool {
    matches!(quant, GgmlType::Q4_0 | GgmlType::Q4_1)
}

/// Whether the host GEMV of `quant` on `target` dots 256 weights at a time
/// (`templates/host/<arch>/<type>.cuh`) instead of decoding chunk by chunk, on 512-bit
/// VNNI: IQ2_XS, whose chunk decoder assembles its grid entries and signs a lane at a
/// time (2.2x the chunk decoder's speed on Zen 4, single thread), and Q4_0, two blocks to
/// a vector with their scales applied together. Q4_0 needs `cols` a multiple of 256.
pub fn superblock_dot(target: &HostTarget, quant: GgmlType, cols: u32) -> bool {
    let vnni512 = target.isa.vector_bytes == 64 && target.isa.features.iter().any(|f| f == "avx512vnni");
    vnni512 && matches!(quant, GgmlType::IQ2_XS | GgmlType::Q4_0) && cols.is_multiple_of(256)
}

/// How the host backend runs one launch of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Phases, a barrier between each (every part of one before any of the next).
    pub phases: u32,
    /// Whether parts go to every worker (else one part on the calling thread).
    pub parallel: bool,
    /// Scratch bytes the call needs.
    pub scratch: usize,
}

/// The schedule of `op` at a launch whose scalar `name` has value `scalar(name)`.
pub fn schedule(op: &Op, scalar: impl Fn(&str) -> u32) -> Schedule {
    match op {
        Op::Gemm(g) if crate::plan::rules::INT8_DOT.contains(&g.quant) => {
            let (tokens, cols) = (scalar("tokens") as usize, g.cols as usize);
            Schedule { phases: 2, parallel: true, scratch: tokens * cols + tokens * cols / 32 * 16 }
        }
        Op::Gemv(_) | Op::AttentionPrefill(_) | Op::Attention(_) => Schedule { phases: 1, parallel: true, scratch: 0 },
        _ => Schedule { phases: 1, parallel: false, scratch: 0 },
    }
}

/// How far a host kernel's outputs may be from the reference's, relative to the largest
/// reference magnitude: a GEMM quantizes its input columns to int8 per 32 (as llama.cpp's
/// CPU products do, and as the GPU's GEMV quantizes its input), which the float
/// reference does not; every other kernel is held to its op's tolerance.
pub fn tolerance(op: &Op) -> f64 {
    match op {
        Op::Gemm(g) if crate::plan::rules::INT8_DOT.contains(&g.quant) => 1e-2,
        _ => op.def().tolerance(),
    }
}

/// The plan options a host compilation uses: int8 dots wherever a type has them (the
/// host's int8 path beats its float path for every size), unless the caller said never;
/// GEMM records with float input (the host GEMM quantizes its columns itself) and one
/// launch a tile, without stream-K's workspace (the host splits its own work); the int8
/// GEMV for every window (the host has no matrix-unit GEMV).
pub fn options(mut options: Options) -> Options {
    if options.int8 == Int8Dot::Auto {
        options.int8 = Int8Dot::Always;
    }
    options.int8_gemm = false;
    options.stream_k = false;
    options.gemv_mma_from = None;
    options
}

/// Plans `pack` for the host and renders its kernels (no toolchain needed).
pub fn render(
    pack: &Pack,
    target: &HostTarget,
    options: &Options,
) -> Result<(plan::Plan, crate::emit::Module), CompileError> {
    let model = ModelDesc::from_pack(pack)?;
    let planner = Target::load(PLANNER).map_err(|e| CompileError::Cross(e.to_string()))?;
    let plan = plan::plan(&model, pack, &planner, &self::options(options.clone()))?;
    let module = emit(&plan, target)?;
    Ok((plan, module))
}

/// The clang command that builds `source` into the shared library `out` for `target`:
/// freestanding C++ (no C or C++ library: the kernels call nothing), position
/// independent, linked by lld, so any architecture builds on any machine.
pub fn build_command(tools: &Toolchain, target: &HostTarget, source: &Path, out: &Path) -> Command {
    let mut c = Command::new(&tools.clang);
    c.args(["-x", "c++", "-std=c++17", "-O3", "-ffreestanding", "-fno-exceptions", "-fno-rtti"])
        .arg(format!("--target={}", target.build.triple))
        .args(&target.build.flags)
        .args(["-fPIC", "-shared", "-nostdlib", "-fuse-ld=lld", "-Wno-unused-function", "-o"])
        .arg(out)
        .arg(source);
    c
}

/// Plans, renders, builds and writes the host artifacts of `pack` for `target` into `out`
/// (skipping the build when `out` holds one of the same source and toolchain).
pub fn compile(
    pack: &Pack,
    target: &HostTarget,
    options: &Options,
    tools: &Toolchain,
    out: &Path,
    progress: &mut dyn FnMut(Stage),
) -> Result<Manifest, CompileError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| CompileError::Io { path: path.clone(), message: e.to_string() }
    };
    progress(Stage::Plan);
    let (plan, module) = render(pack, target, options)?;
    progress(Stage::Emit(module.kernels.len()));
    std::fs::create_dir_all(out.join("src")).map_err(io(out))?;
    let source = out.join("module.cc");
    std::fs::write(&source, &module.source).map_err(io(&source))?;
    let library = out.join(LIBRARY);
    let mut command = build_command(tools, target, &source, &library);
    let build_key = {
        let mut h = Sha256::new();
        for part in [module.source.as_str(), &tools.identity(), &format!("{command:?}")] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        hex(&h.finalize())
    };
    let previous = crate::artifacts::read_manifest(out).ok().filter(|m| {
        m.format == FORMAT
            && m.module.build_key == build_key
            && std::fs::read(out.join(&m.module.binary)).is_ok_and(|b| sha256_hex(&b) == m.module.binary_sha256)
    });
    if previous.is_some() {
        progress(Stage::UpToDate);
    } else {
        progress(Stage::Build(module.kernels.len(), tools.clang_version.clone()));
        let result = command.output().map_err(|e| BuildError::Tool { tool: "clang".into(), message: e.to_string() })?;
        if !result.status.success() {
            return Err(BuildError::Tool {
                tool: "clang".into(),
                message: String::from_utf8_lossy(&result.stderr).chars().take(4000).collect(),
            }
            .into());
        }
    }
    progress(Stage::Write);
    let binary = std::fs::read(&library).map_err(io(&library))?;
    let sources: std::collections::HashMap<&str, &crate::emit::KernelSource> =
        module.kernels.iter().map(|k| (k.name.as_str(), k)).collect();
    let mut kernels = Vec::with_capacity(plan.kernels.len());
    for spec in plan.kernels {
        // Ops without a host kernel keep their record: the backend runs their reference.
        let (source, source_sha256) = match sources.get(spec.name.as_str()) {
            Some(src) => {
                let file = format!("src/{}.cc", spec.name);
                std::fs::write(out.join(&file), &src.text).map_err(io(&out.join(&file)))?;
                (file, src.hash.clone())
            }
            None => (String::new(), String::new()),
        };
        kernels.push(BuiltKernel { kernel: spec, source, source_sha256, resources: Resources::CheckedAtLoad });
    }
    let manifest = Manifest {
        format: FORMAT,
        compiler: format!("strata-compile {}", env!("CARGO_PKG_VERSION")),
        pack: PackRecord {
            file: pack.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            bytes: pack.file_bytes(),
            fingerprint: pack.fingerprint(),
        },
        target: TargetRecord {
            name: target.name.clone(),
            wave_size: target.lanes(),
            dialect: Dialect::Host,
            built_for: target.build.triple.clone(),
        },
        options: self::options(options.clone()),
        module: ModuleRecord {
            source: "module.cc".into(),
            binary: LIBRARY.into(),
            binary_sha256: sha256_hex(&binary),
            build_key,
            toolchain: tools.identity(),
            command: {
                let mut v = vec![command.get_program().to_string_lossy().into_owned()];
                v.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
                v
            },
        },
        kernels,
    };
    let text = toml::to_string(&manifest)
        .map_err(|e| CompileError::Io { path: out.join(MANIFEST), message: e.to_string() })?;
    std::fs::write(out.join(MANIFEST), text).map_err(io(&out.join(MANIFEST)))?;
    Ok(manifest)
}
