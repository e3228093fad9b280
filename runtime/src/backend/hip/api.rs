//! The HIP runtime functions strata calls, resolved at run time, on either of HIP's two
//! platforms.
//!
//! HIP is CUDA's API under other names: on AMD it is libamdhip64; on NVIDIA, HIP itself
//! is a thin layer that forwards each call to the CUDA runtime or driver function with
//! the same signature and error codes (`HIP_PLATFORM=nvidia`). Each entry below names
//! its HIP function and the CUDA function HIP forwards it to, so the same backend code
//! runs on an AMD GPU through ROCm and on an NVIDIA GPU through CUDA. That is how the
//! HIP backend's host code (streams, events, graphs, pinned memory, copies, watchdog)
//! is exercised where no AMD GPU is available.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use libloading::Library;

use crate::backend::RunError;

/// `hipError_t` (the same codes as CUDA's for everything strata tells apart).
pub type HipError = c_int;
/// `hipSuccess`.
pub const SUCCESS: HipError = 0;
/// `hipErrorNotReady`: queued work has not finished.
pub const NOT_READY: HipError = 600;
/// `hipMemcpyKind` values.
pub const HOST_TO_DEVICE: c_int = 1;
/// See [`HOST_TO_DEVICE`].
pub const DEVICE_TO_HOST: c_int = 2;
/// See [`HOST_TO_DEVICE`].
pub const DEVICE_TO_DEVICE: c_int = 3;
/// `hipStreamNonBlocking`: no implicit synchronization with the null stream.
pub const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipEventDefault` (timed) and `hipEventDisableTiming`.
pub const EVENT_TIMED: c_uint = 0;
/// See [`EVENT_TIMED`].
pub const EVENT_UNTIMED: c_uint = 2;
/// `hipStreamCaptureModeThreadLocal`.
pub const CAPTURE_THREAD_LOCAL: c_int = 1;
/// `hipDeviceAttributeComputeCapabilityMajor` / `Minor` on the NVIDIA platform (CUDA's
/// `cudaDevAttrComputeCapabilityMajor` / `Minor`).
const NVIDIA_CC_MAJOR: c_int = 75;
const NVIDIA_CC_MINOR: c_int = 76;

/// Opaque handles.
pub type Stream = *mut c_void;
/// See [`Stream`].
pub type Event = *mut c_void;

/// Which implementation of HIP is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// ROCm's libamdhip64.
    Amd,
    /// HIP on NVIDIA: the CUDA runtime and driver (`HIP_PLATFORM=nvidia`).
    Nvidia,
}

impl Platform {
    /// The platform `HIP_PLATFORM` names (`amd` when unset, as on a ROCm install).
    pub fn from_env() -> Platform {
        match std::env::var("HIP_PLATFORM").as_deref() {
            Ok("nvidia" | "nvcc") => Platform::Nvidia,
            _ => Platform::Amd,
        }
    }

    fn libraries(self) -> &'static [&'static [&'static str]] {
        match self {
            Platform::Amd => {
                &[&["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "/opt/rocm/lib/libamdhip64.so"]]
            }
            Platform::Nvidia => &[
                &["libcudart.so", "libcudart.so.13", "libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so"],
                &["libcuda.so.1", "libcuda.so"],
            ],
        }
    }
}

macro_rules! api {
    ($( $(#[$doc:meta])* $field:ident: fn($($arg:ty),*) = $($name:literal)|+; )*) => {
        /// Resolved HIP runtime entry points (see the module documentation).
        pub struct Api {
            /// Which HIP this is.
            pub platform: Platform,
            /// Never unloaded (leaked): unloading the runtime runs its teardown, which
            /// waits forever for a hung kernel.
            libs: &'static [Library],
            $( $(#[$doc])* pub $field: unsafe extern "C" fn($($arg),*) -> HipError, )*
        }

        impl Api {
            fn resolve(platform: Platform, libs: Vec<Library>) -> Result<Api, RunError> {
                let find = |names: &[&str]| -> Option<*const c_void> {
                    names.iter().find_map(|name| {
                        let symbol = format!("{name}\0");
                        libs.iter().find_map(|lib| {
                            // SAFETY: only the symbol's address is read here.
                            unsafe { lib.get::<*const c_void>(symbol.as_bytes()) }.ok().map(|s| *s)
                        })
                    })
                };
                $(
                    let names: &[&str] = &[$($name),+];
                    let address = find(names).ok_or_else(|| {
                        RunError::NoDevice(format!("HIP backend: the runtime lacks {}", names.join(" / ")))
                    })?;
                    // SAFETY: each name is a C function whose signature (HIP runtime API,
                    // ROCm 6/7, or the CUDA function HIP forwards it to) is the field's.
                    let $field = unsafe { std::mem::transmute::<*const c_void, unsafe extern "C" fn($($arg),*) -> HipError>(address) };
                )*
                Ok(Api { platform, libs: Vec::leak(libs), $($field),* })
            }
        }
    };
}

api! {
    init: fn(c_uint) = "hipInit" | "cuInit";
    get_device_count: fn(*mut c_int) = "hipGetDeviceCount" | "cudaGetDeviceCount";
    set_device: fn(c_int) = "hipSetDevice" | "cudaSetDevice";
    device_get_name: fn(*mut c_char, c_int, c_int) = "hipDeviceGetName" | "cuDeviceGetName";
    /// AMD: fills a `hipDeviceProp_t` (read by [`arch_from_properties`]); not called on NVIDIA.
    get_device_properties: fn(*mut c_void, c_int) = "hipGetDevicePropertiesR0600" | "hipGetDeviceProperties" | "cudaGetDeviceProperties_v2" | "cudaGetDeviceProperties";
    device_get_attribute: fn(*mut c_int, c_int, c_int) = "hipDeviceGetAttribute" | "cudaDeviceGetAttribute";
    driver_get_version: fn(*mut c_int) = "hipDriverGetVersion" | "cudaDriverGetVersion";
    mem_get_info: fn(*mut usize, *mut usize) = "hipMemGetInfo" | "cudaMemGetInfo";
    malloc: fn(*mut *mut c_void, usize) = "hipMalloc" | "cudaMalloc";
    free: fn(*mut c_void) = "hipFree" | "cudaFree";
    host_malloc: fn(*mut *mut c_void, usize, c_uint) = "hipHostMalloc" | "hipHostAlloc" | "cudaHostAlloc";
    host_free: fn(*mut c_void) = "hipHostFree" | "cudaFreeHost";
    memset_async: fn(*mut c_void, c_int, usize, Stream) = "hipMemsetAsync" | "cudaMemsetAsync";
    memcpy_async: fn(*mut c_void, *const c_void, usize, c_int, Stream) = "hipMemcpyAsync" | "cudaMemcpyAsync";
    stream_create: fn(*mut Stream, c_uint) = "hipStreamCreateWithFlags" | "cudaStreamCreateWithFlags";
    stream_destroy: fn(Stream) = "hipStreamDestroy" | "cudaStreamDestroy";
    stream_synchronize: fn(Stream) = "hipStreamSynchronize" | "cudaStreamSynchronize";
    stream_wait_event: fn(Stream, Event, c_uint) = "hipStreamWaitEvent" | "cudaStreamWaitEvent";
    stream_begin_capture: fn(Stream, c_int) = "hipStreamBeginCapture" | "cudaStreamBeginCapture";
    stream_end_capture: fn(Stream, *mut *mut c_void) = "hipStreamEndCapture" | "cudaStreamEndCapture";
    graph_instantiate: fn(*mut *mut c_void, *mut c_void, u64) = "hipGraphInstantiateWithFlags" | "cudaGraphInstantiateWithFlags";
    graph_launch: fn(*mut c_void, Stream) = "hipGraphLaunch" | "cudaGraphLaunch";
    graph_destroy: fn(*mut c_void) = "hipGraphDestroy" | "cudaGraphDestroy";
    graph_exec_destroy: fn(*mut c_void) = "hipGraphExecDestroy" | "cudaGraphExecDestroy";
    event_create: fn(*mut Event, c_uint) = "hipEventCreateWithFlags" | "cudaEventCreateWithFlags";
    event_destroy: fn(Event) = "hipEventDestroy" | "cudaEventDestroy";
    event_record: fn(Event, Stream) = "hipEventRecord" | "cudaEventRecord";
    event_query: fn(Event) = "hipEventQuery" | "cudaEventQuery";
    event_synchronize: fn(Event) = "hipEventSynchronize" | "cudaEventSynchronize";
    event_elapsed_time: fn(*mut f32, Event, Event) = "hipEventElapsedTime" | "cudaEventElapsedTime";
    module_load_data: fn(*mut *mut c_void, *const c_void) = "hipModuleLoadData" | "cuModuleLoadData";
    module_get_function: fn(*mut *mut c_void, *mut c_void, *const c_char) = "hipModuleGetFunction" | "cuModuleGetFunction";
    /// NVIDIA: a kernel's opt-in to dynamic shared memory past 48 KiB; not called on AMD.
    func_set_attribute: fn(*mut c_void, c_int, c_int) = "hipFuncSetAttribute" | "cuFuncSetAttribute";
    module_launch_kernel: fn(
        *mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Stream, *mut *mut c_void, *mut *mut c_void
    ) = "hipModuleLaunchKernel" | "cuLaunchKernel";
}

/// `hipGetErrorString` / `cudaGetErrorString`.
type ErrorString = unsafe extern "C" fn(HipError) -> *const c_char;

impl Api {
    /// Loads the HIP runtime of `platform`; without one, one line saying what to install.
    pub fn load(platform: Platform) -> Result<Api, RunError> {
        let mut libs = Vec::new();
        for candidates in platform.libraries() {
            // SAFETY: loading the HIP (or CUDA) runtime runs only its initializers.
            let lib = candidates.iter().find_map(|n| unsafe { Library::new(*n) }.ok()).ok_or_else(|| {
                RunError::NoDevice(match platform {
                    Platform::Amd => "HIP backend: no HIP runtime (libamdhip64.so) on this machine; install ROCm 6.2+ or use --backend cpu|cuda".into(),
                    Platform::Nvidia => format!("HIP backend (HIP_PLATFORM=nvidia): no {} on this machine", candidates[0]),
                })
            })?;
            libs.push(lib);
        }
        Api::resolve(platform, libs)
    }

    /// `Ok` for success, else the call and the runtime's message.
    pub fn check(&self, call: &str, code: HipError) -> Result<(), RunError> {
        if code == SUCCESS {
            return Ok(());
        }
        Err(RunError::Driver { call: call.into(), message: self.message(code) })
    }

    /// The runtime's text for `code`, with the code.
    pub fn message(&self, code: HipError) -> String {
        let text = self
            .libs
            .iter()
            .find_map(|lib| {
                // SAFETY: hipGetErrorString / cudaGetErrorString take a code and return a
                // static NUL-terminated string (or null), which is read before returning.
                unsafe {
                    let f = lib
                        .get::<ErrorString>(b"hipGetErrorString\0")
                        .or_else(|_| lib.get::<ErrorString>(b"cudaGetErrorString\0"))
                        .ok()?;
                    let p = f(code);
                    (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
                }
            })
            .unwrap_or_else(|| "unknown error".into());
        format!("{text} ({code})")
    }

    /// The architecture of device `ordinal`: `gfx1100` on AMD (`gcnArchName`), `sm_90` on
    /// NVIDIA (its compute capability).
    pub fn arch(&self, ordinal: c_int) -> Option<String> {
        match self.platform {
            Platform::Amd => {
                let mut props = vec![0u8; 8192];
                // SAFETY: the buffer is far larger than any hipDeviceProp_t.
                let code = unsafe { (self.get_device_properties)(props.as_mut_ptr().cast(), ordinal) };
                (code == SUCCESS).then(|| arch_from_properties(&props)).flatten()
            }
            Platform::Nvidia => {
                let (mut major, mut minor) = (0, 0);
                // SAFETY: each call writes one int.
                let ok = unsafe {
                    (self.device_get_attribute)(&mut major, NVIDIA_CC_MAJOR, ordinal) == SUCCESS
                        && (self.device_get_attribute)(&mut minor, NVIDIA_CC_MINOR, ordinal) == SUCCESS
                };
                ok.then(|| format!("sm_{major}{minor}"))
            }
        }
    }

    /// The name of device `ordinal`.
    pub fn name(&self, ordinal: c_int) -> String {
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer is 256 bytes, as passed, and zeroed (so NUL-terminated).
        unsafe {
            (self.device_get_name)(name.as_mut_ptr(), 255, ordinal);
            CStr::from_ptr(name.as_ptr())
        }
        .to_string_lossy()
        .into_owned()
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
