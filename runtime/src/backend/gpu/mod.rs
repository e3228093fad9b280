//! The GPU backend, written once for CUDA and HIP over a small [`Driver`] interface.
//!
//! It holds the state machine both vendors share: kernels by name, buffers, a stream of
//! its own (the null stream cannot be captured into graphs) and a copy stream for uploads
//! from page-locked host memory (created on first upload; `await_uploads` records event
//! pairs that time the kernels' wait), the event-polling watchdog (a kernel that misses
//! its deadline marks the backend hung, and from then on no memory, module, graph, stream
//! or context is released, since that would wait for the kernel and the process could
//! not exit), failures naming the last kernel queued, the `--checked` error-buffer
//! read-back, timing marks, and graph capture. The vendors differ only in their calls
//! (`cuda/driver.rs`, `hip/driver.rs`); `tests` runs this state machine over a fake driver.

pub mod driver;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::task::Poll;
use std::time::{Duration, Instant};

pub use driver::{Driver, Failure, Geometry};
use strata_compiler::plan::KernelRecord;

use super::{Arg, Backend, BufferId, DeviceInfo, GraphId, HostId, Mark, RunError, bounds_error, launch_values};

/// A device allocation with its address and size.
struct Allocation<B> {
    buffer: B,
    address: u64,
    size: usize,
}

/// Page-locked host memory: address and size (freed through the driver).
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

/// A GPU device of driver `D` with its loaded kernels (`Cuda`, `Hip`).
pub struct Gpu<D: Driver> {
    /// Never dropped after a hang (see `Drop`).
    driver: ManuallyDrop<D>,
    /// The stream every kernel, copy and capture goes on. Never dropped after a hang.
    stream: ManuallyDrop<D::Stream>,
    /// The queue of uploads from host memory, beside `stream` (created on first upload).
    copy: Option<D::Stream>,
    buffers: Vec<Allocation<D::Buffer>>,
    host: Vec<Pinned>,
    functions: HashMap<String, D::Function>,
    /// Kernel names in manifest order (the ids `--checked` kernels record).
    names: Vec<String>,
    specs: HashMap<String, KernelRecord>,
    graphs: Vec<D::Graph>,
    /// Timing events recorded by `mark`.
    events: Vec<D::Event>,
    /// Per `await_uploads`: (the kernels reached it, the uploads before it landed).
    waits: Vec<(D::Event, D::Event)>,
    errors: Option<BufferId>,
    /// The last kernel queued, to name in a failure or hang report.
    last_kernel: String,
    /// A kernel did not finish: freeing anything would wait for it forever.
    hung: bool,
}

impl<D: Driver> Gpu<D> {
    /// Opens device `ordinal` of driver `D`, with a stream of its own.
    pub fn new(ordinal: usize) -> Result<Gpu<D>, RunError> {
        Gpu::with_driver(D::open(ordinal)?)
    }

    /// The backend over an opened driver, with a stream of its own.
    fn with_driver(driver: D) -> Result<Gpu<D>, RunError> {
        let stream = driver.new_stream()?;
        Ok(Gpu {
            driver: ManuallyDrop::new(driver),
            stream: ManuallyDrop::new(stream),
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

    fn address(&self, id: BufferId, offset: usize) -> u64 {
        self.buffers[id.0].address + offset as u64
    }

    /// The error for a driver failure: failed kernel work names the last kernel queued.
    fn fault(&self, failure: Failure) -> RunError {
        match failure {
            Failure::Call(e) => e,
            Failure::Kernel(message) => RunError::Launch {
                kernel: self.last_kernel.clone(),
                message: format!("failed on the device: {message}"),
            },
        }
    }

    /// Copies from a buffer into `out` after all queued work (no range check).
    fn copy_to_host(&mut self, buf: BufferId, offset: usize, out: &mut [u8]) -> Result<(), RunError> {
        let src = self.address(buf, offset);
        // SAFETY: the callers checked that the range lies within the buffer.
        unsafe { self.driver.read(&self.stream, src, out) }.map_err(|f| self.fault(f))
    }

    /// Reads the `--checked` error record, if any kernel wrote one, and clears it.
    fn check_errors(&mut self) -> Result<(), RunError> {
        let Some(errors) = self.errors else { return Ok(()) };
        let mut raw = [0u8; 32];
        self.copy_to_host(errors, 0, &mut raw)?;
        let Some(found) = bounds_error(&raw, &self.names, &self.specs) else { return Ok(()) };
        self.write(errors, 0, &[0u8; 32])?;
        Err(found)
    }
}

impl<D: Driver> Drop for Gpu<D> {
    fn drop(&mut self) {
        if self.hung {
            // Leak it all: freeing memory, unloading modules and releasing the context
            // all wait for the running kernel, so the process could not report the hang
            // and exit. `driver` and `stream` are never dropped. Events and the copy
            // stream drop as their handles do, which never waits (CUDA's destroy
            // themselves; HIP's are plain addresses, so leaked).
            std::mem::forget(std::mem::take(&mut self.buffers));
            std::mem::forget(std::mem::take(&mut self.host));
            std::mem::forget(std::mem::take(&mut self.graphs));
            std::mem::forget(std::mem::take(&mut self.functions));
            return;
        }
        let d = &self.driver;
        d.drain(&self.stream);
        for a in std::mem::take(&mut self.buffers) {
            d.free(a.buffer);
        }
        for h in std::mem::take(&mut self.host) {
            // SAFETY: from `alloc_host`, freed once, after the stream drained.
            unsafe { d.free_host(h.ptr) };
        }
        for g in std::mem::take(&mut self.graphs) {
            d.destroy_graph(g);
        }
        let waits = std::mem::take(&mut self.waits).into_iter().flat_map(|(a, b)| [a, b]);
        for e in std::mem::take(&mut self.events).into_iter().chain(waits) {
            d.destroy_event(e);
        }
        if let Some(copy) = self.copy.take() {
            d.destroy_stream(copy);
        }
        // SAFETY: `stream` is taken once, here, and not used after.
        d.destroy_stream(unsafe { ManuallyDrop::take(&mut self.stream) });
        self.functions.clear();
        // SAFETY: `driver` is dropped once, here, after everything made through it.
        unsafe { ManuallyDrop::drop(&mut self.driver) };
    }
}

/// The dynamic shared memory a kernel asks for at launch (0 for static arrays only).
fn dynamic_shared(spec: &KernelRecord) -> u32 {
    if spec.launch.dynamic_shared { spec.launch.shared_bytes } else { 0 }
}

impl<D: Driver> Backend for Gpu<D> {
    fn info(&self) -> DeviceInfo {
        self.driver.info()
    }

    fn load(&mut self, module: &[u8], kernels: &[KernelRecord]) -> Result<(), RunError> {
        let module = self.driver.load_module(module)?;
        for spec in kernels {
            let f = self.driver.function(&module, &spec.name, dynamic_shared(spec))?;
            self.functions.insert(spec.name.clone(), f);
            self.names.push(spec.name.clone());
            self.specs.insert(spec.name.clone(), spec.clone());
        }
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufferId, RunError> {
        let buffer = self.driver.alloc(&self.stream, bytes)?;
        let address = self.driver.address(&buffer);
        self.buffers.push(Allocation { buffer, address, size: bytes.max(1) });
        Ok(BufferId(self.buffers.len() - 1))
    }

    fn size(&self, buf: BufferId) -> usize {
        self.buffers[buf.0].size
    }

    fn write(&mut self, buf: BufferId, offset: usize, data: &[u8]) -> Result<(), RunError> {
        if offset + data.len() > self.size(buf) {
            return Err(RunError::Other(format!(
                "write of {} bytes at {offset} past a {}-byte buffer",
                data.len(),
                self.size(buf)
            )));
        }
        // SAFETY: the destination range is checked above.
        unsafe { self.driver.write(&self.stream, self.address(buf, offset), data) }
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

    fn launch(&mut self, spec: &KernelRecord, args: &[Arg]) -> Result<(), RunError> {
        let f = self.functions.get(&spec.name).ok_or_else(|| RunError::Launch {
            kernel: spec.name.clone(),
            message: "not in the loaded module".into(),
        })?;
        let Some((grid, mut values)) = launch_values(spec, args, |id, offset| self.address(id, offset)) else {
            return Ok(());
        };
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        // A kernel that waits for its inputs in-kernel launches as a programmatic
        // dependent of the one before (where the vendor has that): its blocks start (and
        // load their weights) while that one drains.
        // SAFETY: the parameters follow the kernel's signature from its plan record
        // (addresses of live buffers sized by `bind`, then u32 scalars) and outlive the
        // call, which copies them; the launch geometry is the record's, which the static
        // checks proved within the target and the build proved the code was compiled for
        // (`artifacts::launch_disagreements`).
        let launched = unsafe {
            let geometry = Geometry { grid, threads: spec.launch.threads, dynamic_shared: dynamic_shared(spec) };
            self.driver.launch(&self.stream, f, geometry, spec.launch.grid_dependency, &mut params)
        };
        launched.map_err(|f| match f {
            Failure::Call(e) => e,
            Failure::Kernel(message) => RunError::Launch { kernel: spec.name.clone(), message },
        })?;
        self.last_kernel = spec.name.clone();
        Ok(())
    }

    fn copy(&mut self, from: BufferId, to: BufferId, bytes: usize) -> Result<(), RunError> {
        if bytes > self.size(from) || bytes > self.size(to) {
            return Err(RunError::Other("copy past the end of a buffer".into()));
        }
        if from == to {
            return Err(RunError::Other("copy of a buffer onto itself".into()));
        }
        let (src, dst) = (self.address(from, 0), self.address(to, 0));
        // SAFETY: both ranges lie within live buffers (checked above).
        unsafe { self.driver.copy(&self.stream, dst, src, bytes) }
    }

    fn sync_within(&mut self, deadline: Duration) -> Result<bool, RunError> {
        let event = self.driver.record(&self.stream, false)?;
        let start = Instant::now();
        let outcome = loop {
            if let Poll::Ready(outcome) = self.driver.poll(&event) {
                break outcome;
            }
            if start.elapsed() >= deadline {
                self.hung = true;
                return Ok(false); // `event` is dropped, not destroyed through the driver
            }
            std::thread::sleep(Duration::from_micros(50));
        };
        self.driver.destroy_event(event);
        outcome.map_err(|f| self.fault(f))?;
        self.check_errors()?;
        Ok(true)
    }

    fn error_slot(&mut self) -> &mut Option<BufferId> {
        &mut self.errors
    }

    fn begin_capture(&mut self) -> Result<(), RunError> {
        self.driver.begin_capture(&self.stream)
    }

    fn end_capture(&mut self) -> Result<GraphId, RunError> {
        let graph =
            self.driver.end_capture(&self.stream)?.ok_or_else(|| RunError::Other("captured an empty graph".into()))?;
        self.graphs.push(graph);
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn replay(&mut self, graph: GraphId) -> Result<(), RunError> {
        self.driver.launch_graph(&self.stream, &self.graphs[graph.0])
    }

    fn mark(&mut self) -> Result<Mark, RunError> {
        let event = self.driver.record(&self.stream, true)?;
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
        let ms = self.driver.elapsed_ms(a, b)?;
        Ok(f64::from(ms) / 1e3)
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<HostId, RunError> {
        let ptr = self.driver.alloc_host(bytes)?;
        // SAFETY: `ptr` points to at least `bytes` writable bytes that nothing else
        // references; zeroed here, so no uninitialized byte is ever read.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        self.host.push(Pinned { ptr, len: bytes });
        Ok(HostId(self.host.len() - 1))
    }

    fn host_mut(&mut self, host: HostId) -> &mut [u8] {
        let h = &self.host[host.0];
        // SAFETY: the allocation lives as long as the backend, and `&mut self` makes this
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
        let (ptr, len) = (self.host[from.0].ptr, self.host[from.0].len);
        if from_offset + bytes > len || offset + bytes > self.size(to) {
            return Err(RunError::Other(format!("upload of {bytes} bytes past the end of a buffer")));
        }
        let dst = self.address(to, offset);
        let copy = match self.copy.take() {
            Some(c) => c,
            None => self.driver.new_stream()?,
        };
        let copy = &*self.copy.insert(copy);
        // SAFETY: the range lies within the pinned allocation (checked above), which
        // outlives the copy (host memory is freed only when the backend is dropped).
        let src = unsafe { std::slice::from_raw_parts(ptr.add(from_offset), bytes) };
        // SAFETY: `src` is page-locked memory from `alloc_host`; the destination is
        // `bytes` inside a live buffer (checked above).
        unsafe { self.driver.upload(copy, dst, src) }
    }

    fn await_uploads(&mut self) -> Result<(), RunError> {
        let Some(copy) = &self.copy else { return Ok(()) };
        let reached = self.driver.record(&self.stream, true)?;
        let landed = self.driver.record(copy, true)?;
        self.driver.stream_wait(&self.stream, &landed)?;
        self.waits.push((reached, landed));
        Ok(())
    }

    fn upload_stall(&mut self) -> Result<f64, RunError> {
        let mut seconds = 0.0;
        for (reached, landed) in std::mem::take(&mut self.waits) {
            self.driver.synchronize(&landed)?;
            self.driver.synchronize(&reached)?;
            let ms = self.driver.elapsed_ms(&reached, &landed)?;
            self.driver.destroy_event(reached);
            self.driver.destroy_event(landed);
            seconds += f64::from(ms.max(0.0)) / 1e3;
        }
        Ok(seconds)
    }
}
