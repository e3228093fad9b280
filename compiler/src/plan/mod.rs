//! The kernel plan: a pure function from a model, its tensor types and a target to the
//! exact list of kernels the pack needs, each with every tuning decision made.
//!
//! Templates decide nothing: whatever a kernel's code depends on (shapes, window size,
//! threads, tiles, strides, launch geometry) is a field here, chosen by the rules in
//! [`rules`]. The runtime launches kernels from the same records (via the manifest), so
//! host and device cannot disagree about wave size, block size or window size.

pub mod rules;

use serde::{Deserialize, Serialize};

use crate::model::{Family, ModelDesc, Role};
use crate::pack::{Pack, TensorInfo};
use crate::quant::GgmlType;
use crate::target::Target;

/// The device error record every `--checked` kernel takes last: `[count, kernel,
/// buffer, index low, index high, block, thread, 0]`, written by the first violation.
pub const ERROR_BUFFER: &str = "strata_err";

/// Largest verify window (`--spec`).
pub const MAX_WINDOW: u32 = 16;

/// What the user asked for beyond the pack and the target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// Largest speculative verify window T: windows 2..=T are planned; 0 or 1 plans none.
    pub spec: u32,
    /// Bounds-check every global access and record violations instead of faulting.
    pub checked: bool,
    /// A deliberately broken kernel, to prove the runtime's self-test and watchdog
    /// catch one (tests only; recorded in the manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
    /// Where the int8-dot GEMVs are used (see [`rules::gemv_q8`]).
    #[serde(default, skip_serializing_if = "Int8Dot::is_auto")]
    pub int8: Int8Dot,
    /// Rows per wave of the int8 GEMVs instead of the rule's (for tuning sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q8_rows: Option<u32>,
    /// KV positions per QSA block instead of the target's rule ([`rules::qsa_block`]):
    /// the granularity of the key summaries and of sparse attention's selection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qsa_block: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Options { spec: 4, checked: false, fault: None, int8: Int8Dot::Auto, q8_rows: None, qsa_block: None }
    }
}

/// Which GEMVs quantize their input to int8 and use integer dot products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Int8Dot {
    /// Where the target has an int8 dot instruction, the type an int8 decoder, and the
    /// matrix is large enough to be bound by its weight reads.
    #[default]
    Auto,
    /// Wherever the target and the type allow, whatever the size (tests; small models).
    Always,
    /// Never: every product dequantizes to float (to compare the two paths' numerics).
    Never,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Int8Dot {
    fn is_auto(&self) -> bool {
        *self == Int8Dot::Auto
    }

    /// The choice for expert products: the int8 path wherever it exists unless turned
    /// off (an expert's matrix is small, but one launch reads the whole union's).
    pub fn max_for_experts(self) -> Int8Dot {
        if self == Int8Dot::Never { Int8Dot::Never } else { Int8Dot::Always }
    }
}

impl std::str::FromStr for Int8Dot {
    type Err = String;

    fn from_str(s: &str) -> Result<Int8Dot, String> {
        match s {
            "auto" => Ok(Int8Dot::Auto),
            "always" => Ok(Int8Dot::Always),
            "never" => Ok(Int8Dot::Never),
            _ => Err(format!("{s:?} is not auto, always or never")),
        }
    }
}

/// A planted fault in one kernel (test-only; see [`Options::fault`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fault", content = "kernel", rename_all = "snake_case")]
pub enum Fault {
    /// Launch the kernel with half its blocks, so part of its output is never written.
    Wrong(String),
    /// Make the kernel spin forever.
    Hang(String),
}

impl Fault {
    /// Parses `wrong:KERNEL` or `hang:KERNEL`.
    pub fn parse(text: &str) -> Result<Fault, String> {
        match text.split_once(':') {
            Some(("wrong", k)) if !k.is_empty() => Ok(Fault::Wrong(k.into())),
            Some(("hang", k)) if !k.is_empty() => Ok(Fault::Hang(k.into())),
            _ => Err(format!("fault {text:?} is not wrong:KERNEL or hang:KERNEL")),
        }
    }

    /// The kernel it is planted in.
    pub fn kernel(&self) -> &str {
        match self {
            Fault::Wrong(k) | Fault::Hang(k) => k,
        }
    }
}

/// RoPE pairing: which two elements of a head rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama as converted to GGUF (q/k rows permuted).
    Normal,
    /// Halves (i, i + d/2): the GPT-NeoX layout of Qwen2/Qwen3.
    Neox,
}

/// The operation a kernel performs, with the shapes it is specialized on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `t < window`: a quantized matrix-vector
    /// product over a window of `window` input columns (1 = plain decode; more = the
    /// speculative verify window, reading the weights once for all columns).
    Gemv {
        /// Weight type.
        quant: GgmlType,
        /// Output features (weight rows).
        rows: u32,
        /// Input features (row length).
        cols: u32,
        /// Columns per launch.
        window: u32,
    },
    /// Quantizes rows of `cols` floats to int8 per 32-element chunk (scale = max |x| / 127,
    /// round half away from zero), with each chunk's scale and sum of quants: the input of
    /// the int8-dot GEMVs, made once and read by every product of the same input.
    QuantizeQ8 {
        /// Row length.
        cols: u32,
    },
    /// `y[r] = x[r] · w / sqrt(mean(x[r]²) + eps)` over rows of `n`.
    RmsNorm {
        /// Row length.
        n: u32,
        /// Epsilon.
        eps: f32,
        /// `[q, k]`: the rows are a token's `q` query heads then its `k` key heads (a
        /// decode step's Q·K·V product), `w` holds the query norm then the key norm, and
        /// each row takes its own: qwen3's per-head norms in one launch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        qk: Option<[u32; 2]>,
    },
    /// `sum[r] = a[r] + b[r]`, then `y[r] = rmsnorm(sum[r]) · w`: the residual add and the
    /// next norm in one pass (one launch instead of two, each row read once).
    AddRmsNorm {
        /// Row length.
        n: u32,
        /// Epsilon.
        eps: f32,
        /// Also writes `y` quantized to int8 (as [`Op::QuantizeQ8`] would), for int8-dot
        /// GEMVs that read it: one launch fewer.
        #[serde(default)]
        q8: bool,
        /// With `k` > 0, `b` is the experts' output of a mixture-of-experts layer:
        /// `b[r] = Σ_j weights[r][j] · parts[r·k + j]` (as [`Op::MoeSum`]), summed here
        /// instead of by a launch of its own.
        #[serde(default, skip_serializing_if = "is_zero")]
        experts: u32,
    },
    /// Rotary embedding of a window's Q heads (in place) and K heads, and the rotated K
    /// and V rows stored to the f16 caches at positions from `pos[0]`: one launch for
    /// everything between the projections and attention. Angles come from a
    /// host-computed (cos, sin) table; the position from a device buffer, so a captured
    /// decode step replays as is.
    ///
    /// It also keeps QSA's key summaries: for every `block`-position KV block the window
    /// writes into, the element-wise min and max over that block's keys so far (positions
    /// `block·b` to the window's last), per KV head, recomputed whole from the cache. A
    /// rewound position is therefore never in a summary once it is overwritten, and every
    /// block before the current one is summarized exactly. Layout [KV head][block]
    /// [dimension][min, max]: a block's summary is one contiguous read.
    RopeStore {
        /// Pairing.
        style: RopeStyle,
        /// Query heads.
        heads: u32,
        /// Key/value heads.
        kv_heads: u32,
        /// Head length.
        head_dim: u32,
        /// Leading dimensions of each head that rotate.
        rope_dims: u32,
        /// KV positions per summary block.
        block: u32,
    },
    /// `y[i] = silu(gate[i]) · up[i]` over rows of `n`.
    SiluMul {
        /// Row length.
        n: u32,
        /// Also writes `y` quantized to int8, as [`Op::AddRmsNorm`]'s `q8`.
        #[serde(default)]
        q8: bool,
        /// Gate and up are one input `gate_up` whose rows are `[gate (n) | up (n)]`, as
        /// the experts' stacked gate·up product writes them.
        #[serde(default)]
        paired: bool,
    },
    /// Mixture-of-experts routing of a window: each token's `used` experts of the largest
    /// router logits (ties: the lower expert) with weights the softmax over those logits
    /// (Qwen3-MoE's normalized top-k probabilities), and the window's union of chosen
    /// experts in ascending order with, per union entry and token, which of the token's
    /// choices it is. Layout: [`RouteLayout`].
    MoeRoute {
        /// Experts per layer.
        experts: u32,
        /// Experts each token uses.
        used: u32,
    },
    /// The selected experts' products of a window in one launch: grid row `u` takes the
    /// union's expert `u` (its matrix at slot `slot_of[expert]` of a pool of matrices)
    /// and multiplies it with the input of every token that chose it, reading the
    /// weights once for all of them; the result of token `t`'s choice `j` goes to row
    /// `t·used + j` of `y`. Always on the int8 path ([`rules::gemv_q8`] tuning).
    ExpertGemv {
        /// Weight type.
        quant: GgmlType,
        /// Output features of one expert's matrix.
        rows: u32,
        /// Input features.
        cols: u32,
        /// Tokens per launch.
        window: u32,
        /// Experts each token uses.
        used: u32,
        /// Experts per layer.
        experts: u32,
        /// Which input row a choice reads.
        input: ExpertInput,
    },
    /// `y[t][c] = Σ_j weights[t][j] · parts[t·used + j][c]` in ascending `j`: the experts'
    /// outputs combined with their routing weights.
    MoeSum {
        /// Row length.
        n: u32,
        /// Experts each token uses.
        used: u32,
    },
    /// `y[i] = a[i] + b[i]` over rows of `n`; with `broadcast`, `b` is one row added to
    /// every row (biases).
    Add {
        /// Row length.
        n: u32,
        /// Whether `b` is a single row.
        broadcast: bool,
    },
    /// Gathers and dequantizes rows of the token-embedding table.
    Embed {
        /// Table type.
        quant: GgmlType,
        /// Embedding width.
        cols: u32,
        /// Table rows.
        vocab: u32,
    },
    /// Attention of each token of a window at `pos[0]`, one query per head, over the f16
    /// KV cache, causal (token `t` sees positions up to `pos[0] + t`; grouped-query), split
    /// over the KV positions (flash decoding): block (KV head, token, split) writes each
    /// query head's partial softmax state `[max, sum, acc[head_dim]]` for its share, and
    /// [`Op::AttentionMerge`] combines the shares.
    ///
    /// The positions are taken `block` at a time: with `sparse`, the blocks QSA selected
    /// for the (token, KV head) (`list`, `count`: see [`Op::QsaSelect`]); otherwise every
    /// block up to the token's. How many splits a token uses depends only on how many
    /// blocks it reads (see [`AttentionTuning`]), so a token's result is the same in any
    /// window, and selecting every block equals dense attention bit for bit.
    Attention {
        /// Query heads.
        heads: u32,
        /// KV heads.
        kv_heads: u32,
        /// Head length.
        head_dim: u32,
        /// Score scale, 1/sqrt(head_dim).
        scale: f32,
        /// KV positions per block.
        block: u32,
        /// Whether it reads QSA's selected blocks.
        sparse: bool,
    },
    /// Combines [`Op::Attention`]'s split partial states into each (token, head)'s output:
    /// `Σ_s acc_s·e^(m_s−M) / Σ_s l_s·e^(m_s−M)` over the splits the token used.
    AttentionMerge {
        /// Query heads.
        heads: u32,
        /// Head length.
        head_dim: u32,
        /// Also writes the output quantized to int8, for the int8-dot output projection.
        #[serde(default)]
        q8: bool,
    },
    /// QSA's block scores (Quest): for each token `t` of a window, KV head and KV block
    /// `b`, the largest over the group's query heads of the bound
    /// `U = Σ_i max(q_i·min_i, q_i·max_i)` on any `q·k` of the block, from the key
    /// summaries [`Op::RopeStore`] keeps, in f32 in the order
    /// [`rules::qsa_score_lanes`] fixes for every target. The first block and the token's
    /// newest block score +∞ (always kept), blocks past it −∞. A block's summary is read
    /// once for every query of the window.
    QsaScore {
        /// Query heads.
        heads: u32,
        /// KV heads.
        kv_heads: u32,
        /// Head length.
        head_dim: u32,
        /// KV positions per block.
        block: u32,
    },
    /// QSA's selection: for each (token, KV head), the `budget` blocks of the largest
    /// score among the token's `pos/block + 1` (ties: the lower block), listed in
    /// ascending order, and their count; every block where there are no more than
    /// `budget`. Each token selects for itself, so a verify window selects exactly what
    /// decoding its tokens one by one would.
    QsaSelect {
        /// KV heads.
        kv_heads: u32,
        /// KV positions per block.
        block: u32,
    },
    /// In-place softmax over rows of `n`.
    Softmax {
        /// Row length.
        n: u32,
    },
    /// Index of the largest value of each row of `n` (first on ties).
    Argmax {
        /// Row length.
        n: u32,
    },
}

impl Op {
    /// The op's short name, as in kernel names and templates.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Gemv { .. } => "gemv",
            Op::QuantizeQ8 { .. } => "quantize_q8",
            Op::RmsNorm { .. } => "rmsnorm",
            Op::AddRmsNorm { .. } => "add_rmsnorm",
            Op::RopeStore { .. } => "rope_store",
            Op::SiluMul { .. } => "silu_mul",
            Op::MoeRoute { .. } => "moe_route",
            Op::ExpertGemv { .. } => "expert_gemv",
            Op::MoeSum { .. } => "moe_sum",
            Op::Add { .. } => "add",
            Op::Embed { .. } => "embed",
            Op::Attention { .. } => "attention",
            Op::AttentionMerge { .. } => "attention_merge",
            Op::QsaScore { .. } => "qsa_score",
            Op::QsaSelect { .. } => "qsa_select",
            Op::Softmax { .. } => "softmax",
            Op::Argmax { .. } => "argmax",
        }
    }

    /// The kernel name: op and every shape it is specialized on.
    pub fn kernel_name(&self) -> String {
        let q = |t: &GgmlType| t.name().to_ascii_lowercase();
        match self {
            Op::Gemv { quant, rows, cols, window: 1 } => format!("gemv_{}_{rows}x{cols}", q(quant)),
            Op::Gemv { quant, rows, cols, window } => format!("gemv_{}_{rows}x{cols}_t{window}", q(quant)),
            Op::QuantizeQ8 { cols } => format!("quantize_q8_{cols}"),
            Op::RmsNorm { n, qk: None, .. } => format!("rmsnorm_{n}"),
            Op::RmsNorm { n, qk: Some([q, k]), .. } => format!("rmsnorm_qk{q}x{k}_{n}"),
            Op::AddRmsNorm { n, q8, experts, .. } => {
                let moe = if *experts > 0 { format!("_moe{experts}") } else { String::new() };
                format!("add_rmsnorm{moe}{}_{n}", if *q8 { "_q8" } else { "" })
            }
            Op::RopeStore { style, heads, kv_heads, head_dim, rope_dims, block } => {
                let style = if *style == RopeStyle::Neox { "neox" } else { "normal" };
                let partial = if rope_dims == head_dim { String::new() } else { format!("_r{rope_dims}") };
                format!("rope_store_{style}_{heads}x{kv_heads}x{head_dim}{partial}_b{block}")
            }
            Op::SiluMul { n, q8, paired } => {
                format!("silu_mul{}{}_{n}", if *paired { "_paired" } else { "" }, if *q8 { "_q8" } else { "" })
            }
            Op::MoeRoute { experts, used } => format!("moe_route_{experts}x{used}"),
            Op::ExpertGemv { quant, rows, cols, window, used, experts, input } => {
                let input = match input {
                    ExpertInput::Token => "",
                    ExpertInput::Choice => "_choice",
                };
                format!("expert_gemv{input}_{}_{experts}x{rows}x{cols}_k{used}_t{window}", q(quant))
            }
            Op::MoeSum { n, used } => format!("moe_sum_{n}_k{used}"),
            Op::Add { n, broadcast: false } => format!("add_{n}"),
            Op::Add { n, broadcast: true } => format!("add_bias_{n}"),
            Op::Embed { quant, cols, vocab } => format!("embed_{}_{vocab}x{cols}", q(quant)),
            Op::Attention { heads, kv_heads, head_dim, block, sparse, .. } => {
                let kind = if *sparse { "attention_sparse" } else { "attention" };
                format!("{kind}_{heads}x{kv_heads}x{head_dim}_b{block}")
            }
            Op::AttentionMerge { heads, head_dim, q8 } => {
                format!("attention_merge{}_{heads}x{head_dim}", if *q8 { "_q8" } else { "" })
            }
            Op::QsaScore { heads, kv_heads, head_dim, block } => {
                format!("qsa_score_{heads}x{kv_heads}x{head_dim}_b{block}")
            }
            Op::QsaSelect { kv_heads, block } => format!("qsa_select_{kv_heads}_b{block}"),
            Op::Softmax { n } => format!("softmax_{n}"),
            Op::Argmax { n } => format!("argmax_{n}"),
        }
    }
}

/// The input row an expert product reads for token `t`'s choice `j`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertInput {
    /// Row `t`: the token's normed hidden state (gate·up).
    Token,
    /// Row `t·used + j`: the choice's own activation (down).
    Choice,
}

/// Where [`Op::MoeRoute`] leaves the window's routing in its `route` buffer (i32):
/// `[0]` the union's size `U`; `[1 + u]` the union's experts, ascending; `[pick(u, t)]`
/// which of token `t`'s choices expert `u` is, or −1. Sized for [`MAX_WINDOW`] tokens,
/// so one record serves every window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteLayout {
    /// Experts each token uses.
    pub used: u32,
    /// The largest union: `min(MAX_WINDOW · used, experts)`.
    pub capacity: u32,
}

impl RouteLayout {
    /// The layout for a layer of `experts` experts, `used` a token.
    pub fn new(experts: u32, used: u32) -> RouteLayout {
        RouteLayout { used, capacity: (MAX_WINDOW * used).min(experts) }
    }

    /// Index of `pick(u, t)`.
    pub fn pick(&self, u: u32, t: u32) -> u32 {
        1 + self.capacity + u * MAX_WINDOW + t
    }

    /// i32s of the `route` buffer.
    pub fn len(&self) -> u32 {
        1 + self.capacity * (1 + MAX_WINDOW)
    }

    /// Always false: the count is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The largest union of a window of `window` tokens.
    pub fn union(&self, window: u32) -> u32 {
        (window * self.used).min(self.capacity)
    }
}

/// One grid dimension: fixed at compile time, or `ceil(runtime value / per_block)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    /// A constant block count.
    Fixed(u32),
    /// Blocks derived from a runtime argument (see [`Scalar`]).
    Runtime {
        /// The scalar argument's name.
        arg: String,
        /// Values covered by one block.
        per_block: u32,
    },
}

/// How the host launches a kernel: grid, block and dynamic shared memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// Blocks along x, y, z.
    pub grid: [Dim; 3],
    /// Threads per block (a multiple of the wave size).
    pub threads: u32,
    /// Waves per block.
    pub waves: u32,
    /// Wave size the kernel was written for; the host checks it against the device.
    pub wave_size: u32,
    /// Shared memory the kernel declares, bytes.
    pub shared_bytes: u32,
    /// The kernel waits in-kernel for the one before it (`strata_await_inputs`), so the
    /// host may launch it as a programmatic dependent of that kernel.
    #[serde(default)]
    pub grid_dependency: bool,
}

/// Element type of a buffer argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Elem {
    /// Raw quantized blocks.
    U8,
    /// f32 values.
    F32,
    /// f16 values.
    F16,
    /// i32 values (token ids, indices).
    I32,
}

impl Elem {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Elem::U8 => 1,
            Elem::F16 => 2,
            Elem::F32 | Elem::I32 => 4,
        }
    }
}

/// A buffer's length: fixed, or a fixed row length times a runtime count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Extent {
    /// Elements known at compile time.
    Fixed(u64),
    /// `per_row` elements for each of the runtime argument's value.
    PerArg {
        /// The scalar argument giving the row count.
        arg: String,
        /// Elements per row.
        per_row: u64,
    },
}

/// A buffer argument.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// Argument name (as in the kernel signature).
    pub name: String,
    /// Element type.
    pub elem: Elem,
    /// Length in elements.
    pub extent: Extent,
    /// Whether the kernel writes it.
    pub writes: bool,
}

/// A scalar (u32) argument, with the most it may be at launch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scalar {
    /// Argument name.
    pub name: String,
    /// Largest value the kernel is checked for (the host refuses larger ones).
    pub max: u32,
}

/// Tuning of a float-dot GEMV (see [`rules::gemv`]): weights dequantized to f32 and
/// accumulated with fused multiply-adds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemvTuning {
    /// Waves per block.
    pub waves: u32,
    /// Waves sharing one row (intra-block split-K); `waves / split` rows per block.
    pub split: u32,
    /// Rows per block.
    pub rows_per_block: u32,
    /// Input columns staged in shared memory per tile (a multiple of 32).
    pub tile_cols: u32,
    /// Floats per 32-element chunk in the shared tile (see [`rules::CHUNK_STRIDE`]).
    pub chunk_stride: u32,
}

/// Tuning of an int8-dot GEMV (see [`rules::gemv_q8`]): a wave takes a group of rows at
/// a time and streams them through shared-memory slabs with wide coalesced loads, one
/// slab in flight while the previous one is decoded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemvQ8Tuning {
    /// Waves per block.
    pub waves: u32,
    /// Rows a wave decodes together: each input chunk it loads serves them all.
    pub rows_per_wave: u32,
    /// Bytes of each weight load (16, 8, 4 or 2: the widest dividing the row length).
    pub vector_bytes: u32,
    /// Bytes of one slab: whole quant blocks and whole vectors.
    pub slab_bytes: u32,
    /// 32-element chunks in one slab (a multiple of the wave size).
    pub slab_chunks: u32,
    /// Vector loads per lane per slab.
    pub loads: u32,
    /// Bytes of the type's lookup grid, staged in shared memory once per block (0: none).
    /// Lanes look up different entries, which shared memory serves in a few cycles and
    /// a cache only line by line.
    pub table_bytes: u32,
}

/// How [`Op::Attention`] splits a token's KV blocks (see [`rules::attention`]): a token
/// reading `n` blocks uses `s0 = min(splits, ceil(n / split_blocks))` shares of
/// `per = ceil(n / s0)` blocks, so `ceil(n / per)` splits; [`Op::AttentionMerge`] reads
/// the same record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionTuning {
    /// Most splits of one (token, head): the partial buffer holds this many states.
    pub splits: u32,
    /// Fewest blocks worth a split of their own.
    pub split_blocks: u32,
}

impl AttentionTuning {
    /// Blocks per split and splits for a token reading `blocks` blocks.
    pub fn shares(&self, blocks: u32) -> (u32, u32) {
        let s0 = self.splits.min(blocks.div_ceil(self.split_blocks.max(1))).max(1);
        let per = blocks.div_ceil(s0).max(1);
        (per, blocks.div_ceil(per))
    }
}

/// Per-op tuning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Tuning {
    /// GEMV tuning (float dot).
    Gemv(GemvTuning),
    /// Int8-dot GEMV tuning.
    GemvQ8(GemvQ8Tuning),
    /// Attention's split of the KV positions.
    Attention(AttentionTuning),
    /// Block-per-row or elementwise ops need only their thread count (in `Launch`).
    None {},
}

/// One kernel: what it computes, how it is launched, and its arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelSpec {
    /// Unique name (also the symbol).
    pub name: String,
    /// The operation and its shapes.
    #[serde(flatten)]
    pub op: Op,
    /// Launch geometry.
    pub launch: Launch,
    /// Tuning decisions.
    pub tuning: Tuning,
    /// Buffer arguments, in signature order; a `--checked` build's error buffer, listed
    /// last here, ends the signature, after the scalars.
    pub buffers: Vec<Buffer>,
    /// Scalar arguments, after the buffers, in signature order.
    pub scalars: Vec<Scalar>,
}

impl KernelSpec {
    /// `args` (or anything per argument) in record order (buffers, then scalars)
    /// rearranged into the order of the kernel's signature, which a GPU launch must pass:
    /// a `--checked` kernel's error buffer, listed last among the buffers, ends the
    /// signature (`STRATA_ERR_PARAM`), after the scalars.
    pub fn in_signature_order<T: Copy>(&self, args: &[T]) -> Vec<T> {
        let mut out = args.to_vec();
        if self.buffers.last().is_some_and(|b| b.name == ERROR_BUFFER)
            && args.len() == self.buffers.len() + self.scalars.len()
        {
            let error = out.remove(self.buffers.len() - 1);
            out.push(error);
        }
        out
    }
}

/// The kernels of one pack on one target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Target name.
    pub target: String,
    /// Options used.
    pub options: Options,
    /// Kernels, sorted by name.
    pub kernels: Vec<KernelSpec>,
}

/// Why a pack cannot be planned.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    /// `--spec` out of range.
    #[error("--spec {0} is out of range (0 or 1 for off, 2 to {MAX_WINDOW})")]
    Spec(u32),
    /// `--qsa-block` out of range.
    #[error("--qsa-block {0} is out of range (1 to {max} KV positions)", max = rules::MAX_QSA_BLOCK)]
    QsaBlock(u32),
    /// A fault names a kernel the plan does not have.
    #[error("fault: the plan has no kernel {0}")]
    FaultKernel(String),
    /// A shape the kernels do not handle.
    #[error("tensor {tensor}: {what}")]
    Shape {
        /// The tensor.
        tensor: String,
        /// What is unsupported.
        what: String,
    },
}

/// Plans every kernel `pack` (described by `model`) needs on `target`.
pub fn plan(model: &ModelDesc, pack: &Pack, target: &Target, options: &Options) -> Result<Plan, PlanError> {
    if options.spec > MAX_WINDOW {
        return Err(PlanError::Spec(options.spec));
    }
    let max_window = options.spec.max(1);
    let mut ops = Vec::new();

    // Matrix products: one GEMV per distinct (type, rows, cols), for every window.
    for expected in model.expected_tensors() {
        let Some(t) = pack.tensor(&expected.name) else { continue };
        let gemv_role = matches!(expected.role, Role::Linear | Role::Output | Role::Router);
        let tied_output = expected.role == Role::Embedding && model.tied_output;
        if !(gemv_role || tied_output) {
            continue;
        }
        let (cols, rows) = (t.shape[0] as u32, t.shape[1] as u32);
        if cols % 32 != 0 {
            return Err(PlanError::Shape {
                tensor: t.name.clone(),
                what: format!("row length {cols} is not a multiple of 32, which every GEMV kernel needs"),
            });
        }
        ops.extend((1..=max_window).map(|window| Op::Gemv { quant: t.ty, rows, cols, window }));
    }

    // Decode (window 1) fuses the projections that read the same input: Q, K and V in
    // one product, gate and up in another, over their rows stacked in that order (the
    // runtime uploads them that way), where a layer stores them in one type.
    for layer in 0..model.layers {
        for group in [&["attn_q", "attn_k", "attn_v"][..], &["ffn_gate", "ffn_up"][..]] {
            let tensors: Option<Vec<_>> =
                group.iter().map(|n| pack.tensor(&format!("blk.{layer}.{n}.weight"))).collect();
            if let Some(fused) = tensors.as_deref().and_then(fused_gemv) {
                ops.push(fused);
            }
        }
    }

    if let Some(experts) = model.experts {
        ops.extend(expert_ops(model, pack, experts, max_window)?);
        ops.push(Op::AddRmsNorm { n: model.embd, eps: model.rms_eps, q8: false, experts: experts.used });
    }

    let embd = pack.tensor("token_embd.weight").map(|t| t.ty).unwrap_or(GgmlType::F32);
    let style = if model.family == Family::Llama { RopeStyle::Normal } else { RopeStyle::Neox };
    let block = options.qsa_block.unwrap_or_else(|| rules::qsa_block(target));
    if !(1..=rules::MAX_QSA_BLOCK).contains(&block) {
        return Err(PlanError::QsaBlock(block));
    }
    let scale = 1.0 / (model.head_dim_k as f32).sqrt();
    let ffn = model.experts.map_or(model.ffn, |x| x.ffn);
    ops.extend([
        Op::Embed { quant: embd, cols: model.embd, vocab: model.vocab },
        Op::RmsNorm { n: model.embd, eps: model.rms_eps, qk: None },
        Op::AddRmsNorm { n: model.embd, eps: model.rms_eps, q8: false, experts: 0 },
        Op::RopeStore {
            style,
            heads: model.heads,
            kv_heads: model.kv_heads,
            head_dim: model.head_dim_k,
            rope_dims: model.rope_dims,
            block,
        },
        Op::Attention {
            heads: model.heads,
            kv_heads: model.kv_heads,
            head_dim: model.head_dim_k,
            scale,
            block,
            sparse: false,
        },
        Op::Attention {
            heads: model.heads,
            kv_heads: model.kv_heads,
            head_dim: model.head_dim_k,
            scale,
            block,
            sparse: true,
        },
        Op::AttentionMerge { heads: model.heads, head_dim: model.head_dim_k, q8: false },
        Op::QsaScore { heads: model.heads, kv_heads: model.kv_heads, head_dim: model.head_dim_k, block },
        Op::QsaSelect { kv_heads: model.kv_heads, block },
        Op::Add { n: model.embd, broadcast: false },
        Op::Softmax { n: model.vocab },
        Op::Argmax { n: model.vocab },
    ]);
    ops.push(Op::SiluMul { n: ffn, q8: false, paired: model.experts.is_some() });
    if matches!(model.family, Family::Qwen3 | Family::Qwen3Moe) {
        let (n, eps) = (model.head_dim_k, model.rms_eps);
        ops.push(Op::RmsNorm { n, eps, qk: None });
        ops.push(Op::RmsNorm { n, eps, qk: Some([model.heads, model.kv_heads]) });
    }
    if model.family == Family::Qwen2 {
        for n in [model.heads * model.head_dim_k, model.kv_heads * model.head_dim_k] {
            ops.push(Op::Add { n, broadcast: true });
        }
    }

    let mut kernels: Vec<KernelSpec> = ops.into_iter().map(|op| rules::kernel_with(op, target, options)).collect();
    // Int8-dot products read their input quantized once: one quantizer per row length.
    let q8_cols: std::collections::BTreeSet<u32> = kernels
        .iter()
        .filter_map(|k| match (&k.op, &k.tuning) {
            (Op::Gemv { cols, .. } | Op::ExpertGemv { cols, .. }, Tuning::GemvQ8(_)) => Some(*cols),
            _ => None,
        })
        .collect();
    // Where such products read a norm's or SiLU·mul's output, that kernel quantizes it.
    let (embd, eps) = (model.embd, model.rms_eps);
    if q8_cols.contains(&embd) {
        kernels.push(rules::kernel(Op::AddRmsNorm { n: embd, eps, q8: true, experts: 0 }, target));
        if let Some(x) = model.experts {
            kernels.push(rules::kernel(Op::AddRmsNorm { n: embd, eps, q8: true, experts: x.used }, target));
        }
    }
    // The attention output's quants, made by the merge where its heads are whole chunks.
    let (heads, head_dim) = (model.heads, model.head_dim_k);
    if q8_cols.contains(&(heads * head_dim)) && head_dim % 32 == 0 {
        kernels.push(rules::kernel(Op::AttentionMerge { heads, head_dim, q8: true }, target));
    }
    if q8_cols.contains(&ffn) {
        kernels.push(rules::kernel(Op::SiluMul { n: ffn, q8: true, paired: model.experts.is_some() }, target));
    }
    kernels.extend(q8_cols.into_iter().map(|cols| rules::kernel(Op::QuantizeQ8 { cols }, target)));
    if options.checked {
        for k in &mut kernels {
            k.buffers.push(Buffer {
                name: ERROR_BUFFER.into(),
                elem: Elem::I32,
                extent: Extent::Fixed(8),
                writes: true,
            });
        }
    }
    kernels.sort_by(|a, b| a.name.cmp(&b.name));
    kernels.dedup_by(|a, b| a.name == b.name);
    if let Some(Fault::Wrong(name)) = &options.fault {
        let k = kernels.iter_mut().find(|k| &k.name == name).ok_or_else(|| PlanError::FaultKernel(name.clone()))?;
        // The widest grid dimension loses half its blocks.
        let widest = (0..3).max_by_key(|&i| match &k.launch.grid[i] {
            Dim::Fixed(n) => *n,
            Dim::Runtime { .. } => u32::MAX,
        });
        if let Some(i) = widest {
            k.launch.grid[i] = match &k.launch.grid[i] {
                Dim::Fixed(n) => Dim::Fixed(n / 2),
                Dim::Runtime { arg, per_block } => Dim::Runtime { arg: arg.clone(), per_block: per_block * 2 },
            };
        }
    }
    if let Some(Fault::Hang(name)) = &options.fault
        && !kernels.iter().any(|k| &k.name == name)
    {
        return Err(PlanError::FaultKernel(name.clone()));
    }
    Ok(Plan { target: target.name.clone(), options: options.clone(), kernels })
}

/// A mixture-of-experts layer's kernels: the routing, the experts' stacked gate·up and
/// down products for every window, and their weighted sum.
fn expert_ops(
    model: &ModelDesc,
    pack: &Pack,
    experts: crate::model::Experts,
    max_window: u32,
) -> Result<Vec<Op>, PlanError> {
    let (count, used, ffn, embd) = (experts.count, experts.used, experts.ffn, model.embd);
    if count > rules::MAX_EXPERTS || used == 0 || used > count || used > 32 {
        return Err(PlanError::Shape {
            tensor: "blk.0.ffn_gate_inp.weight".into(),
            what: format!(
                "{used} of {count} experts a token: the routing kernel takes up to {} experts and 1 to 32 a token",
                rules::MAX_EXPERTS
            ),
        });
    }
    let mut ops = vec![Op::MoeRoute { experts: count, used }, Op::MoeSum { n: embd, used }];
    for layer in 0..model.layers {
        let name = |n: &str| format!("blk.{layer}.{n}.weight");
        let [Some(gate), Some(up), Some(down)] =
            ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"].map(|n| pack.tensor(&name(n)))
        else {
            continue; // the model check names missing tensors
        };
        if gate.ty != up.ty {
            return Err(PlanError::Shape {
                tensor: up.name.clone(),
                what: format!(
                    "type {} differs from {}'s {}: the experts' gate and up are one stacked product",
                    up.ty, gate.name, gate.ty
                ),
            });
        }
        for (t, rows, cols, input) in
            [(gate, 2 * ffn, embd, ExpertInput::Token), (down, embd, ffn, ExpertInput::Choice)]
        {
            ops.extend((1..=max_window).map(|window| Op::ExpertGemv {
                quant: t.ty,
                rows,
                cols,
                window,
                used,
                experts: count,
                input,
            }));
        }
    }
    Ok(ops)
}

/// The window-1 GEMV over `tensors` stacked by rows, if they share type and row length
/// (and the row length suits a GEMV).
pub fn fused_gemv(tensors: &[&TensorInfo]) -> Option<Op> {
    let first = tensors.first()?;
    let (quant, cols) = (first.ty, *first.shape.first()?);
    let same = tensors.iter().all(|t| t.ty == quant && t.shape.len() == 2 && t.shape[0] == cols);
    let rows: u64 = tensors.iter().map(|t| t.shape[1]).sum();
    if !same || cols % 32 != 0 || tensors.len() < 2 {
        return None;
    }
    Some(Op::Gemv { quant, rows: u32::try_from(rows).ok()?, cols: u32::try_from(cols).ok()?, window: 1 })
}
