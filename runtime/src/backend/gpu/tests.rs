//! The generic GPU backend's state machine over a fake driver that logs its calls: what
//! is released and in which order, the leak after a hang, the `--checked` read-back, and
//! which kernel a failure names. No GPU is needed.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use strata_compiler::ops::{self, Op};
use strata_compiler::plan::rules;
use strata_compiler::target::Target;

use super::{Driver, Failure, Geometry, Gpu};
use crate::backend::{Arg, Backend, DeviceInfo, RunError};

/// A driver whose memory is host bytes and whose work finishes as `done` says.
struct Fake {
    log: Rc<RefCell<Vec<String>>>,
    memory: RefCell<HashMap<u64, Vec<u8>>>,
    next: Cell<u64>,
    /// What polling an event answers: `None` for "not yet" (a hang).
    done: Rc<RefCell<Option<Result<(), String>>>>,
}

impl Fake {
    fn say(&self, what: String) {
        self.log.borrow_mut().push(what);
    }

    /// The allocation holding `address`, and the offset in it.
    fn locate(&self, address: u64) -> (u64, usize) {
        let memory = self.memory.borrow();
        let base = memory.keys().copied().filter(|&b| b <= address).max().expect("an allocation");
        (base, (address - base) as usize)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.say("close".into());
    }
}

impl Driver for Fake {
    type Stream = u32;
    type Event = u32;
    type Buffer = u64;
    type Module = ();
    type Function = String;
    type Graph = u32;

    fn open(_ordinal: usize) -> Result<Fake, RunError> {
        Err(RunError::NoDevice("fake".into()))
    }
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            backend: "fake",
            name: String::new(),
            arch: String::new(),
            driver: String::new(),
            memory: 0,
            dialect: None,
        }
    }
    fn new_stream(&self) -> Result<u32, RunError> {
        let s = self.log.borrow().iter().filter(|l| l.starts_with("new_stream")).count() as u32;
        self.say(format!("new_stream {s}"));
        Ok(s)
    }
    fn destroy_stream(&self, stream: u32) {
        self.say(format!("destroy_stream {stream}"));
    }
    fn drain(&self, stream: &u32) {
        self.say(format!("drain {stream}"));
    }
    fn load_module(&self, _image: &[u8]) -> Result<(), RunError> {
        Ok(())
    }
    fn function(&self, _module: &(), name: &str, _dynamic_shared: u32) -> Result<String, RunError> {
        Ok(name.into())
    }
    fn alloc(&self, _stream: &u32, bytes: usize) -> Result<u64, RunError> {
        let address = self.next.get();
        self.next.set(address + (1 << 20));
        self.memory.borrow_mut().insert(address, vec![0; bytes.max(1)]);
        Ok(address)
    }
    fn address(&self, buffer: &u64) -> u64 {
        *buffer
    }
    fn free(&self, buffer: u64) {
        self.say(format!("free {buffer:#x}"));
    }
    fn alloc_host(&self, bytes: usize) -> Result<*mut u8, RunError> {
        Ok(Box::leak(vec![7u8; bytes.max(1)].into_boxed_slice()).as_mut_ptr())
    }
    unsafe fn free_host(&self, _ptr: *mut u8) {
        self.say("free_host".into());
    }
    unsafe fn write(&self, stream: &u32, dst: u64, data: &[u8]) -> Result<(), RunError> {
        self.say(format!("write {stream}"));
        let (base, at) = self.locate(dst);
        self.memory.borrow_mut().get_mut(&base).expect("live")[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
    unsafe fn read(&self, stream: &u32, src: u64, out: &mut [u8]) -> Result<(), Failure> {
        self.say(format!("read {stream}"));
        if let Some(Err(e)) = &*self.done.borrow() {
            return Err(Failure::Kernel(e.clone()));
        }
        let (base, at) = self.locate(src);
        out.copy_from_slice(&self.memory.borrow()[&base][at..at + out.len()]);
        Ok(())
    }
    unsafe fn copy(&self, stream: &u32, _dst: u64, _src: u64, _bytes: usize) -> Result<(), RunError> {
        self.say(format!("copy {stream}"));
        Ok(())
    }
    unsafe fn upload(&self, stream: &u32, dst: u64, src: &[u8]) -> Result<(), RunError> {
        self.say(format!("upload {stream}"));
        // SAFETY: the fake's device memory is host memory.
        unsafe { self.write(stream, dst, src) }
    }
    unsafe fn launch(
        &self,
        stream: &u32,
        function: &String,
        _geometry: Geometry,
        dependent: bool,
        _params: &mut [*mut c_void],
    ) -> Result<(), Failure> {
        self.say(format!("launch {function} on {stream} dependent={dependent}"));
        Ok(())
    }
    fn record(&self, stream: &u32, timed: bool) -> Result<u32, RunError> {
        let e = self.log.borrow().len() as u32;
        self.say(format!("record {e} on {stream} timed={timed}"));
        Ok(e)
    }
    fn poll(&self, _event: &u32) -> Poll<Result<(), Failure>> {
        match &*self.done.borrow() {
            None => Poll::Pending,
            Some(r) => Poll::Ready(r.clone().map_err(Failure::Kernel)),
        }
    }
    fn synchronize(&self, event: &u32) -> Result<(), RunError> {
        self.say(format!("synchronize {event}"));
        Ok(())
    }
    fn elapsed_ms(&self, from: &u32, to: &u32) -> Result<f32, RunError> {
        Ok((to - from) as f32)
    }
    fn stream_wait(&self, stream: &u32, event: &u32) -> Result<(), RunError> {
        self.say(format!("wait {stream} for {event}"));
        Ok(())
    }
    fn destroy_event(&self, event: u32) {
        self.say(format!("destroy_event {event}"));
    }
    fn begin_capture(&self, stream: &u32) -> Result<(), RunError> {
        self.say(format!("begin_capture {stream}"));
        Ok(())
    }
    fn end_capture(&self, _stream: &u32) -> Result<Option<u32>, RunError> {
        Ok(Some(9))
    }
    fn launch_graph(&self, stream: &u32, graph: &u32) -> Result<(), RunError> {
        self.say(format!("launch_graph {graph} on {stream}"));
        Ok(())
    }
    fn destroy_graph(&self, graph: u32) {
        self.say(format!("destroy_graph {graph}"));
    }
}

type Log = Rc<RefCell<Vec<String>>>;
type Done = Rc<RefCell<Option<Result<(), String>>>>;

fn gpu() -> (Gpu<Fake>, Log, Done) {
    let log = Log::default();
    let done: Done = Rc::new(RefCell::new(Some(Ok(()))));
    let fake =
        Fake { log: Rc::clone(&log), memory: RefCell::default(), next: Cell::new(1 << 20), done: Rc::clone(&done) };
    (Gpu::with_driver(fake).expect("opens"), log, done)
}

fn released(log: &Log) -> Vec<String> {
    let log = log.borrow();
    let at = log.iter().position(|l| l.starts_with("drain")).expect("released");
    log[at..].to_vec()
}

#[test]
fn everything_is_released_in_order_after_the_queue_drained() {
    let (mut g, log, _) = gpu();
    let buf = g.alloc(64).expect("alloc");
    let host = g.alloc_host(16).expect("host");
    assert_eq!(g.host_mut(host), &[0u8; 16][..], "host memory starts zeroed");
    g.upload(host, 0, buf, 8, 16).expect("upload");
    g.await_uploads().expect("await");
    let mark = g.mark().expect("mark");
    g.begin_capture().expect("begin");
    let graph = g.end_capture().expect("end");
    g.replay(graph).expect("replay");
    let _ = g.seconds(mark, mark).expect("seconds");
    drop(g);
    let expected = [
        "drain 0",
        "free 0x100000",
        "free_host",
        "destroy_graph 9",
        "destroy_event 7",
        "destroy_event 4",
        "destroy_event 5",
        "destroy_stream 1",
        "destroy_stream 0",
        "close",
    ];
    assert_eq!(released(&log), expected, "{:#?}", log.borrow());
    let log = log.borrow();
    assert!(log.contains(&"upload 1".to_string()), "uploads go on the copy stream: {log:#?}");
    assert!(log.contains(&"wait 0 for 5".to_string()), "kernels wait for the uploads' event: {log:#?}");
}

#[test]
fn a_hang_leaks_memory_modules_graphs_streams_and_the_driver() {
    let (mut g, log, done) = gpu();
    g.alloc(64).expect("alloc");
    g.alloc_host(16).expect("host");
    g.begin_capture().expect("begin");
    g.end_capture().expect("end");
    *done.borrow_mut() = None;
    assert!(!g.sync_within(Duration::from_millis(5)).expect("no error"));
    drop(g);
    let log = log.borrow();
    let released = ["drain", "free", "destroy_graph", "destroy_stream", "close"];
    assert!(!log.iter().any(|l| released.iter().any(|r| l.starts_with(r))), "{log:#?}");
}

#[test]
fn device_failures_name_the_last_kernel_queued() {
    let target = Target::load("sm_90").expect("known target");
    let spec = rules::kernel(Op::Add(ops::Add { n: 256, broadcast: false }), &target);
    let (mut g, log, done) = gpu();
    g.load(b"", std::slice::from_ref(&spec)).expect("load");
    let mut args = Vec::new();
    for _ in &spec.buffers {
        args.push(Arg::Buf(g.alloc(1 << 16).expect("alloc"), 0));
    }
    args.extend(spec.scalars.iter().map(|s| Arg::U32(s.max.min(1))));
    g.launch(&spec, &args).expect("launch");
    assert!(log.borrow().iter().any(|l| l.starts_with(&format!("launch {} on 0", spec.name))), "{:#?}", log.borrow());
    *done.borrow_mut() = Some(Err("boom".into()));
    let e = g.sync_within(Duration::from_secs(1)).expect_err("fails").to_string();
    assert_eq!(e, format!("kernel {}: failed on the device: boom", spec.name));
    let mut out = [0u8; 4];
    let e = g.read(args_buffer(&args), 0, &mut out).expect_err("fails").to_string();
    assert_eq!(e, format!("kernel {}: failed on the device: boom", spec.name));
}

fn args_buffer(args: &[Arg]) -> crate::backend::BufferId {
    match args[0] {
        Arg::Buf(b, _) => b,
        Arg::U32(_) => panic!("buffers first"),
    }
}

#[test]
fn a_checked_violation_is_read_back_named_and_cleared() {
    let (mut g, log, _) = gpu();
    let errors = g.error_buffer().expect("error buffer");
    let record: Vec<u8> = [1u32, 5, 2, 40, 0, 3, 0, 17].iter().flat_map(|v| v.to_le_bytes()).collect();
    g.write(errors, 0, &record).expect("write");
    let e = g.sync_within(Duration::from_secs(1)).expect_err("a violation");
    assert!(matches!(e, RunError::Bounds { ref kernel, index: 40, thread: 17, count: 1, .. } if kernel == "#5"), "{e}");
    assert!(g.sync_within(Duration::from_secs(1)).expect("cleared"), "{:#?}", log.borrow());
    let mut raw = [1u8; 32];
    g.read(errors, 0, &mut raw).expect("read");
    assert_eq!(raw, [0u8; 32]);
}

#[test]
fn copies_and_uploads_past_the_end_are_refused() {
    let (mut g, _, _) = gpu();
    let (a, b) = (g.alloc(8).expect("alloc"), g.alloc(8).expect("alloc"));
    let host = g.alloc_host(4).expect("host");
    assert!(g.copy(a, b, 9).is_err());
    assert!(g.copy(a, a, 8).is_err());
    assert!(g.upload(host, 1, a, 0, 4).is_err());
    assert!(g.write(a, 4, &[0; 5]).is_err());
    let empty = g.alloc(0).expect("alloc");
    assert_eq!(g.size(empty), 1);
}
