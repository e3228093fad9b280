//! Per-kernel bandwidth: each matrix-vector product of the model timed on its own, beside
//! the device's copy bandwidth measured in the same run.
//!
//! Weights come from a rotation of copies larger than any target's last-level cache, so
//! every launch reads its matrix from memory, as a decode step does. The launches of one
//! kernel are captured as one graph and replayed, so the host's launch rate does not
//! limit the figure; what remains between kernels is the device's own launch gap.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use strata_compiler::plan::{KernelSpec, Op, Tuning};
use strata_compiler::quant::{random_blocks, random_floats};

use super::Model;
use crate::backend::cpu::quantize_q8;
use crate::backend::{Arg, RunError};

/// Bytes of weight copies cycled through: above the largest last-level cache of the
/// shipped targets (MI300's 256 MiB Infinity Cache; the H200's L2 is 50 MiB).
const ROTATION_BYTES: usize = 512 << 20;
/// Bytes of each buffer of the copy-bandwidth probe.
const COPY_BYTES: usize = 256 << 20;

/// One kernel's figure.
#[derive(Clone, Debug)]
pub struct KernelTiming {
    /// Kernel name.
    pub name: String,
    /// Bytes it reads and writes per launch.
    pub bytes: u64,
    /// Seconds per launch.
    pub seconds: f64,
}

/// Kernel figures and the reference they are judged by.
#[derive(Clone, Debug)]
pub struct KernelReport {
    /// Device-to-device copy bandwidth, bytes read plus bytes written per second.
    pub copy_bytes_per_s: f64,
    /// One entry per single-token product (and its input quantizer), by name.
    pub kernels: Vec<KernelTiming>,
}

impl Model {
    /// Times every single-token GEMV of this model (and the int8 input quantizers) with
    /// `reps` launches each, and the device's copy bandwidth.
    pub fn bench_kernels(&mut self, reps: usize) -> Result<KernelReport, RunError> {
        let reps = reps.max(1);
        let mut specs: Vec<KernelSpec> = self
            .kernels
            .specs()
            .filter(|k| matches!(k.op, Op::Gemv { window: 1, .. } | Op::QuantizeQ8 { .. }))
            .cloned()
            .collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        let copy_bytes_per_s = self.copy_bandwidth(reps)?;
        let mut kernels = Vec::with_capacity(specs.len());
        let mut rng = ChaCha8Rng::seed_from_u64(0xbe7c);
        for spec in &specs {
            kernels.push(self.time_kernel(spec, reps, &mut rng)?);
        }
        Ok(KernelReport { copy_bytes_per_s, kernels })
    }

    fn copy_bandwidth(&mut self, reps: usize) -> Result<f64, RunError> {
        let b = &mut self.backend;
        let (from, to) = (b.alloc(COPY_BYTES)?, b.alloc(COPY_BYTES)?);
        b.copy(from, to, COPY_BYTES)?;
        let start = b.mark()?;
        for _ in 0..reps {
            b.copy(from, to, COPY_BYTES)?;
        }
        let end = b.mark()?;
        let seconds = b.seconds(start, end)?;
        Ok((2 * COPY_BYTES * reps) as f64 / seconds)
    }

    fn time_kernel(&mut self, spec: &KernelSpec, reps: usize, rng: &mut ChaCha8Rng) -> Result<KernelTiming, RunError> {
        let b = &mut self.backend;
        let (args, bytes): (Vec<Vec<(&str, Arg)>>, u64) = match spec.op {
            Op::Gemv { quant, rows, cols, window } => {
                let w_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(0) as usize * rows as usize;
                let mut host = vec![0u8; w_bytes];
                random_blocks(quant, rng, &mut host, 0.05).map_err(|e| RunError::Other(e.to_string()))?;
                let stride = w_bytes.next_multiple_of(256);
                let copies = ROTATION_BYTES.div_ceil(stride).max(2);
                let pool = b.alloc(stride * copies)?;
                for c in 0..copies {
                    b.write(pool, c * stride, &host)?;
                }
                let x = random_floats(rng, (window * cols) as usize, 1.0);
                let y = b.alloc((window * rows) as usize * 4)?;
                let (inputs, in_bytes) = if matches!(spec.tuning, Tuning::GemvQ8(_)) {
                    let (xq, xd) = quantize_q8(&x);
                    let (q, d) = (b.alloc(xq.len())?, b.alloc(xd.len() * 4)?);
                    b.write(q, 0, &xq)?;
                    b.write(d, 0, &xd.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
                    (vec![("xq", Arg::Buf(q, 0)), ("xd", Arg::Buf(d, 0))], xq.len() + xd.len() * 4)
                } else {
                    let buf = b.alloc(x.len() * 4)?;
                    b.write(buf, 0, &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
                    (vec![("x", Arg::Buf(buf, 0))], x.len() * 4)
                };
                let args = (0..copies)
                    .map(|c| {
                        let mut a = vec![("w", Arg::Buf(pool, c * stride)), ("y", Arg::Buf(y, 0))];
                        a.extend(inputs.iter().copied());
                        a
                    })
                    .collect();
                (args, (w_bytes + in_bytes + (window * rows) as usize * 4) as u64)
            }
            Op::QuantizeQ8 { cols } => {
                let x = random_floats(rng, cols as usize, 1.0);
                // Per 32 floats: 32 quants and a (scale, sum) pair of floats.
                let (xb, q, d) = (b.alloc(x.len() * 4)?, b.alloc(x.len())?, b.alloc(x.len() / 4)?);
                b.write(xb, 0, &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
                let a =
                    vec![("x", Arg::Buf(xb, 0)), ("xq", Arg::Buf(q, 0)), ("xd", Arg::Buf(d, 0)), ("rows", Arg::U32(1))];
                (vec![a], (x.len() * 4 + x.len() + x.len() / 4) as u64)
            }
            _ => return Err(RunError::Other(format!("kernel {}: no benchmark for this op", spec.name))),
        };
        b.begin_capture()?;
        let queued = (0..reps).try_for_each(|i| b.call(spec, &args[i % args.len()]));
        let graph = b.end_capture();
        queued?;
        let graph = graph?;
        b.replay(graph)?;
        let start = b.mark()?;
        b.replay(graph)?;
        let end = b.mark()?;
        let seconds = b.seconds(start, end)? / reps as f64;
        Ok(KernelTiming { name: spec.name.clone(), bytes, seconds })
    }
}
