//! The CUDA backend: PTX modules through the CUDA driver (cudarc, loaded at run time).
//!
//! No CUDA is needed to build. At start the driver library is probed first: cudarc's
//! dynamic loader panics when it is absent, so [`Cuda::new`] refuses with one clear line
//! instead.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr};
use cudarc::nvrtc::Ptx;
use strata_compiler::plan::KernelRecord;

use super::{
    Arg, Backend, BufferId, DeviceEntry, DeviceInfo, GraphId, HostId, Mark, RunError, bounds_error, launch_values,
};

/// Whether a CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
        // SAFETY: loading the CUDA driver runs only its initializers, which are safe to
        // run in any process; the handle is dropped immediately.
        unsafe { libloading::Library::new(*name) }.is_ok()
    })
}

/// The CUDA devices present, each with its architecture, or the reason there are none.
pub fn devices() -> Result<Vec<DeviceEntry>, RunError> {
    use cudarc::driver::result::device;
    if !driver_present() {
        return Err(RunError::NoDevice("CUDA backend: no CUDA driver (libcuda.so.1) on this machine".into()));
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

/// A CUDA device with its loaded kernels.
pub struct Cuda {
    /// Page-locked host memory (first: fields drop in order, and it is freed while the
    /// context is alive).
    host: Vec<PinnedHost>,
    /// Per `await_uploads`: (the kernels reached it, the uploads before it landed).
    waits: Vec<(CudaEvent, CudaEvent)>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    buffers: Vec<CudaSlice<u8>>,
    functions: HashMap<String, CudaFunction>,
    /// Kernel names in manifest order (the ids `--checked` kernels record).
    names: Vec<String>,
    specs: HashMap<String, KernelRecord>,
    graphs: Vec<CudaGraph>,
    /// Timing events recorded by `mark`.
    events: Vec<CudaEvent>,
    errors: Option<BufferId>,
    /// The last kernel queued, to name in a hang report.
    last_kernel: String,
    /// A kernel did not finish: freeing device memory would wait for it forever.
    hung: bool,
    /// The queue of uploads from host memory, beside `stream`.
    copy: Option<Arc<CudaStream>>,
}

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
struct PinnedHost {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation belongs to this value alone; moving it to another thread moves
// that ownership (the CUDA context it came from is usable from any thread).
unsafe impl Send for PinnedHost {}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once; the backend syncs its
        // queues before dropping, so no copy reads it any more.
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr.cast()) };
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        if self.hung {
            // Leak everything: cuMemFree, cuModuleUnload and context release all wait for
            // the running kernel, so the process could not report the hang and exit.
            std::mem::forget(std::mem::take(&mut self.buffers));
            std::mem::forget(std::mem::take(&mut self.graphs));
            std::mem::forget(std::mem::take(&mut self.functions));
            std::mem::forget(Arc::clone(&self.stream));
            std::mem::forget(std::mem::take(&mut self.host));
            std::mem::forget(Arc::clone(&self.ctx));
        }
    }
}

fn driver(call: &str) -> impl Fn(cudarc::driver::DriverError) -> RunError + '_ {
    move |e| RunError::Driver { call: call.into(), message: e.to_string() }
}

impl Cuda {
    /// Opens CUDA device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Cuda, RunError> {
        if !driver_present() {
            return Err(RunError::NoDevice("CUDA backend: no CUDA driver (libcuda.so.1) on this machine".into()));
        }
        let count = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            return Err(RunError::NoDevice(format!("CUDA backend: device {ordinal} asked for, {count} present")));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
        // SAFETY: strata uses one stream, so cudarc's cross-stream event tracking is not
        // needed; without it, slices record no events (which would also enter graphs).
        unsafe { ctx.disable_event_tracking() };
        // A stream of its own: the legacy default stream cannot be captured into graphs.
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        Ok(Cuda {
            ctx,
            stream,
            buffers: Vec::new(),
            functions: HashMap::new(),
            names: Vec::new(),
            specs: HashMap::new(),
            graphs: Vec::new(),
            events: Vec::new(),
            errors: None,
            last_kernel: String::new(),
            hung: false,
            copy: None,
            host: Vec::new(),
            waits: Vec::new(),
        })
    }

    fn pointer(&self, id: BufferId, offset: usize) -> u64 {
        let (ptr, _sync) = self.buffers[id.0].device_ptr(&self.stream);
        ptr + offset as u64
    }

    /// Reads the `--checked` error record, if any kernel wrote one, and clears it.
    fn check_errors(&mut self) -> Result<(), RunError> {
        let Some(errors) = self.errors else { return Ok(()) };
        let mut raw = [0u8; 32];
        self.stream.memcpy_dtoh(&self.buffers[errors.0].slice(0..32), &mut raw).map_err(driver("cuMemcpyDtoH"))?;
        let Some(found) = bounds_error(&raw, &self.names, &self.specs) else { return Ok(()) };
        self.stream.memcpy_htod(&[0u8; 32], &mut self.buffers[errors.0]).map_err(driver("cuMemcpyHtoD"))?;
        Err(found)
    }
}

impl Backend for Cuda {
    fn info(&self) -> DeviceInfo {
        let (major, minor) = self.ctx.compute_capability().unwrap_or((0, 0));
        let mut version = 0i32;
        // SAFETY: cuDriverGetVersion writes one int to the pointer it is given.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
        DeviceInfo {
            backend: "cuda",
            name: self.ctx.name().unwrap_or_default(),
            arch: format!("sm_{major}{minor}"),
            driver: format!("CUDA driver {}.{}", version / 1000, version % 1000 / 10),
            memory: self.ctx.total_mem().unwrap_or(0) as u64,
            dialect: Some(strata_compiler::emit::Dialect::Cuda),
        }
    }

    fn load(&mut self, module: &[u8], kernels: &[KernelRecord]) -> Result<(), RunError> {
        let text = String::from_utf8_lossy(module).into_owned();
        let module = self.ctx.load_module(Ptx::from_src(text)).map_err(driver("cuModuleLoadData"))?;
        for spec in kernels {
            let f = module.load_function(&spec.name).map_err(driver(&format!("cuModuleGetFunction({})", spec.name)))?;
            self.functions.insert(spec.name.clone(), f);
            self.names.push(spec.name.clone());
            self.specs.insert(spec.name.clone(), spec.clone());
        }
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufferId, RunError> {
        let slice =
            self.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(driver(&format!("cuMemAlloc({bytes} bytes)")))?;
        self.buffers.push(slice);
        Ok(BufferId(self.buffers.len() - 1))
    }

    fn size(&self, buf: BufferId) -> usize {
        self.buffers[buf.0].len()
    }

    fn write(&mut self, buf: BufferId, offset: usize, data: &[u8]) -> Result<(), RunError> {
        let end = offset + data.len();
        if end > self.size(buf) {
            return Err(RunError::Other(format!(
                "write of {} bytes at {offset} past a {}-byte buffer",
                data.len(),
                self.size(buf)
            )));
        }
        let mut view = self.buffers[buf.0].slice_mut(offset..end);
        self.stream.memcpy_htod(data, &mut view).map_err(driver("cuMemcpyHtoDAsync"))
    }

    fn read(&mut self, buf: BufferId, offset: usize, out: &mut [u8]) -> Result<(), RunError> {
        let end = offset + out.len();
        if end > self.size(buf) {
            return Err(RunError::Other(format!(
                "read of {} bytes at {offset} past a {}-byte buffer",
                out.len(),
                self.size(buf)
            )));
        }
        self.stream.memcpy_dtoh(&self.buffers[buf.0].slice(offset..end), out).map_err(driver("cuMemcpyDtoH"))?;
        self.check_errors()
    }

    fn launch(&mut self, spec: &KernelRecord, args: &[Arg]) -> Result<(), RunError> {
        let f = self.functions.get(&spec.name).ok_or_else(|| RunError::Launch {
            kernel: spec.name.clone(),
            message: "not in the loaded module".into(),
        })?;
        let Some(([x, y, z], mut values)) = launch_values(spec, args, |id, offset| self.pointer(id, offset)) else {
            return Ok(());
        };
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        // A kernel that waits for its inputs in-kernel launches as a programmatic
        // dependent of the one before: its blocks start (and load their weights) while
        // that one drains.
        // SAFETY: a zeroed launch attribute is plain data; id and value are set next.
        let mut dependent: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        dependent.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        dependent.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: x,
            gridDimY: y,
            gridDimZ: z,
            blockDimX: spec.launch.threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: self.stream.cu_stream(),
            attrs: &mut dependent,
            numAttrs: u32::from(spec.launch.grid_dependency),
        };
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: the parameters follow the kernel's signature from its plan record
        // (pointers to live buffers sized by `bind`, then u32 scalars) and outlive the
        // call, which copies them; the launch geometry is the record's, which the static
        // checks proved within the target.
        unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| RunError::Launch { kernel: spec.name.clone(), message: e.to_string() })?;
        self.last_kernel = spec.name.clone();
        Ok(())
    }

    fn copy(&mut self, from: BufferId, to: BufferId, bytes: usize) -> Result<(), RunError> {
        if bytes > self.size(from) || bytes > self.size(to) {
            return Err(RunError::Other("copy past the end of a buffer".into()));
        }
        let (a, b) = if from.0 < to.0 {
            let (lo, hi) = self.buffers.split_at_mut(to.0);
            (&lo[from.0], &mut hi[0])
        } else if from.0 > to.0 {
            let (lo, hi) = self.buffers.split_at_mut(from.0);
            (&hi[0], &mut lo[to.0])
        } else {
            return Err(RunError::Other("copy of a buffer onto itself".into()));
        };
        let mut dst = b.slice_mut(0..bytes);
        self.stream.memcpy_dtod(&a.slice(0..bytes), &mut dst).map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn mark(&mut self) -> Result<Mark, RunError> {
        let event = self.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("cuEventRecord"))?;
        self.events.push(event);
        Ok(Mark::Event(self.events.len() - 1))
    }

    fn seconds(&mut self, from: Mark, to: Mark) -> Result<f64, RunError> {
        let (Mark::Event(a), Mark::Event(b)) = (from, to) else {
            return Err(RunError::Other("timing marks of another backend".into()));
        };
        let (Some(a), Some(b)) = (self.events.get(a), self.events.get(b)) else {
            return Err(RunError::Other("timing marks of another device".into()));
        };
        let ms = a.elapsed_ms(b).map_err(driver("cuEventElapsedTime"))?;
        Ok(f64::from(ms) / 1e3)
    }

    fn sync_within(&mut self, deadline: Duration) -> Result<bool, RunError> {
        let event = self.stream.record_event(None).map_err(driver("cuEventRecord"))?;
        let start = Instant::now();
        while !event.is_complete() {
            if start.elapsed() >= deadline {
                self.hung = true;
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        event.synchronize().map_err(|e| RunError::Launch {
            kernel: self.last_kernel.clone(),
            message: format!("failed on the device: {e}"),
        })?;
        self.check_errors()?;
        Ok(true)
    }

    fn error_slot(&mut self) -> &mut Option<BufferId> {
        &mut self.errors
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<HostId, RunError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: cuMemHostAlloc returns `bytes` of page-locked memory or an error; it is
        // zeroed next, so no uninitialized byte is ever read.
        let ptr = unsafe { cudarc::driver::result::malloc_host(bytes.max(1), 0) }
            .map_err(driver(&format!("cuMemHostAlloc({bytes} bytes)")))?
            .cast::<u8>();
        // SAFETY: `ptr` points to `bytes` writable bytes that nothing else references.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        self.host.push(PinnedHost { ptr, len: bytes });
        Ok(HostId(self.host.len() - 1))
    }

    fn host_mut(&mut self, host: HostId) -> &mut [u8] {
        let h = &self.host[host.0];
        // SAFETY: the allocation is live for the backend's life and `&mut self` makes this
        // the only reference the host holds.
        unsafe { std::slice::from_raw_parts_mut(h.ptr, h.len) }
    }

    fn upload(
        &mut self,
        from: HostId,
        from_offset: usize,
        to: BufferId,
        offset: usize,
        bytes: usize,
    ) -> Result<(), RunError> {
        let h = &self.host[from.0];
        if from_offset + bytes > h.len || offset + bytes > self.size(to) {
            return Err(RunError::Other(format!("upload of {bytes} bytes past the end of a buffer")));
        }
        let copy = match &self.copy {
            Some(c) => Arc::clone(c),
            None => {
                let c = self.ctx.new_stream().map_err(driver("cuStreamCreate"))?;
                self.copy = Some(Arc::clone(&c));
                c
            }
        };
        // SAFETY: the range lies within the pinned allocation (checked above), which
        // outlives the copy (host memory is freed only when the backend is dropped).
        let src = unsafe { std::slice::from_raw_parts(h.ptr.add(from_offset), bytes) };
        let dst = self.pointer(to, offset);
        // SAFETY: `dst` is `bytes` inside a live device buffer (checked above).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, copy.cu_stream()) }
            .map_err(driver("cuMemcpyHtoDAsync"))
    }

    fn await_uploads(&mut self) -> Result<(), RunError> {
        let Some(copy) = self.copy.clone() else { return Ok(()) };
        let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let reached = self.stream.record_event(timed).map_err(driver("cuEventRecord"))?;
        let landed = copy.record_event(timed).map_err(driver("cuEventRecord"))?;
        self.stream.wait(&landed).map_err(driver("cuStreamWaitEvent"))?;
        self.waits.push((reached, landed));
        Ok(())
    }

    fn upload_stall(&mut self) -> Result<f64, RunError> {
        let mut seconds = 0.0;
        for (reached, landed) in self.waits.drain(..) {
            landed.synchronize().map_err(driver("cuEventSynchronize"))?;
            reached.synchronize().map_err(driver("cuEventSynchronize"))?;
            let ms = reached.elapsed_ms(&landed).map_err(driver("cuEventElapsedTime"))?;
            seconds += f64::from(ms.max(0.0)) / 1e3;
        }
        Ok(seconds)
    }

    fn begin_capture(&mut self) -> Result<(), RunError> {
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("cuStreamBeginCapture"))
    }

    fn end_capture(&mut self) -> Result<GraphId, RunError> {
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(driver("cuStreamEndCapture"))?
            .ok_or_else(|| RunError::Other("captured an empty graph".into()))?;
        graph.upload().map_err(driver("cuGraphUpload"))?;
        self.graphs.push(graph);
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn replay(&mut self, graph: GraphId) -> Result<(), RunError> {
        self.graphs[graph.0].launch().map_err(driver("cuGraphLaunch"))
    }
}
