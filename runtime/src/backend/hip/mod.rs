//! The HIP backend: the generic GPU backend ([`Gpu`]) over HIP's runtime (`driver`, through
//! the entry points `api` loads at run time), with code objects through HIP's module API.
//! No ROCm is needed to build, and without one `--backend hip` refuses with one clear line.
//!
//! No AMD GPU is available where strata is developed. The same code runs on an NVIDIA GPU
//! through HIP's NVIDIA platform (`HIP_PLATFORM=nvidia`, see `api`), which is how it is
//! tested; on AMD it has been compiled, never run.

mod api;
mod driver;

use std::ffi::c_int;

use api::Api;
pub use api::{Platform, arch_from_properties};
pub use driver::{Handle, HipDriver};

use super::gpu::Gpu;
use super::{DeviceEntry, RunError};

/// A HIP device with its loaded kernels.
pub type Hip = Gpu<HipDriver>;

/// The HIP devices present, each with its architecture, or the reason there are none.
pub fn devices() -> Result<Vec<DeviceEntry>, RunError> {
    let api = Api::load(Platform::from_env())?;
    let mut count: c_int = 0;
    // SAFETY: plain HIP runtime calls with valid out-pointers.
    unsafe {
        api.check("hipInit", (api.init)(0))?;
        api.check("hipGetDeviceCount", (api.get_device_count)(&mut count))?;
    }
    Ok((0..count)
        .map(|i| DeviceEntry {
            ordinal: i as usize,
            name: api.name(i),
            arch: api.arch(i).unwrap_or_else(|| "unknown".into()),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_is_found_in_device_properties() {
        let mut props = vec![0u8; 2048];
        props[396..396 + 23].copy_from_slice(b"gfx1100:sramecc-:xnack-");
        props[10..20].copy_from_slice(b"Radeon RX ");
        assert_eq!(arch_from_properties(&props).as_deref(), Some("gfx1100"));
        props[396..400].copy_from_slice(b"gfxz");
        assert_eq!(arch_from_properties(&props), None);
        let mut p = vec![0u8; 64];
        p[5..11].copy_from_slice(b"gfx90a");
        assert_eq!(arch_from_properties(&p).as_deref(), Some("gfx90a"));
    }

    #[test]
    fn no_runtime_is_one_clear_line() {
        if Api::load(Platform::Amd).is_ok() {
            return; // a machine with ROCm
        }
        let e = Api::load(Platform::Amd).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.starts_with("HIP backend: no HIP runtime (libamdhip64.so)"), "{e}");
        assert_eq!(e.lines().count(), 1);
    }
}
