//! The host backend's kernels: a host target's shared library (`strata_compiler::host`),
//! loaded with libloading, each kernel's parts run on a pool of worker threads. The host
//! backend is the CPU backend ([`Cpu`]: buffers in host memory, capture and replay) with
//! these kernels in front of its references: an op without a host kernel runs its
//! reference.

mod pool;

use std::collections::HashMap;
use std::io::Write as _;

use strata_compiler::host::{self, HostTarget};
use strata_compiler::plan::KernelRecord;

use self::pool::Pool;
use super::cpu::{Cpu, Memory};
use super::{Arg, RunError};

/// The C signature of every generated host kernel.
type Kernel = unsafe extern "C" fn(*const Call);

/// `strata_call` of the host prelude: one part of one phase of a launch.
#[repr(C)]
struct Call {
    bufs: *const *mut u8,
    scalars: *const u32,
    part: u32,
    parts: u32,
    phase: u32,
    scratch: *mut u8,
}

/// One launch's arguments, shared by the workers that run its parts.
struct Launch {
    kernel: Kernel,
    bufs: Vec<*mut u8>,
    scalars: Vec<u32>,
    scratch: *mut u8,
    parts: u32,
}

// SAFETY: the pointers are the launch's buffers and scratch, alive for the whole launch
// (the caller waits for every part); parts write disjoint parts of the outputs, as each
// kernel's partition promises.
unsafe impl Sync for Launch {}

impl Launch {
    fn part(&self, part: u32, phase: u32) {
        let call = Call {
            bufs: self.bufs.as_ptr(),
            scalars: self.scalars.as_ptr(),
            part,
            parts: self.parts,
            phase,
            scratch: self.scratch,
        };
        // SAFETY: the kernel reads and writes only within the buffers its record
        // describes, whose bounds `bind` checked, and the scratch its schedule sized.
        unsafe { (self.kernel)(&call) };
    }
}

/// A loaded host library and the workers that run its kernels.
pub struct HostKernels {
    target: HostTarget,
    threads: usize,
    pool: Pool,
    /// Kept loaded while `kernels` points into it.
    library: Option<libloading::Library>,
    kernels: HashMap<String, Kernel>,
    scratch: Vec<u8>,
}

/// A host backend for `target` with `threads` workers (physical cores when `None`).
pub fn open(target: HostTarget, threads: Option<usize>) -> Result<Cpu, RunError> {
    let threads = threads.unwrap_or_else(physical_cores).max(1);
    let pool = Pool::new(threads)
        .map_err(|e| RunError::Other(format!("host backend: cannot start {threads} worker threads: {e}")))?;
    Ok(Cpu::with_kernels(HostKernels {
        target,
        threads,
        pool,
        library: None,
        kernels: HashMap::new(),
        scratch: Vec::new(),
    }))
}

/// Physical cores of this machine (hyper-threads of one core counted once), from Linux's
/// CPU topology; the logical CPU count where it cannot be read.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut cores = std::collections::BTreeSet::new();
    for cpu in 0..logical {
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
        match std::fs::read_to_string(path) {
            Ok(siblings) => {
                cores.insert(siblings.trim().to_string());
            }
            Err(_) => return logical,
        }
    }
    cores.len().max(1)
}

impl HostKernels {
    /// The target the library was built for.
    pub fn target(&self) -> &HostTarget {
        &self.target
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Loads a host library (the bytes of `module.so`) and finds each of `kernels` that
    /// has a host kernel in it; a missing one is refused by name.
    pub fn load(&mut self, module: &[u8], kernels: &[KernelRecord]) -> Result<(), RunError> {
        // dlopen needs a file: a temporary one of this process, removed once mapped.
        static LOADED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = LOADED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("strata-host-{}-{n}.so", std::process::id()));
        let written = std::fs::File::create(&path).and_then(|mut f| f.write_all(module));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&path);
            return Err(RunError::Other(format!("host backend: writing {}: {e}", path.display())));
        }
        // SAFETY: the library is a strata host module (built by strata-compile for this
        // target and checked against the manifest's hash by the artifact loader); it has
        // no initializers (freestanding, no C++ runtime) and its kernels are only called
        // through `launch` with the arguments their records describe.
        let library = unsafe { libloading::Library::new(&path) };
        let _ = std::fs::remove_file(&path);
        let library =
            library.map_err(|e| RunError::Other(format!("host backend: cannot load the kernel library: {e}")))?;
        let mut found = HashMap::new();
        for k in kernels.iter().filter(|k| host::has_kernel(k)) {
            // SAFETY: every host kernel is `extern "C" void NAME(const strata_call*)`.
            let f = unsafe { library.get::<Kernel>(k.name.as_bytes()) }
                .map_err(|e| RunError::Other(format!("host library has no kernel {}: {e}", k.name)))?;
            found.insert(k.name.clone(), *f);
        }
        self.kernels = found;
        self.library = Some(library);
        Ok(())
    }

    /// Whether `spec` runs a host kernel (else its reference).
    pub fn has(&self, spec: &KernelRecord) -> bool {
        self.kernels.contains_key(&spec.name)
    }

    /// Runs `spec`'s host kernel on `args` (checked by `bind`) over `buffers`: each phase
    /// of its schedule split into one part per worker, or one part here.
    pub(crate) fn run(&mut self, spec: &KernelRecord, args: &[Arg], buffers: &mut [Memory]) -> Result<(), RunError> {
        let kernel =
            *self.kernels.get(&spec.name).ok_or_else(|| RunError::Other(format!("no host kernel {}", spec.name)))?;
        let nb = spec.buffers.len();
        let mut bufs = Vec::with_capacity(nb);
        for (a, b) in args[..nb].iter().zip(&spec.buffers) {
            match *a {
                // `bind` checked every offset and extent against the buffer's size; the
                // kernel writes only the buffers its record says it writes.
                Arg::Buf(id, offset) => bufs.push(if b.writes {
                    buffers[id.0].bytes_mut()?.as_mut_ptr().wrapping_add(offset)
                } else {
                    buffers[id.0].as_ptr().cast_mut().wrapping_add(offset)
                }),
                Arg::U32(_) => return Err(RunError::Other(format!("{}: a scalar where a buffer goes", spec.name))),
            }
        }
        let scalars: Vec<u32> = args[nb..].iter().map(|a| if let Arg::U32(v) = a { *v } else { 0 }).collect();
        let value = |name: &str| spec.scalars.iter().position(|s| s.name == name).map_or(0, |i| scalars[i]);
        let schedule = host::schedule(&spec.op, value);
        if self.scratch.len() < schedule.scratch {
            self.scratch.resize(schedule.scratch, 0);
        }
        let parts = if schedule.parallel { self.threads } else { 1 };
        let launch = Launch { kernel, bufs, scalars, scratch: self.scratch.as_mut_ptr(), parts: parts as u32 };
        for phase in 0..schedule.phases {
            if parts == 1 {
                launch.part(0, phase);
            } else {
                self.pool.run(&|part| launch.part(part as u32, phase));
            }
        }
        Ok(())
    }
}
