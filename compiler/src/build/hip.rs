//! AMD specifics of the build: the clang HIP command and the code object's metadata.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use super::{BuildError, Geometry, Resources, Toolchain};

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
        // Per-kernel resource remarks on stderr, for the occupancy LLVM computes.
        "-Rpass-analysis=kernel-resource-usage",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Resources and compiled geometry by kernel name.
type PerKernel = (BTreeMap<String, Resources>, BTreeMap<String, Geometry>);

/// Per kernel, as the code object's `NT_AMDGPU_METADATA` note records them (printed by
/// `llvm-readelf --notes`): VGPRs, SGPRs, spills, LDS and scratch, and the wave size and
/// block size it was compiled for.
pub(super) fn resources(tools: &Toolchain, object: &Path, remarks: &str) -> Result<PerKernel, BuildError> {
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
    let (mut resources, geometry) = parse_notes(&String::from_utf8_lossy(&out.stdout));
    for (name, waves) in parse_occupancy(remarks) {
        if let Some(Resources::CodeObject { occupancy, .. }) = resources.get_mut(&name) {
            *occupancy = waves;
        }
    }
    Ok((resources, geometry))
}

/// Waves per SIMD by kernel, from clang's `-Rpass-analysis=kernel-resource-usage` remarks
/// (`remark: Function Name: K`, then `remark:     Occupancy [waves/SIMD]: N`).
fn parse_occupancy(remarks: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut current = None;
    for line in remarks.lines().filter_map(|l| l.split_once("remark:").map(|(_, r)| r.trim())) {
        if let Some(name) = line.strip_prefix("Function Name: ") {
            current = name.split_whitespace().next().map(str::to_owned);
        } else if let (Some(rest), Some(name)) = (line.strip_prefix("Occupancy [waves/SIMD]: "), &current)
            && let Some(waves) = rest.split_whitespace().next().and_then(|w| w.parse().ok())
        {
            out.insert(name.clone(), waves);
        }
    }
    out
}

/// Reads the kernel-level keys of each `amdhsa.kernels` entry.
fn parse_notes(text: &str) -> PerKernel {
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
    let mut resources = BTreeMap::new();
    let mut geometry = BTreeMap::new();
    for k in kernels {
        let get = |key: &str| k.get(key).and_then(|v| v.parse().ok()).unwrap_or(0);
        let Some(name) = k.get(".name") else { continue };
        resources.insert(
            name.clone(),
            Resources::CodeObject {
                vgprs: get(".vgpr_count"),
                sgprs: get(".sgpr_count"),
                vgpr_spills: get(".vgpr_spill_count"),
                sgpr_spills: get(".sgpr_spill_count"),
                lds_bytes: get(".group_segment_fixed_size"),
                scratch_bytes: get(".private_segment_fixed_size"),
                occupancy: 0,
            },
        );
        geometry.insert(
            name.clone(),
            Geometry { wave_size: get(".wavefront_size"), max_threads: get(".max_flat_workgroup_size") },
        );
    }
    (resources, geometry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_note() {
        let text = "amdhsa.kernels:\n  - .args:\n      - .actual_access:  read_only\n        .offset:         0\n\
            \x20   .group_segment_fixed_size: 256\n    .name:           k\n    .private_segment_fixed_size: 16\n\
            \x20   .max_flat_workgroup_size: 256\n    .sgpr_count:     4\n    .sgpr_spill_count: 0\n\
            \x20   .vgpr_count:     40\n    .vgpr_spill_count: 2\n    .wavefront_size: 32\n\
            \x20 - .args:           []\n    .name:           j\n    .vgpr_count:     8\n\
            amdhsa.target:   amdgcn-amd-amdhsa--gfx1100\n";
        let (r, g) = parse_notes(text);
        assert_eq!(
            r["k"],
            Resources::CodeObject {
                vgprs: 40,
                sgprs: 4,
                vgpr_spills: 2,
                sgpr_spills: 0,
                lds_bytes: 256,
                scratch_bytes: 16,
                occupancy: 0
            }
        );
        assert_eq!(r["j"].spills(), Some(0));
        assert_eq!(g["k"], Geometry { wave_size: 32, max_threads: 256 });
        assert_eq!(g["j"], Geometry { wave_size: 0, max_threads: 0 });
    }

    #[test]
    fn occupancy_remarks() {
        let text = "k.hip:5:6: remark: Function Name: gemv_a [-Rpass-analysis=kernel-resource-usage]\n\
            \x20   5 | void gemv_a(const u8* w) {\n\
            k.hip:5:6: remark:     VGPRs: 27 [-Rpass-analysis=kernel-resource-usage]\n\
            k.hip:5:6: remark:     Occupancy [waves/SIMD]: 16 [-Rpass-analysis=kernel-resource-usage]\n\
            k.hip:9:6: remark: Function Name: add_256 [-Rpass-analysis=kernel-resource-usage]\n\
            k.hip:9:6: remark:     Occupancy [waves/SIMD]: 12 [-Rpass-analysis=kernel-resource-usage]\n";
        let o = parse_occupancy(text);
        assert_eq!(o.len(), 2);
        assert_eq!((o["gemv_a"], o["add_256"]), (16, 12));
    }
}
