//! Device backends behind one small trait: memory, kernel launches by plan record,
//! synchronization with a deadline, and capture/replay of launch sequences.
//!
//! Every backend runs the same [`KernelRecord`] records: the GPU backends launch the
//! compiled kernel of that name with the record's launch rule; the CPU backend runs the
//! reference implementation of the record's op. So one model step, one self-test and one
//! test body run on every backend.

pub mod cpu;
pub mod cuda;
pub mod gpu;
pub mod hip;
pub mod host;

use std::time::{Duration, Instant};

use strata_compiler::emit::Dialect;
use strata_compiler::pack::SharedBytes;
use strata_compiler::plan::{Buffer, Dim, ERROR_BUFFER, Extent, KernelRecord};

/// A point in a backend's queue of work, for benchmarks (see [`Backend::mark`]).
#[derive(Clone, Copy, Debug)]
pub enum Mark {
    /// The host clock after all earlier work finished.
    Host(Instant),
    /// A device event recorded after all earlier work (index into the backend's events).
    Event(usize),
}

/// A buffer on a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferId(pub(crate) usize);

/// Host memory a backend copies to its buffers asynchronously (pinned on a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostId(pub(crate) usize);

/// A captured launch sequence on a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphId(pub(crate) usize);

/// One kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A buffer, from a byte offset on.
    Buf(BufferId, usize),
    /// A u32 scalar.
    U32(u32),
}

/// What a backend runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// Backend name: `cpu` (the reference), `host`, `cuda` or `hip`.
    pub backend: &'static str,
    /// The device's name.
    pub name: String,
    /// Architecture (`sm_90`, `gfx1100`, `cpu`).
    pub arch: String,
    /// Driver version, for the self-test cache key.
    pub driver: String,
    /// Device memory in bytes (0 when not applicable).
    pub memory: u64,
    /// The kind of module its kernels load from: PTX (CUDA, and HIP on NVIDIA) or AMD
    /// code objects; none on the CPU.
    pub dialect: Option<Dialect>,
}

/// A device a GPU backend found, before opening it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceEntry {
    /// Its index on its backend (`--device N`).
    pub ordinal: usize,
    /// Its name.
    pub name: String,
    /// Its architecture (`gfx1100`, `sm_90`; `unknown` when the runtime does not say).
    pub arch: String,
}

impl DeviceEntry {
    /// Whether strata has a target for this device's architecture (an integrated
    /// gfx1036, for one, has none).
    pub fn supported(&self) -> bool {
        strata_compiler::target::known_names().contains(&self.arch.as_str())
    }
}

/// Why the runtime cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No usable device or runtime library.
    #[error("{0}")]
    NoDevice(String),
    /// A driver call failed.
    #[error("{call}: {message}")]
    Driver {
        /// The call.
        call: String,
        /// The driver's message.
        message: String,
    },
    /// A launch was refused before it reached the device.
    #[error("kernel {kernel}: {message}")]
    Launch {
        /// The kernel.
        kernel: String,
        /// Why.
        message: String,
    },
    /// A kernel did not finish in time.
    #[error(
        "kernel {kernel} did not finish within {seconds:.0} s: treating it as a hang (the device may need a reset)"
    )]
    Hang {
        /// The kernel.
        kernel: String,
        /// The deadline.
        seconds: f64,
    },
    /// A `--checked` kernel recorded an out-of-bounds access.
    #[error(
        "kernel {kernel}: out-of-bounds access to buffer {buffer} at index {index} (block {block:?}, thread {thread}); {count} violation(s)"
    )]
    Bounds {
        /// The kernel.
        kernel: String,
        /// The buffer's name.
        buffer: String,
        /// The element index.
        index: u64,
        /// Block (x, y).
        block: (u32, u32),
        /// Thread.
        thread: u32,
        /// Violations recorded.
        count: u32,
    },
    /// Anything else, with context.
    #[error("{0}")]
    Other(String),
}

/// A device: memory, launches, synchronization, capture and replay.
pub trait Backend {
    /// What this backend runs on.
    fn info(&self) -> DeviceInfo;

    /// Makes the kernels of `module` (a PTX text, code object or host library; ignored
    /// by the CPU reference) launchable by name.
    fn load(&mut self, module: &[u8], kernels: &[KernelRecord]) -> Result<(), RunError>;

    /// How far this backend's outputs of `spec` may be from the CPU reference's in the
    /// self-test, relative to the largest reference magnitude (the op's own tolerance,
    /// unless the backend computes it otherwise).
    fn tolerance(&self, spec: &KernelRecord) -> f64 {
        spec.op.def().tolerance()
    }

    /// A zero-filled buffer of `bytes`.
    fn alloc(&mut self, bytes: usize) -> Result<BufferId, RunError>;

    /// A buffer holding a pack's tensor bytes, for kernels to read: the backends that read
    /// host memory in place ([`Backend::reads_in_place`]) keep the view of the pack's
    /// mapping, with no copy; the others copy the bytes into a new buffer.
    fn alloc_weights(&mut self, data: SharedBytes) -> Result<BufferId, RunError> {
        let buf = self.alloc(data.len())?;
        self.write(buf, 0, &data)?;
        Ok(buf)
    }

    /// Whether [`Backend::alloc_weights`] reads the pack in place, so that a copy made
    /// to lay weights out differently costs memory the weights otherwise would not.
    fn reads_in_place(&self) -> bool {
        false
    }

    /// Size of a buffer in bytes.
    fn size(&self, buf: BufferId) -> usize;

    /// Copies `data` into the buffer at `offset` (ordered with launches).
    fn write(&mut self, buf: BufferId, offset: usize, data: &[u8]) -> Result<(), RunError>;

    /// Copies from the buffer at `offset` into `out`, after all queued work.
    fn read(&mut self, buf: BufferId, offset: usize, out: &mut [u8]) -> Result<(), RunError>;

    /// Queues the kernel of `spec` with arguments in signature order (see [`bind`]).
    fn launch(&mut self, spec: &KernelRecord, args: &[Arg]) -> Result<(), RunError>;

    /// Waits for queued work; `Ok(false)` if it has not finished by `deadline`.
    fn sync_within(&mut self, deadline: Duration) -> Result<bool, RunError>;

    /// Starts recording launches and writes instead of running them.
    fn begin_capture(&mut self) -> Result<(), RunError>;

    /// Ends a recording and returns it as a replayable graph.
    fn end_capture(&mut self) -> Result<GraphId, RunError>;

    /// Queues a recorded graph.
    fn replay(&mut self, graph: GraphId) -> Result<(), RunError>;

    /// Queues a copy of `bytes` from the start of `from` to the start of `to` (the copy
    /// bandwidth that benchmarks relate kernel bandwidth to).
    fn copy(&mut self, from: BufferId, to: BufferId, bytes: usize) -> Result<(), RunError>;

    /// Host memory of `bytes` that [`Backend::upload`] copies from (page-locked on a GPU,
    /// so copies run at the bus's speed beside the kernels).
    fn alloc_host(&mut self, bytes: usize) -> Result<HostId, RunError> {
        let _ = bytes;
        Err(RunError::Other(format!("the {} backend cannot stream weights from host memory", self.info().backend)))
    }

    /// The contents of host memory, to fill (after [`Backend::sync`] when uploads from it
    /// may be in flight).
    fn host_mut(&mut self, host: HostId) -> &mut [u8] {
        let _ = host;
        &mut []
    }

    /// Queues a copy of `bytes` from `from` at `from_offset` into `to` at `offset` on a
    /// copy queue of its own: it runs beside the kernels, which see it only after
    /// [`Backend::await_uploads`].
    fn upload(
        &mut self,
        from: HostId,
        from_offset: usize,
        to: BufferId,
        offset: usize,
        bytes: usize,
    ) -> Result<(), RunError> {
        let _ = (from, from_offset, to, offset, bytes);
        Err(RunError::Other(format!("the {} backend cannot stream weights from host memory", self.info().backend)))
    }

    /// Makes kernels queued after this wait for every upload queued before it.
    fn await_uploads(&mut self) -> Result<(), RunError> {
        Ok(())
    }

    /// Seconds the kernels waited for uploads (at their [`Backend::await_uploads`]
    /// points) since the last call; waits for the queued work.
    fn upload_stall(&mut self) -> Result<f64, RunError> {
        Ok(0.0)
    }

    /// A timing mark after all queued work. By default the host clock once that work
    /// has finished; a GPU backend records a device event instead, so that marks do not
    /// stall the queue and time only the device.
    fn mark(&mut self) -> Result<Mark, RunError> {
        self.sync()?;
        Ok(Mark::Host(Instant::now()))
    }

    /// Seconds from mark `from` to the later mark `to` (waits for `to`).
    fn seconds(&mut self, from: Mark, to: Mark) -> Result<f64, RunError> {
        match (from, to) {
            (Mark::Host(a), Mark::Host(b)) => Ok(b.saturating_duration_since(a).as_secs_f64()),
            _ => Err(RunError::Other("timing marks of another backend".into())),
        }
    }

    /// Where the backend keeps its `--checked` error buffer, once allocated.
    fn error_slot(&mut self) -> &mut Option<BufferId>;

    /// The buffer `--checked` kernels record violations in (allocated on first use).
    fn error_buffer(&mut self) -> Result<BufferId, RunError> {
        if let Some(b) = *self.error_slot() {
            return Ok(b);
        }
        let b = self.alloc(32)?;
        *self.error_slot() = Some(b);
        Ok(b)
    }

    /// Waits for queued work without a deadline.
    fn sync(&mut self) -> Result<(), RunError> {
        self.sync_within(Duration::MAX).map(|_| ())
    }

    /// Binds named arguments (see [`bind`]; the error buffer of `--checked` kernels is
    /// supplied here) and queues the kernel.
    fn call(&mut self, spec: &KernelRecord, named: &[(&str, Arg)]) -> Result<(), RunError> {
        let mut named = named.to_vec();
        if spec.buffers.iter().any(|b| b.name == ERROR_BUFFER) && !named.iter().any(|(n, _)| *n == ERROR_BUFFER) {
            named.push((ERROR_BUFFER, Arg::Buf(self.error_buffer()?, 0)));
        }
        let args = bind(spec, &named, |id| self.size(id))?;
        self.launch(spec, &args)
    }
}

/// The violation a `--checked` kernel recorded in the 32-byte error buffer (`count,
/// kernel, buffer, index lo, index hi, block x, block y, thread`, little-endian u32s), if
/// any, with kernel and buffer named from the loaded kernels (`names` in manifest order).
pub fn bounds_error(
    record: &[u8; 32],
    names: &[String],
    specs: &std::collections::HashMap<String, KernelRecord>,
) -> Option<RunError> {
    let e: Vec<u32> = record.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    if e[0] == 0 {
        return None;
    }
    let kernel = names.get(e[1] as usize).cloned().unwrap_or_else(|| format!("#{}", e[1]));
    let buffer = specs
        .get(&kernel)
        .and_then(|s| s.buffers.get(e[2] as usize))
        .map_or_else(|| format!("#{}", e[2]), |b| b.name.clone());
    Some(RunError::Bounds {
        kernel,
        buffer,
        index: u64::from(e[3]) | (u64::from(e[4]) << 32),
        block: (e[5], e[6]),
        thread: e[7],
        count: e[0],
    })
}

/// Orders named arguments as `spec`'s record lists them (buffers, then scalars; a GPU
/// launch passes them in signature order, `KernelRecord::in_signature_order`) and checks them on the
/// host: every argument present, scalars within the plan's maximum,
/// every buffer large enough for the extent its kernel may touch. This is where a launch
/// that would run out of bounds is refused, naming kernel, argument and sizes.
pub fn bind(
    spec: &KernelRecord,
    named: &[(&str, Arg)],
    size_of: impl Fn(BufferId) -> usize,
) -> Result<Vec<Arg>, RunError> {
    let refuse = |message: String| RunError::Launch { kernel: spec.name.clone(), message };
    let get = |name: &str| named.iter().find(|(n, _)| *n == name).map(|(_, a)| *a);
    let scalar = |name: &str| -> Result<u32, RunError> {
        match get(name) {
            Some(Arg::U32(v)) => Ok(v),
            _ => Err(refuse(format!("scalar argument {name} is missing"))),
        }
    };
    let mut out = Vec::with_capacity(spec.buffers.len() + spec.scalars.len());
    for b in &spec.buffers {
        let Some(arg @ Arg::Buf(id, offset)) = get(&b.name) else {
            return Err(refuse(format!("buffer argument {} is missing", b.name)));
        };
        let needed = extent_bytes(b, &scalar)?;
        let have = size_of(id).saturating_sub(offset) as u64;
        if needed > have {
            return Err(refuse(format!(
                "buffer {} needs {needed} bytes from offset {offset}, but only {have} are there",
                b.name
            )));
        }
        out.push(arg);
    }
    for s in &spec.scalars {
        let v = scalar(&s.name)?;
        if v > s.max {
            return Err(refuse(format!("{} = {v} is above the {} this kernel was built for", s.name, s.max)));
        }
        out.push(Arg::U32(v));
    }
    Ok(out)
}

/// Bytes of a buffer argument given the runtime scalars.
fn extent_bytes(b: &Buffer, scalar: &impl Fn(&str) -> Result<u32, RunError>) -> Result<u64, RunError> {
    let elems = match &b.extent {
        Extent::Fixed(n) => *n,
        Extent::PerArg { arg, per_row } => u64::from(scalar(arg)?) * per_row,
    };
    Ok(elems * b.elem.bytes())
}

/// What a GPU launch of `spec` passes for bound arguments `args`: its grid and each
/// parameter's value in signature order (buffer addresses from `address`, u32 scalars as
/// the low half of a u64: the driver reads four bytes of it on this little-endian host);
/// `None` when the grid is empty (zero rows or tokens: nothing to launch).
pub fn launch_values(
    spec: &KernelRecord,
    args: &[Arg],
    address: impl Fn(BufferId, usize) -> u64,
) -> Option<([u32; 3], Vec<u64>)> {
    let g = grid(spec, args);
    if g.contains(&0) {
        return None;
    }
    let values = spec
        .in_signature_order(args)
        .into_iter()
        .map(|a| match a {
            Arg::Buf(id, offset) => address(id, offset),
            Arg::U32(v) => u64::from(v),
        })
        .collect();
    Some((g, values))
}

/// The launch grid of `spec` for bound arguments `args` (as [`bind`] returns them).
pub fn grid(spec: &KernelRecord, args: &[Arg]) -> [u32; 3] {
    let scalar = |name: &str| {
        let i = spec.scalars.iter().position(|s| s.name == name)?;
        match args.get(spec.buffers.len() + i) {
            Some(Arg::U32(v)) => Some(*v),
            _ => None,
        }
    };
    spec.launch.grid.each_ref().map(|d| match d {
        Dim::Fixed(n) => *n,
        Dim::Runtime { arg, .. } => d.blocks_for(scalar(arg).unwrap_or(0)).unwrap_or(0),
    })
}
