//! The HIP backend: code objects through HIP's module API, with libamdhip64 loaded at
//! run time by a small shim (no ROCm is needed to build).
//!
//! No AMD GPU is available where strata is developed: this backend compiles, its pure
//! parts are unit-tested, and without a HIP runtime it refuses with one clear line. The
//! full HIP path (graphs, pinned memory, device enumeration) is the AMD issue's work.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::time::{Duration, Instant};

use libloading::Library;
use strata_compiler::plan::KernelSpec;

use super::{Arg, Backend, BufferId, DeviceInfo, GraphId, RunError, grid};

type HipError = c_int;
const HIP_SUCCESS: HipError = 0;
const HIP_ERROR_NOT_READY: HipError = 600;
const MEMCPY_HOST_TO_DEVICE: c_int = 1;
const MEMCPY_DEVICE_TO_HOST: c_int = 2;
const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// The HIP runtime functions strata calls, resolved from libamdhip64.
struct Api {
    _lib: Library,
    init: unsafe extern "C" fn(c_uint) -> HipError,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    set_device: unsafe extern "C" fn(c_int) -> HipError,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    get_device_properties: unsafe extern "C" fn(*mut c_void, c_int) -> HipError,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    memset: unsafe extern "C" fn(*mut c_void, c_int, usize) -> HipError,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipError,
    module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> HipError,
    module_get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> HipError,
    #[allow(clippy::type_complexity)]
    module_launch_kernel: unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    stream_query: unsafe extern "C" fn(*mut c_void) -> HipError,
    device_synchronize: unsafe extern "C" fn() -> HipError,
    get_error_string: unsafe extern "C" fn(HipError) -> *const c_char,
}

impl Api {
    fn load() -> Result<Api, RunError> {
        let names = ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "/opt/rocm/lib/libamdhip64.so"];
        // SAFETY: loading libamdhip64 runs only its initializers.
        let lib = names.iter().find_map(|n| unsafe { Library::new(*n) }.ok()).ok_or_else(|| {
            RunError::NoDevice("HIP backend: no HIP runtime (libamdhip64.so) on this machine; install ROCm 6.2+ or use --backend cpu|cuda".into())
        })?;
        macro_rules! sym {
            ($($name:literal)|+) => {{
                let mut found = None;
                $(
                    if found.is_none() {
                        // SAFETY: the symbol is a HIP runtime C function whose signature
                        // matches the field it is stored in (HIP runtime API, ROCm 6/7).
                        found = unsafe {
                            lib.get::<*const c_void>(concat!($name, "\0").as_bytes())
                                .ok()
                                .map(|s| std::mem::transmute_copy(&*s))
                        };
                    }
                )+
                found.ok_or_else(|| RunError::NoDevice(format!("HIP backend: libamdhip64 lacks {}", [$($name),+].join(" / "))))?
            }};
        }
        Ok(Api {
            init: sym!("hipInit"),
            get_device_count: sym!("hipGetDeviceCount"),
            set_device: sym!("hipSetDevice"),
            device_get_name: sym!("hipDeviceGetName"),
            get_device_properties: sym!("hipGetDevicePropertiesR0600" | "hipGetDeviceProperties"),
            driver_get_version: sym!("hipDriverGetVersion"),
            malloc: sym!("hipMalloc"),
            memset: sym!("hipMemset"),
            memcpy: sym!("hipMemcpy"),
            module_load_data: sym!("hipModuleLoadData"),
            module_get_function: sym!("hipModuleGetFunction"),
            module_launch_kernel: sym!("hipModuleLaunchKernel"),
            stream_query: sym!("hipStreamQuery"),
            device_synchronize: sym!("hipDeviceSynchronize"),
            get_error_string: sym!("hipGetErrorString"),
            _lib: lib,
        })
    }

    fn check(&self, call: &str, code: HipError) -> Result<(), RunError> {
        if code == HIP_SUCCESS {
            return Ok(());
        }
        // SAFETY: hipGetErrorString returns a static NUL-terminated string for any code.
        let message = unsafe { CStr::from_ptr((self.get_error_string)(code)) }.to_string_lossy().into_owned();
        Err(RunError::Driver { call: call.into(), message: format!("{message} ({code})") })
    }
}

/// The architecture name (`gfx1100`) in a `hipDeviceProp_t` read into `props`: the
/// `gcnArchName` field, found by content (`gfx…` up to `:` or NUL) rather than by an
/// offset that differs between ROCm versions.
pub fn arch_from_properties(props: &[u8]) -> Option<String> {
    props.windows(4).enumerate().find_map(|(i, w)| {
        let digit_follows = w.starts_with(b"gfx") && w[3].is_ascii_hexdigit();
        digit_follows.then(|| {
            let end = props[i..].iter().position(|&b| b == 0 || b == b':').map_or(props.len(), |e| i + e);
            String::from_utf8_lossy(&props[i..end]).into_owned()
        })
    })
}

/// A HIP device with its loaded kernels.
pub struct Hip {
    api: Api,
    device: c_int,
    buffers: Vec<(usize, usize)>,
    functions: std::collections::HashMap<String, usize>,
    last_kernel: String,
    errors: Option<BufferId>,
}

impl Hip {
    /// Opens HIP device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Hip, RunError> {
        let api = Api::load()?;
        // SAFETY: plain HIP runtime calls with valid out-pointers.
        unsafe {
            api.check("hipInit", (api.init)(0))?;
            let mut count = 0;
            api.check("hipGetDeviceCount", (api.get_device_count)(&mut count))?;
            if ordinal as c_int >= count {
                return Err(RunError::NoDevice(format!("HIP backend: device {ordinal} asked for, {count} present")));
            }
            api.check("hipSetDevice", (api.set_device)(ordinal as c_int))?;
        }
        Ok(Hip {
            api,
            device: ordinal as c_int,
            buffers: Vec::new(),
            functions: Default::default(),
            last_kernel: String::new(),
            errors: None,
        })
    }

    fn pointer(&self, id: BufferId, offset: usize) -> usize {
        self.buffers[id.0].0 + offset
    }
}

impl Backend for Hip {
    fn info(&self) -> DeviceInfo {
        let mut name = [0 as c_char; 256];
        let mut props = vec![0u8; 8192];
        let mut version = 0;
        // SAFETY: the name buffer is 256 bytes as passed; the properties buffer is far
        // larger than any hipDeviceProp_t; the version is one int.
        unsafe {
            (self.api.device_get_name)(name.as_mut_ptr(), 256, self.device);
            (self.api.get_device_properties)(props.as_mut_ptr().cast(), self.device);
            (self.api.driver_get_version)(&mut version);
        }
        // SAFETY: hipDeviceGetName NUL-terminates within the buffer (zeroed beforehand).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        DeviceInfo {
            backend: "hip",
            name,
            arch: arch_from_properties(&props).unwrap_or_else(|| "unknown".into()),
            driver: format!("HIP driver {version}"),
            memory: 0,
        }
    }

    fn load(&mut self, module: &[u8], kernels: &[KernelSpec]) -> Result<(), RunError> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: `module` is a complete code object that outlives the call (HIP copies it).
        unsafe {
            self.api.check("hipModuleLoadData", (self.api.module_load_data)(&mut handle, module.as_ptr().cast()))?
        };
        for spec in kernels {
            let name = CString::new(spec.name.as_str()).map_err(|e| RunError::Other(e.to_string()))?;
            let mut f = std::ptr::null_mut();
            // SAFETY: valid module handle and NUL-terminated name.
            unsafe {
                self.api.check(
                    &format!("hipModuleGetFunction({})", spec.name),
                    (self.api.module_get_function)(&mut f, handle, name.as_ptr()),
                )?
            };
            self.functions.insert(spec.name.clone(), f as usize);
        }
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufferId, RunError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer is valid; the allocation is zeroed before use.
        unsafe {
            self.api.check(&format!("hipMalloc({bytes} bytes)"), (self.api.malloc)(&mut p, bytes.max(1)))?;
            self.api.check("hipMemset", (self.api.memset)(p, 0, bytes.max(1)))?;
        }
        self.buffers.push((p as usize, bytes));
        Ok(BufferId(self.buffers.len() - 1))
    }

    fn size(&self, buf: BufferId) -> usize {
        self.buffers[buf.0].1
    }

    fn write(&mut self, buf: BufferId, offset: usize, data: &[u8]) -> Result<(), RunError> {
        if offset + data.len() > self.size(buf) {
            return Err(RunError::Other("write past the end of a buffer".into()));
        }
        let dst = self.pointer(buf, offset) as *mut c_void;
        // SAFETY: destination range checked above; source is a live host slice.
        unsafe {
            self.api
                .check("hipMemcpyHtoD", (self.api.memcpy)(dst, data.as_ptr().cast(), data.len(), MEMCPY_HOST_TO_DEVICE))
        }
    }

    fn read(&mut self, buf: BufferId, offset: usize, out: &mut [u8]) -> Result<(), RunError> {
        if offset + out.len() > self.size(buf) {
            return Err(RunError::Other("read past the end of a buffer".into()));
        }
        let src = self.pointer(buf, offset) as *const c_void;
        // SAFETY: source range checked above; destination is a live host slice.
        unsafe {
            self.api.check(
                "hipMemcpyDtoH",
                (self.api.memcpy)(out.as_mut_ptr().cast(), src, out.len(), MEMCPY_DEVICE_TO_HOST),
            )
        }
    }

    fn copy(&mut self, from: BufferId, to: BufferId, bytes: usize) -> Result<(), RunError> {
        if bytes > self.size(from) || bytes > self.size(to) {
            return Err(RunError::Other("copy past the end of a buffer".into()));
        }
        let (src, dst) = (self.pointer(from, 0) as *const c_void, self.pointer(to, 0) as *mut c_void);
        // SAFETY: both ranges are within live device allocations (checked above).
        unsafe { self.api.check("hipMemcpyDtoD", (self.api.memcpy)(dst, src, bytes, MEMCPY_DEVICE_TO_DEVICE)) }
    }

    fn launch(&mut self, spec: &KernelSpec, args: &[Arg]) -> Result<(), RunError> {
        let f = *self.functions.get(&spec.name).ok_or_else(|| RunError::Launch {
            kernel: spec.name.clone(),
            message: "not in the loaded module".into(),
        })?;
        let [x, y, z] = grid(spec, args);
        if x == 0 || y == 0 || z == 0 {
            return Ok(());
        }
        let mut values: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Buf(id, offset) => self.pointer(id, offset) as u64,
                Arg::U32(v) => u64::from(v),
            })
            .collect();
        // Each parameter points at its value; u32 scalars read the low half (little-endian).
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        // SAFETY: parameters follow the kernel's signature from its plan record, and the
        // geometry is the record's, checked against the target before the build.
        let code = unsafe {
            (self.api.module_launch_kernel)(
                f as *mut c_void,
                x,
                y,
                z,
                spec.launch.threads,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.last_kernel = spec.name.clone();
        self.api.check(&format!("hipModuleLaunchKernel({})", spec.name), code)
    }

    fn sync_within(&mut self, deadline: Duration) -> Result<bool, RunError> {
        let start = Instant::now();
        loop {
            // SAFETY: querying the null (default) stream.
            let code = unsafe { (self.api.stream_query)(std::ptr::null_mut()) };
            if code != HIP_ERROR_NOT_READY {
                self.api.check(&format!("kernel {}", self.last_kernel), code)?;
                // SAFETY: plain call.
                return unsafe { self.api.check("hipDeviceSynchronize", (self.api.device_synchronize)()) }
                    .map(|_| true);
            }
            if start.elapsed() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn error_slot(&mut self) -> &mut Option<BufferId> {
        &mut self.errors
    }

    fn begin_capture(&mut self) -> Result<(), RunError> {
        Err(RunError::Other("HIP graphs are not implemented yet (the AMD issue adds them)".into()))
    }

    fn end_capture(&mut self) -> Result<GraphId, RunError> {
        Err(RunError::Other("HIP graphs are not implemented yet".into()))
    }

    fn replay(&mut self, _graph: GraphId) -> Result<(), RunError> {
        Err(RunError::Other("HIP graphs are not implemented yet".into()))
    }
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
        if Api::load().is_ok() {
            return; // a machine with ROCm
        }
        let e = Hip::new(0).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.starts_with("HIP backend: no HIP runtime (libamdhip64.so)"), "{e}");
        assert_eq!(e.lines().count(), 1);
    }
}
