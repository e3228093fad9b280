//! Tuning rules: every decision about threads, tiles and launch geometry, per target.
//!
//! Rules read only the op's shapes and the target's facts, so a plan is reproducible
//! and each decision can be read here in one place. `strata-compile --tune` (a later
//! issue) may replace a rule's choice with a measured one; these defaults must already
//! be good.

use super::{
    AttentionPrefillTuning, AttentionTuning, GemmQ8Tuning, GemmTuning, GemvMmaTuning, GemvQ8Tuning, GemvTuning,
    Int8Dot, KernelRecord, MAX_WINDOW, MatrixUnit, Options,
};
use crate::ops::{AttentionPrefill, Op};
use crate::quant::GgmlType;
use crate::target::{Target, Vendor};

/// Waves per block for GEMV and attention: four waves hide latency well on every
/// shipped target while leaving room for several blocks per SM / CU.
pub const WAVES_PER_BLOCK: u32 = 4;
/// Threads of elementwise kernels.
pub const ELEMENTWISE_THREADS: u32 = 256;
/// Largest runtime row count of block-per-row kernels (grid x; the host refuses more).
pub const MAX_ROWS: u32 = 1 << 20;
/// Largest token count of elementwise kernels, which put tokens on grid y (65535 at most).
pub const MAX_TOKENS: u32 = 65_535;
/// Largest context (KV positions) a kernel accepts.
pub const MAX_CONTEXT: u32 = 1 << 20;
/// Floats per 32-element chunk in a GEMV's shared input tile: 32 plus 4 of padding,
/// so each chunk starts 16-byte aligned (read as float4) and the eight lanes of a
/// 128-bit access phase, reading chunks 36 words apart, hit all 32 banks once.
pub const CHUNK_STRIDE: u32 = 36;

/// Quant types with an int8 dot decoder (`strata_dot32_<type>` in `templates/quant/`).
pub const INT8_DOT: [GgmlType; 9] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
];
/// Smallest weight matrix that takes the int8 path under [`Int8Dot::Large`] (and by
/// default on AMD). Below it a product was taken to be bound by launch latency rather
/// than by its weight reads, where a separate quantizer launch could cost more than the
/// cheaper dot products save (the norms now quantize the input as they write it).
pub const INT8_MIN_BYTES: u64 = 1 << 20;

/// Whether a matrix of `rows` rows of `row_bytes` takes the int8 path under
/// [`Int8Dot::Auto`]: every one on NVIDIA, where the int8-dot GEMV beats the float one
/// even on SmolLM2's 0.2-0.6 MB matrices of 360-byte rows (an H100: one stream 1195 →
/// 1423 t/s, 8 sequences 2946 → 6819, 16 3006 → 9954) at the float path's quality (its
/// perplexity on two texts within 0.3%; docs/PERFORMANCE.md); on AMD, not measured (no
/// device), as [`Int8Dot::Large`].
pub fn int8_by_default(target: &Target, rows: u32, row_bytes: u64) -> bool {
    target.vendor == Vendor::Nvidia || int8_large(rows, row_bytes)
}

/// [`Int8Dot::Large`]'s matrices: at least [`INT8_MIN_BYTES`], of whole 16-byte rows
/// (narrower loads did not reach the bandwidth that paid for a quantizer launch).
fn int8_large(rows: u32, row_bytes: u64) -> bool {
    u64::from(rows) * row_bytes >= INT8_MIN_BYTES && row_bytes.is_multiple_of(16)
}

/// Bytes a wave keeps in flight per slab of an int8 GEMV, at least.
pub const SLAB_TARGET_BYTES: u32 = 1024;
/// Largest (chunks a lane decodes per slab) × window in an int8 GEMV. A lane keeps its
/// chunks of a slab decoded while it dots them with every window column, so registers
/// grow with the product: about 10 VGPRs for each on gfx1100, where an IQ1_M row of 4096
/// (4 chunks a lane) used 253 VGPRs at 4 tokens and spilled at 5.
pub const Q8_LANE_CHUNK_COLUMNS: u32 = 16;
/// Threads of a norm's block, at most (one block a row, four elements a thread): a row
/// of 4096 is one round trip to memory, not sixteen.
pub const NORM_THREADS: u32 = 1024;
/// Waves per block of an int8 GEMV.
pub const Q8_WAVES: u32 = 8;
/// Rows a wave of an int8 GEMV decodes together (single-token products).
pub const Q8_ROWS_PER_WAVE: u32 = 2;
/// Largest rows × window a wave accumulates at once (its float accumulators). A verify
/// window keeps two rows a wave up to T = 16: with one, each row would read the whole
/// window's input for itself, and at T = 8 the window's GEMV took 2.3-5.8× the
/// single-token one on the H200 (8 accumulators); the input, not the weights, bounded it.
pub const Q8_ACCUMULATORS: u32 = 32;
/// Blocks of an int8 GEMV per compute unit, at most; more rows are stepped over. Each
/// block stages the lookup grid once, however many rows it then decodes.
pub const Q8_BLOCKS_PER_CU: u32 = 4;

/// The types whose chunks decode straight into `mma.sync` fragments
/// (`strata_frag8_<type>`: a lane's words q and 4 + q of a chunk, with one scale a
/// chunk or, where [`crate::ops::gemm::q8_decoder_terms`] says, one a 16-element half
/// (`d2`, two k = 16 products a chunk), and where it says, an offset): their GEMVs take
/// the int8 matrix unit ([`gemv_mma`]). Q6_K's 210-byte blocks fill whole 16-byte pieces
/// only eight at a time, so its slabs are whole blocks at their phase in the pieces that
/// hold them ([`mma_slab`]).
pub const MMA_FRAGMENTS: [GgmlType; 5] =
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K];
/// The zero point of a type's matrix-unit fragment bytes (`strata_frag8::z`: weight =
/// d · (byte - z) + m), where it has one: Q4_0's nibbles mean q - 8, Q6_K's six bits
/// q - 32. A GEMV either subtracts it from every byte or, with
/// [`GemvMmaTuning::zero_start`], starts each column's sums at minus its multiple of the
/// column's chunk sum; a type with half scales starts each half's sums at the product of
/// bytes -z with the half's inputs.
pub fn fragment_zero(quant: GgmlType) -> Option<u32> {
    match quant {
        GgmlType::Q4_0 => Some(8),
        GgmlType::Q6_K => Some(32),
        _ => None,
    }
}
/// Whether the types whose halves have scales of their own take the matrix-unit GEMV
/// ([`Options::gemv_mma_half_scales`]): not yet, until a device measures Q6_K's against
/// its int8-dot GEMV (docs/PERFORMANCE.md, eighteenth session).
pub const GEMV_MMA_HALF_SCALES: bool = false;
/// Bytes a matrix-unit slab of whole blocks in whole 16-byte pieces may take at the
/// least (Q8_0: 272); a type whose blocks fill whole pieces only in more (Q6_K: 8 x 210
/// bytes) takes whole blocks at their phase in the pieces that hold them instead, so that
/// a 16-row stage stays small (3.75 KiB rather than 26 KiB).
pub const MMA_WHOLE_PIECE_BYTES: u32 = 512;
/// The narrowest window whose GEMVs take the matrix unit by default
/// ([`Options::gemv_mma_from`]). On an H100 (docs/PERFORMANCE.md), Llama-8B Q4_0: at
/// two columns the int8-dot GEMV is faster on both shapes, at four the matrix unit takes
/// the down projection in 0.57x the time and gate and up in 1.12x (0.88x the three
/// together), at eight in 0.56x and 0.92x; its one column costs 1.3-1.8x.
pub const GEMV_MMA_FROM: u32 = 4;
/// Waves a matrix-unit GEMV wants per compute unit: a wave multiplies its chunks one
/// after another, so a compute unit needs many to keep its loads in flight.
pub const GEMV_MMA_WAVES_PER_CU: u32 = 32;
/// Most waves a matrix-unit GEMV splits a group's row into (a block's waves).
pub const GEMV_MMA_MAX_SPLITS: u32 = 16;
/// Slabs of a matrix-unit GEMV's wave in flight: one loading while one is multiplied.
pub const GEMV_MMA_STAGES: u32 = 2;
/// Bytes of a row's slab in a matrix-unit GEMV, at least (16 rows: 2 KiB a slab, so that
/// 32 waves' stages fit a compute unit's shared memory).
pub const GEMV_MMA_SLAB_BYTES: u32 = 128;
/// Blocks of a matrix-unit GEMV per compute unit, at most, where fewer than that fit its
/// shared memory at once (blocks step over the panels); [`mma_blocks`].
pub const GEMV_MMA_BLOCKS_PER_CU: u32 = 4;
/// 16-row groups a matrix-unit GEMV's wave multiplies together, at most (each chunk's
/// input fragments are loaded once for all of them). On an H200, two took an 8B Q4_0
/// model's 8 and 16 batched sequences from 1575 to 1934 and 2294 to 3121 t/s; four read
/// the inputs less often still but leave too few waves: 2921 at 16 (docs/PERFORMANCE.md).
pub const GEMV_MMA_GROUPS: u32 = 2;
/// Most 16-row groups of a matrix-unit GEMV whose inputs are staged, where the panels
/// still number at least the compute units: on an H100 (docs/PERFORMANCE.md), four
/// took Llama-8B's gate and up (224 panels) at T = 8 from 20.95 to 16.70 µs; the
/// 64 panels of 4096 rows from 17.62 to 30.01 (down) and 6.83 to 8.99 (q, o).
pub const GEMV_MMA_STAGED_GROUPS: u32 = 4;
/// Widest window whose matrix-unit GEMV stages its inputs in shared memory
/// ([`GemvMmaTuning::staged_inputs`]): on an H100, Llama-8B's shapes at 4 to 16 columns
/// ran 0.93-1.46x as fast as unstaged (faster in 50 of 52; q and o at 9 and 10 columns
/// slower); at 32 (a batch's GEMV) 2x slower, its stages leaving one block a compute
/// unit.
pub const GEMV_MMA_STAGED_UP_TO: u32 = 16;
/// Most 16-row groups of a batch's matrix-unit GEMV (wider than [`GEMV_MMA_STAGED_UP_TO`]),
/// where the panels still number at least the compute units: its 32 columns' inputs are
/// loaded once a chunk for all of a wave's groups. On an H100 (docs/PERFORMANCE.md), four
/// took Llama-8B's gate and up at 32 columns from 61.4 to 46.3 µs and its 32 batched
/// sequences from 3232 to 3537 t/s; the 4096-row matrices keep two (64 panels).
pub const BATCH_GEMV_GROUPS: u32 = 4;
/// Most waves a batch's matrix-unit GEMV splits a panel's rows into: its four tiles' sums
/// and inputs need 200-250 registers a lane, which more than 256 lanes a block cannot
/// have. At 14 and 16 waves ptxas capped Llama-8B's 4096- and 1024-row products at 128
/// and spilled; at 8 none spills, and on an H100 q and o took 13.6 µs instead of 16.4
/// and 32 batched sequences 4080 t/s instead of 3581 (with the unrolled, branch-free
/// chunks of the same commit; docs/PERFORMANCE.md).
pub const BATCH_GEMV_MAX_SPLITS: u32 = 8;
/// Bytes of a row's slab in a batch's matrix-unit GEMV over fewer panels than compute
/// units, at least: on an H100 at 32 columns (docs/PERFORMANCE.md, thirteenth session),
/// Llama-8B's down projection took 41.1 µs instead of 46.0, q and o 13.1 instead of 13.9,
/// k and v 9.8 instead of 10.3; gate and up (224 panels) 56.3 instead of 33.9, so they
/// keep [`GEMV_MMA_SLAB_BYTES`].
pub const BATCH_GEMV_SLAB_BYTES: u32 = 256;
/// Rows a compute unit takes of a product before stacking stops paying: a window's or a
/// batch's product stacks matrices (Q·K·V, gate·up, [`crate::ops::Stack`]) only where one
/// of them alone has fewer than this many rows a compute unit, so that its launch would
/// leave units idle. On an H100 (docs/PERFORMANCE.md, fourteenth session) Llama-8B's
/// Q·K·V (K and V 1024 rows) took 10.94 µs stacked at 8 columns instead of 13.84 alone,
/// 25.13 at 32 instead of 33.96, and SmolLM2's launch-bound step 17-26% less; its
/// gate·up (14336 rows each) 38.06 instead of 34.52 at 8 and 77.44 instead of 66.74 at
/// 32. (A decode step's stack is always taken: 24.20 against 24.44 for gate·up.)
pub const STACK_ROWS_PER_CU: u32 = 64;

/// Whether a product of several columns stacks matrices of these row counts in one
/// launch ([`STACK_ROWS_PER_CU`]).
pub fn stack_products(parts: &[u32], target: &Target) -> bool {
    parts.iter().any(|&rows| rows < target.device.compute_units * STACK_ROWS_PER_CU)
}

/// Most columns a matrix-unit GEMV takes (four 8-column tiles): the width of a batch's
/// GEMV ([`crate::ops::BatchGemv`]), which a batch of decode steps wider than the
/// verify window takes for its products instead of the prompt chunk's GEMM.
pub const BATCH_GEMV_COLUMNS: u32 = 32;

/// Most splits of one (token, head) in attention. A decode token deep in a long context
/// needs many waves reading at once: with 16 splits, 8 KV heads gave 128 blocks (4 waves
/// each) on the H200's 132 SMs, and dense attention at 128k read 405 GB/s; 64 give four
/// times the waves, while a 16-token window's partial states stay near 17 MB at 8B shape.
pub const ATTENTION_SPLITS: u32 = 64;
/// Most KV positions per QSA block (the summaries' granularity).
pub const MAX_QSA_BLOCK: u32 = 1024;
/// Queries a QSA score block stages at once: the window's tokens are taken as many at a
/// time as fit, once per window where tokens × group heads ≤ 16.
pub const QSA_QUERIES: u32 = 16;
/// Threads of a QSA score block.
pub const QSA_SCORE_THREADS: u32 = 128;
/// KV blocks a QSA score lane group loads together: their summaries' loads are in flight at
/// once (one load a block kept the H200 at a tenth of its bandwidth, latency-bound).
pub const QSA_SCORE_BLOCKS_PER_GROUP: u32 = 4;
/// Threads of a QSA selection block (one (token, KV head) each).
pub const QSA_SELECT_THREADS: u32 = 512;
/// Most experts a layer may have: [`Op::MoeRoute`] keeps a token's logits in shared
/// memory.
pub const MAX_EXPERTS: u32 = 1024;
/// Most slots of an expert pool (the host refuses more).
pub const MAX_EXPERT_SLOTS: u32 = 1 << 24;
/// Most tokens of a mixture of experts' prompt chunk on the grouped expert GEMMs:
/// [`Op::MoeGroup`] keeps the chunk's choices in shared memory (2 bytes each, 32 KiB at
/// 32 experts a token), and the GEMMs' grids cover this many tokens' tiles.
pub const MAX_EXPERT_CHUNK: u32 = 512;
/// Tiles of the grouped expert GEMM, (rows, tokens), and a wave's tokens: an expert
/// takes `chunk · used / experts` of a chunk's tokens on average (32 for Qwen3-30B-A3B
/// at 512), so its tiles are narrower than a dense GEMM's.
pub const EXPERT_GEMM_TILE: ([u32; 2], u32) = ([128, 32], 16);

/// Bins of one QSA selection radix pass (8 bits of the score's key at a time).
pub const QSA_SELECT_BINS: u32 = 256;

/// Shared bytes a QSA selection block of `threads` needs besides its staged keys (bins,
/// scan scratch, the found digit).
pub fn qsa_select_fixed_bytes(threads: u32) -> u32 {
    (QSA_SELECT_BINS + 2 * threads + 4) * 4
}

/// Score keys a QSA selection block stages in shared memory: what is left of `shared_bytes`
/// (the target's allowance) in whole rows of `threads` (10752 keys, 168k positions at
/// block 16, on a 48 KiB part), leaving the compiler its own few bytes.
pub fn qsa_select_staged(shared_bytes: u32, threads: u32) -> u32 {
    shared_bytes.saturating_sub(qsa_select_fixed_bytes(threads)) / 4 / threads * threads
}

/// KV positions per QSA block on `target`: 16, Quest's page size, on every shipped
/// target (a block's keys are then one 4 KiB read per KV head of dimension 128, and a
/// 2048-token budget keeps 128 blocks).
pub fn qsa_block(_target: &Target) -> u32 {
    16
}

/// Attention's split rule: at most [`ATTENTION_SPLITS`] shares per (token, head), each
/// at least four waves' worth of positions (one position a lane), so a share's fixed
/// cost (its partial state, the merge) stays small beside its reads.
pub fn attention(block: u32, target: &Target) -> AttentionTuning {
    let positions = 4 * target.device.wave_size;
    AttentionTuning { splits: ATTENTION_SPLITS, split_blocks: positions.div_ceil(block.max(1)) }
}

/// Lanes of a QSA score kernel that bound one KV block together, each over head_dim / lanes
/// consecutive dimensions (16 bytes of summary per 4): at most 32, so that the sum's order,
/// and the CPU reference that mirrors it, is the same on every target.
pub fn qsa_score_lanes(head_dim: u32) -> u32 {
    (head_dim / 4).clamp(1, 32)
}

/// Tokens of a window a QSA score block stages at once (see [`QSA_QUERIES`]).
pub fn qsa_tokens_per_tile(heads: u32, kv_heads: u32) -> u32 {
    (QSA_QUERIES / (heads / kv_heads.max(1)).max(1)).clamp(1, MAX_WINDOW)
}

/// The matrix instructions of `target`'s tiled products: NVIDIA's `mma.sync`, gfx11's
/// WMMA, CDNA's MFMA, or plain fused multiply-adds (gfx1030 has no matrix unit).
pub fn matrix_unit(target: &Target) -> MatrixUnit {
    let f = &target.features;
    match target.vendor {
        Vendor::Nvidia if f.mma => MatrixUnit::MmaSync,
        Vendor::Amd if f.wmma && target.device.wave_size == 32 => MatrixUnit::Wmma,
        Vendor::Amd if f.mfma && target.device.wave_size == 64 => MatrixUnit::Mfma,
        _ => MatrixUnit::Fma,
    }
}

/// Tokens of a prompt chunk by default (`--prefill`), and what the GEMM benchmark times.
pub const GEMM_CHUNK: u32 = 512;

/// Window passes a batched decode step takes at most; more sequences go in GEMM passes.
/// A GEMM pass costs about what its tiles do however few tokens fill them: on an H100,
/// an 8B Q4_0 model's 32 sequences decoded 3108 t/s in two window passes of 16 (2124 in
/// one GEMM pass, one row group a wave on an H200), 48 as fast either way (3147 and 3124),
/// and 64 faster in one GEMM pass (4040 and 3124; docs/PERFORMANCE.md).
pub const BATCH_WINDOW_PASSES: u32 = 2;

/// GEMM tiles for `rows × cols` on `target`. Each wave multiplies 64 rows by a wave's
/// width of tokens (`ops::Gemm::wave_tile`: 64 accumulators a lane on every unit), 64
/// features a step on NVIDIA (`cp_async`) where they fit beside the tile and divide the
/// row, else 32 (one dequantized chunk a row; 64 gives each thread a chunk to decode and
/// halves the barriers: pp512 +14% on the Q4_0 and +43% on the IQ2_XS Llama-8B packs on
/// an H100, docs/PERFORMANCE.md; on AMD, unmeasured, 64 only fits smaller tiles and
/// spills gfx1030's registers), rows of the staged tiles padded by 8
/// halves (16 bytes: fragment loads of 8 consecutive rows then fall in distinct banks,
/// and rows stay 16-byte aligned). The block tile is the largest of 128x128, 128x64 and
/// 64x64 (rows x tokens) that fits the target: each dequantized weight serves every
/// token of the tile, and the dequantization is most of a step's work. Measured on the
/// H200 (docs/PERFORMANCE.md), 128x128 everywhere beat tiles chosen to give each SM a
/// block (128x64 or 64x64 for the 4096- and 1024-row matrices) by 20% at pp512, and
/// 128x64 everywhere lost 13%.
///
/// The raw weights reach shared memory ahead of their decode in super-steps of whole
/// blocks (`raw_k` features: the most of 256, 128, 64 and 32 that holds whole blocks
/// and divides the row), copied by consecutive threads in consecutive 16-byte pieces of
/// a row (a row's blocks are contiguous; one lane a row would touch a cache line per
/// lane, and a short span would copy mostly the pieces' slack). Where the target copies
/// asynchronously (`cp_async`) three super-steps are in flight; elsewhere a copy is a
/// load and a store and two suffice. The tiles live in dynamic shared memory, so they
/// may use the target's opt-in limit; the first fit is taken, in the order above (tile,
/// then step, then super-step, then stages). `options.gemm_tile` imposes a block tile (tuning
/// sweeps; the static check refuses one that does not fit). On NVIDIA the grid is one
/// block an SM, walking the tiles stream-K (as [`gemm_q8`]'s; SmolLM2's GEMMs, 20 tiles
/// at 512 tokens, ran 1.5-2x faster on an H100).
pub fn gemm(target: &Target, options: &Options, quant: GgmlType, cols: u32) -> GemmTuning {
    let d = &target.device;
    let (wave_rows, wave_tokens) = crate::ops::Gemm::wave_tile(d.wave_size);
    let pad = 8;
    let tile_ks: Vec<u32> = match options.gemm_k {
        Some(k) => vec![k],
        None if target.features.cp_async => [64u32, 32].into_iter().filter(|k| cols.is_multiple_of(*k)).collect(),
        None => vec![32],
    };
    let tile_ks = if tile_ks.is_empty() { vec![32] } else { tile_ks };
    // Super-steps for a step of tile_k features.
    let raw_ks = |tile_k: u32| {
        let block = u32::try_from(quant.block_len()).unwrap_or(u32::MAX).max(tile_k);
        let ks: Vec<u32> =
            [256u32, 128, 64, 32].into_iter().filter(|k| k.is_multiple_of(block) && cols.is_multiple_of(*k)).collect();
        if ks.is_empty() { vec![block] } else { ks }
    };
    let tuning = |tile_rows: u32, tile_tokens: u32, tile_k: u32, raw_k: u32, raw_stages: u32| GemmTuning {
        unit: matrix_unit(target),
        waves: (tile_rows / wave_rows).max(1) * (tile_tokens / wave_tokens).max(1),
        tile_rows,
        tile_tokens,
        tile_k,
        pad,
        raw_k,
        raw_stages,
        blocks: stream_k_blocks(target, options, 1),
    };
    let most_stages = if target.features.cp_async { 3 } else { 2 };
    let fits = |t: &GemmTuning| {
        crate::ops::Gemm::shared_bytes(quant, t) <= d.shared_limit(true)
            && t.waves * d.wave_size <= d.max_threads_per_block
    };
    let tiles: &[(u32, u32)] = match options.gemm_tile {
        Some([r, t]) => &[(r, t)],
        None => &[(128, 128), (128, 64), (64, 64)],
    };
    let candidates = tiles.iter().flat_map(|&(r, t)| {
        tile_ks.iter().flat_map(move |&k| {
            raw_ks(k).into_iter().flat_map(move |raw| (2..=most_stages).rev().map(move |s| (r, t, k, raw, s)))
        })
    });
    let (last_tile, last_k) = (tiles[tiles.len() - 1], tile_ks[tile_ks.len() - 1]);
    let last_raw = raw_ks(last_k).last().copied().unwrap_or(last_k);
    candidates
        .map(|(r, t, k, raw, s)| tuning(r, t, k, raw, s))
        .find(fits)
        .unwrap_or_else(|| tuning(last_tile.0, last_tile.1, last_k, last_raw, 2))
}

/// The int8 GEMM's tiles for `rows × cols` of `quant` on `target`, where it takes that
/// path: a target whose matrix unit is `mma.sync` (int8 m16n8k32), a type with an int8
/// decoder ([`INT8_DOT`]), rows of whole 16-byte pieces (the decoders' aligned loads see
/// a staged super-step where the row's own alignment puts it) of whole 64-feature steps,
/// and `options.int8_gemm`; under `Int8Dot::Auto` and `Large` only where the GEMV of the
/// same matrix takes the int8 path ([`int8_by_default`], [`INT8_MIN_BYTES`]), so a model
/// whose products stay float in decode reads its prompts in float too.
///
/// The weights decode once per block tile to one byte an element instead of an f16
/// pair's half, and the input is quantized once per chunk of tokens, not converted per
/// block. Wave tiles and block tiles are the f16 GEMM's (128x128: eight waves of 64x32);
/// a step is 64 features (two chunks, whose (scale, sum) pairs are one 16-byte copy a
/// token); raw super-steps are tried from 256 down to 64 features and three stages
/// before two (at least two steps between a copy and its decode: one wait a step covers
/// the input and the weights), first where two blocks fit an SM's shared memory (the
/// opt-in limit is one block's share of it), else where one does; then the smaller tiles
/// the same way. Where none fits, the f16 GEMM. The launch bounds ask for one block an
/// SM: asking for two capped the registers at 128 and ptxas spilled (pp512 33% slower on
/// an H100, docs/PERFORMANCE.md); `options.gemm_blocks` sweeps it. The grid is as many
/// blocks as the target's SMs hold, walking the tiles stream-K ([`GemmQ8Tuning::blocks`]),
/// unless `options.stream_k` is off. The count is the target's (`compute_units`): a
/// smaller part of the same architecture runs the blocks in more than one wave.
pub fn gemm_q8(target: &Target, options: &Options, quant: GgmlType, rows: u32, cols: u32) -> Option<GemmQ8Tuning> {
    q8_tiles(target, options, quant, rows, cols, false)
}

/// [`gemm_q8`]'s tiles; `ragged_rows` allows rows that are not whole 16-byte pieces
/// (the template then stages each row at its own phase: `ops::gemm::ragged_rows`).
fn q8_tiles(
    target: &Target,
    options: &Options,
    quant: GgmlType,
    rows: u32,
    cols: u32,
    ragged_rows: bool,
) -> Option<GemmQ8Tuning> {
    let d = &target.device;
    let row_bytes = quant.row_bytes(u64::from(cols))?;
    let tile_k = options.gemm_k.unwrap_or(64);
    let wanted = match options.int8 {
        Int8Dot::Auto => int8_by_default(target, rows, row_bytes),
        Int8Dot::Large => u64::from(rows) * row_bytes >= INT8_MIN_BYTES,
        Int8Dot::Always => true,
        Int8Dot::Never => false,
    };
    let usable = wanted
        && options.int8_gemm
        && matrix_unit(target) == MatrixUnit::MmaSync
        && target.features.cp_async
        && INT8_DOT.contains(&quant)
        && (ragged_rows || row_bytes.is_multiple_of(16))
        && tile_k.is_multiple_of(64)
        && cols.is_multiple_of(tile_k);
    if !usable {
        return None;
    }
    let (wave_rows, wave_tokens) = (crate::ops::Gemm::wave_tile(d.wave_size).0, options.gemm_wave_tokens.unwrap_or(32));
    let block = u32::try_from(quant.block_len()).unwrap_or(u32::MAX);
    let table_bytes = lookup_table(quant).map_or(0, |(_, elem, len)| elem * len);
    let tuning = |[tile_rows, tile_tokens]: [u32; 2], raw_k: u32, raw_stages: u32| GemmQ8Tuning {
        unit: MatrixUnit::MmaSync,
        waves: (tile_rows / wave_rows).max(1) * (tile_tokens / wave_tokens.max(8)).max(1),
        tile_rows,
        tile_tokens,
        tile_k,
        pad: 16,
        wave_tokens,
        min_blocks: 1,
        raw_k,
        raw_stages,
        x_stages: 3,
        table_bytes,
        blocks: 0,
    };
    let shared = |t: &GemmQ8Tuning| crate::ops::Gemm::q8_shared_bytes(quant, t);
    let limit = d.shared_limit(true);
    let tiles: &[[u32; 2]] = match &options.gemm_tile {
        Some(tile) => std::slice::from_ref(tile),
        None => &[[128, 128], [128, 64], [64, 64]],
    };
    tiles.iter().find_map(|&tile| {
        let candidates: Vec<GemmQ8Tuning> = [256u32, 128, 64]
            .into_iter()
            .filter(|k| k.is_multiple_of(tile_k) && k.is_multiple_of(block.max(1)) && cols.is_multiple_of(*k))
            .flat_map(|k| [3u32, 2].map(|stages| tuning(tile, k, stages)))
            .filter(|t| (t.raw_stages - 1) * (t.raw_k / t.tile_k) >= 2)
            .collect();
        let two = candidates.iter().find(|t| shared(t) <= limit / 2).map(|t| (t, 2));
        let fit = two.or_else(|| candidates.iter().find(|t| shared(t) <= limit).map(|t| (t, 1)));
        fit.map(|(t, fits)| {
            let min_blocks = options.gemm_blocks.unwrap_or(1).min(fits);
            GemmQ8Tuning { min_blocks, blocks: stream_k_blocks(target, options, min_blocks), ..t.clone() }
        })
    })
}

/// Tiles of a GEMM that multiplies a batch of decode steps (at most [`crate::plan::MAX_BATCH`]
/// columns), not a prompt chunk: 128 rows by 32 tokens, waves of 16 tokens, two blocks an
/// SM, where the options leave the tiles to the rules and the int8 GEMM takes them
/// (NVIDIA). On an H100 (docs/PERFORMANCE.md) Llama-8B's Q6_K output head at 32 tokens took
/// 439 µs with them against 1027 with a prompt's 128x128 tiles.
pub fn batch_gemm_options(target: &Target, options: &Options) -> Option<Options> {
    let free = options.gemm_tile.is_none() && options.gemm_wave_tokens.is_none() && options.gemm_blocks.is_none();
    (free && matrix_unit(target) == MatrixUnit::MmaSync).then(|| Options {
        gemm_tile: Some(BATCH_GEMM_TILE),
        gemm_wave_tokens: Some(16),
        gemm_blocks: Some(2),
        ..options.clone()
    })
}

/// Rows and tokens of a batch's GEMM tile ([`batch_gemm_options`]).
pub const BATCH_GEMM_TILE: [u32; 2] = [128, 32];

/// The int8 tiles of [`Op::ExpertGemm`]: [`gemm_q8`]'s rule with [`EXPERT_GEMM_TILE`]
/// (unless the options set tiles), the int8 path wherever it exists (as the expert
/// GEMVs), rows of any even length (an expert's down rows are often 222 bytes, three
/// IQ2_XS blocks) in matrices of whole 16-byte pieces (each slot's copies start
/// aligned), and one block a tile (its tiles are found from the grouping at run time).
pub fn expert_gemm_q8(
    target: &Target,
    options: &Options,
    quant: GgmlType,
    rows: u32,
    cols: u32,
) -> Option<GemmQ8Tuning> {
    let (tile, wave_tokens) = EXPERT_GEMM_TILE;
    let options = Options {
        int8: options.int8.max_for_experts(),
        gemm_tile: options.gemm_tile.or(Some(tile)),
        gemm_wave_tokens: options.gemm_wave_tokens.or(Some(wave_tokens)),
        stream_k: false,
        ..options.clone()
    };
    let row_bytes = quant.row_bytes(u64::from(cols))?;
    let whole = row_bytes.is_multiple_of(2) && (u64::from(rows) * row_bytes).is_multiple_of(16);
    if !whole {
        return None;
    }
    q8_tiles(target, &options, quant, rows, cols, true)
}

/// The f16 tiles of [`Op::ExpertGemm`] where the int8 path is not taken
/// ([`expert_gemm_q8`]: AMD, types without an int8 decoder, `--int8 never`): [`gemm`]'s
/// rule with tiles of 128 (or, where those do not fit the shared memory, 64) rows by a
/// wave's width of choices (unless the options set tiles), one block a tile. Its
/// staging takes rows at any phase.
pub fn expert_gemm(target: &Target, options: &Options, quant: GgmlType, cols: u32) -> GemmTuning {
    let wave = target.device.wave_size;
    let tiles = match options.gemm_tile {
        Some(tile) => vec![tile],
        None => vec![[EXPERT_GEMM_TILE.0[0], wave], [64, wave]],
    };
    let with = |tile| gemm(target, &Options { gemm_tile: Some(tile), stream_k: false, ..options.clone() }, quant, cols);
    let fits = |t: &GemmTuning| crate::ops::Gemm::shared_bytes(quant, t) <= target.device.shared_limit(true);
    let last = with(tiles[tiles.len() - 1]);
    tiles.into_iter().map(with).find(fits).unwrap_or(last)
}

/// Eighths of a wave of tiles from which a chunk's last wave is taken whole rather than
/// split stream-K (the tiles of a 4096-row matrix at 512 tokens, 128 for 132 SMs).
pub const STREAM_K_WHOLE_EIGHTHS: u32 = 7;

/// The grid of a stream-K GEMM holding `per_sm` blocks an SM: one wave of them on the
/// target's SMs, where it was measured (NVIDIA) and `options.stream_k`; else 0, one block
/// a tile (AMD: unmeasured, and the wave64 MFMA kernel took 11 bytes of stack on gfx90a).
pub fn stream_k_blocks(target: &Target, options: &Options, per_sm: u32) -> u32 {
    match options.stream_k && target.vendor == Vendor::Nvidia {
        true => target.device.compute_units * per_sm,
        false => 0,
    }
}

/// Prefill attention's tiles for `op` on `target`: [`WAVES_PER_BLOCK`] waves of 16 query
/// rows (a block's tokens are as many whole tokens' groups of heads as fit), and the
/// widest key tile of 64, 32 or 16 positions whose staged tiles fit the target's shared
/// memory per block (64 at head length 64, 32 at 128 on a 48 KiB part): a wider tile
/// means fewer block barriers and longer runs of matrix instructions between them, and
/// several blocks still fit an SM / CU. Where even 16 does not fit, the static check
/// names the kernel and the limit.
///
/// On `mma.sync` targets with cp.async the scores stay in registers (`stages` > 0): key
/// tiles of 64, each key and value tile copied in the background while the waves work on
/// the one before (two stages), in dynamic shared memory.
pub fn attention_prefill(op: &AttentionPrefill, target: &Target) -> AttentionPrefillTuning {
    let waves = WAVES_PER_BLOCK;
    let block_tokens = (16 * waves / op.group().max(1)).max(1);
    let tuning = |key_tile| AttentionPrefillTuning { waves, block_tokens, key_tile, pad: 8, stages: 0 };
    let fragments = AttentionPrefillTuning { stages: 2, ..tuning(64) };
    if matrix_unit(target) == MatrixUnit::MmaSync
        && target.features.cp_async
        && op.shared_bytes(&fragments) <= u64::from(target.device.shared_limit(true))
    {
        return fragments;
    }
    [64, 32, 16]
        .into_iter()
        .map(tuning)
        .find(|t| op.shared_bytes(t) <= u64::from(target.device.shared_bytes_per_block))
        .unwrap_or_else(|| tuning(16))
}

/// The full kernel record for `op` on `target` (int8 GEMVs by the default rule).
pub fn kernel(op: Op, target: &Target) -> KernelRecord {
    kernel_with(op, target, &Options::default())
}

/// The full kernel record for `op` on `target`, with int8 GEMVs where `options.int8` says:
/// the op's own launch rule ([`crate::ops::KernelOp::record`]).
pub fn kernel_with(op: Op, target: &Target, options: &Options) -> KernelRecord {
    let def = op.def();
    let (name, parts) = (def.kernel_name(), def.record(target, options));
    KernelRecord {
        name,
        op,
        launch: parts.launch,
        tuning: parts.tuning,
        buffers: parts.buffers,
        scalars: parts.scalars,
    }
}

/// GEMV tuning for `rows × cols` over `window` columns.
///
/// - Four waves per block; each row is reduced by `split` waves (intra-block split-K)
///   when there are too few rows to give every SM / CU two blocks, and the row has at
///   least `wave × split` chunks of 32 to share. No atomics: the split partial sums are
///   combined in a fixed order, so results are deterministic.
/// - The input window is staged in shared memory in tiles: as many 32-column chunks as
///   fit half the target's per-block shared memory for `window` columns (rounded down to
///   whole 256-column super-blocks), at least one super-block (or the whole row if
///   shorter). A target too small for that minimum fails the static check, naming the
///   kernel and the limit.
/// - Lane `l` of split part `p` accumulates chunks `c ≡ p·wave + l (mod split·wave)` in
///   ascending order whatever the tile size, so column `j` of a window is bit-identical
///   to the single-column GEMV of input `j`.
pub fn gemv(rows: u32, cols: u32, window: u32, target: &Target) -> GemvTuning {
    let wave = target.device.wave_size;
    let waves = WAVES_PER_BLOCK;
    let chunks = cols / 32;
    let min_blocks = 2 * target.device.compute_units;
    let mut split = 1;
    while split < waves && rows.div_ceil(waves / split) < min_blocks && chunks >= wave * split * 2 {
        split *= 2;
    }
    let budget = target.device.shared_bytes_per_block / 2;
    let fit = budget / (window * CHUNK_STRIDE * 4);
    let tile_chunks = if fit >= chunks { chunks } else { (fit / 8 * 8).max(8.min(chunks)) };
    GemvTuning { waves, split, rows_per_block: waves / split, tile_cols: tile_chunks * 32, chunk_stride: CHUNK_STRIDE }
}

/// Int8-dot GEMV tuning for a `quant` matrix of `rows × cols`, or `None` where the float
/// path is used.
///
/// - Taken where the target has a signed 4-way int8 dot (dp4a, sdot4 or sudot4) and the
///   type an int8 decoder ([`INT8_DOT`]); by default ([`Int8Dot::Auto`]) where
///   [`int8_by_default`] says (every matrix on NVIDIA). The
///   choice does not depend on the window, so a verify window computes exactly what
///   decode does.
/// - A wave decodes [`Q8_ROWS_PER_WAVE`] rows together (`options.q8_rows` overrides;
///   fewer in wide windows, [`Q8_ACCUMULATORS`]): the input chunks, which outweigh a
///   chunk's weights in on-chip traffic, are loaded once for all of them. Lane `l` sums
///   chunks `l`, `l + wave`, ... in order whatever the grouping, so the result does not
///   depend on it. [`Q8_WAVES`] waves per block: no block barriers, and each row is one
///   contiguous stream of loads, each the widest (16, 8, 4 or 2 bytes) that divides the
///   row length, so every row starts aligned to it.
/// - A slab is the smallest run of whole blocks that is whole vectors and whole
///   wave-sized chunk groups (every lane decodes the same number of chunks), doubled
///   until a wave's slabs reach [`SLAB_TARGET_BYTES`] (twice that for two rows or more)
///   or cover the row: enough bytes in flight per wave that a short row is one round
///   trip to memory. Wide windows keep slabs shorter ([`Q8_LANE_CHUNK_COLUMNS`]), within
///   the registers; the sums do not depend on the slab.
/// - IQ types' lookup grids are staged in shared memory ([`lookup_table`]); rows per wave
///   are halved until the slabs and the grid fit the target's shared memory.
pub fn gemv_q8(
    quant: GgmlType,
    rows: u32,
    cols: u32,
    window: u32,
    target: &Target,
    options: &Options,
) -> Option<GemvQ8Tuning> {
    let f = &target.features;
    let row_bytes = quant.row_bytes(u64::from(cols))?;
    let wanted = match options.int8 {
        Int8Dot::Auto => int8_by_default(target, rows, row_bytes),
        Int8Dot::Large => int8_large(rows, row_bytes),
        Int8Dot::Always => true,
        Int8Dot::Never => false,
    };
    if !(wanted && (f.dp4a || f.sdot4 || f.sudot4) && INT8_DOT.contains(&quant)) {
        return None;
    }
    let vector = [16u32, 8, 4, 2].into_iter().find(|v| row_bytes % u64::from(*v) == 0)?;
    let wave = target.device.wave_size;
    let (block_bytes, block_chunks) = (quant.block_bytes() as u32, quant.block_len() as u32 / 32);
    // Blocks per unit: whole vectors, then whole chunk groups of a wave.
    let mut blocks = lcm(block_bytes, vector) / block_bytes;
    blocks *= lcm(blocks * block_chunks, wave) / (blocks * block_chunks);
    let row_chunks = cols / 32;
    let table_bytes = lookup_table(quant).map_or(0, |(_, elem, len)| elem * len);
    let unit = blocks;
    let mut rows_per_wave =
        options.q8_rows.unwrap_or(Q8_ROWS_PER_WAVE).clamp(1, (Q8_ACCUMULATORS / window.max(1)).max(1)).min(rows.max(1));
    loop {
        blocks = unit;
        let per_row = SLAB_TARGET_BYTES * rows_per_wave.min(2) / rows_per_wave;
        let lane_chunks_fit = |blocks: u32| blocks * block_chunks / wave * window.max(1) <= Q8_LANE_CHUNK_COLUMNS;
        while blocks * block_bytes < per_row && blocks * block_chunks < row_chunks && lane_chunks_fit(2 * blocks) {
            blocks *= 2;
        }
        let shared = Q8_WAVES * rows_per_wave * (blocks * block_bytes).next_multiple_of(16) + table_bytes;
        if rows_per_wave == 1 || shared <= target.device.shared_bytes_per_block {
            break;
        }
        rows_per_wave /= 2;
    }
    let slab_bytes = blocks * block_bytes;
    Some(GemvQ8Tuning {
        waves: Q8_WAVES,
        rows_per_wave,
        vector_bytes: vector,
        slab_bytes,
        slab_chunks: blocks * block_chunks,
        loads: (slab_bytes / vector).div_ceil(wave),
        table_bytes,
    })
}

/// Tuning of a GEMV on the int8 matrix unit, where it applies: NVIDIA's `mma.sync`
/// with asynchronous copies, a type of [`MMA_FRAGMENTS`] (one with half scales where
/// `options.gemv_mma_half_scales`, [`GEMV_MMA_HALF_SCALES`] unset), rows of whole 16-byte pieces
/// and at most [`BATCH_GEMV_COLUMNS`] columns (a verify window's 16 or fewer, or a
/// batch's), wherever the int8 GEMV would be taken (`options.int8`), for windows of
/// `options.gemv_mma_from` columns or more ([`GEMV_MMA_FROM`] by default).
///
/// A wave multiplies 16 rows at a time (`m16n8k32`), so each weight chunk is decoded
/// once into the A fragment and the window's columns ride in the B fragment: a window
/// of 8 costs about what one column does, where the int8-dot GEMV's cost grows with
/// every column. Each output sums its chunks in the same order in every window it
/// takes, so where the single token takes it too (`gemv_mma_from` 1) a verify window's
/// or a batch's column equals the single-token product bit for bit; by default they
/// differ from it by rounding (the two templates sum in different orders).
/// - Slabs are the smallest run of whole blocks and whole 16-byte pieces, doubled to
///   [`GEMV_MMA_SLAB_BYTES`] or the row ([`BATCH_GEMV_SLAB_BYTES`] for a batch's unstaged
///   GEMV over fewer panels than compute units); [`GEMV_MMA_STAGES`] a wave
///   (`options.gemv_mma_shape` sweeps these and the next).
/// - A wave multiplies `wave_groups` 16-row groups together (a panel), so that each
///   chunk's input fragments and column scales, read from memory shared by every row,
///   are loaded once for all of them: `options.gemv_mma_groups`, or the most up to
///   [`GEMV_MMA_GROUPS`] that leave the matrix a panel per two compute units. (On an
///   H200 the 1024 rows of an 8B model's k and v, 32 panels of 32 rows for 132 SMs, took
///   17-31% longer at two groups; 4096 rows, 128 panels, took up to 35% less.)
/// - A block's waves split each panel's slabs evenly (`wave_slabs` each), as many as
///   bring the matrix to [`GEMV_MMA_WAVES_PER_CU`] groups in flight a compute unit, at
///   most [`GEMV_MMA_MAX_SPLITS`] ([`BATCH_GEMV_MAX_SPLITS`] for a batch's, whose sums need
///   more registers) and no more than the widest window's block fits in
///   shared memory: a matrix of few groups (4096 rows: 256) still keeps every compute
///   unit's loads in flight. The waves' sums are added in wave order. The split depends
///   on the matrix, the target and the options only, never on a verify window (a
///   batch's wider sums may ask for fewer splits).
/// - Windows up to [`GEMV_MMA_STAGED_UP_TO`] columns (`options.gemv_mma_staged`) copy
///   each slab's inputs into shared memory with its weights, so a chunk's B fragments
///   and scales are conflict-free shared loads rather than loads from eight columns'
///   rows in global memory each; their larger stages may leave fewer splits, and they
///   take up to [`GEMV_MMA_STAGED_GROUPS`] groups where the panels still cover every
///   compute unit. A batch's wider GEMV, unstaged, takes up to [`BATCH_GEMV_GROUPS`]
///   where they do; it may so split its rows differently from the windows (its columns
///   then differ from theirs by rounding).
pub fn gemv_mma(
    quant: GgmlType,
    rows: u32,
    cols: u32,
    window: u32,
    target: &Target,
    options: &Options,
) -> Option<GemvMmaTuning> {
    let row_bytes = quant.row_bytes(u64::from(cols))?;
    let usable = options.gemv_mma_from.is_some_and(|from| window >= from)
        && window <= BATCH_GEMV_COLUMNS
        && matrix_unit(target) == MatrixUnit::MmaSync
        && target.features.cp_async
        && MMA_FRAGMENTS.contains(&quant)
        && (!crate::ops::gemm::q8_decoder_terms(quant).1
            || options.gemv_mma_half_scales.unwrap_or(GEMV_MMA_HALF_SCALES))
        && row_bytes.is_multiple_of(16);
    if !usable {
        return None;
    }
    // The int8 GEMV's choice of where int8 products pay.
    gemv_q8(quant, rows, cols, window.min(crate::plan::MAX_WINDOW), target, options)?;
    let least = options.gemv_mma_shape.map_or(GEMV_MMA_SLAB_BYTES, |[_, least, _]| least);
    let slab = mma_slab(quant, row_bytes, least);
    // Staged inputs copy each column's scales two chunks a 16-byte piece.
    let slab_chunks = slab / quant.block_bytes() as u32 * (quant.block_len() as u32 / 32);
    let staged_inputs = options.gemv_mma_staged.unwrap_or(window <= GEMV_MMA_STAGED_UP_TO)
        && slab_chunks.is_multiple_of(2)
        && (cols / 32).is_multiple_of(2);
    let cus = target.device.compute_units;
    let groups = rows.div_ceil(16);
    // Up to GEMV_MMA_GROUPS groups while the panels number half the compute units; a staged
    // window's or a batch's more only while they number them all.
    let most = if staged_inputs {
        GEMV_MMA_STAGED_GROUPS
    } else if window > GEMV_MMA_STAGED_UP_TO {
        BATCH_GEMV_GROUPS
    } else {
        GEMV_MMA_GROUPS
    };
    let enough = |r: u32| groups.div_ceil(r) * if r > GEMV_MMA_GROUPS { 1 } else { 2 } >= cus;
    let tuned =
        |wave_groups: u32| gemv_mma_split(quant, rows, cols, window, wave_groups, staged_inputs, target, options);
    let Some(asked) = options.gemv_mma_groups else {
        let first = (1..=most).rev().find(|&r| enough(r)).unwrap_or(1);
        let chosen = tuned(first)?;
        if !(staged_inputs && options.gemv_mma_one_round.unwrap_or(true))
            || mma_rounds(&chosen, quant, rows, target) <= 1.0
        {
            return Some(chosen);
        }
        // One round of blocks at GEMV_MMA_ROUND_WINDOW: the nearest group count whose
        // blocks all fit the compute units at once (more groups first), else the first.
        let mut others: Vec<u32> = (1..=most).filter(|&r| r != first).collect();
        others.sort_by_key(|&r| (r.abs_diff(first), std::cmp::Reverse(r)));
        let fits = others.into_iter().filter_map(tuned).find(|t| mma_rounds(t, quant, rows, target) <= 1.0);
        return Some(fits.unwrap_or(chosen));
    };
    tuned(asked.min(groups).max(1))
}

/// The window whose blocks fit the GPU in one round where a group count allows it
/// ([`Options::gemv_mma_one_round`]): eight columns, an 8-sequence batch's and the usual
/// verify window's. On an H100 the stacked Q·K·V of Llama-8B took 128 blocks of three
/// groups instead of 192 of two (1.45 rounds): 11.44 -> 8.92 µs at T=8, and with the zero
/// start 8 and 16 sequences 4.0% and 3.2% faster (docs/PERFORMANCE.md, seventeenth session).
pub const GEMV_MMA_ROUND_WINDOW: u32 = 8;

/// Rounds of blocks a matrix-unit GEMV of `t` takes at [`GEMV_MMA_ROUND_WINDOW`] columns:
/// its blocks over as many as the compute units hold at once by shared memory. Above one,
/// the last blocks wait for the first.
pub fn mma_rounds(t: &GemvMmaTuning, quant: GgmlType, rows: u32, target: &Target) -> f64 {
    let blocks = mma_blocks(t, quant, rows, GEMV_MMA_ROUND_WINDOW, target);
    f64::from(blocks)
        / f64::from((mma_resident(t, quant, GEMV_MMA_ROUND_WINDOW, target) * target.device.compute_units).max(1))
}

/// Blocks of a matrix-unit GEMV of `window` columns: one a panel, at most
/// [`GEMV_MMA_BLOCKS_PER_CU`] a compute unit or, where more fit its shared memory at
/// once, as many as fit (a matrix of more panels than that, such as an output head's
/// 128256 rows, keeps its units' waves busy rather than four at a time); they step over
/// the rest.
pub fn mma_blocks(t: &GemvMmaTuning, quant: GgmlType, rows: u32, window: u32, target: &Target) -> u32 {
    let panels = rows.div_ceil(16 * t.wave_groups);
    let per_cu = mma_resident(t, quant, window, target).max(GEMV_MMA_BLOCKS_PER_CU);
    panels.min(target.device.compute_units * per_cu)
}

/// Blocks of a matrix-unit GEMV a compute unit holds at once by shared memory (1 KiB
/// reserved a block, as NVIDIA does).
fn mma_resident(t: &GemvMmaTuning, quant: GgmlType, window: u32, target: &Target) -> u32 {
    let shared = crate::ops::gemv::mma_shared_bytes(t, quant, window, target.device.wave_size);
    (target.device.shared_limit(true) + 1024) / (shared + 1024)
}

/// The rest of [`gemv_mma`] for a given number of groups a wave: slabs, the split of each
/// row between the waves, and the stages.
#[allow(clippy::too_many_arguments)]
fn gemv_mma_split(
    quant: GgmlType,
    rows: u32,
    cols: u32,
    window: u32,
    wave_groups: u32,
    staged_inputs: bool,
    target: &Target,
    options: &Options,
) -> Option<GemvMmaTuning> {
    let row_bytes = quant.row_bytes(u64::from(cols))?;
    let [stages, least, per_cu] =
        options.gemv_mma_shape.unwrap_or([GEMV_MMA_STAGES, GEMV_MMA_SLAB_BYTES, GEMV_MMA_WAVES_PER_CU]);
    let cus = target.device.compute_units;
    let panels = rows.div_ceil(16 * wave_groups);
    let batch_panels =
        options.gemv_mma_shape.is_none() && window > GEMV_MMA_STAGED_UP_TO && !staged_inputs && panels < cus;
    let slab = mma_slab(quant, row_bytes, if batch_panels { BATCH_GEMV_SLAB_BYTES } else { least });
    let slabs = u32::try_from(row_bytes.div_ceil(u64::from(slab))).ok().filter(|&n| n > 0)?;
    let wanted = (cus * per_cu).div_ceil(panels * wave_groups);
    let most_splits = if window > GEMV_MMA_STAGED_UP_TO { BATCH_GEMV_MAX_SPLITS } else { GEMV_MMA_MAX_SPLITS };
    let mut wave_slabs = slabs.div_ceil(wanted.min(most_splits.min(slabs)).max(1));
    let tuning = |wave_slabs: u32| GemvMmaTuning {
        waves: slabs.div_ceil(wave_slabs),
        wave_slabs,
        slab_bytes: slab,
        stages,
        slab_stride: 16 * (mma_slab_pieces(slab) | 1),
        wave_groups,
        staged_inputs,
        // One group a wave has the fewest products to share a column's start: the 1024-row
        // k and v windows measured 3% slower at T=4 and 16 with it, and ptxas spilled at T=4.
        zero_start: staged_inputs
            && wave_groups > 1
            && fragment_zero(quant).is_some()
            && !crate::ops::gemm::q8_decoder_terms(quant).1
            && options.gemv_mma_zero_start.unwrap_or(true),
    };
    // Fewer, longer splits where the widest window's block would not fit shared memory.
    let limit = target.device.shared_limit(true);
    let shared =
        |t: &GemvMmaTuning| crate::ops::gemv::mma_shared_bytes(t, quant, window.max(16), target.device.wave_size);
    while wave_slabs < slabs && shared(&tuning(wave_slabs)) > limit {
        wave_slabs += 1;
    }
    Some(tuning(wave_slabs))
}

/// A matrix-unit GEMV's slab: whole quant blocks in whole 16-byte pieces, doubled up to
/// `least` bytes or the row; or, for a type whose blocks fill whole pieces only in more
/// than [`MMA_WHOLE_PIECE_BYTES`], whole blocks likewise, each slab copied at its phase in
/// the pieces that hold it ([`mma_slab_pieces`]).
fn mma_slab(quant: GgmlType, row_bytes: u64, least: u32) -> u32 {
    let block = quant.block_bytes() as u32;
    let whole = lcm(block, 16);
    let mut slab = if whole > MMA_WHOLE_PIECE_BYTES { block } else { whole };
    while slab < least && u64::from(slab) < row_bytes {
        slab *= 2;
    }
    slab
}

/// The 16-byte pieces a stage copies for one row's slab: its bytes from the latest phase
/// a slab of `slab_bytes` meets in a row of whole pieces (`s * slab_bytes % 16`).
pub fn mma_slab_pieces(slab_bytes: u32) -> u32 {
    let latest = (16 - gcd(slab_bytes, 16)) % 16;
    (latest + slab_bytes).div_ceil(16)
}

/// The lookup grid an int8 decoder reads: (name in the module, bytes an entry, entries).
pub fn lookup_table(quant: GgmlType) -> Option<(&'static str, u32, u32)> {
    match quant {
        GgmlType::IQ1_M => Some(("strata_iq1s_grid", 8, 2048)),
        GgmlType::IQ2_XS => Some(("strata_iq2xs_grid", 8, 512)),
        GgmlType::IQ3_XXS => Some(("strata_iq3xxs_grid", 4, 256)),
        GgmlType::IQ3_S => Some(("strata_iq3s_grid", 4, 512)),
        _ => None,
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: u32, b: u32) -> u32 {
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use crate::plan::Dim;

    fn with(int8: Int8Dot) -> Options {
        Options { int8, ..Options::default() }
    }

    #[test]
    fn int8_dot_is_taken_by_default_on_nvidia_and_by_size_elsewhere() {
        let sm90 = Target::load("sm_90").expect("known");
        let (auto, large) = (with(Int8Dot::Auto), with(Int8Dot::Large));
        let down = gemv_q8(GgmlType::Q4_0, 4096, 14_336, 1, &sm90, &auto).expect("an 8B down projection");
        assert_eq!((down.vector_bytes, down.slab_bytes, down.slab_chunks), (16, 1152, 64));
        assert!(gemv_q8(GgmlType::IQ1_M, 4096, 4096, 1, &sm90, &large).is_some(), "an 8B IQ1_M output projection");
        // SmolLM2's small products and its output's 612-byte rows: int8 on NVIDIA, float
        // where only large matrices are.
        let small = gemv_q8(GgmlType::Q4_1, 1536, 576, 1, &sm90, &auto).expect("NVIDIA: every matrix");
        assert_eq!(small.vector_bytes, 8, "360-byte rows load 8 bytes at a time");
        assert!(gemv_q8(GgmlType::Q8_0, 49_152, 576, 1, &sm90, &auto).is_some());
        assert_eq!(gemv_q8(GgmlType::Q4_1, 1536, 576, 1, &sm90, &large), None);
        assert_eq!(gemv_q8(GgmlType::Q8_0, 49_152, 576, 1, &sm90, &large), None);
        let gfx1100 = Target::load("gfx1100").expect("known");
        assert_eq!(gemv_q8(GgmlType::Q4_1, 1536, 576, 1, &gfx1100, &auto), None, "AMD: by size");
        assert!(gemv_q8(GgmlType::Q4_1, 1536, 576, 1, &gfx1100, &with(Int8Dot::Always)).is_some());
        assert_eq!(gemv_q8(GgmlType::Q4_0, 4096, 14_336, 1, &sm90, &with(Int8Dot::Never)), None);
        assert_eq!(gemv_q8(GgmlType::Q5_0, 4096, 14_336, 1, &sm90, &with(Int8Dot::Always)), None, "no int8 decoder");
        // Wave64: every lane gets the same number of chunks.
        let gfx90a = Target::load("gfx90a").expect("known");
        let g = gemv_q8(GgmlType::IQ2_XS, 4096, 14_336, 1, &gfx90a, &auto).expect("sdot4");
        assert_eq!(g.slab_chunks % 64, 0);
        assert_eq!(g.slab_bytes % 74, 0);
    }

    #[test]
    fn int8_rows_per_wave_shrink_with_the_window_and_keep_the_slab_shape() {
        let sm90 = Target::load("sm_90").expect("known");
        let rows = |window, q8_rows| {
            let options = Options { q8_rows, ..Options::default() };
            gemv_q8(GgmlType::IQ2_XS, 4096, 14_336, window, &sm90, &options).expect("int8").rows_per_wave
        };
        assert_eq!(rows(1, None), Q8_ROWS_PER_WAVE);
        assert_eq!(rows(1, Some(4)), 4);
        assert_eq!(rows(8, None), 2, "windows keep two rows a wave");
        assert_eq!(rows(8, Some(8)), 4, "32 accumulators: 4 rows of 8 columns");
        assert_eq!(rows(16, None), 2);
        // Four rows keep slabs half as long: the wave still has 2 KiB in flight.
        let options = Options { q8_rows: Some(4), ..Options::default() };
        let four = gemv_q8(GgmlType::Q4_0, 4096, 14_336, 1, &sm90, &options).expect("int8");
        assert_eq!(four.slab_bytes, 576);
        let spec = kernel_with(Op::Gemv(ops::Gemv::new(GgmlType::Q4_0, 4096, 14_336, 1)), &sm90, &options);
        assert_eq!(spec.launch.grid[0], Dim::Fixed(128), "4096 rows, 32 a block");
        let big = Op::Gemv(ops::Gemv::new(GgmlType::Q4_0, 28_672, 4096, 1));
        assert_eq!(kernel_with(big, &sm90, &options).launch.grid[0], Dim::Fixed(132 * Q8_BLOCKS_PER_CU));
    }

    #[test]
    fn products_stack_where_a_part_alone_leaves_compute_units_idle() {
        let sm90 = Target::load("sm_90").expect("known");
        assert!(stack_products(&[4096, 1024, 1024], &sm90), "Llama-8B's Q·K·V: K and V have 16 panels");
        assert!(!stack_products(&[14_336, 14_336], &sm90), "its gate·up fill the units alone");
        assert!(stack_products(&[1536, 1536], &sm90), "SmolLM2's gate·up");
        let units = sm90.device.compute_units * STACK_ROWS_PER_CU;
        assert!(!stack_products(&[units, units], &sm90) && stack_products(&[units, units - 1], &sm90));
    }

    #[test]
    fn matrix_unit_gemvs_take_fragment_types_on_mma_sync_where_int8_pays() {
        let (sm90, gfx1100) = (Target::load("sm_90").expect("known"), Target::load("gfx1100").expect("known"));
        let all = Options { gemv_mma_from: Some(1), ..Options::default() };
        let t = gemv_mma(GgmlType::Q4_0, 4096, 14_336, 8, &sm90, &all).expect("an 8B down projection");
        // 8 blocks of 18 bytes, 9 pieces: an odd number apart, so that rows g and g + 8 miss
        // each other's banks. 256 groups of 56 slabs: 14 waves of 4 slabs would bring 3584
        // waves, but their stages with 16 columns' inputs would not fit: 10 waves of 6.
        assert_eq!((t.slab_bytes, t.slab_stride, t.stages), (144, 144, 2));
        assert_eq!((t.waves, t.wave_slabs), (10, 6));
        let unstaged = Options { gemv_mma_staged: Some(false), ..all.clone() };
        let plain = gemv_mma(GgmlType::Q4_0, 4096, 14_336, 8, &sm90, &unstaged).expect("inputs from global memory");
        assert_eq!((plain.waves, plain.wave_slabs), (14, 4));
        let one = gemv_mma(GgmlType::Q4_0, 4096, 14_336, 1, &sm90, &all).expect("one column too");
        assert_eq!(one, t, "the split does not depend on the window");
        let q8 = gemv_mma(GgmlType::Q8_0, 14_336, 4096, 1, &sm90, &all).expect("an 8B gate");
        // 17 pieces apart; 896 groups of 16 slabs: 4 waves of 4 slabs.
        assert_eq!((q8.slab_bytes, q8.slab_stride, q8.waves, q8.wave_slabs), (272, 272, 4, 4));
        // Q6_K's blocks fill whole pieces only eight at a time (1680 bytes): one block a
        // slab, copied from its piece at phases 0, 2, .. 14, so 14 pieces, 15 apart; its
        // half scales take no column start.
        assert_eq!(gemv_mma(GgmlType::Q6_K, 128_256, 4096, 8, &sm90, &all), None, "half scales: asked for");
        let halves = Options { gemv_mma_half_scales: Some(true), ..all.clone() };
        let head = gemv_mma(GgmlType::Q6_K, 128_256, 4096, 8, &sm90, &halves).expect("an 8B output head");
        assert_eq!((head.slab_bytes, head.slab_stride, head.zero_start), (210, 240, false));
        assert_eq!((mma_slab_pieces(210), mma_slab_pieces(144), mma_slab_pieces(272)), (14, 9, 17));
        // Its 2004 panels: blocks as many as the units hold at once, past four a unit.
        let resident = mma_resident(&head, GgmlType::Q6_K, 8, &sm90);
        assert!(resident > GEMV_MMA_BLOCKS_PER_CU, "{resident} blocks a unit");
        assert_eq!(mma_blocks(&head, GgmlType::Q6_K, 128_256, 8, &sm90), 132 * resident);
        assert_eq!(mma_blocks(&t, GgmlType::Q4_0, 4096, 8, &sm90), 256 / t.wave_groups, "a block a panel");
        let default = Options::default();
        assert!(gemv_mma(GgmlType::Q4_0, 4096, 14_336, GEMV_MMA_FROM, &sm90, &default).is_some(), "windows by default");
        assert_eq!(
            gemv_mma(GgmlType::Q4_0, 4096, 14_336, GEMV_MMA_FROM - 1, &sm90, &default),
            None,
            "narrower: int8 dot"
        );
        assert_eq!(gemv_mma(GgmlType::Q4_0, 4096, 14_336, 1, &sm90, &default), None, "one column: int8 dot");
        let none = Options { gemv_mma_from: None, ..Options::default() };
        assert_eq!(gemv_mma(GgmlType::Q4_0, 4096, 14_336, 8, &sm90, &none), None, "asked for none");
        assert!(
            gemv_mma(GgmlType::Q4_0, 4096, 14_336, BATCH_GEMV_COLUMNS, &sm90, &all).is_some(),
            "a batch's four tiles"
        );
        assert_eq!(
            gemv_mma(GgmlType::Q4_0, 4096, 14_336, BATCH_GEMV_COLUMNS + 1, &sm90, &all),
            None,
            "four tiles at most"
        );
        assert_eq!(gemv_mma(GgmlType::IQ2_XS, 4096, 14_336, 8, &sm90, &all), None, "no fragment decoder");
        assert_eq!(gemv_mma(GgmlType::Q4_0, 4096, 14_336, 8, &gfx1100, &all), None, "WMMA, not mma.sync");
        assert_eq!(gemv_mma(GgmlType::Q8_0, 49_152, 576, 1, &sm90, &all), None, "612-byte rows");
        assert_eq!(gemv_mma(GgmlType::Q4_0, 4096, 0, 8, &sm90, &all), None, "no columns");
        let never = Options { int8: Int8Dot::Never, gemv_mma_from: Some(1), ..Options::default() };
        assert_eq!(gemv_mma(GgmlType::Q4_0, 4096, 14_336, 8, &sm90, &never), None);
    }

    #[test]
    fn matrix_unit_gemv_waves_share_inputs_across_groups_within_shared_memory() {
        let sm90 = Target::load("sm_90").expect("known");
        let all = Options { gemv_mma_from: Some(1), ..Options::default() };
        let groups = |rows, cols, options: &Options| {
            gemv_mma(GgmlType::Q4_0, rows, cols, 8, &sm90, options).expect("an 8B product").wave_groups
        };
        assert_eq!(groups(14_336, 4096, &all), GEMV_MMA_STAGED_GROUPS, "224 panels of 64 rows, staged");
        let batch =
            |rows, cols| gemv_mma(GgmlType::Q4_0, rows, cols, BATCH_GEMV_COLUMNS, &sm90, &all).expect("a batch's");
        assert_eq!(batch(14_336, 4096).wave_groups, BATCH_GEMV_GROUPS, "224 panels of 64 rows, not staged");
        assert!(!batch(14_336, 4096).staged_inputs);
        assert_eq!(batch(4096, 14_336).wave_groups, GEMV_MMA_GROUPS, "64 panels of 64 rows would leave SMs idle");
        // A batch's four tiles of sums need more registers than 512 lanes a block can have.
        for (rows, cols) in [(14_336, 4096), (4096, 14_336), (4096, 4096), (1024, 4096)] {
            assert!(batch(rows, cols).waves <= BATCH_GEMV_MAX_SPLITS, "{rows}x{cols}");
        }
        assert_eq!(groups(4096, 4096, &all), 2, "128 panels of 32 rows for 132 SMs; 64 of 64 too few");
        assert_eq!(groups(1024, 4096, &all), 1, "32 panels of 32 would leave most SMs idle");
        let two = Options { gemv_mma_groups: Some(2), ..all.clone() };
        assert_eq!(groups(4096, 14_336, &two), 2, "the option sets it");
        let t = gemv_mma(GgmlType::Q4_0, 14_336, 4096, 8, &sm90, &two).expect("an 8B gate");
        // 448 panels of 32 rows: the split is that of 16-row groups at the same waves a
        // compute unit, so each wave's loads are in flight for twice the rows.
        assert_eq!((t.waves, t.wave_slabs), (4, 4));
        let many = Options { gemv_mma_groups: Some(128), ..all.clone() };
        assert_eq!(groups(1024, 4096, &many), 64, "no more than the matrix has");
        // Four groups of 4096 rows: 64 panels want 16 splits, whose stages would not fit
        // shared memory; fewer, longer splits do, at every window.
        let four = Options { gemv_mma_groups: Some(4), ..all.clone() };
        let t = gemv_mma(GgmlType::Q4_0, 4096, 14_336, 16, &sm90, &four).expect("fits");
        assert!(t.waves < GEMV_MMA_MAX_SPLITS);
        let limit = sm90.device.shared_limit(true);
        for window in [1, 8, 16] {
            assert!(crate::ops::gemv::mma_shared_bytes(&t, GgmlType::Q4_0, window, 32) <= limit, "{window} columns");
        }
    }

    #[test]
    fn verify_windows_stage_their_inputs_counted_in_shared_memory() {
        let sm90 = Target::load("sm_90").expect("known");
        let default = Options::default();
        let staged = |window| gemv_mma(GgmlType::Q4_0, 14_336, 4096, window, &sm90, &default).map(|t| t.staged_inputs);
        assert_eq!(staged(GEMV_MMA_STAGED_UP_TO), Some(true), "a verify window's");
        assert_eq!(staged(BATCH_GEMV_COLUMNS), Some(false), "a batch's");
        let asked = |on| Options { gemv_mma_staged: Some(on), gemv_mma_groups: Some(2), ..Options::default() };
        let plain = gemv_mma(GgmlType::Q4_0, 14_336, 4096, 8, &sm90, &asked(false)).expect("an 8B gate");
        let t = gemv_mma(GgmlType::Q4_0, 14_336, 4096, 8, &sm90, &asked(true)).expect("an 8B gate, staged");
        assert!(!plain.staged_inputs && t.staged_inputs);
        // Per stage: 32 rows of 144 bytes, then 8 columns of 8 chunks' quants (256 bytes
        // and 16 of padding) and of their scale pairs (64 and 16).
        let stages = 4 * 2;
        assert_eq!(
            crate::ops::gemv::mma_shared_bytes(&t, GgmlType::Q4_0, 8, 32)
                - crate::ops::gemv::mma_shared_bytes(&plain, GgmlType::Q4_0, 8, 32),
            stages * 8 * (272 + 80)
        );
        let limit = sm90.device.shared_limit(true);
        for (rows, cols) in [(4096, 14_336), (1024, 4096), (14_336, 4096)] {
            let t = gemv_mma(GgmlType::Q4_0, rows, cols, 16, &sm90, &default).expect("fits");
            assert!(crate::ops::gemv::mma_shared_bytes(&t, GgmlType::Q4_0, 16, 32) <= limit, "{rows}x{cols}");
        }
    }

    #[test]
    fn one_round_of_blocks_where_another_group_count_gives_it() {
        let sm90 = Target::load("sm_90").expect("known");
        let first = Options { gemv_mma_one_round: Some(false), ..Options::default() };
        let rule = Options::default();
        // Llama-8B's stacked Q·K·V (6144 rows): two groups make 192 blocks of which the
        // H100's 132 compute units hold one each at eight columns; three make 128.
        let (rows, cols) = (6144, 4096);
        let unfitted = gemv_mma(GgmlType::Q4_0, rows, cols, 8, &sm90, &first).expect("matrix unit");
        let fitted = gemv_mma(GgmlType::Q4_0, rows, cols, 8, &sm90, &rule).expect("matrix unit");
        assert_eq!((unfitted.wave_groups, fitted.wave_groups), (2, 3));
        assert!(mma_rounds(&unfitted, GgmlType::Q4_0, rows, &sm90) > 1.0);
        assert!(mma_rounds(&fitted, GgmlType::Q4_0, rows, &sm90) <= 1.0);
        // Every window of the shape takes the same tuning (one summation order).
        for window in [4, 12, 16] {
            assert_eq!(gemv_mma(GgmlType::Q4_0, rows, cols, window, &sm90, &rule), Some(fitted.clone()));
        }
        // A shape whose first choice fits keeps it: the gate's 224 blocks, two an SM.
        let gate = |o: &Options| gemv_mma(GgmlType::Q4_0, 14_336, cols, 8, &sm90, o).expect("matrix unit");
        assert_eq!(gate(&rule), gate(&first));
    }

    #[test]
    fn wide_windows_keep_slabs_within_the_registers() {
        let gfx1100 = Target::load("gfx1100").expect("known");
        // Qwen3-30B-A3B's attention output projection: IQ1_M rows of 4096, 4 chunks a
        // lane when the slab covers the row.
        let lane_chunks = |window| {
            let g = gemv_q8(GgmlType::IQ1_M, 2048, 4096, window, &gfx1100, &Options::default()).expect("int8");
            g.slab_chunks / gfx1100.device.wave_size
        };
        assert_eq!([1, 4, 5, 8, 9, 16].map(lane_chunks), [4, 4, 2, 2, 1, 1]);
    }
}
