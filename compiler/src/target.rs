//! GPU targets: the facts and features of one architecture, read from `targets/*.toml`.
//!
//! The nine known targets are compiled into the binary, so `--target gfx1100` works
//! anywhere; `--target path/to/custom.toml` reads a file of the same schema (a smaller
//! LDS, a new part). Every fact in the shipped files cites its vendor document.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The shipped target files, by name.
const KNOWN: [(&str, &str); 9] = [
    ("gfx1100", include_str!("../../targets/gfx1100.toml")),
    ("gfx1030", include_str!("../../targets/gfx1030.toml")),
    ("gfx90a", include_str!("../../targets/gfx90a.toml")),
    ("gfx942", include_str!("../../targets/gfx942.toml")),
    ("sm_80", include_str!("../../targets/sm_80.toml")),
    ("sm_86", include_str!("../../targets/sm_86.toml")),
    ("sm_89", include_str!("../../targets/sm_89.toml")),
    ("sm_90", include_str!("../../targets/sm_90.toml")),
    ("sm_120", include_str!("../../targets/sm_120.toml")),
];

/// GPU vendor: decides the prelude, the compiler mode and the artifact format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// CUDA: PTX, loaded through the CUDA driver.
    Nvidia,
    /// HIP: a gfx code object, loaded through HIP's module API.
    Amd,
}

/// One GPU architecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Name, e.g. `gfx1100`.
    pub name: String,
    /// Vendor.
    pub vendor: Vendor,
    /// The part the counts and bandwidth describe.
    pub product: String,
    /// Hardware limits.
    pub device: Device,
    /// Instructions that select code paths.
    pub features: Features,
    /// How to build for it.
    pub build: Build,
}

/// Hardware limits and sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Threads per wave (warp): 32 or 64.
    pub wave_size: u32,
    /// Most threads in one block (work-group).
    pub max_threads_per_block: u32,
    /// Shared memory (LDS) one block may use without opting in.
    pub shared_bytes_per_block: u32,
    /// Shared memory one block may use after opting in (equal where there is no opt-in).
    pub shared_bytes_opt_in: u32,
    /// Most registers one thread may use.
    pub registers_per_thread: u32,
    /// 32-bit registers per SM / CU.
    pub registers_per_cu: u32,
    /// SMs / CUs of the reference part.
    pub compute_units: u32,
    /// Nominal memory bandwidth of the reference part, GB/s.
    pub memory_bandwidth_gbs: u32,
    /// L2 cache bytes (per device, or per XCD/GCD where noted).
    pub l2_bytes: u64,
}

impl Device {
    /// Shared memory one block may use: the opt-in limit for a kernel whose shared
    /// memory is sized at launch, the static one otherwise.
    pub fn shared_limit(&self, dynamic: bool) -> u32 {
        if dynamic { self.shared_bytes_opt_in } else { self.shared_bytes_per_block }
    }
}

/// Instructions that select template variants and tuning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Features {
    /// NVIDIA `dp4a`: 4-way int8 dot product with int32 accumulate.
    pub dp4a: bool,
    /// AMD `V_DOT4_I32_I8`: signed 4-way int8 dot product.
    pub sdot4: bool,
    /// AMD `V_DOT4_I32_IU8`: mixed-sign 4-way int8 dot product.
    pub sudot4: bool,
    /// Wave-level matrix instructions (NVIDIA wmma, AMD RDNA3 WMMA).
    pub wmma: bool,
    /// NVIDIA `mma.sync` tensor-core instructions.
    pub mma: bool,
    /// AMD CDNA `V_MFMA_*` matrix instructions (wave64).
    #[serde(default)]
    pub mfma: bool,
    /// NVIDIA `cp.async` global-to-shared copies.
    pub cp_async: bool,
    /// NVIDIA `griddepcontrol` (sm_90 on): a kernel may start while the one before it
    /// drains, and waits for its results in-kernel (programmatic dependent launch).
    pub grid_dependency: bool,
}

/// How to build code for the target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Build {
    /// Offload architecture (`sm_90`, `gfx1100`).
    pub arch: String,
    /// For NVIDIA targets newer than the available clang: the older architecture whose
    /// PTX the driver JIT-compiles forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_arch: Option<String>,
    /// PTX ISA version to emit (NVIDIA), e.g. 80 for PTX 8.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_isa: Option<u32>,
}

/// Why a target cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Neither a known name nor a readable file.
    #[error("unknown target {0:?} (known: {list}; or give the path of a target .toml)", list = known_names().join(", "))]
    Unknown(String),
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid target description.
    #[error("{path}: {message}")]
    Invalid {
        /// The file (or the known target's name).
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// Names of the shipped targets.
pub fn known_names() -> Vec<&'static str> {
    KNOWN.iter().map(|(n, _)| *n).collect()
}

/// Every shipped target.
pub fn known() -> Vec<Target> {
    KNOWN.iter().filter_map(|(name, text)| Target::parse(text, name).ok()).collect()
}

impl Target {
    /// A shipped target by name, or a target file by path (anything naming a `.toml`).
    pub fn load(name_or_path: &str) -> Result<Target, TargetError> {
        if let Some((name, text)) = KNOWN.iter().find(|(n, _)| *n == name_or_path) {
            return Target::parse(text, name);
        }
        let path = Path::new(name_or_path);
        if path.extension().is_some_and(|e| e == "toml") || path.exists() {
            let text = std::fs::read_to_string(path)
                .map_err(|source| TargetError::Io { path: name_or_path.into(), source })?;
            return Target::parse(&text, name_or_path);
        }
        Err(TargetError::Unknown(name_or_path.into()))
    }

    /// Parses and validates a target description; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Target, TargetError> {
        let invalid = |message: String| TargetError::Invalid { path: origin.into(), message };
        let t: Target = toml::from_str(text).map_err(|e| invalid(e.message().to_owned()))?;
        t.validate().map_err(invalid)?;
        Ok(t)
    }

    fn validate(&self) -> Result<(), String> {
        let d = &self.device;
        if !matches!(d.wave_size, 32 | 64) {
            return Err(format!("device.wave_size is {}, expected 32 or 64", d.wave_size));
        }
        if self.vendor == Vendor::Nvidia && d.wave_size != 32 {
            return Err("NVIDIA warps are 32 threads".into());
        }
        if d.max_threads_per_block < d.wave_size || !d.max_threads_per_block.is_multiple_of(d.wave_size) {
            return Err(format!(
                "device.max_threads_per_block {} is not a multiple of the wave size {}",
                d.max_threads_per_block, d.wave_size
            ));
        }
        if d.shared_bytes_opt_in < d.shared_bytes_per_block {
            return Err("device.shared_bytes_opt_in is below device.shared_bytes_per_block".into());
        }
        let arch_ok = match self.vendor {
            Vendor::Nvidia => self.build.arch.starts_with("sm_"),
            Vendor::Amd => self.build.arch.starts_with("gfx"),
        };
        if !arch_ok {
            return Err(format!("build.arch {:?} does not belong to vendor {:?}", self.build.arch, self.vendor));
        }
        if self.vendor == Vendor::Nvidia && self.build.ptx_isa.is_none() {
            return Err("build.ptx_isa is required for NVIDIA targets".into());
        }
        let f = &self.features;
        if self.vendor == Vendor::Amd && (f.dp4a || f.mma || f.cp_async || f.grid_dependency) {
            return Err("dp4a, mma, cp_async and grid_dependency are NVIDIA features".into());
        }
        if self.vendor == Vendor::Nvidia && (f.sdot4 || f.sudot4) {
            return Err("sdot4 and sudot4 are AMD features".into());
        }
        Ok(())
    }

    /// Whether wave `wave_size` kernels of this target can run on NVIDIA hardware through
    /// the CUDA prelude (cross-vendor execution): only wave32 targets can.
    pub fn runs_on_cuda(&self) -> bool {
        self.device.wave_size == 32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_target_is_valid() {
        for (name, text) in KNOWN {
            let t = Target::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(t.name, name);
        }
        assert_eq!(known().len(), 9);
    }

    #[test]
    fn facts_that_select_code_paths() {
        let t = |n| Target::load(n).expect("known");
        assert_eq!(t("gfx1100").device.wave_size, 32);
        assert_eq!(t("gfx90a").device.wave_size, 64);
        assert!(t("gfx1100").features.sudot4 && !t("gfx1100").features.sdot4);
        assert!(t("gfx942").features.sdot4);
        assert_eq!(t("sm_90").device.shared_bytes_opt_in, 232_448);
        assert_eq!(t("sm_120").build.fallback_arch.as_deref(), Some("sm_90"));
    }

    #[test]
    fn bad_targets_are_refused_clearly() {
        let e = Target::load("gfx9999").unwrap_err().to_string();
        assert!(e.starts_with("unknown target \"gfx9999\" (known: gfx1100, gfx1030"), "{e}");
        let base = KNOWN[0].1;
        let e = Target::parse(&base.replace("wave_size = 32", "wave_size = 48"), "x.toml").unwrap_err().to_string();
        assert_eq!(e, "x.toml: device.wave_size is 48, expected 32 or 64");
        let e = Target::parse(&base.replace("l2_bytes", "l2_byte"), "x.toml").unwrap_err().to_string();
        assert!(e.contains("unknown field `l2_byte`"), "{e}");
        let e = Target::load("/nonexistent/t.toml").unwrap_err().to_string();
        assert!(e.starts_with("/nonexistent/t.toml: "), "{e}");
    }
}
