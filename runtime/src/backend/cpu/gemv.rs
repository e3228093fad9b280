//! The GEMV reference (`Op::Gemv`, and `Op::BatchGemv`'s), for both of its kernels: the float product reads
//! `x`, the int8-dot product reads `x` quantized (`xq`, `xd`) and is referenced by the
//! float product of the same dequantized activations (see [`OpIo::activations`]).

use rayon::prelude::*;

use super::RunError;
use super::io::{OpIo, dot};
use strata_compiler::ops;
use strata_compiler::quant::GgmlType;

/// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `t < window`, rows dequantized one at a time
/// and spread over all cores (see [`product`]), a stack's matrices laid out apart.
pub(super) fn run(op: &ops::Gemv, io: &mut OpIo) -> Result<(), RunError> {
    let ops::Gemv { quant, rows, cols, window, stack } = *op;
    let x = io.activations((window * cols) as usize);
    let y = product(quant, rows, cols, io.input("w"), &x, window as usize);
    io.output_floats("y", &unstack(stack, rows, y));
    Ok(())
}

/// The batch's GEMV (`Op::BatchGemv`): the GEMV's product over its runtime count of
/// columns.
pub(super) fn run_batch(op: &ops::BatchGemv, io: &mut OpIo) -> Result<(), RunError> {
    let ops::BatchGemv { quant, rows, cols, max, stack } = *op;
    let tokens = io.scalar("tokens").min(max) as usize;
    let x = io.activations(tokens * cols as usize);
    let y = product(quant, rows, cols, io.input("w"), &x, tokens);
    io.output_floats("y", &unstack(stack, rows, y));
    Ok(())
}

/// `y` (`[t][rows]`) laid out as `stack` has it: each stacked matrix's `[t][its rows]`
/// after the one before's (`strata_out_at`).
fn unstack(stack: ops::Stack, rows: u32, y: Vec<f32>) -> Vec<f32> {
    if stack.is_single() {
        return y;
    }
    let (rows, mut start) = (rows as usize, 0);
    let columns = y.len() / rows.max(1);
    let mut out = Vec::with_capacity(y.len());
    for part in stack.parts(rows as u32) {
        let part = part as usize;
        for t in 0..columns {
            out.extend_from_slice(&y[t * rows + start..t * rows + start + part]);
        }
        start += part;
    }
    out
}

/// `y[t][r] = Σ_c W[r][c] · x[t][c]` for the `x.len() / cols` columns of `x`: the
/// product of a GEMV window and of a GEMM alike.
pub(super) fn product(quant: GgmlType, rows: u32, cols: u32, w: &[u8], x: &[f32], columns: usize) -> Vec<f32> {
    let (rows, cols) = (rows as usize, cols as usize);
    let row_bytes = quant.row_bytes(cols as u64).unwrap_or(0) as usize;
    let results: Vec<Vec<f32>> = (0..rows)
        .into_par_iter()
        .map(|r| {
            let mut wr = vec![0f32; cols];
            // Rows were sized by `bind`; a dequantization error cannot occur.
            let _ = quant.dequantize(&w[r * row_bytes..(r + 1) * row_bytes], &mut wr);
            (0..columns).map(|t| dot(&wr, &x[t * cols..(t + 1) * cols])).collect()
        })
        .collect();
    let mut y = vec![0f32; columns * rows];
    for (r, column) in results.iter().enumerate() {
        for t in 0..columns {
            y[t * rows + r] = column[t];
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use strata_compiler::ops::{self, Op};
    use strata_compiler::plan::{Int8Dot, Options, Tuning, rules};
    use strata_compiler::quant::{GgmlType, random_blocks, random_floats};
    use strata_compiler::target::Target;

    use super::super::io::{f32_bytes, floats};
    use super::super::{Arg, Backend, Cpu, quantize_q8};

    /// The int8 GEMV's reference is the float GEMV of the dequantized activations.
    #[test]
    fn int8_gemv_reference_is_the_float_product_of_dequantized_activations() {
        let target = Target::load("sm_90").expect("known");
        let (rows, cols, window) = (8u32, 512u32, 3u32);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for quant in [GgmlType::Q4_0, GgmlType::IQ2_XS] {
            let op = Op::Gemv(ops::Gemv::new(quant, rows, cols, window));
            let (q8, float) = (
                rules::kernel_with(op.clone(), &target, &Options { int8: Int8Dot::Always, ..Options::default() }),
                rules::kernel_with(op, &target, &Options { int8: Int8Dot::Never, ..Options::default() }),
            );
            assert!(matches!(q8.tuning, Tuning::GemvQ8(_)) && matches!(float.tuning, Tuning::Gemv(_)));
            let mut w = vec![0u8; quant.row_bytes(u64::from(cols)).expect("whole") as usize * rows as usize];
            random_blocks(quant, &mut rng, &mut w, 0.05).expect("valid");
            let x = random_floats(&mut rng, (window * cols) as usize, 1.0);
            let (xq, xd) = quantize_q8(&x);
            let dequantized: Vec<f32> = (0..x.len()).map(|i| f32::from(xq[i] as i8) * xd[i / 32 * 2]).collect();
            let mut cpu = Cpu::new();
            let mut buffer = |bytes: &[u8]| {
                let b = cpu.alloc(bytes.len()).expect("host memory");
                cpu.write(b, 0, bytes).expect("in bounds");
                Arg::Buf(b, 0)
            };
            let (wb, xqb, xdb, xb) =
                (buffer(&w), buffer(&xq), buffer(&f32_bytes(&xd)), buffer(&f32_bytes(&dequantized)));
            let (y1, y2) =
                (buffer(&vec![0; (window * rows) as usize * 4]), buffer(&vec![0; (window * rows) as usize * 4]));
            cpu.call(&q8, &[("w", wb), ("xq", xqb), ("xd", xdb), ("y", y1)]).expect("runs");
            cpu.call(&float, &[("w", wb), ("x", xb), ("y", y2)]).expect("runs");
            let read = |cpu: &mut Cpu, a: Arg| {
                let Arg::Buf(b, _) = a else { unreachable!() };
                let mut out = vec![0u8; (window * rows) as usize * 4];
                cpu.read(b, 0, &mut out).expect("in bounds");
                floats(&out, (window * rows) as usize)
            };
            assert_eq!(read(&mut cpu, y1), read(&mut cpu, y2), "{quant}");
        }
    }

    /// A stacked product of several columns (a window's GEMV, a batch's of fewer columns
    /// than it takes) leaves each matrix's outputs where that matrix's own product would
    /// (`[t][its rows]`, one matrix after another).
    #[test]
    fn a_stacked_product_lays_out_each_matrix_as_its_own_product() {
        let target = Target::load("sm_90").expect("known");
        let options = Options::default();
        let (quant, cols, parts) = (GgmlType::Q4_0, 256u32, [32u32, 16, 16]);
        let rows: u32 = parts.iter().sum();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let row_bytes = quant.row_bytes(u64::from(cols)).expect("whole") as usize;
        let mut w = vec![0u8; row_bytes * rows as usize];
        random_blocks(quant, &mut rng, &mut w, 0.05).expect("valid");
        let stack = ops::Stack::of(&parts);
        let max = rules::BATCH_GEMV_COLUMNS;
        for (columns, stacked) in [
            (3, Op::Gemv(ops::Gemv { quant, rows, cols, window: 3, stack })),
            (2, Op::BatchGemv(ops::BatchGemv { quant, rows, cols, max, stack })),
        ] {
            // Inputs for the most columns a batch's GEMV takes (its buffers' extents).
            let x = random_floats(&mut rng, (max * cols) as usize, 1.0);
            let (xq, xd) = quantize_q8(&x);
            let mut cpu = Cpu::new();
            let mut run = |op: Op, w: &[u8], out: u32| {
                let spec = rules::kernel_with(op, &target, &options);
                let mut buffer = |bytes: &[u8]| {
                    let b = cpu.alloc(bytes.len()).expect("host memory");
                    cpu.write(b, 0, bytes).expect("in bounds");
                    b
                };
                let (wb, xqb, xdb, xb) = (buffer(w), buffer(&xq), buffer(&f32_bytes(&xd)), buffer(&f32_bytes(&x)));
                let y = buffer(&vec![0; (max * out) as usize * 4]);
                let mut args = vec![("w", Arg::Buf(wb, 0)), ("y", Arg::Buf(y, 0))];
                match spec.tuning {
                    Tuning::Gemv(_) => args.push(("x", Arg::Buf(xb, 0))),
                    _ => args.extend([("xq", Arg::Buf(xqb, 0)), ("xd", Arg::Buf(xdb, 0))]),
                }
                args.push(("tokens", Arg::U32(columns)));
                args.retain(|(name, _)| {
                    spec.buffers.iter().any(|b| b.name == *name) || spec.scalars.iter().any(|s| s.name == *name)
                });
                cpu.call(&spec, &args).expect("runs");
                let mut bytes = vec![0u8; (columns * out) as usize * 4];
                cpu.read(y, 0, &mut bytes).expect("in bounds");
                floats(&bytes, (columns * out) as usize)
            };
            let together = run(stacked.clone(), &w, rows);
            let mut first = 0;
            let mut alone = Vec::new();
            for part in parts {
                let op = match &stacked {
                    Op::Gemv(g) => Op::Gemv(ops::Gemv::new(quant, part, cols, g.window)),
                    _ => Op::BatchGemv(ops::BatchGemv { quant, rows: part, cols, max, stack: ops::Stack::SINGLE }),
                };
                let bytes = &w[first as usize * row_bytes..(first + part) as usize * row_bytes];
                alone.extend(run(op, bytes, part));
                first += part;
            }
            assert_eq!(together, alone, "{}", stacked.kernel_name());
        }
    }
}
