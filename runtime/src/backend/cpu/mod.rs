//! The CPU backend: the reference every GPU kernel is tested against, and a way to run
//! the default model with no GPU.
//!
//! Each op is plain Rust with the meaning its plan record states (see `ops::Op`),
//! written for clarity: weights are dequantized with the bit-exact ggml-compatible
//! dequantizers, reductions accumulate in f64 where a kernel would accumulate in f32,
//! and the large products use all cores.
//!
//! Each op's reference is its own module, named as `Op::kind` names the op; every one
//! has a `run` taking the op's fields and an [`io::OpIo`] (the launch's arguments by
//! name). This module holds the backend itself (buffers, capture and replay) and the
//! dispatch from an op to its module.

mod add;
mod add_rmsnorm;
mod argmax;
mod attention;
mod attention_merge;
mod attention_prefill;
mod embed;
mod expert_gemm;
mod expert_gemv;
mod gemm;
mod gemv;
mod io;
mod memory;
mod moe_group;
mod moe_route;
mod moe_sum;
mod qsa_score;
mod qsa_select;
mod quantize_q8;
mod rmsnorm;
mod rope_store;
mod silu_mul;
mod softmax;

use std::time::Duration;

use strata_compiler::emit::Dialect;
use strata_compiler::ops::Op;
use strata_compiler::plan::KernelRecord;

pub use self::argmax::argmax;
pub use self::moe_group::moe_group;
pub use self::moe_route::{moe_route, route_weights, top_experts};
pub use self::qsa_score::qsa_bound;
pub use self::qsa_select::qsa_select;
pub use self::quantize_q8::quantize_q8;
use super::host::HostKernels;
use super::{Arg, Backend, BufferId, DeviceInfo, GraphId, HostId, RunError, bind};
use io::OpIo;
pub(crate) use memory::Memory;
use memory::zeroed;
use strata_compiler::pack::SharedBytes;

/// Reference backend over host memory.
#[derive(Default)]
pub struct Cpu {
    buffers: Vec<Memory>,
    host: Vec<Vec<u8>>,
    errors: Option<BufferId>,
    capturing: Option<Vec<Recorded>>,
    graphs: Vec<Vec<Recorded>>,
    /// The host backend's generated kernels, run in place of the references they cover.
    kernels: Option<Box<HostKernels>>,
}

/// A recorded step of a capture.
#[derive(Clone)]
enum Recorded {
    Launch(Box<KernelRecord>, Vec<Arg>),
    Write(BufferId, usize, Vec<u8>),
}

impl Cpu {
    /// A CPU backend with no buffers.
    pub fn new() -> Cpu {
        Cpu::default()
    }

    /// The host backend: these generated kernels, each in place of its op's reference.
    pub fn with_kernels(kernels: HostKernels) -> Cpu {
        Cpu { kernels: Some(Box::new(kernels)), ..Cpu::default() }
    }

    /// Runs `spec` on `args` (in the record's order): its host kernel where there is one,
    /// else the reference of its op, whose module computes the outputs from the inputs,
    /// then they are stored.
    fn run(&mut self, spec: &KernelRecord, args: &[Arg]) -> Result<(), RunError> {
        if let Some(kernels) = self.kernels.as_mut().filter(|k| k.has(spec)) {
            return kernels.run(spec, args, &mut self.buffers);
        }
        let io = &mut OpIo::new(spec, args, &mut self.buffers);
        match &spec.op {
            Op::Gemv(op) => gemv::run(op, io)?,
            Op::Gemm(op) => gemm::run(op, io)?,
            Op::BatchGemv(op) => gemv::run_batch(op, io)?,
            Op::QuantizeQ8(op) => quantize_q8::run(op, io)?,
            Op::RmsNorm(op) => rmsnorm::run(op, io)?,
            Op::AddRmsNorm(op) => add_rmsnorm::run(op, io)?,
            Op::RopeStore(op) => rope_store::run(op, io)?,
            Op::SiluMul(op) => silu_mul::run(op, io)?,
            Op::MoeRoute(op) => moe_route::run(op, io)?,
            Op::ExpertGemv(op) => expert_gemv::run(op, io)?,
            Op::MoeGroup(op) => moe_group::run(op, io)?,
            Op::ExpertGemm(op) => expert_gemm::run(op, io)?,
            Op::MoeSum(op) => moe_sum::run(op, io)?,
            Op::Add(op) => add::run(op, io)?,
            Op::Embed(op) => embed::run(op, io)?,
            Op::Attention(op) => attention::run(op, io)?,
            Op::AttentionMerge(op) => attention_merge::run(op, io)?,
            Op::AttentionPrefill(op) => attention_prefill::run(op, io)?,
            Op::QsaScore(op) => qsa_score::run(op, io)?,
            Op::QsaSelect(op) => qsa_select::run(op, io)?,
            Op::Softmax(op) => softmax::run(op, io)?,
            Op::Argmax(op) => argmax::run(op, io)?,
        }
        io.finish()
    }
}

impl Backend for Cpu {
    fn info(&self) -> DeviceInfo {
        if let Some(k) = &self.kernels {
            return DeviceInfo {
                backend: "host",
                name: format!("host CPU ({}, {} threads)", k.target().product, k.threads()),
                arch: k.target().name.clone(),
                driver: String::new(),
                memory: 0,
                dialect: Some(Dialect::Host),
            };
        }
        DeviceInfo {
            backend: "cpu",
            name: format!("host CPU ({} threads)", rayon::current_num_threads()),
            arch: "cpu".into(),
            driver: String::new(),
            memory: 0,
            dialect: None,
        }
    }

    fn load(&mut self, module: &[u8], kernels: &[KernelRecord]) -> Result<(), RunError> {
        match &mut self.kernels {
            Some(k) => k.load(module, kernels),
            None => Ok(()),
        }
    }

    fn tolerance(&self, spec: &KernelRecord) -> f64 {
        match &self.kernels {
            Some(_) => strata_compiler::host::tolerance(&spec.op),
            None => spec.op.def().tolerance(),
        }
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufferId, RunError> {
        self.buffers.push(Memory::Owned(zeroed(bytes)?));
        Ok(BufferId(self.buffers.len() - 1))
    }

    fn alloc_weights(&mut self, data: SharedBytes) -> Result<BufferId, RunError> {
        self.buffers.push(Memory::Mapped(data));
        Ok(BufferId(self.buffers.len() - 1))
    }

    fn reads_in_place(&self) -> bool {
        true
    }

    fn size(&self, buf: BufferId) -> usize {
        self.buffers[buf.0].len()
    }

    fn write(&mut self, buf: BufferId, offset: usize, data: &[u8]) -> Result<(), RunError> {
        if offset + data.len() > self.size(buf) {
            return Err(RunError::Other(format!(
                "write of {} bytes at {offset} past a {}-byte buffer",
                data.len(),
                self.size(buf)
            )));
        }
        match &mut self.capturing {
            Some(steps) => steps.push(Recorded::Write(buf, offset, data.to_vec())),
            None => self.buffers[buf.0].bytes_mut()?[offset..offset + data.len()].copy_from_slice(data),
        }
        Ok(())
    }

    fn read(&mut self, buf: BufferId, offset: usize, out: &mut [u8]) -> Result<(), RunError> {
        let src = self.buffers[buf.0].get(offset..offset + out.len()).ok_or_else(|| {
            RunError::Other(format!("read of {} bytes at {offset} past a {}-byte buffer", out.len(), self.size(buf)))
        })?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn launch(&mut self, spec: &KernelRecord, args: &[Arg]) -> Result<(), RunError> {
        let named: Vec<(&str, Arg)> = spec
            .buffers
            .iter()
            .map(|b| b.name.as_str())
            .chain(spec.scalars.iter().map(|s| s.name.as_str()))
            .zip(args.iter().copied())
            .collect();
        bind(spec, &named, |id| self.size(id))?;
        match &mut self.capturing {
            Some(steps) => steps.push(Recorded::Launch(Box::new(spec.clone()), args.to_vec())),
            None => self.run(spec, args)?,
        }
        Ok(())
    }

    fn copy(&mut self, from: BufferId, to: BufferId, bytes: usize) -> Result<(), RunError> {
        if bytes > self.buffers[from.0].len() || bytes > self.buffers[to.0].len() {
            return Err(RunError::Other("copy past the end of a buffer".into()));
        }
        let data = self.buffers[from.0][..bytes].to_vec();
        self.buffers[to.0].bytes_mut()?[..bytes].copy_from_slice(&data);
        Ok(())
    }

    fn sync_within(&mut self, _deadline: Duration) -> Result<bool, RunError> {
        Ok(true)
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<HostId, RunError> {
        self.host.push(zeroed(bytes)?);
        Ok(HostId(self.host.len() - 1))
    }

    fn host_mut(&mut self, host: HostId) -> &mut [u8] {
        &mut self.host[host.0]
    }

    fn upload(
        &mut self,
        from: HostId,
        from_offset: usize,
        to: BufferId,
        offset: usize,
        bytes: usize,
    ) -> Result<(), RunError> {
        let src = self.host[from.0].get(from_offset..from_offset + bytes);
        let dst = self.buffers[to.0].bytes_mut()?.get_mut(offset..offset + bytes);
        match (src, dst) {
            (Some(src), Some(dst)) => {
                dst.copy_from_slice(src);
                Ok(())
            }
            _ => Err(RunError::Other(format!("upload of {bytes} bytes past the end of a buffer"))),
        }
    }

    fn error_slot(&mut self) -> &mut Option<BufferId> {
        &mut self.errors
    }

    fn begin_capture(&mut self) -> Result<(), RunError> {
        self.capturing = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&mut self) -> Result<GraphId, RunError> {
        let steps = self.capturing.take().ok_or_else(|| RunError::Other("no capture in progress".into()))?;
        self.graphs.push(steps);
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn replay(&mut self, graph: GraphId) -> Result<(), RunError> {
        // The steps are lent out of the graph while they run (not cloned: a decode step
        // replays hundreds of records a token).
        let slot = self.graphs.get_mut(graph.0).ok_or_else(|| RunError::Other("no such graph".into()))?;
        let steps = std::mem::take(slot);
        let result = steps.iter().try_for_each(|step| match step {
            Recorded::Launch(spec, args) => self.run(spec, args),
            Recorded::Write(buf, offset, data) => {
                self.buffers[buf.0].bytes_mut()?[*offset..offset + data.len()].copy_from_slice(data);
                Ok(())
            }
        });
        self.graphs[graph.0] = steps;
        result
    }
}
