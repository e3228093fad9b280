//! Per-kernel bandwidth: each matrix-vector product of the model timed on its own, beside
//! the device's copy bandwidth measured in the same run.
//!
//! Weights come from a rotation of copies larger than any target's last-level cache, so
//! every launch reads its matrix from memory, as a decode step does. The launches of one
//! kernel are captured as one graph and replayed, so the host's launch rate does not
//! limit the figure; what remains between kernels is the device's own launch gap.
//!
//! With windows, every compiled window T of each GEMV is timed too (the speculative
//! verify windows): one launch reads the weights once for T input columns, so the time
//! per token should fall almost as 1/T while the weights dominate the bytes.
//!
//! Every GEMM (the prompt chunk's products) is timed at a chunk of [`GEMM_TOKENS`]
//! tokens (or as many as asked), reported as TFLOP/s (2 · rows · cols · tokens per
//! launch). At that width a GEMM is bound by the matrix unit and the dequantization, not
//! by reading its weights once, so one copy of the weights serves every launch; at a
//! batch GEMV's width ([`rules::BATCH_GEMV_COLUMNS`] tokens or fewer) it is bound by the
//! weights' bytes like the GEMV it would replace, so its weights rotate as the GEMVs' do. Beside them the report names
//! `gemm_ceiling`: the fastest F16 GEMM where the model has one, whose dequantization
//! is a copy, so its rate is what the kernel's tiles and the matrix unit reach on this
//! device, the bound for the quantized ones.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use strata_compiler::ops::{self, Op};
use strata_compiler::plan::{Extent, KernelRecord, MAX_WINDOW, Tuning, rules};
use strata_compiler::quant::{GgmlType, random_blocks, random_floats};

use crate::backend::cpu::quantize_q8;
use crate::backend::{Arg, BufferId, RunError};
use crate::model::Model;

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
    /// Tokens (input columns) per launch: a GEMV's window; 1 for other kernels.
    pub window: u32,
    /// Bytes it reads and writes per launch: for a GEMV its weights once, `window`
    /// input columns and `window` output columns.
    pub bytes: u64,
    /// Seconds per launch.
    pub seconds: f64,
}

/// One GEMV shape timed at every window compiled for it (speculative verify windows).
#[derive(Clone, Debug)]
pub struct WindowSweep {
    /// The shape's window-1 kernel name (`gemv_<type>_<rows>x<cols>`).
    pub base: String,
    /// Weight type.
    pub quant: GgmlType,
    /// Output rows.
    pub rows: u32,
    /// Row length.
    pub cols: u32,
    /// One entry per window, ascending (window 1 where it is compiled).
    pub timings: Vec<KernelTiming>,
}

/// Tokens a GEMM is timed at: a prompt chunk.
pub const GEMM_TOKENS: u32 = rules::GEMM_CHUNK;

/// One GEMM timed at [`GEMM_TOKENS`] tokens.
#[derive(Clone, Debug)]
pub struct GemmTiming {
    /// Kernel name.
    pub name: String,
    /// Weight type.
    pub quant: GgmlType,
    /// Output rows.
    pub rows: u32,
    /// Row length.
    pub cols: u32,
    /// Tokens (input columns) per launch.
    pub tokens: u32,
    /// Seconds per launch.
    pub seconds: f64,
}

impl GemmTiming {
    /// Floating-point operations per second, in units of 10^12: each of the
    /// rows · cols · tokens multiply-adds counts as two.
    pub fn tflops(&self) -> f64 {
        2.0 * f64::from(self.rows) * f64::from(self.cols) * f64::from(self.tokens) / self.seconds / 1e12
    }
}

/// Kernel figures and the reference they are judged by.
#[derive(Clone, Debug)]
pub struct KernelReport {
    /// Device-to-device copy bandwidth, bytes read plus bytes written per second.
    pub copy_bytes_per_s: f64,
    /// One entry per single-token product (and its input quantizer), by name.
    pub kernels: Vec<KernelTiming>,
    /// With windows ([`Model::bench_kernels_with`]): every GEMV shape that has windows
    /// above 1, by base name; empty otherwise.
    pub windows: Vec<WindowSweep>,
    /// Every GEMM of the model at [`GEMM_TOKENS`] tokens, by name.
    pub gemms: Vec<GemmTiming>,
    /// The fastest F16 GEMM among `gemms` (the kernels' ceiling on this device, see the
    /// module's documentation); `None` where the model has no F16 matrix.
    pub gemm_ceiling: Option<GemmTiming>,
}

/// GEMV shape: weight type, rows, row length.
type Shape = (GgmlType, u32, u32);

/// Where GEMVs read their weights: `copies` copies of one matrix, `stride` bytes apart,
/// in one pool shared by every shape (the backend cannot free, so it is allocated once,
/// for the largest), refilled when the shape changes (the specs come sorted by shape).
struct Rotation {
    pool: BufferId,
    /// Largest window timed per shape, which its input and output buffers are sized for.
    largest: Vec<(Shape, u32)>,
    filled: Option<Filled>,
}

/// The shape in the pool and its buffers.
struct Filled {
    shape: Shape,
    w_bytes: usize,
    stride: usize,
    copies: usize,
    /// Float input, int8 quants, their (scale, sum) pairs, output.
    x: BufferId,
    xq: BufferId,
    xd: BufferId,
    y: BufferId,
}

/// Weight bytes, stride and copies of the rotation for one shape.
fn rotation_layout(quant: GgmlType, rows: u32, cols: u32) -> (usize, usize, usize) {
    let w_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(0) as usize * rows as usize;
    let stride = w_bytes.next_multiple_of(256);
    (w_bytes, stride, ROTATION_BYTES.div_ceil(stride.max(1)).max(2))
}

/// A GEMV's shape and the columns it is timed at: its window, or a batch's GEMV at its
/// most columns (timed beside the windows of its shape).
fn gemv_columns(op: &Op) -> Option<(Shape, u32)> {
    match *op {
        Op::Gemv(ops::Gemv { quant, rows, cols, window, .. }) => Some(((quant, rows, cols), window)),
        Op::BatchGemv(ops::BatchGemv { quant, rows, cols, max, .. }) => Some(((quant, rows, cols), max)),
        _ => None,
    }
}

/// Kernels of one GEMV shape sort together, window 1 first (a batch's GEMV last); other
/// kernels by name.
fn bench_order(spec: &KernelRecord) -> (String, u32) {
    match gemv_columns(&spec.op) {
        Some(((quant, rows, cols), window)) => (Op::Gemv(ops::Gemv::new(quant, rows, cols, 1)).kernel_name(), window),
        None => (spec.name.clone(), 1),
    }
}

impl Model {
    /// Times every single-token GEMV of this model (and the int8 input quantizers) with
    /// `reps` launches each, and the device's copy bandwidth.
    pub fn bench_kernels(&mut self, reps: usize) -> Result<KernelReport, RunError> {
        self.bench_kernels_with(reps, false, GEMM_TOKENS)
    }

    /// As [`Model::bench_kernels`]; with `windows`, also every other window of each
    /// GEMV (the speculative verify windows `--spec` compiles; where kernels are planned
    /// on demand, windows 1 to the largest `--spec` of each shape that has one above 1).
    /// A shape's weights are made once and read by all its windows. The GEMMs are timed
    /// at `gemm_tokens` tokens (at most each one's compiled limit).
    pub fn bench_kernels_with(
        &mut self,
        reps: usize,
        windows: bool,
        gemm_tokens: u32,
    ) -> Result<KernelReport, RunError> {
        let reps = reps.max(1);
        if windows {
            self.plan_windows()?;
        }
        let mut specs: Vec<KernelRecord> = self
            .kernels
            .specs()
            .filter(|k| match k.op {
                Op::Gemv(ops::Gemv { window, .. }) => window == 1 || windows,
                // Where kernels are planned on demand (CPU) a batch's GEMV has no kernel.
                Op::BatchGemv(_) => windows && matches!(k.tuning, Tuning::GemvMma(_)),
                Op::QuantizeQ8(_) => true,
                _ => false,
            })
            .cloned()
            .collect();
        specs.sort_by_cached_key(bench_order);
        let copy_bytes_per_s = self.copy_bandwidth(reps)?;
        let mut rotation = self.rotation(&specs)?;
        let mut kernels = Vec::with_capacity(specs.len());
        let mut sweeps: Vec<WindowSweep> = Vec::new();
        let mut rng = ChaCha8Rng::seed_from_u64(0xbe7c);
        for spec in &specs {
            let timing = self.time_kernel(spec, reps, &mut rng, rotation.as_mut())?;
            if let Some(((quant, rows, cols), _)) = gemv_columns(&spec.op) {
                let base = bench_order(spec).0;
                match sweeps.last_mut() {
                    Some(s) if s.base == base => s.timings.push(timing.clone()),
                    _ => sweeps.push(WindowSweep { base, quant, rows, cols, timings: vec![timing.clone()] }),
                }
            }
            if timing.window == 1 {
                kernels.push(timing);
            }
        }
        sweeps.retain(|s| s.timings.iter().any(|k| k.window > 1));
        let gemms = self.bench_gemms(reps, gemm_tokens, &mut rng)?;
        let gemm_ceiling =
            gemms.iter().filter(|g| g.quant == GgmlType::F16).max_by(|a, b| a.tflops().total_cmp(&b.tflops())).cloned();
        Ok(KernelReport { copy_bytes_per_s, kernels, windows: sweeps, gemms, gemm_ceiling })
    }

    /// Times every GEMM among the kernels at `tokens` tokens, `reps` launches each, on
    /// random weights and inputs (one copy, or a rotation at a batch GEMV's width: see
    /// the module's documentation).
    fn bench_gemms(&mut self, reps: usize, tokens: u32, rng: &mut ChaCha8Rng) -> Result<Vec<GemmTiming>, RunError> {
        let mut specs: Vec<KernelRecord> =
            self.kernels.specs().filter(|k| matches!(k.op, Op::Gemm(_))).cloned().collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        let rotate = tokens <= rules::BATCH_GEMV_COLUMNS;
        // One pool for the largest rotation, allocated once (the backend cannot free).
        let pool_bytes = specs
            .iter()
            .filter_map(|s| match s.op {
                Op::Gemm(ops::Gemm { quant, rows, cols }) if rotate => {
                    let (_, stride, copies) = rotation_layout(quant, rows, cols);
                    Some(stride * copies)
                }
                _ => None,
            })
            .max();
        let pool = pool_bytes.map(|bytes| self.backend.alloc(bytes)).transpose()?;
        let mut timings = Vec::with_capacity(specs.len());
        for spec in &specs {
            let Op::Gemm(ops::Gemm { quant, rows, cols }) = spec.op else { continue };
            let tokens = tokens.clamp(1, spec.scalars.iter().find(|s| s.name == "tokens").map_or(1, |s| s.max));
            let (w_bytes, stride, copies) = rotation_layout(quant, rows, cols);
            let mut host = vec![0u8; w_bytes];
            random_blocks(quant, rng, &mut host, 0.05).map_err(|e| RunError::Other(e.to_string()))?;
            let x = random_floats(rng, (tokens * cols) as usize, 1.0);
            let b = &mut self.backend;
            let (w, stride, copies) = match pool {
                Some(pool) => (pool, stride, copies),
                None => (b.alloc(w_bytes)?, 0, 1),
            };
            for c in 0..copies {
                b.write(w, c * stride, &host)?;
            }
            let y = b.alloc((tokens * rows) as usize * 4)?;
            let floats = |v: &[f32]| v.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
            // An int8 GEMM reads its input quantized (the quantizer is not timed).
            let inputs = if spec.buffers.iter().any(|b| b.name == "xq") {
                let (q, d) = crate::backend::cpu::quantize_q8(&x);
                vec![("xq", q), ("xd", floats(&d))]
            } else {
                vec![("x", floats(&x))]
            };
            let mut args = vec![("y", Arg::Buf(y, 0)), ("tokens", Arg::U32(tokens))];
            // A stream-K GEMM's workspace, zeroed as the model hands it over.
            let workspace = spec.buffers.iter().filter(|b| b.workspace).filter_map(|w| match w.extent {
                Extent::Fixed(n) => Some((w.name.as_str(), vec![0; usize::try_from(n * w.elem.bytes()).ok()?])),
                Extent::PerArg { .. } => None,
            });
            for (name, bytes) in inputs.into_iter().chain(workspace) {
                let buf = b.alloc(bytes.len())?;
                b.write(buf, 0, &bytes)?;
                args.push((name, Arg::Buf(buf, 0)));
            }
            let args: Vec<_> = (0..copies)
                .map(|c| {
                    let mut a = vec![("w", Arg::Buf(w, c * stride))];
                    a.extend(args.iter().copied());
                    a
                })
                .collect();
            let seconds = self.time_launches(spec, &args, reps)?;
            timings.push(GemmTiming { name: spec.name.clone(), quant, rows, cols, tokens, seconds });
        }
        Ok(timings)
    }

    /// Where kernels are planned on demand (CPU), plans windows 1 to [`MAX_WINDOW`] of
    /// every GEMV shape that has a window above 1 (a per-tensor product, not a fused
    /// single-token one); compiled artifacts are left as they are.
    fn plan_windows(&mut self) -> Result<(), RunError> {
        let mut shapes: Vec<Shape> = self
            .kernels
            .specs()
            .filter_map(|k| match k.op {
                Op::Gemv(ops::Gemv { quant, rows, cols, window, .. }) if window > 1 => Some((quant, rows, cols)),
                _ => None,
            })
            .collect();
        shapes.sort();
        shapes.dedup();
        for (quant, rows, cols) in shapes {
            for window in 1..=MAX_WINDOW {
                let op = Op::Gemv(ops::Gemv::new(quant, rows, cols, window));
                if self.kernels.has(&op) {
                    self.kernels.get(&op)?;
                }
            }
        }
        Ok(())
    }

    /// One weight pool for the largest GEMV among `specs` (none without GEMVs).
    fn rotation(&mut self, specs: &[KernelRecord]) -> Result<Option<Rotation>, RunError> {
        let mut largest: Vec<(Shape, u32)> = Vec::new();
        let mut pool_bytes = 0;
        for spec in specs {
            if let Some(((quant, rows, cols), window)) = gemv_columns(&spec.op) {
                let (_, stride, copies) = rotation_layout(quant, rows, cols);
                pool_bytes = pool_bytes.max(stride * copies);
                match largest.iter_mut().find(|(s, _)| *s == (quant, rows, cols)) {
                    Some((_, w)) => *w = (*w).max(window),
                    None => largest.push(((quant, rows, cols), window)),
                }
            }
        }
        if largest.is_empty() {
            return Ok(None);
        }
        Ok(Some(Rotation { pool: self.backend.alloc(pool_bytes)?, largest, filled: None }))
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

    /// The rotation filled with random weights of `shape` (once per shape), with input
    /// and output buffers for its largest window.
    fn fill<'r>(&mut self, r: &'r mut Rotation, shape: Shape, rng: &mut ChaCha8Rng) -> Result<&'r Filled, RunError> {
        if r.filled.as_ref().is_none_or(|f| f.shape != shape) {
            let (quant, rows, cols) = shape;
            let (w_bytes, stride, copies) = rotation_layout(quant, rows, cols);
            let mut host = vec![0u8; w_bytes];
            random_blocks(quant, rng, &mut host, 0.05).map_err(|e| RunError::Other(e.to_string()))?;
            let b = &mut self.backend;
            for c in 0..copies {
                b.write(r.pool, c * stride, &host)?;
            }
            let largest = r.largest.iter().find(|(s, _)| *s == shape).map_or(1, |(_, w)| *w) as usize;
            let (n, m) = (largest * cols as usize, largest * rows as usize);
            // Floats, int8 quants (a byte each) and a (scale, sum) pair of floats per 32.
            let (x, xq, xd, y) = (b.alloc(n * 4)?, b.alloc(n)?, b.alloc(n / 32 * 8)?, b.alloc(m * 4)?);
            r.filled = Some(Filled { shape, w_bytes, stride, copies, x, xq, xd, y });
        }
        r.filled.as_ref().ok_or_else(|| RunError::Other("weight rotation not filled".into()))
    }

    fn time_kernel(
        &mut self,
        spec: &KernelRecord,
        reps: usize,
        rng: &mut ChaCha8Rng,
        rotation: Option<&mut Rotation>,
    ) -> Result<KernelTiming, RunError> {
        let (args, bytes, window): (Vec<Vec<(&str, Arg)>>, u64, u32) =
            match (gemv_columns(&spec.op), &spec.op, rotation) {
                (Some(((quant, rows, cols), window)), _, Some(r)) => {
                    let pool = r.pool;
                    let f = self.fill(r, (quant, rows, cols), rng)?;
                    let b = &mut self.backend;
                    // Window T reads T input columns: T rows of `cols` floats, or their int8
                    // quants (quantized per 32-element chunk, so T rows quantize as one).
                    let x = random_floats(rng, (window * cols) as usize, 1.0);
                    let (inputs, in_bytes) = if matches!(spec.tuning, Tuning::GemvMma(_) | Tuning::GemvQ8(_)) {
                        let (xq, xd) = quantize_q8(&x);
                        b.write(f.xq, 0, &xq)?;
                        b.write(f.xd, 0, &xd.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
                        (vec![("xq", Arg::Buf(f.xq, 0)), ("xd", Arg::Buf(f.xd, 0))], xq.len() + xd.len() * 4)
                    } else {
                        b.write(f.x, 0, &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
                        (vec![("x", Arg::Buf(f.x, 0))], x.len() * 4)
                    };
                    // A batch's GEMV takes its columns as a scalar.
                    let tokens =
                        spec.scalars.iter().any(|s| s.name == "tokens").then_some(("tokens", Arg::U32(window)));
                    let args = (0..f.copies)
                        .map(|c| {
                            let mut a = vec![("w", Arg::Buf(pool, c * f.stride)), ("y", Arg::Buf(f.y, 0))];
                            a.extend(inputs.iter().copied().chain(tokens));
                            a
                        })
                        .collect();
                    // The weights once, `window` input columns and `window` output columns.
                    (args, (f.w_bytes + in_bytes + (window * rows) as usize * 4) as u64, window)
                }
                (None, &Op::QuantizeQ8(ops::QuantizeQ8 { cols }), _) => {
                    let b = &mut self.backend;
                    let x = random_floats(rng, cols as usize, 1.0);
                    // Per 32 floats: 32 quants and a (scale, sum) pair of floats.
                    let (xb, q, d) = (b.alloc(x.len() * 4)?, b.alloc(x.len())?, b.alloc(x.len() / 4)?);
                    b.write(xb, 0, &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
                    let a = vec![
                        ("x", Arg::Buf(xb, 0)),
                        ("xq", Arg::Buf(q, 0)),
                        ("xd", Arg::Buf(d, 0)),
                        ("rows", Arg::U32(1)),
                    ];
                    (vec![a], (x.len() * 4 + x.len() + x.len() / 4) as u64, 1)
                }
                _ => return Err(RunError::Other(format!("kernel {}: no benchmark for this op", spec.name))),
            };
        let seconds = self.time_launches(spec, &args, reps)?;
        Ok(KernelTiming { name: spec.name.clone(), window, bytes, seconds })
    }

    /// Seconds per launch of `spec`: `reps` launches, cycling through `args`, captured as
    /// one graph, replayed once to warm up and once timed.
    fn time_launches(&mut self, spec: &KernelRecord, args: &[Vec<(&str, Arg)>], reps: usize) -> Result<f64, RunError> {
        let b = &mut self.backend;
        b.begin_capture()?;
        let queued = (0..reps).try_for_each(|i| b.call(spec, &args[i % args.len()]));
        let graph = b.end_capture();
        queued?;
        let graph = graph?;
        b.replay(graph)?;
        let start = b.mark()?;
        b.replay(graph)?;
        let end = b.mark()?;
        Ok(b.seconds(start, end)? / reps as f64)
    }
}
