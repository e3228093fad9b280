//! One home per kernel op: each module holds the op's parameters (the shapes its kernel
//! is specialized on), its kernel name, its launch rule with buffers and scalars, its
//! static check and its template context. The registry below lists them once; the
//! plan, the static check and emit reach an op only through [`KernelOp`]. An op's other
//! homes: its template (`templates/ops/<op>.cu.hbs`), its CPU reference
//! (`runtime/src/backend/cpu/<op>.rs`) and its step in [`crate::forward`].

pub mod add;
pub mod add_rmsnorm;
pub mod argmax;
pub mod attention;
pub mod attention_merge;
pub mod attention_prefill;
pub mod batch_gemv;
pub mod embed;
pub mod expert_gemm;
pub mod expert_gemv;
pub mod gemm;
pub mod gemv;
pub mod moe_group;
pub mod moe_route;
pub mod moe_sum;
pub mod qsa_score;
pub mod qsa_select;
pub mod quantize_q8;
pub mod rmsnorm;
pub mod rope_store;
pub mod silu_mul;
pub mod softmax;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use add::Add;
pub use add_rmsnorm::AddRmsNorm;
pub use argmax::Argmax;
pub use attention::Attention;
pub use attention_merge::AttentionMerge;
pub use attention_prefill::AttentionPrefill;
pub use batch_gemv::BatchGemv;
pub use embed::Embed;
pub use expert_gemm::ExpertGemm;
pub use expert_gemv::{ExpertGemv, ExpertInput};
pub use gemm::Gemm;
pub use gemv::{Gemv, Stack};
pub use moe_group::MoeGroup;
pub use moe_route::{MoeRoute, RouteLayout};
pub use moe_sum::MoeSum;
pub use qsa_score::QsaScore;
pub use qsa_select::QsaSelect;
pub use quantize_q8::QuantizeQ8;
pub use rmsnorm::RmsNorm;
pub use rope_store::{RopeStore, RopeStyle};
pub use silu_mul::{Activation, SiluMul};
pub use softmax::Softmax;

use crate::check::CheckError;
use crate::plan::{Buffer, Dim, Elem, Extent, KernelRecord, Launch, Options, Scalar, Tuning};
use crate::target::Target;

/// What every op provides to the compiler stages.
pub trait KernelOp {
    /// The kernel name: the op and every shape it is specialized on (also the symbol).
    fn kernel_name(&self) -> String;

    /// The launch rule and arguments on `target`: everything the record holds besides
    /// the op and its name.
    fn record(&self, target: &Target, options: &Options) -> Parts;

    /// The op's own static checks of its record (coverage, window tables, index ranges),
    /// beyond the limits every kernel is checked for.
    fn check(&self, k: &KernelRecord, c: &mut Checker);

    /// How far the kernel's outputs may be from the CPU reference's in the device
    /// self-test, relative to the largest reference magnitude of the output.
    fn tolerance(&self) -> f64;

    /// The values its template reads besides the common ones (name, id, threads, ...).
    fn context(&self, k: &KernelRecord, target: &Target) -> Value;

    /// The template to render, when not `ops/<kind>`.
    fn template(&self, _k: &KernelRecord) -> Option<&'static str> {
        None
    }

    /// The type of the quantized matrix or table it reads (`w` or `table`): the block
    /// decoder its module carries and the blocks its self-test draws.
    fn weights(&self) -> Option<crate::quant::GgmlType> {
        None
    }

    /// Whether its kernel `k` multiplies tiles with the target's matrix unit (then the
    /// module carries `templates/matrix/<unit>.cuh`).
    fn uses_matrix_unit(&self, _k: &KernelRecord) -> bool {
        false
    }

    /// Whether an output may be one of the inputs (computed in place): then no pointer
    /// of the signature is declared `restrict`.
    fn in_place(&self) -> bool {
        false
    }
}

/// A record's launch and arguments, as an op's launch rule makes them.
pub struct Parts {
    /// Launch geometry.
    pub launch: Launch,
    /// Tuning decisions.
    pub tuning: Tuning,
    /// Buffer arguments, in signature order.
    pub buffers: Vec<Buffer>,
    /// Scalar arguments, in signature order.
    pub scalars: Vec<Scalar>,
}

macro_rules! registry {
    ($($(#[$doc:meta])* $variant:ident = $kind:literal,)*) => {
        /// The operation a kernel performs, with the shapes it is specialized on: one
        /// variant per op module (serialized with its fields inline, tagged `op`).
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "op", rename_all = "snake_case")]
        pub enum Op {
            $($(#[$doc])* $variant($variant),)*
        }

        impl Op {
            /// The op's short name, as in kernel names, templates and CPU references.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(Op::$variant(_) => $kind,)*
                }
            }

            /// The kernel name (see [`KernelOp::kernel_name`]).
            pub fn kernel_name(&self) -> String {
                self.def().kernel_name()
            }

            /// The op's module, behind its common interface.
            pub fn def(&self) -> &dyn KernelOp {
                match self {
                    $(Op::$variant(op) => op,)*
                }
            }
        }

        $(impl From<$variant> for Op {
            fn from(op: $variant) -> Op {
                Op::$variant(op)
            }
        })*
    };
}

registry! {
    /// A quantized matrix times a window of vectors ([`gemv`]).
    Gemv = "gemv",
    /// A quantized matrix times a chunk's columns on the matrix unit ([`gemm`]).
    Gemm = "gemm",
    /// A quantized matrix times a batch's columns, their count at run time ([`batch_gemv`]).
    BatchGemv = "batch_gemv",
    /// Rows quantized to int8 for the int8-dot products ([`quantize_q8`]).
    QuantizeQ8 = "quantize_q8",
    /// RMS norm, or qwen3's per-head q/k norms ([`rmsnorm`]).
    RmsNorm = "rmsnorm",
    /// Residual add and the next norm in one pass ([`add_rmsnorm`]).
    AddRmsNorm = "add_rmsnorm",
    /// RoPE, the KV cache store and QSA's key summaries ([`rope_store`]).
    RopeStore = "rope_store",
    /// SiLU(gate) · up ([`silu_mul`]).
    SiluMul = "silu_mul",
    /// Mixture-of-experts routing of a window ([`moe_route`]).
    MoeRoute = "moe_route",
    /// The routed experts' products in one launch ([`expert_gemv`]).
    ExpertGemv = "expert_gemv",
    /// A prompt chunk's routing, its choices grouped by expert ([`moe_group`]).
    MoeGroup = "moe_group",
    /// A prompt chunk's routed experts' products, grouped by expert ([`expert_gemm`]).
    ExpertGemm = "expert_gemm",
    /// The experts' weighted sum ([`moe_sum`]).
    MoeSum = "moe_sum",
    /// Elementwise add, or a bias ([`add`]).
    Add = "add",
    /// Token embedding rows ([`embed`]).
    Embed = "embed",
    /// Split decode attention, dense or over QSA's blocks ([`attention`]).
    Attention = "attention",
    /// The merge of attention's splits ([`attention_merge`]).
    AttentionMerge = "attention_merge",
    /// Causal flash attention of a prompt chunk ([`attention_prefill`]).
    AttentionPrefill = "attention_prefill",
    /// QSA's block score bounds ([`qsa_score`]).
    QsaScore = "qsa_score",
    /// QSA's top-k block selection ([`qsa_select`]).
    QsaSelect = "qsa_select",
    /// In-place softmax ([`softmax`]).
    Softmax = "softmax",
    /// Row argmax ([`argmax`]).
    Argmax = "argmax",
}

/// Collects one kernel's violations for [`KernelOp::check`].
pub struct Checker<'a> {
    /// The kernel.
    pub kernel: &'a KernelRecord,
    /// Violations so far.
    pub errors: Vec<CheckError>,
    /// Buffers whose fixed extent must be exactly what the op's indices reach.
    pub extents: Vec<(&'static str, u64)>,
}

impl<'a> Checker<'a> {
    /// A checker of `kernel` with nothing found yet.
    pub fn new(kernel: &'a KernelRecord) -> Checker<'a> {
        Checker { kernel, errors: Vec::new(), extents: Vec::new() }
    }

    /// Records a violation: `what` is `value`, but `limit`.
    pub fn fail(&mut self, what: &str, value: String, limit: String) {
        self.errors.push(CheckError { kernel: self.kernel.name.clone(), what: what.into(), value, limit });
    }

    /// Grid x's blocks (`u64::MAX` when sized at run time).
    pub fn grid_x(&self) -> u64 {
        fixed_dim(&self.kernel.launch.grid[0], u64::MAX)
    }

    /// Grid y's blocks (0 when sized at run time).
    pub fn grid_y(&self) -> u64 {
        fixed_dim(&self.kernel.launch.grid[1], 0)
    }

    /// Fails unless `window` is a window the runtime runs.
    pub fn window(&mut self, window: u32) {
        if !(1..=crate::plan::MAX_WINDOW).contains(&window) {
            let max = crate::plan::MAX_WINDOW;
            self.fail("the window", window.to_string(), format!("windows run from 1 to {max}"));
        }
    }

    /// Fails unless `units` (blocks, or elements a thread) of the block's threads cover
    /// rows of `n` elements.
    pub fn covers(&mut self, n: u64, units: u64) {
        let covered = u64::from(self.kernel.launch.threads).saturating_mul(units);
        if covered < n {
            self.fail("elements covered per row", covered.to_string(), format!("rows have {n}"));
        }
    }

    /// Fails unless the declared shared memory is `needed` bytes, for `what`.
    pub fn shared(&mut self, needed: u32, what: String) {
        let declared = self.kernel.launch.shared_bytes;
        if declared != needed {
            self.fail("declared shared memory", format!("{declared} bytes"), format!("{what} need {needed}"));
        }
    }

    /// Fails unless the tuning is of the op's kind.
    pub fn tuning_missing(&mut self, what: &str) {
        self.fail("tuning", "missing".into(), what.into());
    }
}

fn fixed_dim(dim: &Dim, runtime: u64) -> u64 {
    match dim {
        Dim::Fixed(n) => u64::from(*n),
        Dim::Runtime { .. } => runtime,
    }
}

/// Elements of a buffer's fixed extent (0 for runtime-sized or absent ones).
pub fn fixed(k: &KernelRecord, buffer: &str) -> u64 {
    k.buffers.iter().find(|b| b.name == buffer).map_or(0, |b| if let Extent::Fixed(n) = b.extent { n } else { 0 })
}

/// A buffer argument.
pub(crate) fn buffer(name: &str, elem: Elem, extent: Extent, writes: bool) -> Buffer {
    Buffer { name: name.into(), elem, extent, writes, workspace: false }
}

/// A kernel's working memory of `n` elements ([`Buffer::workspace`]).
pub(crate) fn workspace(name: &str, elem: Elem, n: u64) -> Buffer {
    Buffer { name: name.into(), elem, extent: Extent::Fixed(n), writes: true, workspace: true }
}

/// `per_row` elements for each unit of the runtime argument `arg`.
pub(crate) fn per(arg: &str, per_row: u32) -> Extent {
    Extent::PerArg { arg: arg.into(), per_row: u64::from(per_row) }
}

/// A fixed extent.
pub(crate) fn fixed_len(n: impl Into<u64>) -> Extent {
    Extent::Fixed(n.into())
}

/// A scalar argument of at most `max`.
pub(crate) fn scalar(name: &str, max: u32) -> Scalar {
    Scalar { name: name.into(), max }
}

/// A grid dimension of one block per unit of the runtime argument `arg`.
pub(crate) fn rows(arg: &str) -> Dim {
    blocks_of(arg, 1)
}

/// A grid dimension of one block per `per_block` units of the runtime argument `arg`.
pub(crate) fn blocks_of(arg: &str, per_block: u32) -> Dim {
    Dim::Runtime { arg: arg.into(), per_block, most: 0 }
}

/// A launch of `threads` in the target's waves.
pub(crate) fn launch(target: &Target, grid: [Dim; 3], threads: u32, shared_bytes: u32) -> Launch {
    let wave = target.device.wave_size;
    Launch {
        grid,
        threads,
        waves: threads / wave,
        wave_size: wave,
        shared_bytes,
        dynamic_shared: false,
        grid_dependency: target.features.grid_dependency,
    }
}

/// [`launch`] of a kernel whose shared memory is its dynamic array, sized at launch (up
/// to the target's opt-in limit).
pub(crate) fn launch_dynamic(target: &Target, grid: [Dim; 3], threads: u32, shared_bytes: u32) -> Launch {
    Launch { dynamic_shared: true, ..launch(target, grid, threads, shared_bytes) }
}

/// Threads of a block-per-row kernel over rows of `n`: four elements a thread, whole
/// waves, at most `cap`.
pub(crate) fn block_per_row(target: &Target, n: u32, cap: u32) -> u32 {
    let wave = target.device.wave_size;
    n.div_ceil(4).next_multiple_of(wave).clamp(wave, cap.max(wave))
}

/// A kernel record of no tuning beyond its launch.
pub(crate) fn untuned(launch: Launch, buffers: Vec<Buffer>, scalars: Vec<Scalar>) -> Parts {
    Parts { launch, tuning: Tuning::None {}, buffers, scalars }
}

/// Serde's skip test for zero counts.
pub(crate) fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// `a` with `b`'s fields added (template contexts).
pub(crate) fn merge(mut a: Value, b: Value) -> Value {
    if let (Value::Object(a), Value::Object(b)) = (&mut a, b) {
        a.extend(b);
    }
    a
}

/// An f32 as a C float literal that reads back to the same value.
pub(crate) fn c_float(v: f32) -> String {
    format!("{v:e}f")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Int8Dot, rules};
    use crate::quant::GgmlType;

    /// Every op's own check holds for the record its launch rule makes, on a wave32 and
    /// a wave64 target, and catches a record broken where that op depends on it.
    #[test]
    fn every_op_checks_its_own_record() {
        type Break = fn(&mut KernelRecord);
        let shared: Break = |k| k.launch.shared_bytes += 16;
        let grid_x_one: Break = |k| k.launch.grid[0] = Dim::Fixed(1);
        let grid_x_more: Break = |k| {
            if let Dim::Fixed(n) = k.launch.grid[0] {
                k.launch.grid[0] = Dim::Fixed(n + 1);
            }
        };
        let (q4, iq2) = (GgmlType::Q4_0, GgmlType::IQ2_XS);
        let cases: Vec<(Op, Int8Dot, Break)> = vec![
            (Gemv::new(q4, 4096, 4096, 4).into(), Int8Dot::Never, shared),
            (Gemv::new(iq2, 4096, 4096, 4).into(), Int8Dot::Always, shared),
            (Gemm { quant: q4, rows: 4096, cols: 4096 }.into(), Int8Dot::Auto, shared),
            (
                ExpertGemv {
                    quant: iq2,
                    rows: 1536,
                    cols: 2048,
                    window: 3,
                    used: 8,
                    experts: 128,
                    input: ExpertInput::Token,
                }
                .into(),
                Int8Dot::Auto,
                |k| k.launch.grid[1] = Dim::Fixed(1),
            ),
            (QuantizeQ8 { cols: 4096 }.into(), Int8Dot::Auto, |k| k.launch.grid[1] = Dim::Fixed(0)),
            (RmsNorm { n: 4096, eps: 1e-5, qk: None }.into(), Int8Dot::Auto, shared),
            (AddRmsNorm { n: 4096, eps: 1e-5, q8: true, experts: 8, norm_b: false }.into(), Int8Dot::Auto, shared),
            (
                RopeStore { style: RopeStyle::Neox, heads: 32, kv_heads: 8, head_dim: 128, rope_dims: 128, block: 16 }
                    .into(),
                Int8Dot::Auto,
                grid_x_more,
            ),
            (SiluMul { n: 14_336, q8: true, paired: false, act: Activation::Silu }.into(), Int8Dot::Auto, grid_x_one),
            (MoeRoute { experts: 128, used: 8 }.into(), Int8Dot::Auto, shared),
            (MoeSum { n: 4096, used: 8 }.into(), Int8Dot::Auto, grid_x_one),
            (Add { n: 4096, broadcast: true }.into(), Int8Dot::Auto, grid_x_one),
            (Embed { quant: q4, cols: 4096, vocab: 1000, scale: 1.0 }.into(), Int8Dot::Auto, |k| {
                k.buffers[0].extent = Extent::Fixed(1)
            }),
            (
                Attention { heads: 32, kv_heads: 8, head_dim: 128, scale: 0.1, block: 16, sparse: true, window: 0 }
                    .into(),
                Int8Dot::Auto,
                grid_x_more,
            ),
            (AttentionMerge { heads: 32, head_dim: 128, q8: true }.into(), Int8Dot::Auto, grid_x_more),
            (
                AttentionPrefill { heads: 9, kv_heads: 3, head_dim: 64, scale: 0.125, window: 0, page: 16 }.into(),
                Int8Dot::Auto,
                shared,
            ),
            (QsaScore { heads: 32, kv_heads: 8, head_dim: 128, block: 16 }.into(), Int8Dot::Auto, shared),
            (QsaSelect { kv_heads: 8, block: 16 }.into(), Int8Dot::Auto, |k| k.launch.shared_bytes = 64),
            (Softmax { n: 32_000 }.into(), Int8Dot::Auto, shared),
            (Argmax { n: 32_000 }.into(), Int8Dot::Auto, shared),
        ];
        let kinds: std::collections::BTreeSet<_> = cases.iter().map(|(op, _, _)| op.kind()).collect();
        assert_eq!(kinds.len(), 19, "one case for every registered op");
        for target in ["sm_90", "gfx90a"].map(|t| Target::load(t).expect("known")) {
            for (op, int8, broken) in &cases {
                let options = Options { int8: *int8, ..Options::default() };
                let mut k = rules::kernel_with(op.clone(), &target, &options);
                let plan = crate::plan::Plan { target: target.name.clone(), options, kernels: vec![k.clone()] };
                let errors = crate::check::check(&plan, &target);
                assert!(errors.is_empty(), "{} {}: {errors:?}", target.name, k.name);
                // An op reading quant blocks names their type (its decoder, its test blocks).
                let blocks = k.buffers.iter().any(|b| b.elem == Elem::U8 && !b.writes && b.name != "xq");
                assert_eq!(blocks, k.op.def().weights().is_some(), "{}: weights()", k.name);
                broken(&mut k);
                let mut own = Checker::new(&k);
                k.op.def().check(&k, &mut own);
                let extents = own.extents.iter().any(|(name, n)| fixed(&k, name) != *n);
                assert!(!own.errors.is_empty() || extents, "{} {}: a broken record passed", target.name, k.name);
            }
        }
    }

    /// Constants rendered as C float literals are refused by the check when not finite
    /// and positive, so `NaNf` / `inff` never reach clang.
    #[test]
    fn non_finite_float_constants_are_refused() {
        let target = Target::load("sm_90").expect("known");
        for bad in [f32::NAN, f32::INFINITY, 0.0, -1e-5] {
            let ops: [Op; 4] = [
                RmsNorm { n: 4096, eps: bad, qk: None }.into(),
                AddRmsNorm { n: 4096, eps: bad, q8: true, experts: 8, norm_b: false }.into(),
                Attention { heads: 32, kv_heads: 8, head_dim: 128, scale: bad, block: 16, sparse: false, window: 0 }
                    .into(),
                AttentionPrefill { heads: 9, kv_heads: 3, head_dim: 64, scale: bad, window: 0, page: 16 }.into(),
            ];
            for op in ops {
                let options = Options::default();
                let k = rules::kernel_with(op, &target, &options);
                let plan = crate::plan::Plan { target: target.name.clone(), options, kernels: vec![k.clone()] };
                let errors = crate::check::check(&plan, &target);
                assert!(
                    errors.iter().any(|e| e.limit.contains("a finite value above 0")),
                    "{} with {bad}: {errors:?}",
                    k.name
                );
            }
        }
    }

    #[test]
    fn c_floats_read_back_exactly() {
        for v in [1e-5f32, 1e-6, 0.125, 1.0 / 8f32.sqrt(), 100_000.0] {
            let s = c_float(v);
            let back: f32 = s.trim_end_matches('f').parse().expect("a float");
            assert_eq!(back.to_bits(), v.to_bits(), "{s}");
        }
    }
}
