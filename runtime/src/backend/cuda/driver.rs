//! [`Driver`] for CUDA: the driver API through cudarc. Handles are cudarc's types, which
//! also release themselves when dropped; releasing one through the driver drops it.
//!
//! cudarc's own event tracking is off (strata orders its two streams itself), so its
//! slices record no events, which would also enter graphs; copies go through cudarc's
//! `result` layer on device addresses, as its stream methods do without tracking.

use std::ffi::c_void;
use std::sync::Arc;
use std::task::Poll;

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr};
use cudarc::nvrtc::Ptx;

use super::{driver, driver_present, no_driver};
use crate::backend::gpu::{Driver, Failure, Geometry};
use crate::backend::{DeviceInfo, RunError};

/// A CUDA context on one device.
pub struct CudaDriver {
    ctx: Arc<CudaContext>,
}

impl Driver for CudaDriver {
    type Stream = Arc<CudaStream>;
    type Event = CudaEvent;
    type Buffer = CudaSlice<u8>;
    type Module = Arc<CudaModule>;
    type Function = CudaFunction;
    type Graph = CudaGraph;

    fn open(ordinal: usize) -> Result<CudaDriver, RunError> {
        if !driver_present() {
            return Err(no_driver());
        }
        let count = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            return Err(RunError::NoDevice(format!("CUDA backend: device {ordinal} asked for, {count} present")));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
        // SAFETY: strata orders its streams itself (events where the kernels wait for
        // uploads), so cudarc's cross-stream event tracking is not needed; without it,
        // slices record no events (which would also enter graphs).
        unsafe { ctx.disable_event_tracking() };
        Ok(CudaDriver { ctx })
    }

    fn info(&self) -> DeviceInfo {
        let (major, minor) = self.ctx.compute_capability().unwrap_or((0, 0));
        let mut version = 0i32;
        // SAFETY: cuDriverGetVersion writes one int to the pointer it is given.
        unsafe { sys::cuDriverGetVersion(&mut version) };
        DeviceInfo {
            backend: "cuda",
            name: self.ctx.name().unwrap_or_default(),
            arch: format!("sm_{major}{minor}"),
            driver: format!("CUDA driver {}.{}", version / 1000, version % 1000 / 10),
            memory: self.ctx.total_mem().unwrap_or(0) as u64,
            dialect: Some(strata_compiler::emit::Dialect::Cuda),
        }
    }

    fn new_stream(&self) -> Result<Arc<CudaStream>, RunError> {
        self.ctx.new_stream().map_err(driver("cuStreamCreate"))
    }

    fn destroy_stream(&self, stream: Arc<CudaStream>) {
        drop(stream);
    }

    fn drain(&self, _stream: &Arc<CudaStream>) {
        // Nothing: cudarc frees device memory on the stream, after the work queued there.
    }

    fn load_module(&self, image: &[u8]) -> Result<Arc<CudaModule>, RunError> {
        let text = String::from_utf8_lossy(image).into_owned();
        self.ctx.load_module(Ptx::from_src(text)).map_err(driver("cuModuleLoadData"))
    }

    fn function(&self, module: &Arc<CudaModule>, name: &str, dynamic_shared: u32) -> Result<CudaFunction, RunError> {
        let f = module.load_function(name).map_err(driver(&format!("cuModuleGetFunction({name})")))?;
        // A kernel opts in to its dynamic shared memory (required beyond 48 KiB).
        if dynamic_shared > 0 {
            let bytes = i32::try_from(dynamic_shared).unwrap_or(i32::MAX);
            f.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes)
                .map_err(driver(&format!(
                    "cuFuncSetAttribute({name}, {dynamic_shared} bytes of dynamic shared memory)"
                )))?;
        }
        Ok(f)
    }

    fn alloc(&self, stream: &Arc<CudaStream>, bytes: usize) -> Result<CudaSlice<u8>, RunError> {
        stream.alloc_zeros::<u8>(bytes.max(1)).map_err(driver(&format!("cuMemAlloc({bytes} bytes)")))
    }

    fn address(&self, buffer: &CudaSlice<u8>) -> u64 {
        let (ptr, _sync) = buffer.device_ptr(buffer.stream());
        ptr
    }

    fn free(&self, buffer: CudaSlice<u8>) {
        drop(buffer);
    }

    fn alloc_host(&self, bytes: usize) -> Result<*mut u8, RunError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: cuMemHostAlloc returns `bytes` of page-locked memory or an error.
        let ptr =
            unsafe { cu::malloc_host(bytes.max(1), 0) }.map_err(driver(&format!("cuMemHostAlloc({bytes} bytes)")))?;
        Ok(ptr.cast())
    }

    unsafe fn free_host(&self, ptr: *mut u8) {
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once (the caller's contract).
        let _ = unsafe { cu::free_host(ptr.cast()) };
    }

    unsafe fn write(&self, stream: &Arc<CudaStream>, dst: u64, data: &[u8]) -> Result<(), RunError> {
        self.ctx.bind_to_thread().map_err(driver("cuMemcpyHtoDAsync"))?;
        // SAFETY: the destination lies within a live allocation (the caller's contract);
        // the source is pageable, which the driver copies out before returning.
        unsafe { cu::memcpy_htod_async(dst, data, stream.cu_stream()) }.map_err(driver("cuMemcpyHtoDAsync"))
    }

    unsafe fn read(&self, stream: &Arc<CudaStream>, src: u64, out: &mut [u8]) -> Result<(), Failure> {
        self.ctx.bind_to_thread().map_err(driver("cuMemcpyDtoH"))?;
        // SAFETY: the source lies within a live allocation (the caller's contract); a
        // copy to pageable memory returns once it has landed, after the stream's work.
        unsafe { cu::memcpy_dtoh_async(out, src, stream.cu_stream()) }.map_err(driver("cuMemcpyDtoH"))?;
        Ok(())
    }

    unsafe fn copy(&self, stream: &Arc<CudaStream>, dst: u64, src: u64, bytes: usize) -> Result<(), RunError> {
        self.ctx.bind_to_thread().map_err(driver("cuMemcpyDtoDAsync"))?;
        // SAFETY: both ranges lie within live allocations (the caller's contract).
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }.map_err(driver("cuMemcpyDtoDAsync"))
    }

    unsafe fn upload(&self, stream: &Arc<CudaStream>, dst: u64, src: &[u8]) -> Result<(), RunError> {
        // SAFETY: `src` is page-locked and outlives the copy; the destination lies within
        // a live allocation (the caller's contract).
        unsafe { cu::memcpy_htod_async(dst, src, stream.cu_stream()) }.map_err(driver("cuMemcpyHtoDAsync"))
    }

    unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        function: &CudaFunction,
        Geometry { grid: [x, y, z], threads, dynamic_shared }: Geometry,
        dependent: bool,
        params: &mut [*mut c_void],
    ) -> Result<(), Failure> {
        // A dependent launches as a programmatic dependent of the kernel before it
        // (cuLaunchKernelEx's programmatic stream serialization attribute).
        // SAFETY: a zeroed launch attribute is plain data; id and value are set next.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: x,
            gridDimY: y,
            gridDimZ: z,
            blockDimX: threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: dynamic_shared,
            hStream: stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: u32::from(dependent),
        };
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: the parameters match the kernel's signature and outlive the call, which
        // copies them; the geometry is within the device's limits (the caller's contract).
        unsafe { sys::cuLaunchKernelEx(&config, function.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| Failure::Kernel(e.to_string()))
    }

    fn record(&self, stream: &Arc<CudaStream>, timed: bool) -> Result<CudaEvent, RunError> {
        // cudarc's default (`None`) is an event without timing.
        let flags = timed.then_some(CUevent_flags::CU_EVENT_DEFAULT);
        stream.record_event(flags).map_err(driver("cuEventRecord"))
    }

    fn poll(&self, event: &CudaEvent) -> Poll<Result<(), Failure>> {
        // cudarc's `is_complete` reads any error of cuEventQuery as "not yet", so a failure
        // surfaces through cuEventSynchronize only once the query succeeds.
        if !event.is_complete() {
            return Poll::Pending;
        }
        Poll::Ready(event.synchronize().map_err(|e| Failure::Kernel(e.to_string())))
    }

    fn synchronize(&self, event: &CudaEvent) -> Result<(), RunError> {
        event.synchronize().map_err(driver("cuEventSynchronize"))
    }

    fn elapsed_ms(&self, from: &CudaEvent, to: &CudaEvent) -> Result<f32, RunError> {
        from.elapsed_ms(to).map_err(driver("cuEventElapsedTime"))
    }

    fn stream_wait(&self, stream: &Arc<CudaStream>, event: &CudaEvent) -> Result<(), RunError> {
        stream.wait(event).map_err(driver("cuStreamWaitEvent"))
    }

    fn destroy_event(&self, event: CudaEvent) {
        drop(event);
    }

    fn begin_capture(&self, stream: &Arc<CudaStream>) -> Result<(), RunError> {
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("cuStreamBeginCapture"))
    }

    fn end_capture(&self, stream: &Arc<CudaStream>) -> Result<Option<CudaGraph>, RunError> {
        let Some(graph) = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver("cuStreamEndCapture"))? else {
            return Ok(None);
        };
        graph.upload().map_err(driver("cuGraphUpload"))?;
        Ok(Some(graph))
    }

    fn launch_graph(&self, _stream: &Arc<CudaStream>, graph: &CudaGraph) -> Result<(), RunError> {
        // A cudarc graph launches on the stream it was captured on.
        graph.launch().map_err(driver("cuGraphLaunch"))
    }

    fn destroy_graph(&self, graph: CudaGraph) {
        drop(graph);
    }
}
