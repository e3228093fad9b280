//! NVIDIA specifics of the build: the clang CUDA command, `ptxas -v` resources and, with
//! cuobjdump, each kernel's hot loop from the SASS ([`super::sass`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use super::{BuildError, Geometry, Resources, Toolchain};

/// clang arguments (before `-O3 -o OUT SRC`) for PTX of `arch` at PTX ISA `ptx_isa`.
/// The explicit `+ptxNN` feature is needed: clang-19 otherwise picks an ISA too old for
/// the `shfl.sync` shuffles.
pub(super) fn command(arch: &str, ptx_isa: u32) -> Vec<String> {
    [
        "-x",
        "cuda",
        "--cuda-device-only",
        &format!("--cuda-gpu-arch={arch}"),
        "-nocudainc",
        "-nocudalib",
        "-S",
        "-Xclang",
        "-target-feature",
        "-Xclang",
        &format!("+ptx{ptx_isa}"),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Registers, shared memory, stack and spills per kernel from `ptxas -v` (and the hot
/// loop, where cuobjdump reads ptxas's cubin), or "checked at load" for every kernel when
/// there is no ptxas.
pub(super) fn resources(
    tools: &Toolchain,
    ptx: &Path,
    arch: &str,
    names: &[&str],
) -> Result<BTreeMap<String, Resources>, BuildError> {
    let Some(ptxas) = &tools.ptxas else {
        return Ok(names.iter().map(|n| ((*n).to_owned(), Resources::CheckedAtLoad)).collect());
    };
    let cubin = ptx.with_extension("cubin");
    let keep = tools.cuobjdump.is_some();
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .args(["-v", "-o"])
        .arg(if keep { cubin.as_path() } else { Path::new("/dev/null") })
        .arg(ptx)
        .output()
        .map_err(|e| BuildError::Tool { tool: ptxas.display().to_string(), message: e.to_string() })?;
    let text = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(BuildError::Tool { tool: ptxas.display().to_string(), message: text.into_owned() });
    }
    let mut resources = parse_ptxas(&text);
    if let Some(cuobjdump) = &tools.cuobjdump {
        let sass = Command::new(cuobjdump).arg("-sass").arg(&cubin).output();
        // The cubin is only the disassembler's input; the module ships as PTX.
        let _ = std::fs::remove_file(&cubin);
        let sass =
            sass.map_err(|e| BuildError::Tool { tool: cuobjdump.display().to_string(), message: e.to_string() })?;
        if !sass.status.success() {
            let message = String::from_utf8_lossy(&sass.stderr).into_owned();
            return Err(BuildError::Tool { tool: cuobjdump.display().to_string(), message });
        }
        for (name, hot) in super::sass::hot_loops(&String::from_utf8_lossy(&sass.stdout)) {
            if let Some(Resources::Ptxas { hot_loop, .. }) = resources.get_mut(&name) {
                *hot_loop = Some(hot);
            }
        }
    }
    Ok(resources)
}

/// The block size each PTX entry was compiled for (its `.maxntid`; every NVIDIA warp has
/// 32 lanes). An entry without `.maxntid` records 0 threads, which no launch record has.
pub(super) fn geometry(ptx: &str) -> BTreeMap<String, Geometry> {
    ptx.split(".entry ")
        .skip(1)
        .filter_map(|entry| {
            let name = entry.split('(').next()?.trim().to_owned();
            let header = &entry[..entry.find('{').unwrap_or(entry.len())];
            let max_threads = header
                .split(".maxntid")
                .nth(1)
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0);
            Some((name, Geometry { wave_size: 32, max_threads }))
        })
        .collect()
}

/// Parses `ptxas -v` diagnostics into resources per entry function.
fn parse_ptxas(text: &str) -> BTreeMap<String, Resources> {
    let number = |line: &str, before: &str| -> u32 {
        line.split(',')
            .find(|part| part.contains(before))
            .and_then(|part| part.split_whitespace().find_map(|w| w.parse().ok()))
            .unwrap_or(0)
    };
    let mut out = BTreeMap::new();
    let mut current: Option<(String, Resources)> = None;
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            if let Some((name, r)) = current.take() {
                out.insert(name, r);
            }
            let name = rest.split('\'').next().unwrap_or_default().to_owned();
            current = Some((
                name,
                Resources::Ptxas {
                    registers: 0,
                    shared_bytes: 0,
                    stack_bytes: 0,
                    spill_stores: 0,
                    spill_loads: 0,
                    hot_loop: None,
                },
            ));
        } else if let Some((
            _,
            Resources::Ptxas { stack_bytes, spill_stores, spill_loads, registers, shared_bytes, .. },
        )) = current.as_mut()
        {
            if line.contains("bytes stack frame") {
                *stack_bytes = number(line, "stack frame");
                *spill_stores = number(line, "spill stores");
                *spill_loads = number(line, "spill loads");
            } else if line.contains("Used") && line.contains("registers") {
                *registers = number(line, "registers");
                *shared_bytes = number(line, "smem");
            }
        }
    }
    if let Some((name, r)) = current {
        out.insert(name, r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_report() {
        let text = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'gemv_q4_0_576x576' for 'sm_90'\n\
            ptxas info    : Function properties for gemv_q4_0_576x576\n\
            \x20   8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
            ptxas info    : Used 40 registers, 9504 bytes smem, 352 bytes cmem[0]\n\
            ptxas info    : Compiling entry function 'argmax_256' for 'sm_90'\n\
            ptxas info    : Function properties for argmax_256\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 12 registers, 384 bytes cmem[0]\n";
        let r = parse_ptxas(text);
        assert_eq!(
            r["gemv_q4_0_576x576"],
            Resources::Ptxas {
                registers: 40,
                shared_bytes: 9504,
                stack_bytes: 8,
                spill_stores: 4,
                spill_loads: 4,
                hot_loop: None
            }
        );
        assert_eq!(r["argmax_256"].spills(), Some(0));
    }

    #[test]
    fn entry_geometry() {
        let ptx = ".visible .entry add_256(\n\t.param .u64 add_256_param_0\n)\n.maxntid 256, 1, 1\n{\n\tret;\n}\n\
            .visible .entry bare(\n)\n{\n.maxntid 64, 1, 1\n}\n";
        let g = geometry(ptx);
        assert_eq!(g["add_256"], Geometry { wave_size: 32, max_threads: 256 });
        assert_eq!(g["bare"].max_threads, 0, "a .maxntid inside the body is not the entry's");
    }
}
