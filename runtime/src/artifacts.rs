//! Loading compiled artifacts beside a pack: the manifest must name this pack (by
//! fingerprint) and this device's architecture; otherwise the run is refused with one
//! line saying what the artifacts are for. Without an artifact directory, the pack is
//! compiled for the detected device into a cache directory first.

use std::path::{Path, PathBuf};

use strata_compiler::artifacts::{self, Manifest, Request, Stage};
use strata_compiler::build::Toolchain;
use strata_compiler::emit::Dialect;
use strata_compiler::host::{self, HostTarget};
use strata_compiler::pack::Pack;
use strata_compiler::plan::Options;
use strata_compiler::target::Target;

use crate::backend::{DeviceInfo, RunError};

/// A manifest and its compiled module, checked against the pack and the device.
#[derive(Clone, Debug)]
pub struct Artifacts {
    /// Where they are.
    pub dir: PathBuf,
    /// What was compiled, from what, for what.
    pub manifest: Manifest,
    /// The module's bytes (PTX text or code object).
    pub module: Vec<u8>,
}

/// Strata's cache directory: `$STRATA_CACHE`, else `$XDG_CACHE_HOME/strata` or
/// `~/.cache/strata`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("STRATA_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("strata")
}

/// Reads the artifacts in `dir` and refuses them unless they were compiled from `pack`
/// for `device`'s architecture with a module this backend loads.
pub fn open(dir: &Path, pack: &Pack, device: &DeviceInfo) -> Result<Artifacts, RunError> {
    let manifest = artifacts::read_manifest(dir).map_err(|e| RunError::Other(format!("artifacts: {e}")))?;
    if manifest.format != artifacts::FORMAT {
        return Err(RunError::Other(format!(
            "{}: artifact format {} is not the {} this strata-run reads; recompile them",
            dir.display(),
            manifest.format,
            artifacts::FORMAT
        )));
    }
    let fingerprint = pack.fingerprint();
    if manifest.pack.fingerprint != fingerprint {
        return Err(RunError::Other(format!(
            "{}: artifacts are for another pack ({}, fingerprint {}…); {} has fingerprint {}…; recompile them",
            dir.display(),
            manifest.pack.file,
            short(&manifest.pack.fingerprint),
            pack.path().display(),
            short(&fingerprint)
        )));
    }
    let t = &manifest.target;
    if device.dialect != Some(t.dialect) || (t.built_for != device.arch && t.name != device.arch) {
        let built = if t.built_for == t.name { String::new() } else { format!(" (built for {})", t.built_for) };
        return Err(RunError::Other(format!(
            "{}: artifacts are for {}{built}; this device is {} ({})",
            dir.display(),
            t.name,
            device.arch,
            device.name
        )));
    }
    let path = dir.join(&manifest.module.binary);
    let module = std::fs::read(&path).map_err(|e| RunError::Other(format!("{}: {e}", path.display())))?;
    Ok(Artifacts { dir: dir.to_path_buf(), manifest, module })
}

/// Compiles `pack` for `device` into the cache (a no-op when the cache already holds
/// this build) and opens the result.
pub fn compile_for_device(
    pack: &Pack,
    device: &DeviceInfo,
    options: Options,
    progress: &mut dyn FnMut(Stage),
) -> Result<Artifacts, RunError> {
    if device.dialect == Some(Dialect::Host) {
        let target = HostTarget::load(&device.arch).map_err(|e| RunError::Other(e.to_string()))?;
        let tools = Toolchain::discover().map_err(|e| RunError::Other(e.to_string()))?;
        let out = cache_dir().join("artifacts").join(format!("{}-{}", short(&pack.fingerprint()), target.name));
        let _lock = lock(&out)?;
        host::compile(pack, &target, &options, &tools, &out, progress).map_err(|e| RunError::Other(e.to_string()))?;
        return open(&out, pack, device);
    }
    let target = Target::load(&device.arch).map_err(|_| {
        RunError::Other(format!(
            "no strata target for this device's architecture {} ({}); compile for the nearest target with strata-compile and pass --artifacts",
            device.arch, device.name
        ))
    })?;
    let tools = Toolchain::discover().map_err(|e| RunError::Other(e.to_string()))?;
    let out = cache_dir().join("artifacts").join(format!("{}-{}", short(&pack.fingerprint()), target.name));
    let _lock = lock(&out)?;
    let req = Request { pack, target: &target, options, allow_spills: false, run_on: None, out: &out };
    artifacts::compile(&req, &tools, progress).map_err(|e| RunError::Other(e.to_string()))?;
    open(&out, pack, device)
}

/// The lock of the cached artifact directory `out`, held while compiling into it: a
/// second process starting on the same pack (two servers, parallel tests) waits, then
/// finds the artifacts up to date instead of writing the directory at the same time.
fn lock(out: &Path) -> Result<std::fs::File, RunError> {
    let path = out.with_extension("lock");
    let fail = |e: std::io::Error| RunError::Other(format!("artifact cache: locking {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let file = std::fs::File::options().create(true).truncate(false).write(true).open(&path).map_err(fail)?;
    file.lock().map_err(fail)?;
    Ok(file)
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..16).unwrap_or(fingerprint)
}
