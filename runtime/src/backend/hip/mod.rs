//! The HIP backend: code objects through HIP's module API, on a stream of its own, with
//! events, graphs, page-locked host memory and a copy stream for uploads, and the same
//! event-polling watchdog as CUDA. The runtime is loaded at run time (`api`), so no ROCm
//! is needed to build, and without one `--backend hip` refuses with one clear line.
//!
//! No AMD GPU is available where strata is developed. The same code runs on an NVIDIA GPU
//! through HIP's NVIDIA platform (`HIP_PLATFORM=nvidia`, see `api`), which is how it is
//! tested; on AMD it has been compiled, never run.

mod api;

use std::collections::HashMap;
use std::ffi::{CString, c_int, c_void};
use std::time::{Duration, Instant};

use api::{Api, Event, Stream};
pub use api::{Platform, arch_from_properties};
use strata_compiler::emit::Dialect;
use strata_compiler::plan::KernelRecord;

use super::{
    Arg, Backend, BufferId, DeviceEntry, DeviceInfo, GraphId, HostId, Mark, RunError, bounds_error, launch_values,
};

/// A HIP device with its loaded kernels.
pub struct Hip {
    api: Api,
    device: c_int,
    stream: Stream,
    /// The queue of uploads from host memory, beside `stream` (created on first upload).
    copy: Option<Stream>,
    /// Device allocations: address and size.
    buffers: Vec<(usize, usize)>,
    /// Page-locked host allocations: address and size.
    host: Vec<(usize, usize)>,
    functions: HashMap<String, usize>,
    /// Kernel names in manifest order (the ids `--checked` kernels record).
    names: Vec<String>,
    specs: HashMap<String, KernelRecord>,
    /// Instantiated graphs.
    graphs: Vec<usize>,
    /// Timing events recorded by `mark`.
    events: Vec<usize>,
    /// Per `await_uploads`: (the kernels reached it, the uploads before it landed).
    waits: Vec<(usize, usize)>,
    errors: Option<BufferId>,
    /// The last kernel queued, to name in a failure or hang report.
    last_kernel: String,
    /// A kernel did not finish: freeing anything would wait for it forever.
    hung: bool,
}

/// The HIP devices present, each with its architecture, or the reason there are none.
pub fn devices() -> Result<Vec<DeviceEntry>, RunError> {
    let api = Api::load(Platform::from_env())?;
    let mut count = 0;
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

impl Hip {
    /// Opens HIP device `ordinal` on the platform `HIP_PLATFORM` names.
    pub fn new(ordinal: usize) -> Result<Hip, RunError> {
        let api = Api::load(Platform::from_env())?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: plain HIP runtime calls with valid out-pointers.
        unsafe {
            api.check("hipInit", (api.init)(0))?;
            let mut count = 0;
            api.check("hipGetDeviceCount", (api.get_device_count)(&mut count))?;
            if ordinal as c_int >= count {
                return Err(RunError::NoDevice(format!("HIP backend: device {ordinal} asked for, {count} present")));
            }
            api.check("hipSetDevice", (api.set_device)(ordinal as c_int))?;
            // The null stream cannot be captured into a graph.
            api.check("hipStreamCreateWithFlags", (api.stream_create)(&mut stream, api::STREAM_NON_BLOCKING))?;
        }
        Ok(Hip {
            api,
            device: ordinal as c_int,
            stream,
            copy: None,
            buffers: Vec::new(),
            host: Vec::new(),
            functions: HashMap::new(),
            names: Vec::new(),
            specs: HashMap::new(),
            graphs: Vec::new(),
            events: Vec::new(),
            waits: Vec::new(),
            errors: None,
            last_kernel: String::new(),
            hung: false,
        })
    }

    fn pointer(&self, id: BufferId, offset: usize) -> usize {
        self.buffers[id.0].0 + offset
    }

    fn event(&self, stream: Stream, timed: bool) -> Result<Event, RunError> {
        let mut event = std::ptr::null_mut();
        let flags = if timed { api::EVENT_TIMED } else { api::EVENT_UNTIMED };
        // SAFETY: valid out-pointer, then a live event and stream.
        unsafe {
            self.api.check("hipEventCreateWithFlags", (self.api.event_create)(&mut event, flags))?;
            self.api.check("hipEventRecord", (self.api.event_record)(event, stream))?;
        }
        Ok(event)
    }

    fn destroy_event(&self, event: Event) {
        // SAFETY: an event this backend created, destroyed once.
        unsafe { (self.api.event_destroy)(event) };
    }

    /// A failure of queued work, naming the last kernel queued before it.
    fn failed(&self, code: api::HipError) -> RunError {
        RunError::Launch {
            kernel: self.last_kernel.clone(),
            message: format!("failed on the device: {}", self.api.message(code)),
        }
    }

    /// Reads the `--checked` error record, if any kernel wrote one, and clears it.
    fn check_errors(&mut self) -> Result<(), RunError> {
        let Some(errors) = self.errors else { return Ok(()) };
        let mut raw = [0u8; 32];
        self.copy_to_host(errors, 0, &mut raw)?;
        let found = bounds_error(&raw, &self.names, &self.specs);
        if found.is_some() {
            self.write(errors, 0, &[0u8; 32])?;
        }
        found.map_or(Ok(()), Err)
    }

    /// Copies from a buffer into `out` after all queued work (waiting without a deadline,
    /// as a CUDA copy to pageable memory does).
    fn copy_to_host(&mut self, buf: BufferId, offset: usize, out: &mut [u8]) -> Result<(), RunError> {
        let src = self.pointer(buf, offset) as *const c_void;
        // SAFETY: the caller checked the range; the destination is a live host slice,
        // read only after the stream has drained.
        let code = unsafe {
            self.api.check(
                "hipMemcpyAsync(DtoH)",
                (self.api.memcpy_async)(out.as_mut_ptr().cast(), src, out.len(), api::DEVICE_TO_HOST, self.stream),
            )?;
            (self.api.stream_synchronize)(self.stream)
        };
        if code != api::SUCCESS {
            return Err(self.failed(code));
        }
        Ok(())
    }
}

impl Drop for Hip {
    fn drop(&mut self) {
        if self.hung {
            return; // freeing would wait for the hung kernel: leak it all, so the process can exit
        }
        // SAFETY: every handle below was created by this backend and is released once,
        // after the queues are drained.
        unsafe {
            let _ = (self.api.stream_synchronize)(self.stream);
            for &(p, _) in &self.buffers {
                (self.api.free)(p as *mut c_void);
            }
            for &(p, _) in &self.host {
                (self.api.host_free)(p as *mut c_void);
            }
            for &g in &self.graphs {
                (self.api.graph_exec_destroy)(g as *mut c_void);
            }
            for &e in self.events.iter().chain(self.waits.iter().flat_map(|(a, b)| [a, b])) {
                (self.api.event_destroy)(e as Event);
            }
            if let Some(copy) = self.copy {
                (self.api.stream_destroy)(copy);
            }
            (self.api.stream_destroy)(self.stream);
        }
    }
}

impl Backend for Hip {
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

    fn load(&mut self, module: &[u8], kernels: &[KernelRecord]) -> Result<(), RunError> {
        // A code object, or PTX text on the NVIDIA platform, which must end in a NUL.
        let mut image = module.to_vec();
        image.push(0);
        let mut handle = std::ptr::null_mut();
        // SAFETY: `image` is a complete module that outlives the call (HIP copies it).
        unsafe {
            self.api.check("hipModuleLoadData", (self.api.module_load_data)(&mut handle, image.as_ptr().cast()))?
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
            self.names.push(spec.name.clone());
            self.specs.insert(spec.name.clone(), spec.clone());
        }
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufferId, RunError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the allocation is zeroed on the stream before use.
        unsafe {
            self.api.check(&format!("hipMalloc({bytes} bytes)"), (self.api.malloc)(&mut p, bytes.max(1)))?;
            self.api.check("hipMemsetAsync", (self.api.memset_async)(p, 0, bytes.max(1), self.stream))?;
        }
        self.buffers.push((p as usize, bytes.max(1)));
        Ok(BufferId(self.buffers.len() - 1))
    }

    fn size(&self, buf: BufferId) -> usize {
        self.buffers[buf.0].1
    }

    fn write(&mut self, buf: BufferId, offset: usize, data: &[u8]) -> Result<(), RunError> {
        if offset + data.len() > self.size(buf) {
            return Err(RunError::Other(format!(
                "write of {} bytes at {offset} past a {}-byte buffer",
                data.len(),
                self.size(buf)
            )));
        }
        let dst = self.pointer(buf, offset) as *mut c_void;
        // SAFETY: destination range checked above. The source is pageable host memory,
        // which HIP (as CUDA) copies out before the call returns.
        unsafe {
            self.api.check(
                "hipMemcpyAsync(HtoD)",
                (self.api.memcpy_async)(dst, data.as_ptr().cast(), data.len(), api::HOST_TO_DEVICE, self.stream),
            )
        }
    }

    fn read(&mut self, buf: BufferId, offset: usize, out: &mut [u8]) -> Result<(), RunError> {
        if offset + out.len() > self.size(buf) {
            return Err(RunError::Other(format!(
                "read of {} bytes at {offset} past a {}-byte buffer",
                out.len(),
                self.size(buf)
            )));
        }
        self.copy_to_host(buf, offset, out)?;
        self.check_errors()
    }

    fn copy(&mut self, from: BufferId, to: BufferId, bytes: usize) -> Result<(), RunError> {
        if bytes > self.size(from) || bytes > self.size(to) {
            return Err(RunError::Other("copy past the end of a buffer".into()));
        }
        let (src, dst) = (self.pointer(from, 0) as *const c_void, self.pointer(to, 0) as *mut c_void);
        // SAFETY: both ranges are within live device allocations (checked above).
        unsafe {
            self.api.check(
                "hipMemcpyAsync(DtoD)",
                (self.api.memcpy_async)(dst, src, bytes, api::DEVICE_TO_DEVICE, self.stream),
            )
        }
    }

    fn launch(&mut self, spec: &KernelRecord, args: &[Arg]) -> Result<(), RunError> {
        let f = *self.functions.get(&spec.name).ok_or_else(|| RunError::Launch {
            kernel: spec.name.clone(),
            message: "not in the loaded module".into(),
        })?;
        let Some(([x, y, z], mut values)) = launch_values(spec, args, |id, offset| self.pointer(id, offset) as u64)
        else {
            return Ok(());
        };
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        // SAFETY: the parameters follow the kernel's signature from its plan record
        // (buffers sized by `bind`, then scalars) and outlive the call, which copies them;
        // the block size is the record's, which the build proved the code was compiled
        // for (`artifacts::launch_disagreements`).
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
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if code != api::SUCCESS {
            return Err(RunError::Launch { kernel: spec.name.clone(), message: self.api.message(code) });
        }
        self.last_kernel = spec.name.clone();
        Ok(())
    }

    fn sync_within(&mut self, deadline: Duration) -> Result<bool, RunError> {
        let event = self.event(self.stream, false)?;
        let start = Instant::now();
        let code = loop {
            // SAFETY: a live event.
            let code = unsafe { (self.api.event_query)(event) };
            if code != api::NOT_READY {
                break code;
            }
            if start.elapsed() >= deadline {
                self.hung = true;
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(50));
        };
        self.destroy_event(event);
        if code != api::SUCCESS {
            return Err(self.failed(code));
        }
        self.check_errors()?;
        Ok(true)
    }

    fn error_slot(&mut self) -> &mut Option<BufferId> {
        &mut self.errors
    }

    fn begin_capture(&mut self) -> Result<(), RunError> {
        // SAFETY: a live stream.
        unsafe {
            self.api
                .check("hipStreamBeginCapture", (self.api.stream_begin_capture)(self.stream, api::CAPTURE_THREAD_LOCAL))
        }
    }

    fn end_capture(&mut self) -> Result<GraphId, RunError> {
        let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: ends the capture begun on this stream; the graph is destroyed once its
        // executable instance exists (which keeps what it needs).
        unsafe {
            self.api.check("hipStreamEndCapture", (self.api.stream_end_capture)(self.stream, &mut graph))?;
            if graph.is_null() {
                return Err(RunError::Other("captured an empty graph".into()));
            }
            let made = (self.api.graph_instantiate)(&mut exec, graph, 0);
            (self.api.graph_destroy)(graph);
            self.api.check("hipGraphInstantiateWithFlags", made)?;
        }
        self.graphs.push(exec as usize);
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn replay(&mut self, graph: GraphId) -> Result<(), RunError> {
        let exec = self.graphs[graph.0] as *mut c_void;
        // SAFETY: an instantiated graph of this backend, launched on its stream.
        unsafe { self.api.check("hipGraphLaunch", (self.api.graph_launch)(exec, self.stream)) }
    }

    fn mark(&mut self) -> Result<Mark, RunError> {
        let event = self.event(self.stream, true)?;
        self.events.push(event as usize);
        Ok(Mark::Event(self.events.len() - 1))
    }

    fn seconds(&mut self, from: Mark, to: Mark) -> Result<f64, RunError> {
        let (Mark::Event(a), Mark::Event(b)) = (from, to) else {
            return Err(RunError::Other("timing marks of another backend".into()));
        };
        let (Some(&a), Some(&b)) = (self.events.get(a), self.events.get(b)) else {
            return Err(RunError::Other("timing marks of another device".into()));
        };
        let mut ms = 0f32;
        // SAFETY: two recorded timing events of this backend.
        unsafe {
            self.api.check("hipEventSynchronize", (self.api.event_synchronize)(b as Event))?;
            self.api.check("hipEventElapsedTime", (self.api.event_elapsed_time)(&mut ms, a as Event, b as Event))?;
        }
        Ok(f64::from(ms) / 1e3)
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<HostId, RunError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer; default flags (page-locked, portable to this device).
        unsafe {
            self.api.check(&format!("hipHostMalloc({bytes} bytes)"), (self.api.host_malloc)(&mut p, bytes.max(1), 0))?
        };
        // SAFETY: `p` points to at least `bytes` writable bytes that nothing else references.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
        self.host.push((p as usize, bytes));
        Ok(HostId(self.host.len() - 1))
    }

    fn host_mut(&mut self, host: HostId) -> &mut [u8] {
        let (p, len) = self.host[host.0];
        // SAFETY: the allocation lives as long as the backend, and `&mut self` makes this
        // the only reference the host holds.
        unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) }
    }

    fn upload(
        &mut self,
        from: HostId,
        from_offset: usize,
        to: BufferId,
        offset: usize,
        bytes: usize,
    ) -> Result<(), RunError> {
        let (src, len) = self.host[from.0];
        if from_offset + bytes > len || offset + bytes > self.size(to) {
            return Err(RunError::Other(format!("upload of {bytes} bytes past the end of a buffer")));
        }
        let copy = match self.copy {
            Some(c) => c,
            None => {
                let mut c = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                unsafe {
                    self.api
                        .check("hipStreamCreateWithFlags", (self.api.stream_create)(&mut c, api::STREAM_NON_BLOCKING))?
                };
                self.copy = Some(c);
                c
            }
        };
        let (src, dst) = ((src + from_offset) as *const c_void, self.pointer(to, offset) as *mut c_void);
        // SAFETY: both ranges checked above; the pinned source lives as long as the backend.
        unsafe {
            self.api
                .check("hipMemcpyAsync(upload)", (self.api.memcpy_async)(dst, src, bytes, api::HOST_TO_DEVICE, copy))
        }
    }

    fn await_uploads(&mut self) -> Result<(), RunError> {
        let Some(copy) = self.copy else { return Ok(()) };
        let reached = self.event(self.stream, true)?;
        let landed = self.event(copy, true)?;
        // SAFETY: live stream and event.
        unsafe { self.api.check("hipStreamWaitEvent", (self.api.stream_wait_event)(self.stream, landed, 0))? };
        self.waits.push((reached as usize, landed as usize));
        Ok(())
    }

    fn upload_stall(&mut self) -> Result<f64, RunError> {
        let mut seconds = 0.0;
        for (reached, landed) in std::mem::take(&mut self.waits) {
            let mut ms = 0f32;
            // SAFETY: two recorded timing events of this backend, destroyed once after.
            unsafe {
                self.api.check("hipEventSynchronize", (self.api.event_synchronize)(landed as Event))?;
                self.api.check("hipEventSynchronize", (self.api.event_synchronize)(reached as Event))?;
                self.api.check(
                    "hipEventElapsedTime",
                    (self.api.event_elapsed_time)(&mut ms, reached as Event, landed as Event),
                )?;
            }
            self.destroy_event(reached as Event);
            self.destroy_event(landed as Event);
            seconds += f64::from(ms.max(0.0)) / 1e3;
        }
        Ok(seconds)
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
        if Api::load(Platform::Amd).is_ok() {
            return; // a machine with ROCm
        }
        let e = Api::load(Platform::Amd).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.starts_with("HIP backend: no HIP runtime (libamdhip64.so)"), "{e}");
        assert_eq!(e.lines().count(), 1);
    }
}
