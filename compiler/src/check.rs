//! Static checks: every kernel of a plan against the target's limits, before anything
//! is built. A violation names the kernel, the limit and the value — it never becomes a
//! kernel that fails at launch.

use crate::plan::{Dim, Extent, KernelSpec, MAX_WINDOW, Op, Plan, Tuning};
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

fn check_kernel(k: &KernelSpec, target: &Target) -> Vec<CheckError> {
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
    if l.shared_bytes > d.shared_bytes_per_block {
        fail(
            "shared memory per block",
            format!("{} bytes", l.shared_bytes),
            format!("{t} allows {} bytes per block", d.shared_bytes_per_block),
        );
    }
    for (axis, dim) in ["x", "y", "z"].iter().zip(&l.grid) {
        let cap = if *axis == "x" { MAX_GRID_X } else { MAX_GRID_YZ };
        match dim {
            Dim::Fixed(n) if *n == 0 || *n > cap => {
                fail(&format!("grid {axis}"), n.to_string(), format!("it must be 1 to {cap}"))
            }
            Dim::Runtime { arg, per_block } => match k.scalars.iter().find(|s| &s.name == arg) {
                None => fail(&format!("grid {axis}"), format!("runtime {arg}"), "no such scalar argument".into()),
                Some(s) if s.max.div_ceil((*per_block).max(1)) > cap => fail(
                    &format!("grid {axis} at its largest {arg} ({})", s.max),
                    s.max.div_ceil((*per_block).max(1)).to_string(),
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

    // Op-specific: coverage, window tables and index ranges.
    let fixed = |name: &str| {
        k.buffers.iter().find(|b| b.name == name).and_then(|b| match b.extent {
            Extent::Fixed(n) => Some(n),
            Extent::PerArg { .. } => None,
        })
    };
    let grid_x = match l.grid[0] {
        Dim::Fixed(n) => u64::from(n),
        Dim::Runtime { .. } => u64::MAX,
    };
    // Buffers whose fixed extent must be exactly what the op's indices reach.
    let mut extents: Vec<(&str, u64)> = Vec::new();
    match (&k.op, &k.tuning) {
        (Op::Gemv { quant, rows, cols, window }, Tuning::Gemv(g)) => {
            if !(1..=MAX_WINDOW).contains(window) {
                fail("the window", window.to_string(), format!("windows run from 1 to {MAX_WINDOW}"));
            }
            if g.tile_cols == 0 || g.tile_cols % 32 != 0 || g.tile_cols > *cols {
                fail(
                    "the input tile",
                    format!("{} columns", g.tile_cols),
                    format!("it must be whole 32-column chunks of the {cols}-column row"),
                );
            }
            if g.split == 0 || g.waves % g.split != 0 || g.rows_per_block * g.split != g.waves || g.waves != l.waves {
                fail(
                    "the wave split",
                    format!("{} waves, {} per row, {} rows per block", g.waves, g.split, g.rows_per_block),
                    "waves must divide evenly into rows".into(),
                );
            }
            // The window table: `window` columns of the staged tile, padded chunks.
            let table = window * (g.tile_cols / 32) * g.chunk_stride * 4;
            let parts = if g.split > 1 { g.waves * window * 4 } else { 0 };
            if table + parts != l.shared_bytes {
                fail(
                    "declared shared memory",
                    format!("{} bytes", l.shared_bytes),
                    format!("a {window}-column window table of {} columns needs {} bytes", g.tile_cols, table + parts),
                );
            }
            if grid_x.saturating_mul(u64::from(g.rows_per_block.max(1))) < u64::from(*rows) {
                fail(
                    "rows covered by the grid",
                    (grid_x * u64::from(g.rows_per_block)).to_string(),
                    format!("the matrix has {rows}"),
                );
            }
            let row_bytes = quant.row_bytes(u64::from(*cols)).unwrap_or(u64::MAX);
            extents = vec![
                ("w", u64::from(*rows).saturating_mul(row_bytes)),
                ("x", u64::from(window * cols)),
                ("y", u64::from(window * rows)),
            ];
        }
        (Op::Gemv { quant, rows, cols, window }, Tuning::GemvQ8(g)) => {
            if !(1..=MAX_WINDOW).contains(window) {
                fail("the window", window.to_string(), format!("windows run from 1 to {MAX_WINDOW}"));
            }
            let (block_bytes, block_chunks) = (quant.block_bytes() as u32, quant.block_len() as u32 / 32);
            let row_bytes = quant.row_bytes(u64::from(*cols)).unwrap_or(u64::MAX);
            let v = g.vector_bytes;
            if ![2, 4, 8, 16].contains(&v)
                || row_bytes % u64::from(v) != 0
                || g.slab_bytes == 0
                || g.slab_bytes % v != 0
                || g.slab_bytes % block_bytes != 0
                || g.slab_chunks != g.slab_bytes / block_bytes * block_chunks
                || g.slab_chunks % l.wave_size != 0
                || g.loads * v * l.wave_size < g.slab_bytes
            {
                fail(
                    "the weight slab",
                    format!(
                        "{} bytes in {v}-byte loads, {} chunks, {} loads a lane",
                        g.slab_bytes, g.slab_chunks, g.loads
                    ),
                    format!(
                        "a slab is whole {block_bytes}-byte blocks and whole loads dividing the {row_bytes}-byte \
                         rows, with chunks a multiple of the wave"
                    ),
                );
            }
            // Each wave's slab starts 16-byte aligned (the decoders' aligned loads).
            let table = crate::plan::rules::lookup_table(*quant).map_or(0, |(_, elem, len)| elem * len);
            let slabs = g.waves * g.rows_per_wave * g.slab_bytes.next_multiple_of(16);
            if g.waves != l.waves || g.table_bytes != table || slabs + table != l.shared_bytes {
                fail(
                    "declared shared memory",
                    format!("{} bytes for {} waves", l.shared_bytes, l.waves),
                    format!(
                        "{} waves of {} {}-byte slabs, 16-byte aligned, and a {table}-byte lookup grid need {}",
                        g.waves,
                        g.rows_per_wave,
                        g.slab_bytes,
                        slabs + table
                    ),
                );
            }
            // Blocks step over the row groups, so any grid of at least one block covers them.
            if g.rows_per_wave == 0 || grid_x == 0 {
                fail(
                    "rows per wave and blocks",
                    format!("{} rows a wave, {grid_x} blocks", g.rows_per_wave),
                    "at least one of each".into(),
                );
            }
            extents = vec![
                ("w", u64::from(*rows).saturating_mul(row_bytes)),
                ("xq", u64::from(window * cols)),
                ("xd", u64::from(window * cols / 32 * 2)),
                ("y", u64::from(window * rows)),
            ];
        }
        (Op::Gemv { .. }, _) => fail("tuning", "missing".into(), "a GEMV needs GEMV tuning".into()),
        (Op::QuantizeQ8 { cols }, _) => {
            let chunks = u64::from(cols / 32);
            let grid_y = match l.grid[1] {
                Dim::Fixed(n) => u64::from(n),
                Dim::Runtime { .. } => 0,
            };
            if cols % 32 != 0 || grid_y.saturating_mul(u64::from(l.threads)) < chunks {
                fail(
                    "chunks covered per row",
                    (grid_y * u64::from(l.threads)).to_string(),
                    format!("rows have {chunks} chunks of 32"),
                );
            }
        }
        (Op::SiluMul { n, .. } | Op::Add { n, .. }, _)
            if grid_x.saturating_mul(u64::from(l.threads)) < u64::from(*n) =>
        {
            fail("elements covered per row", (grid_x * u64::from(l.threads)).to_string(), format!("rows have {n}"));
        }
        (Op::Embed { cols, .. }, _) => {
            let chunks = u64::from(cols / 32);
            if cols % 32 != 0 || grid_x.saturating_mul(u64::from(l.threads)) < chunks {
                fail(
                    "chunks covered per row",
                    (grid_x * u64::from(l.threads)).to_string(),
                    format!("rows have {chunks} chunks of 32"),
                );
            }
        }
        (Op::RopeStore { rope_dims, head_dim, .. }, _)
            if (l.threads < head_dim / 2 || rope_dims > head_dim || rope_dims % 2 != 0 || head_dim % 2 != 0) =>
        {
            fail(
                "element pairs per block",
                l.threads.to_string(),
                format!("heads of {head_dim} with {rope_dims} rotating, taken in pairs"),
            );
        }
        (Op::Attention { heads, kv_heads, head_dim, block, .. }, tuning) => {
            if *kv_heads == 0 || heads % kv_heads != 0 {
                fail("query heads per KV head", format!("{heads}/{kv_heads}"), "they must divide evenly".into());
            }
            if grid_x != u64::from(*kv_heads) {
                fail("blocks", grid_x.to_string(), format!("there is one block per KV head ({kv_heads})"));
            }
            // V rows are read 16 bytes a lane, a whole number of rows a wave.
            if !head_dim.is_multiple_of(8) || *head_dim > 8 * l.wave_size || !l.wave_size.is_multiple_of(head_dim / 8) {
                fail(
                    "head length",
                    head_dim.to_string(),
                    format!("a multiple of 8 whose eighth divides the wave of {}", l.wave_size),
                );
            }
            let Tuning::Attention(t) = tuning else {
                fail("tuning", "missing".into(), "attention needs its split rule".into());
                return errors;
            };
            if l.grid[2] != Dim::Fixed(t.splits) || t.split_blocks == 0 || *block == 0 {
                fail(
                    "splits",
                    format!("grid z {:?}, {} blocks a split, blocks of {block}", l.grid[2], t.split_blocks),
                    format!("grid z must be the {} splits, each of at least one block", t.splits),
                );
            }
            let group = heads / (*kv_heads).max(1);
            let needed =
                (group * head_dim + l.waves * (group + 1) * l.wave_size + l.waves * group * (2 + head_dim)) * 4;
            if needed != l.shared_bytes {
                fail(
                    "declared shared memory",
                    format!("{} bytes", l.shared_bytes),
                    format!("queries, tile weights and per-wave softmax states need {needed}"),
                );
            }
        }
        (Op::AttentionMerge { head_dim, .. }, _) if l.threads < *head_dim => {
            fail("threads", l.threads.to_string(), format!("one a dimension of {head_dim}"));
        }
        (Op::QsaScore { heads, kv_heads, head_dim, .. }, _) => {
            if *kv_heads == 0 || heads % kv_heads != 0 {
                fail("query heads per KV head", format!("{heads}/{kv_heads}"), "they must divide evenly".into());
            }
            let lanes = crate::plan::rules::qsa_score_lanes(*head_dim);
            if !lanes.is_power_of_two() || !head_dim.is_multiple_of(4 * lanes) || !l.threads.is_multiple_of(lanes) {
                fail(
                    "head length",
                    head_dim.to_string(),
                    format!(
                        "{lanes} lanes a KV block, 4 dimensions or a multiple of 4 each, within {} threads",
                        l.threads
                    ),
                );
            }
            let queries = crate::plan::rules::qsa_tokens_per_tile(*heads, *kv_heads) * (heads / (*kv_heads).max(1));
            if l.shared_bytes != queries * head_dim * 4 {
                fail(
                    "declared shared memory",
                    format!("{} bytes", l.shared_bytes),
                    format!("a tile of {queries} queries of {head_dim} needs {}", queries * head_dim * 4),
                );
            }
        }
        (Op::QsaSelect { .. }, _) => {
            let needed = crate::plan::rules::qsa_select_fixed_bytes(l.threads) + 4 * l.threads;
            if l.threads < crate::plan::rules::QSA_SELECT_BINS || l.shared_bytes < needed {
                fail(
                    "threads and shared memory",
                    format!("{} threads, {} bytes", l.threads, l.shared_bytes),
                    format!(
                        "a thread per radix bin ({}) and at least {needed} bytes (a staged key a thread)",
                        crate::plan::rules::QSA_SELECT_BINS
                    ),
                );
            }
        }
        _ => {}
    }
    for (name, needed) in extents {
        if fixed(name) != Some(needed) {
            fail(
                &format!("buffer {name}"),
                format!("{:?} elements", fixed(name)),
                format!("its indices reach {needed}"),
            );
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Int8Dot, Options, rules};

    /// A float-path GEMV (the int8 path has its own test).
    fn gemv(rows: u32, cols: u32, window: u32, target: &Target) -> KernelSpec {
        let op = Op::Gemv { quant: crate::quant::GgmlType::Q4_0, rows, cols, window };
        rules::kernel_with(op, target, &Options { int8: Int8Dot::Never, ..Options::default() })
    }

    fn plan(kernels: Vec<KernelSpec>) -> Plan {
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
                        let options = Options { int8: Int8Dot::Always, q8_rows, ..Options::default() };
                        let k = rules::kernel_with(Op::Gemv { quant, rows, cols, window }, &target, &options);
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
                let ops = [
                    Op::QsaScore { heads, kv_heads, head_dim, block: 16 },
                    Op::QsaSelect { kv_heads, block: 16 },
                    Op::Attention { heads, kv_heads, head_dim, scale: 0.1, block: 16, sparse: true },
                ];
                for op in ops {
                    let k = rules::kernel(op, &target);
                    let errors = check(&plan(vec![k.clone()]), &target);
                    assert!(errors.is_empty(), "{} {}: {errors:?}", target.name, k.name);
                }
            }
            // 24 lanes a KV block cannot meet in a butterfly, nor 12 chunks of a V row fill a wave.
            for op in [
                Op::QsaScore { heads: 32, kv_heads: 8, head_dim: 96, block: 16 },
                Op::Attention { heads: 32, kv_heads: 8, head_dim: 96, scale: 0.1, block: 16, sparse: false },
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
