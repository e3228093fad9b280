//! The GEMM reference (`Op::Gemm`): the GEMV's product over a runtime count of columns.

use super::RunError;
use super::gemv::product;
use super::io::OpIo;
use strata_compiler::ops;

/// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `t < tokens`.
pub(super) fn run(op: &ops::Gemm, io: &mut OpIo) -> Result<(), RunError> {
    let ops::Gemm { quant, rows, cols } = *op;
    let tokens = io.scalar("tokens") as usize;
    let x = io.floats("x", tokens * cols as usize);
    let y = product(quant, rows, cols, io.input("w"), &x, tokens);
    io.output_floats("y", &y);
    Ok(())
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use strata_compiler::ops::{self, Op};
    use strata_compiler::plan::rules;
    use strata_compiler::quant::{SUPPORTED, random_blocks, random_floats};
    use strata_compiler::target::Target;

    use super::super::io::{f32_bytes, floats};
    use super::super::{Arg, Backend, Cpu};

    /// Column t of the GEMM's reference is the single-column GEMV's reference of input
    /// column t, bit for bit, for every type.
    #[test]
    fn gemm_reference_is_the_gemv_reference_column_by_column() {
        let target = Target::load("sm_90").expect("known");
        let (rows, cols, tokens) = (24u32, 512u32, 5u32);
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        for quant in SUPPORTED {
            let gemm = rules::kernel(Op::Gemm(ops::Gemm { quant, rows, cols }), &target);
            let gemv = rules::kernel(Op::Gemv(ops::Gemv { quant, rows, cols, window: 1 }), &target);
            let mut w = vec![0u8; quant.row_bytes(u64::from(cols)).expect("whole") as usize * rows as usize];
            random_blocks(quant, &mut rng, &mut w, 0.05).expect("valid");
            let x = random_floats(&mut rng, (tokens * cols) as usize, 1.0);
            let mut cpu = Cpu::new();
            let mut buffer = |bytes: &[u8]| {
                let b = cpu.alloc(bytes.len()).expect("host memory");
                cpu.write(b, 0, bytes).expect("in bounds");
                b
            };
            let (wb, xb, yb) = (buffer(&w), buffer(&f32_bytes(&x)), buffer(&vec![0; (tokens * rows) as usize * 4]));
            let column = buffer(&vec![0; rows as usize * 4]);
            let args = [("w", Arg::Buf(wb, 0)), ("x", Arg::Buf(xb, 0)), ("y", Arg::Buf(yb, 0))];
            cpu.call(&gemm, &[args[0], args[1], args[2], ("tokens", Arg::U32(tokens))]).expect("runs");
            let mut all = vec![0u8; (tokens * rows) as usize * 4];
            cpu.read(yb, 0, &mut all).expect("in bounds");
            let all = floats(&all, (tokens * rows) as usize);
            for t in 0..tokens as usize {
                let x = Arg::Buf(xb, t * cols as usize * 4);
                cpu.call(&gemv, &[("w", Arg::Buf(wb, 0)), ("x", x), ("y", Arg::Buf(column, 0))]).expect("runs");
                let mut one = vec![0u8; rows as usize * 4];
                cpu.read(column, 0, &mut one).expect("in bounds");
                let one = floats(&one, rows as usize);
                assert_eq!(&all[t * rows as usize..][..rows as usize], &one[..], "{quant}, column {t}");
            }
        }
    }
}
