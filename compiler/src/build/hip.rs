//! AMD specifics of the build: the clang HIP command and the code object's metadata.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use super::{BuildError, Resources, Toolchain};

/// clang arguments (before `-O3 -o OUT SRC`) for a linked code object of `arch`.
pub(super) fn command(arch: &str) -> Vec<String> {
    [
        "-x",
        "hip",
        &format!("--offload-arch={arch}"),
        "-nogpuinc",
        "-nogpulib",
        "--offload-device-only",
        "--no-gpu-bundle-output",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// VGPRs, SGPRs, spills, LDS and scratch per kernel from the code object's
/// `NT_AMDGPU_METADATA` note, printed by `llvm-readelf --notes`.
pub(super) fn resources(tools: &Toolchain, object: &Path) -> Result<BTreeMap<String, Resources>, BuildError> {
    let Some(readelf) = &tools.readelf else {
        return Err(BuildError::Tool {
            tool: "llvm-readelf".into(),
            message: "not found (install llvm-19, or set STRATA_READELF): AMD resources cannot be read".into(),
        });
    };
    let out = Command::new(readelf)
        .arg("--notes")
        .arg(object)
        .output()
        .map_err(|e| BuildError::Tool { tool: readelf.display().to_string(), message: e.to_string() })?;
    Ok(parse_notes(&String::from_utf8_lossy(&out.stdout)))
}

/// Reads the kernel-level keys of each `amdhsa.kernels` entry.
fn parse_notes(text: &str) -> BTreeMap<String, Resources> {
    let mut kernels: Vec<BTreeMap<String, String>> = Vec::new();
    let mut in_kernels = false;
    for line in text.lines() {
        if line.starts_with("amdhsa.") {
            in_kernels = line.starts_with("amdhsa.kernels:");
            continue;
        }
        if !in_kernels {
            continue;
        }
        let body = if let Some(rest) = line.strip_prefix("  - ") {
            kernels.push(BTreeMap::new());
            rest
        } else if let Some(rest) = line.strip_prefix("    ") {
            if rest.starts_with(' ') || rest.starts_with('-') {
                continue; // nested (argument) entries
            }
            rest
        } else {
            continue;
        };
        if let (Some(kernel), Some((key, value))) = (kernels.last_mut(), body.split_once(':')) {
            kernel.insert(key.trim().to_owned(), value.trim().to_owned());
        }
    }
    kernels
        .into_iter()
        .filter_map(|k| {
            let get = |key: &str| k.get(key).and_then(|v| v.parse().ok()).unwrap_or(0);
            let name = k.get(".name")?.clone();
            Some((
                name,
                Resources::CodeObject {
                    vgprs: get(".vgpr_count"),
                    sgprs: get(".sgpr_count"),
                    vgpr_spills: get(".vgpr_spill_count"),
                    sgpr_spills: get(".sgpr_spill_count"),
                    lds_bytes: get(".group_segment_fixed_size"),
                    scratch_bytes: get(".private_segment_fixed_size"),
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_note() {
        let text = "amdhsa.kernels:\n  - .args:\n      - .actual_access:  read_only\n        .offset:         0\n\
            \x20   .group_segment_fixed_size: 256\n    .name:           k\n    .private_segment_fixed_size: 16\n\
            \x20   .sgpr_count:     4\n    .sgpr_spill_count: 0\n    .vgpr_count:     40\n    .vgpr_spill_count: 2\n\
            \x20 - .args:           []\n    .name:           j\n    .vgpr_count:     8\n\
            amdhsa.target:   amdgcn-amd-amdhsa--gfx1100\n";
        let r = parse_notes(text);
        assert_eq!(
            r["k"],
            Resources::CodeObject {
                vgprs: 40,
                sgprs: 4,
                vgpr_spills: 2,
                sgpr_spills: 0,
                lds_bytes: 256,
                scratch_bytes: 16
            }
        );
        assert_eq!(r["j"].spills(), Some(0));
    }
}
