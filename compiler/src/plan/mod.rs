//! The kernel plan: a pure function from a model, its tensor types and a target to the
//! exact list of kernels the pack needs, each with every tuning decision made.
//!
//! Templates decide nothing: whatever a kernel's code depends on (shapes, window size,
//! threads, tiles, strides, launch geometry) is a field here, chosen by the rules in
//! [`rules`]. The runtime launches kernels from the same records (via the manifest), so
//! host and device cannot disagree about wave size, block size or window size.

pub mod rules;

use serde::{Deserialize, Serialize};

use crate::forward::{Forward, Matrix};
use crate::model::{ModelDesc, Role};
use crate::ops::{self, ExpertInput, Op};
use crate::pack::{Pack, TensorInfo};
use crate::quant::GgmlType;
use crate::target::Target;

/// The device error record every `--checked` kernel takes last: `[count, kernel,
/// buffer, index low, index high, block, thread, 0]`, written by the first violation.
pub const ERROR_BUFFER: &str = "strata_err";

/// Largest verify window (`--spec`).
pub const MAX_WINDOW: u32 = 16;

/// Most sequences one batched decode pass holds. Up to the widest window its products
/// are window GEMVs (each row as decoding it alone computes it, or on the matrix unit,
/// [`Options::gemv_mma_from`], to rounding); wider, they are the batch GEMVs
/// ([`ops::BatchGemv`], up to [`rules::BATCH_GEMV_COLUMNS`] columns a launch) where the
/// matrix unit takes them, else the prompt chunks' GEMMs: either reads the weights once
/// for all of them.
pub const MAX_BATCH: u32 = 64;

/// What the user asked for beyond the pack and the target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// Largest speculative verify window T: windows 2..=T are planned; 0 or 1 plans none.
    #[serde(alias = "spec")]
    pub verify_window: u32,
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
    /// Rows and tokens of every GEMM's block tile instead of the rule's (for tuning
    /// sweeps; [`rules::gemm`] still fits the waves to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_tile: Option<[u32; 2]>,
    /// Input features of every GEMM's step instead of the rule's (for tuning sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_k: Option<u32>,
    /// Whether GEMMs may take the int8 path ([`rules::gemm_q8`]) where `int8` allows it:
    /// the host's plan keeps the float-input GEMM record, whose kernel quantizes its
    /// columns itself.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub int8_gemm: bool,
    /// Tokens of an int8 GEMM's wave tile instead of the rule's (tuning sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_wave_tokens: Option<u32>,
    /// Blocks of an int8 GEMM an SM must hold at once (the launch bounds' minimum, which
    /// caps its registers) instead of the rule's (tuning sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_blocks: Option<u32>,
    /// Whether GEMMs on NVIDIA run as many blocks as the SMs hold and split the tiles'
    /// steps among them (stream-K, [`GemmQ8Tuning::blocks`], [`GemmTuning::blocks`])
    /// instead of one block a tile.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub stream_k: bool,
    /// The narrowest window whose GEMVs take the int8 matrix unit ([`rules::gemv_mma`]:
    /// `mma.sync` targets, the types with a fragment decoder); `None`: no window does.
    /// By default windows of [`rules::GEMV_MMA_FROM`] columns or more, where it was
    /// measured faster than the int8-dot GEMV (docs/PERFORMANCE.md); `Some(1)` puts the
    /// single token on it too, so that a window's columns equal single-token products
    /// bit for bit on the device as well. A manifest without the key predates it: none.
    #[serde(default)]
    pub gemv_mma_from: Option<u32>,
    /// Stages, least slab bytes and waves per compute unit of the matrix-unit GEMVs
    /// instead of the rule's (tuning sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemv_mma_shape: Option<[u32; 3]>,
    /// 16-row groups a wave of the matrix-unit GEMVs multiplies together instead of the
    /// rule's (tuning sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemv_mma_groups: Option<u32>,
    /// Whether the matrix-unit GEMVs stage their inputs in shared memory
    /// ([`GemvMmaTuning::staged_inputs`]) instead of the rule's choice (tuning sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemv_mma_staged: Option<bool>,
    /// Whether the matrix-unit GEMVs of a type with a zero point take it out through each
    /// column's starting sum ([`GemvMmaTuning::zero_start`]; the rule: yes, where the
    /// inputs are staged) instead of making the bytes signed (tuning sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemv_mma_zero_start: Option<bool>,
    /// Whether a staged window's matrix-unit GEMV takes another number of row groups
    /// where the first choice would need more than one round of blocks at eight columns
    /// ([`rules::mma_rounds`]; the rule: yes; tuning sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemv_mma_one_round: Option<bool>,
    /// Whether the types whose 16-element halves have scales of their own (Q6_K, the
    /// output head of most Q4 and Q5 downloads) take the matrix-unit GEMV
    /// ([`rules::GEMV_MMA_HALF_SCALES`] where unset) instead of the int8-dot one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemv_mma_half_scales: Option<bool>,
    /// Plans the prompt-chunk kernels (a GEMM per product matrix, the prefill attention)
    /// of a dense pack, or a mixture of experts' prompt window; without them prompts are
    /// read in verify-window passes.
    #[serde(default)]
    pub prefill: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            verify_window: 4,
            checked: false,
            fault: None,
            int8: Int8Dot::Auto,
            q8_rows: None,
            qsa_block: None,
            gemm_tile: None,
            gemm_k: None,
            int8_gemm: true,
            gemm_wave_tokens: None,
            gemm_blocks: None,
            stream_k: true,
            gemv_mma_from: Some(rules::GEMV_MMA_FROM),
            gemv_mma_shape: None,
            gemv_mma_groups: None,
            gemv_mma_staged: None,
            gemv_mma_zero_start: None,
            gemv_mma_one_round: None,
            gemv_mma_half_scales: None,
            prefill: true,
        }
    }
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Which GEMVs (and, unless `Never`, GEMMs: [`rules::gemm_q8`]) quantize their input to
/// int8 and use integer dot products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Int8Dot {
    /// Where the target has an int8 dot instruction and the type an int8 decoder: on
    /// NVIDIA every matrix, elsewhere as [`Int8Dot::Large`] ([`rules::int8_by_default`]).
    #[default]
    Auto,
    /// Only matrices large enough to be bound by their weight reads
    /// ([`rules::INT8_MIN_BYTES`], rows of whole 16-byte vectors): the CPU reference's
    /// choice, whose small models' products stay float.
    Large,
    /// Wherever the target and the type allow, whatever the size (tests; small models).
    Always,
    /// Never: every product dequantizes to float (to compare the two paths' numerics).
    Never,
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
            "large" => Ok(Int8Dot::Large),
            "always" => Ok(Int8Dot::Always),
            "never" => Ok(Int8Dot::Never),
            _ => Err(format!("{s:?} is not auto, large, always or never")),
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

/// One grid dimension: fixed at compile time, or `ceil(runtime value / per_block)`, at
/// most `most` where that is not 0.
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
        /// Most blocks (0: no bound): attention's splits, for instance, past which the
        /// value needs no more.
        #[serde(default, skip_serializing_if = "crate::ops::is_zero")]
        most: u32,
    },
}

impl Dim {
    /// The blocks of a runtime dimension for `value` of its argument (`None` for a fixed one).
    pub fn blocks_for(&self, value: u32) -> Option<u32> {
        match self {
            Dim::Fixed(_) => None,
            Dim::Runtime { per_block, most, .. } => {
                let n = value.div_ceil((*per_block).max(1));
                Some(if *most > 0 { n.min(*most) } else { n })
            }
        }
    }
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
    /// Shared memory the kernel declares, bytes (requested at launch where `dynamic_shared`).
    pub shared_bytes: u32,
    /// The kernel's shared memory is one dynamic array sized at launch
    /// (`STRATA_DYNAMIC_SHARED`), so it may use the target's opt-in limit beyond the
    /// static one (NVIDIA: 48 KiB static, up to 227 KiB opted in).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dynamic_shared: bool,
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
    /// The kernel's own working memory (a stream-K GEMM's partial tiles and arrival
    /// counts), neither input nor output: the host hands it over zeroed once, and the
    /// kernel leaves its integers zero again, so that any launch may reuse it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub workspace: bool,
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

/// Tuning of a GEMV on the int8 matrix unit (see [`rules::gemv_mma`]): a block takes a
/// panel of `16 * wave_groups` rows at a time, its waves splitting their length, each
/// streaming its part through shared memory in slabs, several in flight, and multiplying
/// each 32-weight chunk by up to 8 columns a `mma.sync` m16n8k32.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemvMmaTuning {
    /// Waves per block: the split of each row.
    pub waves: u32,
    /// Slabs of each row a wave multiplies (the last wave's may be fewer).
    pub wave_slabs: u32,
    /// Bytes of one slab of a row: whole quant blocks, in whole 16-byte pieces or, where
    /// those would take many blocks (Q6_K), at their phase in the pieces that hold them.
    pub slab_bytes: u32,
    /// Slabs of a wave in flight (asynchronous copies), the one being multiplied included.
    pub stages: u32,
    /// Bytes from one row's slab to the next in shared memory: an odd number of 16-byte
    /// pieces, so that the 8 rows a fragment reads at once fall in different banks.
    pub slab_stride: u32,
    /// 16-row groups a wave multiplies together, sharing each chunk's input fragments
    /// and column scales (loaded once for all of them). A manifest without the key
    /// predates it: one.
    #[serde(default = "one")]
    pub wave_groups: u32,
    /// Each slab's inputs (every column's quants and scales for its chunks) are copied
    /// into shared memory with its weights, so that a chunk's input fragments are
    /// conflict-free shared loads instead of eight columns' scattered global ones. A
    /// manifest without the key predates it: not staged.
    #[serde(default)]
    pub staged_inputs: bool,
    /// For a type whose fragment bytes have a zero point ([`rules::fragment_zero`]),
    /// staged inputs and more than one row group a wave: each column's integer sums start at the bias minus the zero point
    /// times the column's chunk sum (one multiply-add a column and chunk, shared by the
    /// wave's groups; the outputs are the same bits) instead of every byte being made
    /// signed (two instructions a fragment word; 12-17% of a product's at T=4 and 8). Not
    /// with inputs from global memory, whose four tiles' starts cost registers the batch
    /// GEMV has none of. Absent (false): the bytes are made signed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zero_start: bool,
}

/// Tiles of a [`Op::Gemm`] (see [`rules::gemm`]): a block computes `tile_rows` outputs
/// for `tile_tokens` columns, `tile_k` input features a step, each wave 16x16 tiles on
/// the matrix unit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmTuning {
    /// The matrix instructions.
    pub unit: MatrixUnit,
    /// Waves per block.
    pub waves: u32,
    /// Weight rows per block (a multiple of 16).
    pub tile_rows: u32,
    /// Input columns (tokens) per block (a multiple of 16).
    pub tile_tokens: u32,
    /// Input features per step (a multiple of 32: whole dequantized chunks).
    pub tile_k: u32,
    /// f16 elements padding each staged row (spreads a tile's rows over the banks).
    pub pad: u32,
    /// Input features of a staged super-step of raw weights: a multiple of `tile_k` that
    /// holds whole blocks (256 for the super-block types, whose scales lead each block).
    pub raw_k: u32,
    /// Super-steps of raw weights in flight in shared memory (at least 2): the block
    /// copies super-step n + raw_stages - 1 while it decodes super-step n.
    pub raw_stages: u32,
    /// Blocks of the grid where they walk the tiles stream-K (as [`GemmQ8Tuning::blocks`]);
    /// 0 gives one block a tile.
    #[serde(default, skip_serializing_if = "crate::ops::is_zero")]
    pub blocks: u32,
}

/// Tiles of an int8 [`Op::Gemm`] (see [`rules::gemm_q8`]): the input arrives quantized
/// (int8 per 32-element chunk with its scale and sum, as `quantize_q8` writes it); the
/// weights are decoded to int8 tiles with a scale and offset per (row, chunk), multiplied
/// on the matrix unit's int8 instructions and scaled into f32 accumulators chunk by chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmQ8Tuning {
    /// The matrix instructions.
    pub unit: MatrixUnit,
    /// Waves per block.
    pub waves: u32,
    /// Weight rows per block (a multiple of 16).
    pub tile_rows: u32,
    /// Input columns (tokens) per block (a multiple of 16).
    pub tile_tokens: u32,
    /// Input features per step (a multiple of 64: one 16-byte copy covers a token's
    /// (scale, sum) pairs of a step).
    pub tile_k: u32,
    /// Bytes padding each staged int8 row (spreads a fragment's rows over the banks).
    pub pad: u32,
    /// Tokens of a wave's tile (a multiple of 8; its rows are 64): the wave's 16x8
    /// tiles share each loaded weight fragment across this many tokens.
    pub wave_tokens: u32,
    /// Blocks an SM must hold at once (the kernel's launch bounds): the compiler keeps
    /// the registers within their share.
    pub min_blocks: u32,
    /// Input features of a staged super-step of raw weights (as [`GemmTuning::raw_k`]).
    pub raw_k: u32,
    /// Super-steps of raw weights in shared memory.
    pub raw_stages: u32,
    /// Steps of quantized input in shared memory: step s + 1's copies are in flight
    /// while step s - 1 is multiplied.
    pub x_stages: u32,
    /// Bytes of the type's lookup grid, staged in shared memory once per block (0: none).
    pub table_bytes: u32,
    /// Blocks of the grid, where the blocks walk the tiles (stream-K): 0 gives one
    /// block a tile. A chunk's tiles that fill waves of `blocks` are taken whole, in
    /// turn; the rest's super-steps are split evenly among the blocks, and the last of a
    /// split tile's blocks to finish sums its partial tiles in block order. This keeps
    /// every SM busy where the tiles leave the last wave part-empty (a 1024-row matrix
    /// at 512 tokens is 32 tiles for 132 SMs).
    #[serde(default, skip_serializing_if = "crate::ops::is_zero")]
    pub blocks: u32,
}

/// Tiles of [`Op::AttentionPrefill`] (see [`rules::attention_prefill`]): a block takes
/// one KV head and `block_tokens` tokens, whose (token, query head of the group) pairs are
/// its query rows, 16 a wave; it walks the keys `key_tile` positions at a time, staged in
/// shared memory (keys as rows, values transposed) and shared by every wave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionPrefillTuning {
    /// Waves per block, 16 query rows each.
    pub waves: u32,
    /// Tokens per block: `block_tokens × group ≤ 16 × waves` rows.
    pub block_tokens: u32,
    /// KV positions per staged tile (a multiple of 16).
    pub key_tile: u32,
    /// f16 elements padding each staged row (a multiple of 8: rows stay 16-byte aligned
    /// and a tile's rows spread over the banks).
    pub pad: u32,
    /// Key and value tiles in flight (cp.async) where the scores stay in registers as
    /// `mma.sync` fragments (NVIDIA, `attention_prefill_mma`); 0: the portable kernel,
    /// whose scores and weights pass through shared memory (`strata_mma16`).
    #[serde(default, skip_serializing_if = "crate::ops::is_zero")]
    pub stages: u32,
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

/// The matrix instructions a kernel's tiles are multiplied with (see
/// [`rules::matrix_unit`]): each has its template `templates/matrix/<unit>.cuh`, which
/// gives `strata_mma16` (a wave's 16x16 f32 tile += A·Bᵀ over 16 f16 of k, operands in
/// shared memory) and the tile row and column of each accumulator register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatrixUnit {
    /// NVIDIA `mma.sync.m16n8k16` (sm_80 on).
    MmaSync,
    /// AMD RDNA3 `V_WMMA_F32_16X16X16_F16` (wave32); emulated exactly by the CUDA
    /// prelude when a gfx11 kernel runs on NVIDIA.
    Wmma,
    /// AMD CDNA `V_MFMA_F32_16X16X16F16` (wave64).
    Mfma,
    /// None: fused multiply-adds in the same tiles.
    Fma,
}

impl MatrixUnit {
    /// Its template's name under `templates/matrix/`.
    pub fn name(self) -> &'static str {
        match self {
            MatrixUnit::MmaSync => "mma_sync",
            MatrixUnit::Wmma => "wmma",
            MatrixUnit::Mfma => "mfma",
            MatrixUnit::Fma => "fma",
        }
    }
}

/// Per-op tuning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Tuning {
    /// GEMV tuning (float dot).
    Gemv(GemvTuning),
    /// Int8 matrix-unit GEMV tuning (before [`Tuning::GemvQ8`]: untagged, the first
    /// variant whose fields all match is taken, and only this one has `stages`).
    GemvMma(GemvMmaTuning),
    /// Int8-dot GEMV tuning.
    GemvQ8(GemvQ8Tuning),
    /// Attention's split of the KV positions.
    Attention(AttentionTuning),
    /// An int8 GEMM's tiles (before [`Tuning::Gemm`]: untagged, the first variant whose
    /// fields all match is taken, and only this one has `x_stages`).
    GemmQ8(GemmQ8Tuning),
    /// A GEMM's tiles.
    Gemm(GemmTuning),
    /// Prefill attention's query and key tiles.
    AttentionPrefill(AttentionPrefillTuning),
    /// Block-per-row or elementwise ops need only their thread count (in `Launch`).
    None {},
}

/// One kernel: what it computes, how it is launched, and its arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelRecord {
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

impl KernelRecord {
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
    pub kernels: Vec<KernelRecord>,
}

/// Why a pack cannot be planned.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    /// `--spec` out of range.
    #[error("--spec {0} is out of range (0 or 1 for off, 2 to {MAX_WINDOW})")]
    VerifyWindow(u32),
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

/// The GEMV windows planned: every verify window, and for a mixture of experts with
/// `prefill` on its prompt window, [`MAX_WINDOW`]: it reads prompts in passes of that
/// many tokens (the most its routing takes), each reading a layer's chosen experts once
/// for all of them, and a prompt's last tokens in verify windows.
fn windows(model: &ModelDesc, options: &Options) -> Vec<u32> {
    let verify = options.verify_window.max(1);
    let mut windows: Vec<u32> = (1..=verify).collect();
    if model.experts.is_some() && options.prefill && verify < MAX_WINDOW {
        windows.push(MAX_WINDOW);
    }
    windows
}

/// Plans every kernel `pack` (described by `model`) needs on `target`.
pub fn plan(model: &ModelDesc, pack: &Pack, target: &Target, options: &Options) -> Result<Plan, PlanError> {
    if options.verify_window > MAX_WINDOW {
        return Err(PlanError::VerifyWindow(options.verify_window));
    }
    let windows = windows(model, options);
    let mut ops = Vec::new();
    // Kernels planned with other options than the rest: the output projection's GEMM.
    let mut own = Vec::new();
    // Prompt chunks run on the matrix units: a dense pack's, and a mixture of experts'
    // where its pools take the grouped expert GEMMs (else it reads its prompt in windows:
    // its routing and expert GEMVs take at most MAX_WINDOW).
    let block = options.qsa_block.unwrap_or_else(|| rules::qsa_block(target));
    let forward = Forward::new(model, block);
    let prefill = options.prefill && (model.experts.is_none() || grouped_experts(model, pack, &forward));

    // Matrix products: one GEMV per distinct (type, rows, cols), for every window, and
    // the GEMM of prompt chunks.
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
        ops.extend(windows.iter().map(|&window| Op::Gemv(ops::Gemv::new(t.ty, rows, cols, window))));
        if prefill {
            let gemm = Op::Gemm(ops::Gemm { quant: t.ty, rows, cols });
            // The logits of a prompt chunk are its last token's: the output's GEMM only ever
            // multiplies a batch of decode steps, in a batch's tiles where the int8 GEMM takes it.
            let narrow = (expected.role == Role::Output || tied_output)
                .then(|| rules::batch_gemm_options(target, options))
                .flatten()
                .map(|narrow| rules::kernel_with(gemm.clone(), target, &narrow))
                .filter(|k| matches!(k.tuning, Tuning::GemmQ8(_)));
            match narrow {
                Some(k) => own.push(k),
                None => ops.push(gemm),
            }
            // A batch wider than the verify window: its products on the matrix unit,
            // where the GEMV takes it.
            let batch =
                ops::BatchGemv { quant: t.ty, rows, cols, max: rules::BATCH_GEMV_COLUMNS, stack: ops::Stack::SINGLE };
            if batch.tuning(target, options).is_some() {
                ops.push(batch.into());
            }
        }
    }

    // The projections that read the same input are one product: Q, K and V in one,
    // gate and up in another, over their rows stacked in that order (the runtime
    // uploads them that way), where a layer stores them in one type: in the decode step,
    // and where one of them leaves compute units idle (`rules::stack_products`) in every
    // window and in a batch's GEMV where its matrices take one.
    for layer in 0..model.layers {
        for group in [&["attn_q", "attn_k", "attn_v"][..], &["ffn_gate", "ffn_up"][..]] {
            let tensors: Option<Vec<_>> =
                group.iter().map(|n| pack.tensor(&format!("blk.{layer}.{n}.weight"))).collect();
            let Some(stacked) = tensors.as_deref().and_then(stacked_matrix) else { continue };
            ops.push(forward.product(stacked, 1));
            if !rules::stack_products(&stacked.stack.parts(stacked.rows), target) {
                continue;
            }
            ops.extend(windows.iter().filter(|&&w| w > 1).map(|&window| forward.product(stacked, window)));
            let batch = forward.batch_product(stacked);
            if prefill && matches!(&batch, Op::BatchGemv(b) if b.tuning(target, options).is_some()) {
                ops.push(batch);
            }
        }
    }

    if !(1..=rules::MAX_QSA_BLOCK).contains(&block) {
        return Err(PlanError::QsaBlock(block));
    }
    if let Some(experts) = model.experts {
        ops.extend(expert_ops(model, pack, experts, &forward, &windows, prefill)?);
        ops.push(forward.add_norm(false, true));
    }

    let embd = pack.tensor("token_embd.weight").map(|t| t.ty).unwrap_or(GgmlType::F32);
    ops.extend([
        forward.embed(embd),
        forward.norm(),
        forward.add_norm(false, false),
        forward.rope_store(),
        forward.attention(true, None),
        forward.merge(false),
        forward.qsa_score(),
        forward.qsa_select(),
        forward.residual_add(),
        forward.softmax(),
        forward.argmax(),
        forward.silu_mul(false),
    ]);
    for window in forward.windows() {
        ops.push(forward.attention(false, window));
        if prefill {
            ops.extend(forward.attention_prefill(window));
        }
    }
    ops.extend(forward.head_norm());
    ops.extend(forward.qk_norm());
    ops.extend(forward.biases().into_iter().flatten());

    let mut kernels: Vec<KernelRecord> = ops.into_iter().map(|op| rules::kernel_with(op, target, options)).collect();
    kernels.extend(own);
    // Int8-dot products read their input quantized once: one quantizer per row length,
    // and where a norm, the attention merge or SiLU·mul makes that input, that kernel
    // quantizes it.
    let q8_cols: std::collections::BTreeSet<u32> = kernels
        .iter()
        .filter_map(|k| match (&k.op, &k.tuning) {
            (Op::Gemv(ops::Gemv { cols, .. }) | Op::ExpertGemv(ops::ExpertGemv { cols, .. }), Tuning::GemvQ8(_))
            | (Op::Gemv(ops::Gemv { cols, .. }) | Op::BatchGemv(ops::BatchGemv { cols, .. }), Tuning::GemvMma(_))
            | (Op::Gemm(ops::Gemm { cols, .. }) | Op::ExpertGemm(ops::ExpertGemm { cols, .. }), Tuning::GemmQ8(_)) => {
                Some(*cols)
            }
            _ => None,
        })
        .collect();
    for &cols in &q8_cols {
        kernels.extend(forward.quantizing_producers(cols).into_iter().map(|op| rules::kernel(op, target)));
        kernels.push(rules::kernel(forward.quantize(cols), target));
    }
    if options.checked {
        for k in &mut kernels {
            k.buffers.push(Buffer {
                name: ERROR_BUFFER.into(),
                elem: Elem::I32,
                extent: Extent::Fixed(8),
                writes: true,
                workspace: false,
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
                Dim::Runtime { arg, per_block, most } => {
                    Dim::Runtime { arg: arg.clone(), per_block: per_block * 2, most: most.div_ceil(2) }
                }
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

/// Whether every layer's expert pools can take the grouped expert GEMMs
/// ([`ops::ExpertGemm::fits`]), so that a mixture of experts' prompt chunks run on the
/// matrix units.
fn grouped_experts(model: &ModelDesc, pack: &Pack, forward: &Forward) -> bool {
    (0..model.layers).all(|l| {
        [("ffn_gate_exps", ExpertInput::Token), ("ffn_down_exps", ExpertInput::Choice)].iter().all(|&(n, input)| {
            let op = pack.tensor(&format!("blk.{l}.{n}.weight")).and_then(|t| forward.expert_gemm(t.ty, input));
            matches!(op, Some(Op::ExpertGemm(g)) if g.fits())
        })
    })
}

/// A mixture-of-experts layer's kernels: the routing, the experts' stacked gate·up and
/// down products for every window, and their weighted sum; with `prefill`, a prompt
/// chunk's grouping and grouped products too.
fn expert_ops(
    model: &ModelDesc,
    pack: &Pack,
    experts: crate::model::Experts,
    forward: &Forward,
    windows: &[u32],
    prefill: bool,
) -> Result<Vec<Op>, PlanError> {
    let (count, used) = (experts.count, experts.used);
    if count > rules::MAX_EXPERTS || used == 0 || used > count || used > 32 {
        return Err(PlanError::Shape {
            tensor: "blk.0.ffn_gate_inp.weight".into(),
            what: format!(
                "{used} of {count} experts a token: the routing kernel takes up to {} experts and 1 to 32 a token",
                rules::MAX_EXPERTS
            ),
        });
    }
    let mut ops: Vec<Op> = forward.route().into_iter().chain(forward.moe_sum()).collect();
    if prefill {
        ops.extend(forward.group());
    }
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
        for (t, input) in [(gate, ExpertInput::Token), (down, ExpertInput::Choice)] {
            ops.extend(windows.iter().filter_map(|&window| forward.expert_product(t.ty, window, input)));
            if prefill {
                ops.extend(forward.expert_gemm(t.ty, input));
            }
        }
    }
    Ok(ops)
}

/// `tensors` stacked by rows as one matrix, if they share type and row length (and the
/// row length suits a GEMV).
pub fn stacked_matrix(tensors: &[&TensorInfo]) -> Option<Matrix> {
    let first = tensors.first()?;
    let (quant, cols) = (first.ty, *first.shape.first()?);
    let same = tensors.iter().all(|t| t.ty == quant && t.shape.len() == 2 && t.shape[0] == cols);
    if !same || cols % 32 != 0 || !(2..=3).contains(&tensors.len()) {
        return None;
    }
    let parts: Vec<u32> = tensors.iter().map(|t| u32::try_from(t.shape[1]).ok()).collect::<Option<_>>()?;
    let rows = parts.iter().try_fold(0u32, |sum, &r| sum.checked_add(r))?;
    Some(Matrix { quant, rows, cols: u32::try_from(cols).ok()?, stack: ops::Stack::of(&parts) })
}

/// The window-1 GEMV over `tensors` stacked by rows ([`stacked_matrix`]).
pub fn fused_gemv(tensors: &[&TensorInfo]) -> Option<Op> {
    let m = stacked_matrix(tensors)?;
    Some(Op::Gemv(ops::Gemv::new(m.quant, m.rows, m.cols, 1)))
}
