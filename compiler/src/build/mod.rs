//! Build: compiles a rendered module with clang (no vendor SDK) and reads back each
//! kernel's resource usage.
//!
//! CUDA → PTX with `--cuda-device-only -nocudainc -nocudalib` and an explicit `+ptxNN`
//! feature; HIP → a code object with `-nogpuinc -nogpulib --offload-device-only
//! --no-gpu-bundle-output`. Device code is always built with `-O3` (HIP defaults to -O0,
//! which is slow and known to miscompile on ROCm 7.x) and `-ffp-contract=off`, so the
//! only fused multiply-adds are the ones the templates ask for. Vendor specifics live
//! in `cuda.rs` and `hip.rs`.

mod cuda;
mod hip;
pub mod sass;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::emit::{Dialect, Module};
use crate::target::Target;

/// The tools found on this machine.
#[derive(Clone, Debug)]
pub struct Toolchain {
    /// clang (19 or newer).
    pub clang: PathBuf,
    /// clang's `--version` first line.
    pub clang_version: String,
    /// clang's major version.
    pub clang_major: u32,
    /// llvm-readelf, to read AMDGPU metadata notes.
    pub readelf: Option<PathBuf>,
    /// NVIDIA's ptxas, to read register and spill counts of PTX (optional).
    pub ptxas: Option<PathBuf>,
    /// NVIDIA's cuobjdump (with nvdisasm beside it), to read the hot loop of each kernel
    /// ptxas compiled (optional; used only with ptxas).
    pub cuobjdump: Option<PathBuf>,
}

/// Resource usage of one compiled kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Resources {
    /// From the AMDGPU metadata note of the code object.
    CodeObject {
        /// Vector registers per lane.
        vgprs: u32,
        /// Scalar registers.
        sgprs: u32,
        /// Vector registers spilled.
        vgpr_spills: u32,
        /// Scalar registers spilled.
        sgpr_spills: u32,
        /// LDS bytes (group segment).
        lds_bytes: u32,
        /// Scratch bytes per lane (private segment).
        scratch_bytes: u32,
        /// Waves per SIMD the compiler expects to fit at once, from registers, LDS and
        /// block size (LLVM's `kernel-resource-usage` remark; 0 where not recorded).
        #[serde(default)]
        occupancy: u32,
    },
    /// From `ptxas -v`.
    Ptxas {
        /// Registers per thread.
        registers: u32,
        /// Shared memory bytes.
        shared_bytes: u32,
        /// Stack frame bytes.
        stack_bytes: u32,
        /// Spill store bytes.
        spill_stores: u32,
        /// Spill load bytes.
        spill_loads: u32,
        /// The hot loop's instructions, where cuobjdump could read the SASS.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hot_loop: Option<sass::HotLoop>,
    },
    /// No ptxas here: the runtime reads registers and local memory when it loads the PTX.
    CheckedAtLoad,
}

impl Resources {
    /// Bytes spilled or of scratch / stack, when known.
    pub fn spills(&self) -> Option<u32> {
        match self {
            Resources::CodeObject { vgpr_spills, sgpr_spills, scratch_bytes, .. } => {
                Some(vgpr_spills + sgpr_spills + scratch_bytes)
            }
            Resources::Ptxas { stack_bytes, spill_stores, spill_loads, .. } => {
                Some(stack_bytes + spill_stores + spill_loads)
            }
            Resources::CheckedAtLoad => None,
        }
    }
}

/// The launch geometry a kernel's binary was compiled for, read back from the binary
/// (`.maxntid` in PTX; `.wavefront_size` and `.max_flat_workgroup_size` in the AMDGPU
/// metadata), so the host's launch record can be proven to agree with the device code: a
/// wave-size or block-size mismatch shows up on the device only as a launch failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Lanes per wave the code was compiled for.
    pub wave_size: u32,
    /// The most threads per block the code accepts.
    pub max_threads: u32,
}

/// A compiled module.
#[derive(Clone, Debug)]
pub struct Built {
    /// The PTX text or code object bytes.
    pub binary: Vec<u8>,
    /// Its file name in the artifacts.
    pub file_name: String,
    /// The architecture actually compiled for.
    pub arch: String,
    /// Resources per kernel name.
    pub resources: BTreeMap<String, Resources>,
    /// Launch geometry per kernel name, as compiled.
    pub geometry: BTreeMap<String, Geometry>,
    /// The compiler command, for the manifest and for users reproducing a build.
    pub command: Vec<String>,
}

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// No usable clang.
    #[error(
        "no clang 19 or newer found (tried $STRATA_CLANG, clang-19, clang-20, clang-21, clang); install clang-19 and lld-19"
    )]
    NoClang,
    /// The compiler rejected the source.
    #[error("clang failed on {}:\n{message}", kernel.as_deref().unwrap_or("the module"))]
    Compiler {
        /// The kernel whose source the first error points into.
        kernel: Option<String>,
        /// The compiler's diagnostics.
        message: String,
    },
    /// A kernel spills where that is not allowed.
    #[error("kernel {kernel}: {what} (pass --allow-spills to accept)")]
    Spills {
        /// The kernel.
        kernel: String,
        /// What spilled.
        what: String,
    },
    /// A tool could not be run or its output read.
    #[error("{tool}: {message}")]
    Tool {
        /// The tool.
        tool: String,
        /// What went wrong.
        message: String,
    },
}

impl Toolchain {
    /// Finds clang (`$STRATA_CLANG` first), llvm-readelf of the same version and, when
    /// present, ptxas (`$STRATA_PTXAS`, `ptxas` on the PATH, `/usr/local/cuda/bin`) and
    /// cuobjdump (`$STRATA_CUOBJDUMP`, beside ptxas, on the PATH, `/usr/local/cuda/bin`).
    pub fn discover() -> Result<Toolchain, BuildError> {
        let mut candidates: Vec<PathBuf> = std::env::var_os("STRATA_CLANG").map(PathBuf::from).into_iter().collect();
        candidates.extend(["clang-19", "clang-20", "clang-21", "clang"].map(PathBuf::from));
        let (clang, clang_version, clang_major) = candidates
            .into_iter()
            .find_map(|c| {
                let out = Command::new(&c).arg("--version").output().ok()?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let line = text.lines().next()?.trim().to_owned();
                let major = version_major(&line)?;
                (major >= 19).then_some((c, line, major))
            })
            .ok_or(BuildError::NoClang)?;
        let runs = |p: &Path| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success());
        let readelf = std::env::var_os("STRATA_READELF")
            .map(PathBuf::from)
            .into_iter()
            .chain([PathBuf::from(format!("llvm-readelf-{clang_major}")), "llvm-readelf".into()])
            .find(|p| runs(p));
        let ptxas = std::env::var_os("STRATA_PTXAS")
            .map(PathBuf::from)
            .into_iter()
            .chain(["ptxas".into(), "/usr/local/cuda/bin/ptxas".into()])
            .find(|p| runs(p));
        let cuobjdump = std::env::var_os("STRATA_CUOBJDUMP")
            .map(PathBuf::from)
            .into_iter()
            .chain(ptxas.as_ref().and_then(|p| p.parent()).map(|dir| dir.join("cuobjdump")))
            .chain(["cuobjdump".into(), "/usr/local/cuda/bin/cuobjdump".into()])
            .find(|p| runs(p));
        Ok(Toolchain { clang, clang_version, clang_major, readelf, ptxas, cuobjdump })
    }

    /// The identity of the toolchain, part of every build's content hash.
    pub fn identity(&self) -> String {
        let ptxas = match (&self.ptxas, &self.cuobjdump) {
            (Some(_), Some(_)) => "ptxas, cuobjdump",
            (Some(_), None) => "ptxas",
            (None, _) => "no ptxas",
        };
        format!("{} ({ptxas})", self.clang_version)
    }
}

/// `Debian clang version 19.1.7 (3~deb12u1)` → 19.
fn version_major(line: &str) -> Option<u32> {
    let rest = &line[line.find("version ")? + 8..];
    rest.split(['.', ' ']).next()?.parse().ok()
}

/// The architecture to compile `target` for with this toolchain (clang 19 cannot emit
/// sm_100+: such targets name an older `fallback_arch` whose PTX the driver JIT-compiles).
pub fn build_arch(target: &Target, tools: &Toolchain) -> String {
    match &target.build.fallback_arch {
        Some(fallback) if tools.clang_major < 20 => fallback.clone(),
        _ => target.build.arch.clone(),
    }
}

/// Compiles `module` for `target` (the device it will run on) in `dir`, writing the
/// source and the binary there, and reads back resources.
pub fn build(module: &Module, target: &Target, tools: &Toolchain, dir: &Path) -> Result<Built, BuildError> {
    let arch = build_arch(target, tools);
    let io = |e: std::io::Error| BuildError::Tool { tool: "write".into(), message: format!("{}: {e}", dir.display()) };
    let source = dir.join(format!("module.{}", module.dialect.extension()));
    std::fs::write(&source, &module.source).map_err(io)?;
    let (file_name, mut command) = match module.dialect {
        Dialect::Cuda => ("module.ptx", cuda::command(&arch, target.build.ptx_isa.unwrap_or(80))),
        Dialect::Hip => ("module.hsaco", hip::command(&arch)),
        Dialect::Host => {
            return Err(BuildError::Tool {
                tool: "build".into(),
                message: "host modules build through host::compile".into(),
            });
        }
    };
    let output = dir.join(file_name);
    command.extend(["-O3".into(), "-ffp-contract=off".into(), "-o".into()]);
    command.push(output.display().to_string());
    command.push(source.display().to_string());
    let out = Command::new(&tools.clang)
        .args(&command)
        .output()
        .map_err(|e| BuildError::Tool { tool: tools.clang.display().to_string(), message: e.to_string() })?;
    if !out.status.success() {
        let message = String::from_utf8_lossy(&out.stderr).into_owned();
        let kernel = first_error_kernel(&message);
        return Err(BuildError::Compiler { kernel, message: failure(&out.status, &message) });
    }
    let binary = std::fs::read(&output).map_err(io)?;
    let names: Vec<&str> = module.kernels.iter().map(|k| k.name.as_str()).collect();
    let (resources, geometry) = match module.dialect {
        Dialect::Cuda => {
            (cuda::resources(tools, &output, &arch, &names)?, cuda::geometry(&String::from_utf8_lossy(&binary)))
        }
        Dialect::Hip => hip::resources(tools, &output, &String::from_utf8_lossy(&out.stderr))?,
        Dialect::Host => unreachable!("refused above: host modules build through host::compile"),
    };
    let mut full = vec![tools.clang.display().to_string()];
    full.extend(command);
    Ok(Built { binary, file_name: file_name.into(), arch, resources, geometry, command: full })
}

/// The kernel named by the first `NAME.cu:LINE:COL: error:` diagnostic.
fn first_error_kernel(stderr: &str) -> Option<String> {
    stderr.lines().find(|l| l.contains(": error:")).and_then(|l| {
        let file = l.split(':').next()?;
        let stem = Path::new(file).file_stem()?.to_str()?;
        (stem != "module").then(|| stem.to_owned())
    })
}

/// What to show of a failed clang run: its diagnostics from the first error on (the
/// resource remarks asked of AMD builds come before it and are left out), or, where it
/// printed none, how it ended (a signal: killed, e.g. for memory) and its last lines.
fn failure(status: &std::process::ExitStatus, stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    if let Some(first) = lines.iter().position(|l| l.contains("error:")) {
        return clip(&lines[first..].join("\n"), 40);
    }
    let tail = &lines[lines.len().saturating_sub(10)..];
    format!("clang ended with {status} and no error message; its last lines:\n{}", tail.join("\n"))
}

fn clip(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    if all.len() <= lines {
        return text.trim_end().to_owned();
    }
    format!("{}\n… ({} more lines)", all[..lines].join("\n"), all.len() - lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_error_locations() {
        assert_eq!(version_major("Debian clang version 19.1.7 (3~deb12u1)"), Some(19));
        assert_eq!(version_major("clang version 21.0.0git"), Some(21));
        let stderr = "gemv_q4_0_576x576_t4.cu:12:5: error: use of undeclared identifier 'x'\n   12 |     x = 1;\n";
        assert_eq!(first_error_kernel(stderr).as_deref(), Some("gemv_q4_0_576x576_t4"));
        assert_eq!(first_error_kernel("/tmp/o/module.cu:3:1: error: bad\n"), None);
    }

    #[cfg(unix)]
    #[test]
    fn failures_show_the_first_error_or_how_clang_ended() {
        use std::os::unix::process::ExitStatusExt;
        let remarks = "k.hip:3:6: remark: Function Name: k\nk.hip:3:6: remark:     SGPRs: 16\n";
        let failed = std::process::ExitStatus::from_raw(1 << 8);
        let shown = failure(&failed, &format!("{remarks}k.hip:9:1: error: bad\n    9 | x\n"));
        assert_eq!(shown, "k.hip:9:1: error: bad\n    9 | x");
        let killed = failure(&std::process::ExitStatus::from_raw(9), remarks);
        assert!(killed.starts_with("clang ended with signal: 9") && killed.ends_with("SGPRs: 16"), "{killed}");
    }
}
