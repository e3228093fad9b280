//! The CUDA backend: the generic GPU backend ([`Gpu`]) over the CUDA driver API
//! (`driver`, through cudarc, loaded at run time), with PTX modules.
//!
//! No CUDA is needed to build. At start the driver library is probed first: cudarc's
//! dynamic loader panics when it is absent, so [`Cuda::new`] and [`devices`] refuse with
//! one clear line instead.

mod driver;

use cudarc::driver::sys;
pub use driver::CudaDriver;

use super::gpu::Gpu;
use super::{DeviceEntry, RunError};

/// A CUDA device with its loaded kernels.
pub type Cuda = Gpu<CudaDriver>;

/// Whether a CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
        // SAFETY: loading the CUDA driver runs only its initializers, which are safe to
        // run in any process; the handle is dropped immediately.
        unsafe { libloading::Library::new(*name) }.is_ok()
    })
}

/// The refusal when there is no CUDA driver.
fn no_driver() -> RunError {
    RunError::NoDevice("CUDA backend: no CUDA driver (libcuda.so.1) on this machine".into())
}

/// A failed driver call, named.
fn driver(call: &str) -> impl Fn(cudarc::driver::DriverError) -> RunError + '_ {
    move |e| RunError::Driver { call: call.into(), message: e.to_string() }
}

/// The CUDA devices present, each with its architecture, or the reason there are none.
pub fn devices() -> Result<Vec<DeviceEntry>, RunError> {
    use cudarc::driver::result::device;
    if !driver_present() {
        return Err(no_driver());
    }
    cudarc::driver::result::init().map_err(driver("cuInit"))?;
    let count = device::get_count().map_err(driver("cuDeviceGetCount"))?;
    (0..count)
        .map(|i| {
            let dev = device::get(i).map_err(driver("cuDeviceGet"))?;
            let attribute = |a| {
                // SAFETY: `dev` came from cuDeviceGet.
                unsafe { device::get_attribute(dev, a) }.map_err(driver("cuDeviceGetAttribute"))
            };
            let major = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            Ok(DeviceEntry {
                ordinal: i as usize,
                name: device::get_name(dev).unwrap_or_default(),
                arch: format!("sm_{major}{minor}"),
            })
        })
        .collect()
}
