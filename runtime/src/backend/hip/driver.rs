//! [`Driver`] for HIP: the runtime entry points of `api`, on either of HIP's platforms.
//! Handles are plain addresses ([`Handle`]), released only through the driver; the
//! runtime library itself is never unloaded (see `api`), and modules never are either.

use std::ffi::{CString, c_int, c_void};
use std::task::Poll;

use strata_compiler::emit::Dialect;

use super::api::{self, Api, Platform};
use crate::backend::gpu::{Driver, Failure, Geometry};
use crate::backend::{DeviceInfo, RunError};

/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, the opt-in [`Api::func_set_attribute`]
/// sets on the NVIDIA platform.
const MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;

/// A HIP object (stream, event, allocation, module, function or graph), owned: released
/// once, through [`HipDriver`], or leaked.
#[derive(Debug)]
pub struct Handle(*mut c_void);

/// The HIP runtime, with the device it was set to.
pub struct HipDriver {
    api: Api,
    device: c_int,
}

impl HipDriver {
    fn event(&self, flags: u32) -> Result<*mut c_void, RunError> {
        let mut event = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { self.api.check("hipEventCreateWithFlags", (self.api.event_create)(&mut event, flags))? };
        Ok(event)
    }
}

impl Driver for HipDriver {
    type Stream = Handle;
    type Event = Handle;
    type Buffer = Handle;
    type Module = Handle;
    type Function = Handle;
    type Graph = Handle;

    /// Loads the runtime of the platform `HIP_PLATFORM` names and sets device `ordinal`.
    fn open(ordinal: usize) -> Result<HipDriver, RunError> {
        let api = Api::load(Platform::from_env())?;
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
        Ok(HipDriver { api, device: ordinal as c_int })
    }

    fn info(&self) -> DeviceInfo {
        let mut version = 0;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: each call writes plain values to valid out-pointers.
        unsafe {
            (self.api.driver_get_version)(&mut version);
            (self.api.mem_get_info)(&mut free, &mut total);
        }
        let (platform, dialect) = match self.api.platform {
            Platform::Amd => ("HIP driver", Dialect::Hip),
            Platform::Nvidia => ("HIP on CUDA driver", Dialect::Cuda),
        };
        DeviceInfo {
            backend: "hip",
            name: self.api.name(self.device),
            arch: self.api.arch(self.device).unwrap_or_else(|| "unknown".into()),
            driver: format!("{platform} {version}"),
            memory: total as u64,
            dialect: Some(dialect),
        }
    }

    fn new_stream(&self) -> Result<Handle, RunError> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe {
            self.api
                .check("hipStreamCreateWithFlags", (self.api.stream_create)(&mut stream, api::STREAM_NON_BLOCKING))?
        };
        Ok(Handle(stream))
    }

    fn destroy_stream(&self, stream: Handle) {
        // SAFETY: a stream of this driver, owned by `stream` and so released once.
        unsafe { (self.api.stream_destroy)(stream.0) };
    }

    fn drain(&self, stream: &Handle) {
        // SAFETY: a live stream.
        let _ = unsafe { (self.api.stream_synchronize)(stream.0) };
    }

    fn load_module(&self, image: &[u8]) -> Result<Handle, RunError> {
        // A code object, or PTX text on the NVIDIA platform, which must end in a NUL.
        let mut image = image.to_vec();
        image.push(0);
        let mut handle = std::ptr::null_mut();
        // SAFETY: `image` is a complete module that outlives the call (HIP copies it).
        unsafe {
            self.api.check("hipModuleLoadData", (self.api.module_load_data)(&mut handle, image.as_ptr().cast()))?
        };
        Ok(Handle(handle))
    }

    /// AMD parts give a block all of its 64 KiB of LDS without opting in; on the NVIDIA
    /// platform a kernel opts in to its dynamic shared memory, as the CUDA backend's do
    /// (required beyond 48 KiB).
    fn function(&self, module: &Handle, name: &str, dynamic_shared: u32) -> Result<Handle, RunError> {
        let c_name = CString::new(name).map_err(|e| RunError::Other(e.to_string()))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: a valid module handle and NUL-terminated name.
        unsafe {
            self.api.check(
                &format!("hipModuleGetFunction({name})"),
                (self.api.module_get_function)(&mut f, module.0, c_name.as_ptr()),
            )?
        };
        if self.api.platform == Platform::Nvidia && dynamic_shared > 0 {
            let bytes = c_int::try_from(dynamic_shared).unwrap_or(c_int::MAX);
            // SAFETY: `f` is the function just loaded; the attribute takes a byte count.
            unsafe {
                self.api.check(
                    &format!("cuFuncSetAttribute({name}, {dynamic_shared} bytes of dynamic shared memory)"),
                    (self.api.func_set_attribute)(f, MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
                )?
            };
        }
        Ok(Handle(f))
    }

    fn alloc(&self, stream: &Handle, bytes: usize) -> Result<Handle, RunError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the allocation is zeroed on the stream before use.
        unsafe {
            self.api.check(&format!("hipMalloc({bytes} bytes)"), (self.api.malloc)(&mut p, bytes.max(1)))?;
            self.api.check("hipMemsetAsync", (self.api.memset_async)(p, 0, bytes.max(1), stream.0))?;
        }
        Ok(Handle(p))
    }

    fn address(&self, buffer: &Handle) -> u64 {
        buffer.0 as u64
    }

    fn free(&self, buffer: Handle) {
        // SAFETY: an allocation of this driver, owned by `buffer` and so freed once.
        unsafe { (self.api.free)(buffer.0) };
    }

    fn alloc_host(&self, bytes: usize) -> Result<*mut u8, RunError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; default flags (page-locked, portable to this device).
        unsafe {
            self.api.check(&format!("hipHostMalloc({bytes} bytes)"), (self.api.host_malloc)(&mut p, bytes.max(1), 0))?
        };
        Ok(p.cast())
    }

    unsafe fn free_host(&self, ptr: *mut u8) {
        // SAFETY: `ptr` came from hipHostMalloc and is freed once (the caller's contract).
        unsafe { (self.api.host_free)(ptr.cast()) };
    }

    unsafe fn write(&self, stream: &Handle, dst: u64, data: &[u8]) -> Result<(), RunError> {
        // SAFETY: the destination lies within a live allocation (the caller's contract).
        // The source is pageable host memory, which HIP (as CUDA) copies out before the
        // call returns.
        unsafe {
            self.api.check(
                "hipMemcpyAsync(HtoD)",
                (self.api.memcpy_async)(
                    dst as *mut c_void,
                    data.as_ptr().cast(),
                    data.len(),
                    api::HOST_TO_DEVICE,
                    stream.0,
                ),
            )
        }
    }

    unsafe fn read(&self, stream: &Handle, src: u64, out: &mut [u8]) -> Result<(), Failure> {
        // SAFETY: the source lies within a live allocation (the caller's contract); the
        // destination is a live host slice, read only after the stream has drained.
        let code = unsafe {
            self.api.check(
                "hipMemcpyAsync(DtoH)",
                (self.api.memcpy_async)(
                    out.as_mut_ptr().cast(),
                    src as *const c_void,
                    out.len(),
                    api::DEVICE_TO_HOST,
                    stream.0,
                ),
            )?;
            (self.api.stream_synchronize)(stream.0)
        };
        if code != api::SUCCESS {
            return Err(Failure::Kernel(self.api.message(code)));
        }
        Ok(())
    }

    unsafe fn copy(&self, stream: &Handle, dst: u64, src: u64, bytes: usize) -> Result<(), RunError> {
        // SAFETY: both ranges lie within live allocations (the caller's contract).
        unsafe {
            self.api.check(
                "hipMemcpyAsync(DtoD)",
                (self.api.memcpy_async)(
                    dst as *mut c_void,
                    src as *const c_void,
                    bytes,
                    api::DEVICE_TO_DEVICE,
                    stream.0,
                ),
            )
        }
    }

    unsafe fn upload(&self, stream: &Handle, dst: u64, src: &[u8]) -> Result<(), RunError> {
        // SAFETY: the pinned source outlives the copy; the destination lies within a live
        // allocation (the caller's contract).
        unsafe {
            self.api.check(
                "hipMemcpyAsync(upload)",
                (self.api.memcpy_async)(
                    dst as *mut c_void,
                    src.as_ptr().cast(),
                    src.len(),
                    api::HOST_TO_DEVICE,
                    stream.0,
                ),
            )
        }
    }

    /// HIP has no programmatic dependent launch: `dependent` is ignored (the kernel's
    /// in-kernel wait compiles to nothing there).
    unsafe fn launch(
        &self,
        stream: &Handle,
        function: &Handle,
        Geometry { grid: [x, y, z], threads, dynamic_shared }: Geometry,
        _dependent: bool,
        params: &mut [*mut c_void],
    ) -> Result<(), Failure> {
        // SAFETY: the parameters match the kernel's signature and outlive the call, which
        // copies them; the geometry is within the device's limits (the caller's contract).
        let code = unsafe {
            (self.api.module_launch_kernel)(
                function.0,
                x,
                y,
                z,
                threads,
                1,
                1,
                dynamic_shared,
                stream.0,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if code != api::SUCCESS {
            return Err(Failure::Kernel(self.api.message(code)));
        }
        Ok(())
    }

    fn record(&self, stream: &Handle, timed: bool) -> Result<Handle, RunError> {
        let event = self.event(if timed { api::EVENT_TIMED } else { api::EVENT_UNTIMED })?;
        // SAFETY: a live event and stream.
        unsafe { self.api.check("hipEventRecord", (self.api.event_record)(event, stream.0))? };
        Ok(Handle(event))
    }

    fn poll(&self, event: &Handle) -> Poll<Result<(), Failure>> {
        // SAFETY: a live event.
        match unsafe { (self.api.event_query)(event.0) } {
            api::NOT_READY => Poll::Pending,
            api::SUCCESS => Poll::Ready(Ok(())),
            code => Poll::Ready(Err(Failure::Kernel(self.api.message(code)))),
        }
    }

    fn synchronize(&self, event: &Handle) -> Result<(), RunError> {
        // SAFETY: a recorded event of this driver.
        unsafe { self.api.check("hipEventSynchronize", (self.api.event_synchronize)(event.0)) }
    }

    fn elapsed_ms(&self, from: &Handle, to: &Handle) -> Result<f32, RunError> {
        let mut ms = 0f32;
        self.synchronize(to)?;
        // SAFETY: two recorded timing events of this driver.
        unsafe { self.api.check("hipEventElapsedTime", (self.api.event_elapsed_time)(&mut ms, from.0, to.0))? };
        Ok(ms)
    }

    fn stream_wait(&self, stream: &Handle, event: &Handle) -> Result<(), RunError> {
        // SAFETY: a live stream and event.
        unsafe { self.api.check("hipStreamWaitEvent", (self.api.stream_wait_event)(stream.0, event.0, 0)) }
    }

    fn destroy_event(&self, event: Handle) {
        // SAFETY: an event of this driver, owned by `event` and so destroyed once.
        unsafe { (self.api.event_destroy)(event.0) };
    }

    fn begin_capture(&self, stream: &Handle) -> Result<(), RunError> {
        // SAFETY: a live stream.
        unsafe {
            self.api
                .check("hipStreamBeginCapture", (self.api.stream_begin_capture)(stream.0, api::CAPTURE_THREAD_LOCAL))
        }
    }

    fn end_capture(&self, stream: &Handle) -> Result<Option<Handle>, RunError> {
        let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: ends the capture begun on this stream; the graph is destroyed once its
        // executable instance exists (which keeps what it needs).
        unsafe {
            self.api.check("hipStreamEndCapture", (self.api.stream_end_capture)(stream.0, &mut graph))?;
            if graph.is_null() {
                return Ok(None);
            }
            let made = (self.api.graph_instantiate)(&mut exec, graph, 0);
            (self.api.graph_destroy)(graph);
            self.api.check("hipGraphInstantiateWithFlags", made)?;
        }
        Ok(Some(Handle(exec)))
    }

    fn launch_graph(&self, stream: &Handle, graph: &Handle) -> Result<(), RunError> {
        // SAFETY: an instantiated graph of this driver, launched on its stream.
        unsafe { self.api.check("hipGraphLaunch", (self.api.graph_launch)(graph.0, stream.0)) }
    }

    fn destroy_graph(&self, graph: Handle) {
        // SAFETY: an instantiated graph of this driver, owned by `graph` and so destroyed once.
        unsafe { (self.api.graph_exec_destroy)(graph.0) };
    }
}
