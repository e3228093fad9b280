//! The GEMM reference (`Op::Gemm`): the GEMV's product over a runtime count of columns.

use super::RunError;
use super::gemv::product;
use super::io::OpIo;
use strata_compiler::ops;

/// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `t < tokens` (an int8 kernel's `x` dequantized
/// from its quants, as the int8 GEMV's reference reads it).
pub(super) fn run(op: &ops::Gemm, io: &mut OpIo) -> Result<(), RunError> {
    let ops::Gemm { quant, rows, cols } = *op;
    let tokens = io.scalar("tokens") as usize;
    let x = io.activations(tokens * cols as usize);
    let y = product(quant, rows, cols, io.input("w"), &x, tokens);
    io.output_floats("y", &y);
    Ok(())
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use strata_compiler::ops::{self, Op};
    use strata_compiler::plan::{Int8Dot, Options, Tuning, rules};
    use strata_compiler::quant::{SUPPORTED, random_blocks, random_floats};
    use strata_compiler::target::Target;

    use super::super::io::{f32_bytes, floats};
    use super::super::{Arg, Backend, Cpu, quantize_q8};

    /// Column t of the GEMM's reference is the single-column GEMV's reference of input
    /// column t, bit for bit, for every type, on either path: float input, and input
    /// quantized to int8 (the int8 GEMM's, where a type has one, beside the int8 GEMV's).
    #[test]
    fn gemm_reference_is_the_gemv_reference_column_by_column() {
        let target = Target::load("sm_90").expect("known");
        // 2048 columns: whole 16-byte rows for every type, as the int8 GEMM needs.
        let (rows, cols, tokens) = (24u32, 2048u32, 5u32);
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let mut int8_gemms = 0;
        for (quant, int8) in SUPPORTED.into_iter().flat_map(|q| [(q, Int8Dot::Never), (q, Int8Dot::Always)]) {
            // As the CPU plans them (`Kernels::planned`): no stream-K workspace.
            let options = Options { int8, stream_k: false, ..Options::default() };
            let gemm = rules::kernel_with(Op::Gemm(ops::Gemm { quant, rows, cols }), &target, &options);
            let gemv = rules::kernel_with(Op::Gemv(ops::Gemv::new(quant, rows, cols, 1)), &target, &options);
            let quantized = gemm.buffers.iter().any(|b| b.name == "xq");
            assert_eq!(quantized, matches!(gemm.tuning, Tuning::GemmQ8(_)), "{}", gemm.name);
            if int8 == Int8Dot::Always && !quantized {
                continue;
            }
            assert_eq!(quantized, gemv.buffers.iter().any(|b| b.name == "xq"), "{quant}: both paths alike");
            int8_gemms += usize::from(quantized);
            let mut w = vec![0u8; quant.row_bytes(u64::from(cols)).expect("whole") as usize * rows as usize];
            random_blocks(quant, &mut rng, &mut w, 0.05).expect("valid");
            let x = random_floats(&mut rng, (tokens * cols) as usize, 1.0);
            let (xq, xd) = quantize_q8(&x);
            let mut cpu = Cpu::new();
            let mut buffer = |bytes: &[u8]| {
                let b = cpu.alloc(bytes.len()).expect("host memory");
                cpu.write(b, 0, bytes).expect("in bounds");
                b
            };
            let (wb, yb) = (buffer(&w), buffer(&vec![0; (tokens * rows) as usize * 4]));
            let (xb, qb, db) = (buffer(&f32_bytes(&x)), buffer(&xq), buffer(&f32_bytes(&xd)));
            let column = buffer(&vec![0; rows as usize * 4]);
            // Column t's input: its floats, or its quants and (scale, sum) pairs.
            let input = |t: usize| -> Vec<(&'static str, Arg)> {
                let c = cols as usize;
                if quantized {
                    vec![("xq", Arg::Buf(qb, t * c)), ("xd", Arg::Buf(db, t * c / 32 * 2 * 4))]
                } else {
                    vec![("x", Arg::Buf(xb, t * c * 4))]
                }
            };
            let mut args = input(0);
            args.extend([("w", Arg::Buf(wb, 0)), ("y", Arg::Buf(yb, 0)), ("tokens", Arg::U32(tokens))]);
            cpu.call(&gemm, &args).expect("runs");
            let mut all = vec![0u8; (tokens * rows) as usize * 4];
            cpu.read(yb, 0, &mut all).expect("in bounds");
            let all = floats(&all, (tokens * rows) as usize);
            for t in 0..tokens as usize {
                let mut args = input(t);
                args.extend([("w", Arg::Buf(wb, 0)), ("y", Arg::Buf(column, 0))]);
                cpu.call(&gemv, &args).expect("runs");
                let mut one = vec![0u8; rows as usize * 4];
                cpu.read(column, 0, &mut one).expect("in bounds");
                let one = floats(&one, rows as usize);
                assert_eq!(&all[t * rows as usize..][..rows as usize], &one[..], "{quant} {int8:?}, column {t}");
            }
        }
        assert_eq!(int8_gemms, rules::INT8_DOT.len());
    }
}
