//! The forward walk's launches, kernel by kernel with their bound arguments, as a GPU
//! would receive them: a model planned for sm_90 (so fused kernels exist exactly where a
//! GPU's artifacts have them) runs on the CPU backend behind a recorder. The snapshots
//! change only when the forward pass does: a refactor of the walk must leave them alone.

use std::fmt::Write as _;
use std::time::Duration;

use strata_compiler::model::{Family, ModelDesc};
use strata_compiler::pack::Pack;
use strata_compiler::plan::{self, Int8Dot, KernelRecord, Options};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::Preset;
use strata_compiler::target::Target;
use strata_runtime::backend::cpu::Cpu;
use strata_runtime::backend::{Arg, Backend, BufferId, DeviceInfo, GraphId, HostId, RunError};
use strata_runtime::kernels::Kernels;
use strata_runtime::model::{CacheSize, ExpertOptions, KvBudget, Logits, Model, QsaConfig};
use strata_tests::{synthetic_pack, synthetic_pack_of};

/// A buffer as the trace names it: `b` and its allocation number.
fn buffer(id: BufferId) -> String {
    format!("{id:?}").replace("BufferId(", "b").replace(')', "")
}

/// The CPU backend, writing down every launch it is given.
struct Recorder {
    cpu: Cpu,
    log: std::rc::Rc<std::cell::RefCell<String>>,
}

impl Backend for Recorder {
    fn info(&self) -> DeviceInfo {
        self.cpu.info()
    }
    fn load(&mut self, module: &[u8], kernels: &[KernelRecord]) -> Result<(), RunError> {
        self.cpu.load(module, kernels)
    }
    fn alloc(&mut self, bytes: usize) -> Result<BufferId, RunError> {
        self.cpu.alloc(bytes)
    }
    fn size(&self, buf: BufferId) -> usize {
        self.cpu.size(buf)
    }
    fn write(&mut self, buf: BufferId, offset: usize, data: &[u8]) -> Result<(), RunError> {
        self.cpu.write(buf, offset, data)
    }
    fn read(&mut self, buf: BufferId, offset: usize, out: &mut [u8]) -> Result<(), RunError> {
        self.cpu.read(buf, offset, out)
    }
    fn launch(&mut self, spec: &KernelRecord, args: &[Arg]) -> Result<(), RunError> {
        let shown: Vec<String> = args
            .iter()
            .map(|a| match a {
                Arg::Buf(id, 0) => buffer(*id),
                Arg::Buf(id, offset) => format!("{}+{offset}", buffer(*id)),
                Arg::U32(v) => v.to_string(),
            })
            .collect();
        let _ = writeln!(self.log.borrow_mut(), "{}({})", spec.name, shown.join(", "));
        self.cpu.launch(spec, args)
    }
    fn sync_within(&mut self, deadline: Duration) -> Result<bool, RunError> {
        self.cpu.sync_within(deadline)
    }
    fn begin_capture(&mut self) -> Result<(), RunError> {
        self.log.borrow_mut().push_str("-- capture\n");
        self.cpu.begin_capture()
    }
    fn end_capture(&mut self) -> Result<GraphId, RunError> {
        self.cpu.end_capture()
    }
    fn replay(&mut self, graph: GraphId) -> Result<(), RunError> {
        let _ = writeln!(self.log.borrow_mut(), "-- replay {graph:?}");
        self.cpu.replay(graph)
    }
    fn copy(&mut self, from: BufferId, to: BufferId, bytes: usize) -> Result<(), RunError> {
        self.cpu.copy(from, to, bytes)
    }
    fn error_slot(&mut self) -> &mut Option<BufferId> {
        self.cpu.error_slot()
    }
    fn alloc_host(&mut self, bytes: usize) -> Result<HostId, RunError> {
        self.cpu.alloc_host(bytes)
    }
    fn host_mut(&mut self, host: HostId) -> &mut [u8] {
        self.cpu.host_mut(host)
    }
    fn upload(&mut self, from: HostId, at: usize, to: BufferId, offset: usize, bytes: usize) -> Result<(), RunError> {
        let _ = writeln!(self.log.borrow_mut(), "-- upload {bytes} bytes to {}+{offset}", buffer(to));
        self.cpu.upload(from, at, to, offset, bytes)
    }
}

/// The launches of a prefill window, a prompt chunk (dense packs), a decode step, a
/// verify window and, past a small QSA budget, a sparse decode step of `preset` with
/// `weights`, planned for sm_90.
fn trace(preset: Preset, weights: &[GgmlType], int8: Int8Dot, experts: ExpertOptions) -> String {
    trace_pack(synthetic_pack(preset, 2, weights), int8, experts)
}

/// [`trace`] of a pack's bytes.
fn trace_pack(bytes: Vec<u8>, int8: Int8Dot, experts: ExpertOptions) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pack.gguf");
    std::fs::write(&path, bytes).expect("write pack");
    let pack = Pack::open(&path).expect("opens");
    let target = Target::load("sm_90").expect("known");
    let desc = ModelDesc::from_pack(&pack).expect("a model");
    let options = Options { verify_window: 4, int8, ..Options::default() };
    let plan = plan::plan(&desc, &pack, &target, &options).expect("plans");
    let log = std::rc::Rc::new(std::cell::RefCell::new(String::new()));
    let backend = Box::new(Recorder { cpu: Cpu::new(), log: log.clone() });
    let mut model = Model::load(
        &pack,
        backend,
        Kernels::compiled(plan.kernels),
        128,
        4,
        6,
        1,
        KvBudget::PerSlot,
        &experts,
        &mut |_, _| {},
    )
    .expect("loads");
    log.borrow_mut().clear();
    let section = |log: &std::rc::Rc<std::cell::RefCell<String>>, title: &str| {
        let _ = writeln!(log.borrow_mut(), "== {title}");
    };
    // A small expert cache narrows the passes.
    let w = model.window().min(3) as usize;
    section(&log, &format!("prefill of {w}, last logits"));
    model.forward(&[5, 6, 7][..w], Logits::Last).expect("prefill");
    if model.chunk() > model.window() {
        section(&log, "prompt chunk of 6 on the matrix units, last logits");
        model.forward(&[1, 2, 3, 4, 5, 6], Logits::Last).expect("prefill");
    }
    section(&log, "decode step");
    model.decode_greedy(8).expect("decodes");
    section(&log, &format!("verify window of {w}"));
    model.verify_greedy(&[9, 10, 11][..w]).expect("verifies");
    model.set_qsa(QsaConfig { enabled: true, budget: 32, block: None }).expect("qsa");
    model.fill_context(80, 1).expect("fills");
    section(&log, "sparse decode step at 80");
    model.decode_greedy(12).expect("decodes");
    log.take()
}

#[test]
fn dense_int8_walk() {
    let weights = [GgmlType::Q4_0, GgmlType::IQ2_XS, GgmlType::Q6_K];
    insta::assert_snapshot!(trace(Preset::TinyLlama, &weights, Int8Dot::Always, ExpertOptions::default()));
}

#[test]
fn qwen3_float_walk() {
    let weights = [GgmlType::Q4_K, GgmlType::Q8_0];
    insta::assert_snapshot!(trace(Preset::TinyQwen3, &weights, Int8Dot::Never, ExpertOptions::default()));
}

#[test]
fn moe_walk_resident_and_cached() {
    let weights = [GgmlType::IQ2_XS, GgmlType::Q4_K];
    insta::assert_snapshot!(trace(Preset::TinyQwen3Moe, &weights, Int8Dot::Always, ExpertOptions::default()));
    let cached = ExpertOptions { cache: CacheSize::Percent(25.0), ..ExpertOptions::default() };
    insta::assert_snapshot!(trace(Preset::TinyQwen3Moe, &weights, Int8Dot::Auto, cached));
}

#[test]
fn stacked_decode_products_and_head_norms() {
    // One type: Q·K·V and gate·up stack for the decode step, and qwen3's head norms take
    // one launch there.
    insta::assert_snapshot!(trace(Preset::TinyQwen3, &[GgmlType::Q8_0], Int8Dot::Always, ExpertOptions::default()));
}

#[test]
fn qwen2_biases() {
    let mut shape = Preset::TinyLlama.shape();
    shape.family = Family::Qwen2;
    shape.layers = 2;
    let pack = synthetic_pack_of(&shape, &[GgmlType::Q4_0]);
    insta::assert_snapshot!(trace_pack(pack, Int8Dot::Auto, ExpertOptions::default()));
}

#[test]
fn gemma3_windows_and_normed_outputs() {
    // Two local layers (a window of 16, their own RoPE table; dense past QSA's budget)
    // and a global one; each block's output normed in the residual add's launch, the last
    // one's by a norm of its own.
    let pack = synthetic_pack_of(&Preset::TinyGemma3.shape(), &[GgmlType::Q8_0]);
    insta::assert_snapshot!(trace_pack(pack, Int8Dot::Always, ExpertOptions::default()));
}
