//! Static checks: every kernel of a plan against the target's limits, before anything
//! is built. A violation names the kernel, the limit and the value — it never becomes a
//! kernel that fails at launch.

use crate::ops::Checker;
use crate::plan::{Dim, Extent, KernelRecord, Plan};
use crate::target::Target;

/// Largest grid dimension along y and z (CUDA and HIP alike).
const MAX_GRID_YZ: u32 = 65_535;
/// Largest grid dimension along x.
const MAX_GRID_X: u32 = i32::MAX as u32;

/// One violated limit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("kernel {kernel}: {what} is {value}, but {limit}")]
pub struct CheckError {
    /// The kernel.
    pub kernel: String,
    /// The quantity checked.
    pub what: String,
    /// Its value.
    pub value: String,
    /// The limit it broke, with where the limit comes from.
    pub limit: String,
}

/// Checks every kernel; returns all violations (empty when the plan fits the target).
pub fn check(plan: &Plan, target: &Target) -> Vec<CheckError> {
    plan.kernels.iter().flat_map(|k| check_kernel(k, target)).collect()
}

fn check_kernel(k: &KernelRecord, target: &Target) -> Vec<CheckError> {
    let d = &target.device;
    let mut errors = Vec::new();
    let mut fail = |what: &str, value: String, limit: String| {
        errors.push(CheckError { kernel: k.name.clone(), what: what.into(), value, limit });
    };
    let l = &k.launch;
    let t = &target.name;

    // Launch geometry.
    if l.wave_size != d.wave_size {
        fail("the wave size it was written for", l.wave_size.to_string(), format!("{t} runs waves of {}", d.wave_size));
    }
    if l.threads > d.max_threads_per_block {
        fail("threads per block", l.threads.to_string(), format!("{t} allows at most {}", d.max_threads_per_block));
    }
    if l.threads == 0 || !l.threads.is_multiple_of(d.wave_size) || l.waves * d.wave_size != l.threads {
        fail(
            "threads per block",
            format!("{} ({} waves)", l.threads, l.waves),
            format!("it must be a whole number of {t}'s {}-thread waves", d.wave_size),
        );
    }
    let shared_limit = d.shared_limit(l.dynamic_shared);
    if l.shared_bytes > shared_limit {
        let (kind, limit_kind) = if l.dynamic_shared { (" (dynamic)", " opted in") } else { ("", "") };
        fail(
            "shared memory per block",
            format!("{} bytes{kind}", l.shared_bytes),
            format!("{t} allows {shared_limit} bytes per block{limit_kind}"),
        );
    }
    for (axis, dim) in ["x", "y", "z"].iter().zip(&l.grid) {
        let cap = if *axis == "x" { MAX_GRID_X } else { MAX_GRID_YZ };
        match dim {
            Dim::Fixed(n) if *n == 0 || *n > cap => {
                fail(&format!("grid {axis}"), n.to_string(), format!("it must be 1 to {cap}"))
            }
            Dim::Runtime { arg, .. } => match k.scalars.iter().find(|s| &s.name == arg) {
                None => fail(&format!("grid {axis}"), format!("runtime {arg}"), "no such scalar argument".into()),
                Some(s) if dim.blocks_for(s.max).unwrap_or(0) > cap => fail(
                    &format!("grid {axis} at its largest {arg} ({})", s.max),
                    dim.blocks_for(s.max).unwrap_or(0).to_string(),
                    format!("grid {axis} allows {cap} blocks"),
                ),
                _ => {}
            },
            _ => {}
        }
    }
    for b in &k.buffers {
        if let Extent::PerArg { arg, .. } = &b.extent
            && !k.scalars.iter().any(|s| &s.name == arg)
        {
            fail(&format!("buffer {}", b.name), format!("sized by {arg}"), "no such scalar argument".into());
        }
    }

    // The op's own rules: coverage, window tables and index ranges.
    let mut op = Checker::new(k);
    k.op.def().check(k, &mut op);
    errors.extend(op.errors);
    for (name, needed) in op.extents {
        let fixed = k.buffers.iter().find(|b| b.name == name).and_then(|b| match b.extent {
            Extent::Fixed(n) => Some(n),
            Extent::PerArg { .. } => None,
        });
        if fixed != Some(needed) {
            errors.push(CheckError {
                kernel: k.name.clone(),
                what: format!("buffer {name}"),
                value: format!("{fixed:?} elements"),
                limit: format!("its indices reach {needed}"),
            });
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use crate::ops::Op;
    use crate::plan::{Int8Dot, MAX_WINDOW, Options, Tuning, rules};

    /// A float-path GEMV (the int8 path has its own test).
    fn gemv(rows: u32, cols: u32, window: u32, target: &Target) -> KernelRecord {
        let op = Op::Gemv(ops::Gemv::new(crate::quant::GgmlType::Q4_0, rows, cols, window));
        rules::kernel_with(op, target, &Options { int8: Int8Dot::Never, ..Options::default() })
    }

    fn plan(kernels: Vec<KernelRecord>) -> Plan {
        Plan { target: "t".into(), options: Options::default(), kernels }
    }

    #[test]
    fn shipped_rules_fit_every_shipped_target() {
        for target in crate::target::known() {
            for window in 1..=MAX_WINDOW {
                let k = gemv(14_336, 4096, window, &target);
                assert!(check(&plan(vec![k]), &target).is_empty(), "{} T={window}", target.name);
            }
        }
    }

    #[test]
    fn int8_gemvs_fit_every_shipped_target() {
        let shapes = [(14_336, 4096), (4096, 14_336), (256, 512), (1536, 576), (576, 1536), (256, 256)];
        for target in crate::target::known() {
            for quant in rules::INT8_DOT {
                for (rows, cols) in shapes {
                    let Some(row_bytes) = quant.row_bytes(u64::from(cols)) else { continue };
                    for (window, q8_rows) in [(1, None), (1, Some(8)), (2, Some(4)), (6, None), (16, None)] {
                        let options =
                            Options { int8: Int8Dot::Always, q8_rows, gemv_mma_from: None, ..Options::default() };
                        let k =
                            rules::kernel_with(Op::Gemv(ops::Gemv::new(quant, rows, cols, window)), &target, &options);
                        let Tuning::GemvQ8(g) = &k.tuning else { panic!("{} {}: not int8", target.name, k.name) };
                        assert_eq!(row_bytes % u64::from(g.vector_bytes), 0);
                        let errors = check(&plan(vec![k.clone()]), &target);
                        assert!(errors.is_empty(), "{} {}: {errors:?}", target.name, k.name);
                    }
                }
            }
        }
    }

    #[test]
    fn attention_and_qsa_kernels_fit_every_shipped_target_and_odd_heads_are_refused() {
        for target in crate::target::known() {
            for (heads, kv_heads, head_dim) in [(32, 8, 128), (9, 3, 64), (16, 16, 256), (64, 4, 128)] {
                let sparse =
                    ops::Attention { heads, kv_heads, head_dim, scale: 0.1, block: 16, sparse: true, window: 0 };
                let ops = [
                    Op::QsaScore(ops::QsaScore { heads, kv_heads, head_dim, block: 16 }),
                    Op::QsaSelect(ops::QsaSelect { kv_heads, block: 16 }),
                    Op::Attention(sparse),
                    // A local layer's window (Gemma 3: 4/1 heads of 256, 512 positions).
                    Op::Attention(ops::Attention { sparse: false, window: 512, ..sparse }),
                ];
                for op in ops {
                    let k = rules::kernel(op, &target);
                    let errors = check(&plan(vec![k.clone()]), &target);
                    assert!(errors.is_empty(), "{} {}: {errors:?}", target.name, k.name);
                }
            }
            // 24 lanes a KV block cannot meet in a butterfly, nor 12 chunks of a V row fill a wave.
            for op in [
                Op::QsaScore(ops::QsaScore { heads: 32, kv_heads: 8, head_dim: 96, block: 16 }),
                Op::Attention(ops::Attention {
                    heads: 32,
                    kv_heads: 8,
                    head_dim: 96,
                    scale: 0.1,
                    block: 16,
                    sparse: false,
                    window: 0,
                }),
            ] {
                let errors = check(&plan(vec![rules::kernel(op, &target)]), &target);
                assert!(errors.iter().any(|e| e.to_string().contains("head length is 96")), "{errors:?}");
            }
        }
    }

    #[test]
    fn a_small_lds_names_kernel_limit_and_value() {
        let mut target = Target::load("gfx1100").expect("known");
        target.device.shared_bytes_per_block = 8192;
        target.device.shared_bytes_opt_in = 8192;
        assert!(check(&plan(vec![gemv(4096, 4096, 4, &target)]), &target).is_empty());
        let errors = check(&plan(vec![gemv(4096, 4096, 16, &target)]), &target);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0].to_string(),
            "kernel gemv_q4_0_4096x4096_t16: shared memory per block is 18432 bytes, but gfx1100 allows 8192 bytes per block"
        );
    }

    #[test]
    fn inconsistent_records_are_caught() {
        let target = Target::load("sm_90").expect("known");
        let mut k = gemv(576, 576, 4, &target);
        k.launch.grid[0] = Dim::Fixed(2);
        k.launch.threads = 100;
        let errors: Vec<String> = check(&plan(vec![k]), &target).iter().map(|e| e.to_string()).collect();
        assert!(errors.iter().any(|e| e.contains("threads per block is 100 (4 waves)")), "{errors:?}");
        assert!(errors.iter().any(|e| e.contains("rows covered by the grid is")), "{errors:?}");
        let mut k = gemv(576, 576, 4, &target);
        k.launch.wave_size = 64;
        let errors = check(&plan(vec![k]), &target);
        assert!(errors[0].to_string().contains("the wave size it was written for is 64, but sm_90 runs waves of 32"));
    }
}
