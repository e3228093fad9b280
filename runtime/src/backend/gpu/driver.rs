//! The driver interface under the generic GPU backend: the calls CUDA and HIP both
//! provide (streams, device and page-locked memory, copies, events, modules, launches,
//! graphs), implemented once per vendor (`cuda/driver.rs`, `hip/driver.rs`).
//!
//! A driver only makes calls: which stream a copy goes on, the watchdog, the `--checked`
//! read-back, timing and the leak after a hang are [`super::Gpu`]'s. Each driver names a
//! failed call in its own vendor's words (`cuMemcpyDtoH`, `hipMemcpyAsync(DtoH)`).
//!
//! Handles are owned values, given back to the driver to be released. CUDA's (cudarc's
//! types) also release themselves when dropped; HIP's are plain addresses, released only
//! through the driver. `Gpu` releases everything through the driver, or after a hang
//! forgets it all.

use std::ffi::c_void;
use std::task::Poll;

use crate::backend::{DeviceInfo, RunError};

/// Why a driver call failed.
#[derive(Debug)]
pub enum Failure {
    /// The call itself failed; the error names it.
    Call(RunError),
    /// Kernel work failed (a launch refused, or queued work that failed on the device),
    /// with the driver's message; the backend names the kernel.
    Kernel(String),
}

impl From<RunError> for Failure {
    fn from(e: RunError) -> Failure {
        Failure::Call(e)
    }
}

/// Where a kernel runs: `grid` blocks of `threads` threads, each with
/// `dynamic_shared` bytes of dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Blocks along x, y, z.
    pub grid: [u32; 3],
    /// Threads a block.
    pub threads: u32,
    /// Bytes of dynamic shared memory a block.
    pub dynamic_shared: u32,
}

/// One vendor's GPU driver (see the module documentation). Device memory is addressed by
/// plain device addresses (`u64`), as kernels see it.
pub trait Driver: Sized {
    /// A queue of work.
    type Stream;
    /// A recorded point in a stream.
    type Event;
    /// A device allocation.
    type Buffer;
    /// A loaded module (PTX or code object).
    type Module;
    /// A kernel of a loaded module.
    type Function;
    /// An instantiated graph, ready to launch.
    type Graph;

    /// Opens device `ordinal` (everything before its first stream), or says why not.
    fn open(ordinal: usize) -> Result<Self, RunError>;

    /// What the device is.
    fn info(&self) -> DeviceInfo;

    /// A new stream, not synchronizing with the null stream (which cannot be captured).
    fn new_stream(&self) -> Result<Self::Stream, RunError>;

    /// Releases a stream (after its work, which the driver need not wait for).
    fn destroy_stream(&self, stream: Self::Stream);

    /// Waits for `stream` before the backend releases its memory, where the vendor's
    /// frees do not order themselves after queued work; errors are ignored.
    fn drain(&self, stream: &Self::Stream);

    /// Loads a module image (PTX text or a code object).
    fn load_module(&self, image: &[u8]) -> Result<Self::Module, RunError>;

    /// The kernel `name` of a loaded module, allowed `dynamic_shared` bytes of dynamic
    /// shared memory at launch (0: none) where the vendor asks kernels to opt in.
    fn function(&self, module: &Self::Module, name: &str, dynamic_shared: u32) -> Result<Self::Function, RunError>;

    /// `bytes.max(1)` bytes of device memory, zeroed on `stream` (errors name `bytes`).
    fn alloc(&self, stream: &Self::Stream, bytes: usize) -> Result<Self::Buffer, RunError>;

    /// The device address of an allocation.
    fn address(&self, buffer: &Self::Buffer) -> u64;

    /// Frees an allocation.
    fn free(&self, buffer: Self::Buffer);

    /// `bytes.max(1)` bytes of page-locked host memory, not zeroed (errors name `bytes`).
    fn alloc_host(&self, bytes: usize) -> Result<*mut u8, RunError>;

    /// Frees page-locked host memory.
    ///
    /// # Safety
    /// `ptr` came from [`Driver::alloc_host`], is freed once, and no queued copy reads it.
    unsafe fn free_host(&self, ptr: *mut u8);

    /// Queues a copy of pageable `data` to device address `dst` on `stream` (the driver
    /// has taken the data when this returns).
    ///
    /// # Safety
    /// `dst .. dst + data.len()` lies within a live allocation of this driver.
    unsafe fn write(&self, stream: &Self::Stream, dst: u64, data: &[u8]) -> Result<(), RunError>;

    /// Copies from device address `src` into pageable `out` after all work queued on
    /// `stream`, waiting without a deadline; [`Failure::Kernel`] when that work failed.
    ///
    /// # Safety
    /// `src .. src + out.len()` lies within a live allocation of this driver.
    unsafe fn read(&self, stream: &Self::Stream, src: u64, out: &mut [u8]) -> Result<(), Failure>;

    /// Queues a device-to-device copy of `bytes` on `stream`.
    ///
    /// # Safety
    /// Both ranges lie within live allocations of this driver.
    unsafe fn copy(&self, stream: &Self::Stream, dst: u64, src: u64, bytes: usize) -> Result<(), RunError>;

    /// Queues a copy from page-locked `src` to device address `dst` on `stream`, which
    /// runs after this returns.
    ///
    /// # Safety
    /// `src` lies in memory from [`Driver::alloc_host`] that outlives the copy, and
    /// `dst .. dst + src.len()` within a live allocation of this driver.
    unsafe fn upload(&self, stream: &Self::Stream, dst: u64, src: &[u8]) -> Result<(), RunError>;

    /// Queues `function` on `stream` with `geometry`; `dependent`
    /// asks for a programmatic dependent launch where the vendor has one (the kernel waits
    /// for its inputs in-kernel). [`Failure::Kernel`] when the driver refuses the launch.
    ///
    /// # Safety
    /// `params` point to the kernel's parameters in the order and sizes of its signature
    /// (device addresses within live allocations, sized for what the kernel touches) and
    /// live through the call; `grid` and `threads` are within the device's limits.
    unsafe fn launch(
        &self,
        stream: &Self::Stream,
        function: &Self::Function,
        geometry: Geometry,
        dependent: bool,
        params: &mut [*mut c_void],
    ) -> Result<(), Failure>;

    /// A new event recorded on `stream`; `timed` for one that [`Driver::elapsed_ms`] reads.
    fn record(&self, stream: &Self::Stream, timed: bool) -> Result<Self::Event, RunError>;

    /// Whether the work before `event` has finished, without waiting: `Ready(Err)` with
    /// [`Failure::Kernel`] when it failed on the device.
    fn poll(&self, event: &Self::Event) -> Poll<Result<(), Failure>>;

    /// Waits for the work before `event`.
    fn synchronize(&self, event: &Self::Event) -> Result<(), RunError>;

    /// Milliseconds from timed event `from` to the later `to`, waiting for `to`.
    fn elapsed_ms(&self, from: &Self::Event, to: &Self::Event) -> Result<f32, RunError>;

    /// Makes work queued on `stream` after this wait for the work before `event`.
    fn stream_wait(&self, stream: &Self::Stream, event: &Self::Event) -> Result<(), RunError>;

    /// Releases an event.
    fn destroy_event(&self, event: Self::Event);

    /// Starts capturing the work queued on `stream` (thread-local mode) instead of running it.
    fn begin_capture(&self, stream: &Self::Stream) -> Result<(), RunError>;

    /// Ends the capture on `stream` and instantiates it; `None` for an empty capture.
    fn end_capture(&self, stream: &Self::Stream) -> Result<Option<Self::Graph>, RunError>;

    /// Queues an instantiated graph on `stream` (the one it was captured on).
    fn launch_graph(&self, stream: &Self::Stream, graph: &Self::Graph) -> Result<(), RunError>;

    /// Releases an instantiated graph.
    fn destroy_graph(&self, graph: Self::Graph);
}
