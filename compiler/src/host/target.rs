//! Host targets: the CPU's instruction set as facts, read from `targets/host/*.toml`, and
//! the running CPU's best match.

use serde::{Deserialize, Serialize};

/// The shipped host target files, by name, best first within an architecture.
const KNOWN: [(&str, &str); 4] = [
    ("x86_64-v4", include_str!("../../../targets/host/x86_64-v4.toml")),
    ("x86_64-v3-vnni", include_str!("../../../targets/host/x86_64-v3-vnni.toml")),
    ("x86_64-v3", include_str!("../../../targets/host/x86_64-v3.toml")),
    ("aarch64", include_str!("../../../targets/host/aarch64.toml")),
];

/// One CPU instruction-set level: what the host kernels may use and how clang builds them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostTarget {
    /// Name, e.g. `x86_64-v4`.
    pub name: String,
    /// `x86_64` or `aarch64`: decides the instruction-set prelude.
    pub arch: String,
    /// The CPUs it describes.
    pub product: String,
    /// Vector registers and features.
    pub isa: Isa,
    /// Cache sizes: tuning inputs, not limits.
    pub cache: Cache,
    /// How clang builds for it.
    pub build: HostBuild,
}

/// Vector registers and the features the kernels may use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Isa {
    /// Bytes of the widest vector register.
    pub vector_bytes: u32,
    /// Vector registers the compiler may allocate.
    pub vector_registers: u32,
    /// Features every CPU of this target has, in `std::arch` detection names.
    pub features: Vec<String>,
}

/// Cache sizes of a typical core.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cache {
    /// L1 data cache bytes per core.
    pub l1d_bytes: u32,
    /// L2 bytes per core.
    pub l2_bytes: u32,
}

/// The clang invocation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostBuild {
    /// clang's `--target` triple.
    pub triple: String,
    /// Code generation flags (`-march=...`).
    pub flags: Vec<String>,
}

/// Why a host target cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HostTargetError {
    /// Not a shipped host target's name.
    #[error("unknown host target {0:?} (known: {list})", list = known_names().join(", "))]
    Unknown(String),
    /// A shipped file does not parse (a bug in strata, caught by the tests).
    #[error("host target {name}: {message}")]
    Invalid {
        /// The target.
        name: String,
        /// The TOML parser's message.
        message: String,
    },
}

/// The shipped host targets' names.
pub fn known_names() -> Vec<&'static str> {
    KNOWN.iter().map(|(n, _)| *n).collect()
}

impl HostTarget {
    /// The shipped host target `name`.
    pub fn load(name: &str) -> Result<HostTarget, HostTargetError> {
        let (_, text) = KNOWN.iter().find(|(n, _)| *n == name).ok_or_else(|| HostTargetError::Unknown(name.into()))?;
        toml::from_str(text).map_err(|e| HostTargetError::Invalid { name: name.into(), message: e.to_string() })
    }

    /// Whether `name` names a host target (rather than a GPU).
    pub fn is_host(name: &str) -> bool {
        KNOWN.iter().any(|(n, _)| *n == name)
    }

    /// The best shipped target this CPU runs: the first of its architecture whose every
    /// feature the CPU reports. `None` on an architecture without one.
    pub fn detect() -> Option<HostTarget> {
        KNOWN
            .iter()
            .filter_map(|(n, _)| HostTarget::load(n).ok())
            .find(|t| t.arch == std::env::consts::ARCH && t.isa.features.iter().all(|f| cpu_has(f)))
    }

    /// Lanes of 32-bit values in one vector register.
    pub fn lanes(&self) -> u32 {
        self.isa.vector_bytes / 4
    }
}

/// Whether the running CPU has `feature` (a `std::arch` detection name); false for a
/// feature of another architecture or one this function does not know.
pub fn cpu_has(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            "avx2" => std::arch::is_x86_feature_detected!("avx2"),
            "fma" => std::arch::is_x86_feature_detected!("fma"),
            "f16c" => std::arch::is_x86_feature_detected!("f16c"),
            "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
            "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
            "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
            "avx512bf16" => std::arch::is_x86_feature_detected!("avx512bf16"),
            "avxvnni" => std::arch::is_x86_feature_detected!("avxvnni"),
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        match feature {
            "neon" => std::arch::is_aarch64_feature_detected!("neon"),
            "dotprod" => std::arch::is_aarch64_feature_detected!("dotprod"),
            "i8mm" => std::arch::is_aarch64_feature_detected!("i8mm"),
            _ => false,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = feature;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_host_target_parses_and_names_its_file() {
        for name in known_names() {
            let t = HostTarget::load(name).expect("parses");
            assert_eq!(t.name, name);
            assert!(["x86_64", "aarch64"].contains(&t.arch.as_str()), "{name}");
            assert!(t.build.triple.starts_with(&t.arch), "{name}");
        }
        assert!(HostTarget::load("sm_90").is_err() && !HostTarget::is_host("sm_90"));
    }

    #[test]
    fn detection_picks_a_target_of_this_architecture_whose_features_the_cpu_has() {
        if let Some(t) = HostTarget::detect() {
            assert_eq!(t.arch, std::env::consts::ARCH);
            assert!(t.isa.features.iter().all(|f| cpu_has(f)));
        }
    }
}
