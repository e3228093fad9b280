//! `gemm`: a quantized matrix times the columns of a prompt chunk (or any window wider
//! than the GEMV's), on the target's matrix unit, by one of two templates as the rules
//! decide: `gemm_q8` ([`rules::gemm_q8`]) multiplies int8 tiles of decoded weights with
//! the input quantized to int8 (`quantize_q8`, as the int8 GEMV reads it) and scales
//! each chunk's integer products into f32; `gemm` ([`rules::gemm`]) multiplies tiles
//! of weights dequantized to f16 with the input converted to f16 (`strata_mma16`,
//! `templates/matrix/<unit>.cuh`). Both stage the raw weight blocks in shared memory a
//! few steps ahead of their decode.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, fixed, fixed_len, launch_dynamic, per, scalar, workspace};
use crate::plan::rules::{self, MAX_TOKENS};
use crate::plan::{Buffer, Dim, Elem, Extent, GemmQ8Tuning, GemmTuning, KernelRecord, Options, Tuning};
use crate::quant::GgmlType;
use crate::target::Target;

/// `y[t][r] = Σ_c W[r][c] · x[t][c]` for `t < tokens` (a runtime count): the product
/// the GEMV computes for a window, for any number of columns.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gemm {
    /// Weight type.
    pub quant: GgmlType,
    /// Output features (weight rows).
    pub rows: u32,
    /// Input features (row length).
    pub cols: u32,
}

/// Shared-memory stages of the f16 tiles: the waves multiply one while the next is stored.
pub const STAGES: u32 = 2;

impl Gemm {
    /// Shared bytes of a tuning for weights of `quant`: the weight and input tiles in
    /// f16, rows padded, in [`STAGES`] buffers, then `raw_stages` super-steps of raw
    /// weight rows ([`Gemm::raw_slot`] bytes each) and, stream-K, the word that tells the
    /// block whether it sums a split tile.
    pub fn shared_bytes(quant: GgmlType, t: &GemmTuning) -> u32 {
        Gemm::word_at(quant, t) + if t.blocks > 0 { 16 } else { 0 }
    }

    /// Where the stream-K word lies in a GEMM's shared memory: after the rest.
    pub fn word_at(quant: GgmlType, t: &GemmTuning) -> u32 {
        STAGES * (t.tile_rows + t.tile_tokens) * (t.tile_k + t.pad) * 2
            + t.raw_stages * t.tile_rows * Gemm::raw_slot(quant, t.raw_k)
    }

    /// Bytes of one row's staged super-step of `raw_k` features: the 16-byte pieces
    /// that cover its blocks wherever they start (16-byte copies keep the phase, so
    /// the blocks keep their alignment).
    pub fn raw_slot(quant: GgmlType, raw_k: u32) -> u32 {
        let span = u64::from(raw_k) / quant.block_len().max(1) as u64 * quant.block_bytes() as u64;
        u32::try_from((span + 15).next_multiple_of(16)).unwrap_or(u32::MAX)
    }

    /// The part of a block's tile one wave multiplies, (rows, tokens): 64 rows by a
    /// wave's width of tokens, so that every matrix unit keeps 64 accumulators a lane
    /// (16x16 tiles hold 256 / wave each), enough reuse of each loaded fragment without
    /// pressing on the registers.
    pub fn wave_tile(wave_size: u32) -> (u32, u32) {
        (64, wave_size)
    }

    /// Shared bytes of an int8 GEMM's tuning, in the template's order: two int8 weight
    /// tiles and their (scale, offset, half scales) per (row, chunk), `x_stages` int8
    /// input tiles and their (scale, sum) per (token, chunk), the raw weights' stages,
    /// the lookup grid and, stream-K, a word that tells the block whether it sums a split
    /// tile (at [`Gemm::q8_word_at`]). Rows are padded by `pad` bytes; every part stays
    /// 16-byte aligned.
    pub fn q8_shared_bytes(quant: GgmlType, t: &GemmQ8Tuning) -> u32 {
        Gemm::q8_word_at(quant, t) + if t.blocks > 0 { 16 } else { 0 }
    }

    /// Where the stream-K word lies in an int8 GEMM's shared memory: after the rest.
    pub fn q8_word_at(quant: GgmlType, t: &GemmQ8Tuning) -> u32 {
        let (stride, chunks) = (t.tile_k + t.pad, t.tile_k / 32);
        STAGES * t.tile_rows * (stride + chunks * 16)
            + t.x_stages * t.tile_tokens * (stride + chunks * 8)
            + t.raw_stages * t.tile_rows * Gemm::raw_slot(quant, t.raw_k)
            + t.table_bytes
    }

    /// Elements of a stream-K GEMM's workspace, (partial tiles, arrival counts): two
    /// partial tiles a block (the tiles its share of super-steps starts and ends in) and
    /// one count a block (a split tile's, kept by the block that starts it).
    pub fn stream_k_workspace(blocks: u32, tile_rows: u32, tile_tokens: u32) -> (u64, u64) {
        (u64::from(blocks) * 2 * u64::from(tile_rows) * u64::from(tile_tokens), u64::from(blocks))
    }
}

impl KernelOp for Gemm {
    fn kernel_name(&self) -> String {
        let Gemm { quant, rows, cols } = self;
        format!("gemm_{}_{rows}x{cols}", quant.name().to_ascii_lowercase())
    }

    fn record(&self, target: &Target, options: &Options) -> Parts {
        let Gemm { quant, rows, cols } = *self;
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(0);
        // One block a tile, or stream-K's blocks and their workspace.
        let grid = |blocks: u32, tile_rows: u32, tile_tokens: u32, buffers: &mut Vec<Buffer>| {
            if blocks == 0 {
                return [Dim::Fixed(rows.div_ceil(tile_rows)), super::blocks_of("tokens", tile_tokens), Dim::Fixed(1)];
            }
            let (part, flags) = Gemm::stream_k_workspace(blocks, tile_rows, tile_tokens);
            buffers.extend([workspace("part", Elem::F32, part), workspace("flags", Elem::I32, flags)]);
            [Dim::Fixed(blocks), Dim::Fixed(1), Dim::Fixed(1)]
        };
        let threads = |waves: u32| waves * target.device.wave_size;
        let w = buffer("w", Elem::U8, fixed_len(u64::from(rows) * row_bytes), false);
        let y = buffer("y", Elem::F32, per("tokens", rows), true);
        let scalars = vec![scalar("tokens", MAX_TOKENS)];
        if let Some(t) = rules::gemm_q8(target, options, quant, rows, cols) {
            let shared = Gemm::q8_shared_bytes(quant, &t);
            let mut buffers = vec![
                w,
                buffer("xq", Elem::U8, per("tokens", cols), false),
                buffer("xd", Elem::F32, per("tokens", cols / 16), false),
                y,
            ];
            let grid = grid(t.blocks, t.tile_rows, t.tile_tokens, &mut buffers);
            return Parts {
                launch: launch_dynamic(target, grid, threads(t.waves), shared),
                tuning: Tuning::GemmQ8(t),
                buffers,
                scalars,
            };
        }
        let t = rules::gemm(target, options, quant, cols);
        let shared = Gemm::shared_bytes(quant, &t);
        let mut buffers = vec![w, buffer("x", Elem::F32, per("tokens", cols), false), y];
        let grid = grid(t.blocks, t.tile_rows, t.tile_tokens, &mut buffers);
        Parts {
            launch: launch_dynamic(target, grid, threads(t.waves), shared),
            tuning: Tuning::Gemm(t),
            buffers,
            scalars,
        }
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let Gemm { quant, rows, cols } = *self;
        let Some(Tiles { rows: tile_rows, tokens: tile_tokens, blocks, inputs }) = check_tiles(k, c, quant, cols)
        else {
            return;
        };
        if ragged_rows(k, quant, cols) {
            c.fail(
                "rows staged at their own phase",
                "yes".into(),
                "a dense GEMM's rows are whole 16-byte pieces".into(),
            );
        }
        match blocks {
            1.. => check_stream_k(k, blocks, tile_rows, tile_tokens, c),
            0 => {
                if c.grid_x().saturating_mul(u64::from(tile_rows)) < u64::from(rows) {
                    c.fail("rows covered by the grid", c.grid_x().to_string(), format!("the matrix has {rows}"));
                }
                let per_block = match &k.launch.grid[1] {
                    Dim::Runtime { arg, per_block, .. } if arg == "tokens" => *per_block,
                    _ => 0,
                };
                if per_block != tile_tokens {
                    let tiles = format!("tiles of {tile_tokens} tokens");
                    c.fail("tokens per block of grid y", per_block.to_string(), tiles);
                }
            }
        }
        check_extents(k, c, inputs.into_iter().chain([("y", rows)]));
        let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(u64::MAX);
        c.extents.push(("w", u64::from(rows).saturating_mul(row_bytes)));
    }

    fn weights(&self) -> Option<GgmlType> {
        Some(self.quant)
    }

    fn tolerance(&self) -> f64 {
        // f16 operands (11-bit significands), f32 accumulation.
        2e-3
    }

    fn context(&self, k: &KernelRecord, target: &Target) -> Value {
        let Gemm { quant, rows, cols } = *self;
        if let Tuning::GemmQ8(t) = &k.tuning {
            return q8_context(k, quant, rows, cols, t);
        }
        let Tuning::Gemm(t) = &k.tuning else { return json!({}) };
        f16_context(k, target, quant, rows, cols, t)
    }

    fn uses_matrix_unit(&self, _k: &KernelRecord) -> bool {
        true
    }

    fn template(&self, k: &KernelRecord) -> Option<&'static str> {
        matches!(k.tuning, Tuning::GemmQ8(_)).then_some("gemm_q8")
    }
}

/// The f16 GEMM template's context (`templates/ops/gemm.cu.hbs`), both GEMM ops'.
pub(super) fn f16_context(
    k: &KernelRecord,
    target: &Target,
    quant: GgmlType,
    rows: u32,
    cols: u32,
    t: &GemmTuning,
) -> Value {
    let threads = k.launch.threads.max(1);
    let (wave_rows, wave_tokens) = Gemm::wave_tile(k.launch.wave_size);
    let w_tasks = t.tile_rows * (t.tile_k / 32);
    let x_vectors = t.tile_tokens * (t.tile_k / 4);
    let raw_slot = Gemm::raw_slot(quant, t.raw_k);
    let raw_tasks = t.tile_rows * (raw_slot / 16);
    let context = json!({
        "quant": quant.name().to_ascii_lowercase(), "quant_name": quant.name(), "unit": t.unit.name(),
        "rows": rows, "cols": cols, "row_bytes": quant.row_bytes(u64::from(cols)).unwrap_or(0),
        "block_len": quant.block_len(), "block_bytes": quant.block_bytes(),
        "tile_rows": t.tile_rows, "tile_tokens": t.tile_tokens, "tile_k": t.tile_k,
        "stride": t.tile_k + t.pad, "w_len": fixed(k, "w"), "steps": cols / t.tile_k.max(32),
        "raw_stages": t.raw_stages, "raw_steps": cols / t.raw_k.max(32), "per_raw": t.raw_k / t.tile_k.max(32),
        "raw_span": u64::from(t.raw_k) / quant.block_len().max(1) as u64 * quant.block_bytes() as u64,
        "raw_slot": raw_slot, "raw_pieces": raw_slot / 16, "raw_tasks": raw_tasks,
        "raw_per_thread": raw_tasks.div_ceil(threads), "raw_ragged": !raw_tasks.is_multiple_of(threads),
        // Background copies all issue at once; copies that are loads and stores two at a
        // time, so that their registers stay few.
        "raw_unroll": if target.features.cp_async { raw_tasks.div_ceil(threads) } else { 2 },
        "chunks_per_step": t.tile_k / 32,
        "wave_rows": wave_rows, "wave_tokens": wave_tokens, "waves_t": (t.tile_tokens / wave_tokens).max(1),
        "wm": wave_rows / 16, "wn": wave_tokens / 16, "k16": t.tile_k / 16, "chunk_vectors": t.tile_k / 4,
        "w_tasks": w_tasks, "w_per_thread": w_tasks.div_ceil(threads), "w_ragged": !w_tasks.is_multiple_of(threads),
        "x_per_thread": x_vectors.div_ceil(threads), "x_vectors": x_vectors,
        "x_ragged": !x_vectors.is_multiple_of(threads), "x_rows": "tokens",
    });
    let acc = wave_rows / 16 * (wave_tokens / 16) * (256 / k.launch.wave_size.max(1));
    super::merge(context, stream_k_context(k, rows, (t.blocks, t.tile_rows), Gemm::word_at(quant, t), acc))
}

/// What [`check_tiles`] found of a GEMM's tuning.
pub(super) struct Tiles {
    /// Tile rows and tokens.
    pub rows: u32,
    pub tokens: u32,
    /// Stream-K blocks (0: a block a tile).
    pub blocks: u32,
    /// The input buffers with their elements a column.
    pub inputs: Vec<(&'static str, u32)>,
}

/// The checks of a GEMM's tuning both GEMM ops share (tiles, stages, shared memory,
/// waves).
pub(super) fn check_tiles(k: &KernelRecord, c: &mut Checker, quant: GgmlType, cols: u32) -> Option<Tiles> {
    let ragged = ragged_rows(k, quant, cols);
    // The parts both paths share: (tile rows, tile tokens, step, raw super-step, waves,
    // wave tile), and the input's buffers with their elements a token.
    let (tiles, inputs) = match &k.tuning {
        Tuning::Gemm(t) => {
            let shared = Gemm::shared_bytes(quant, t);
            if shared != k.launch.shared_bytes || !k.launch.dynamic_shared {
                c.shared(shared, "the weight and input tiles and the raw weights' stages (dynamic)".into());
            }
            if !(t.tile_k + t.pad).is_multiple_of(8) {
                let stride = t.tile_k + t.pad;
                c.fail("the staged row stride", format!("{stride} halves"), "16-byte rows (a multiple of 8)".into());
            }
            if t.raw_stages < 2 {
                c.fail("the raw weights' stages", t.raw_stages.to_string(), "2 at least".into());
            }
            let wave = Gemm::wave_tile(k.launch.wave_size);
            ((t.tile_rows, t.tile_tokens, t.tile_k, t.raw_k, t.waves, wave), vec![("x", cols)])
        }
        Tuning::GemmQ8(t) => {
            let shared = Gemm::q8_shared_bytes(quant, t);
            if shared != k.launch.shared_bytes || !k.launch.dynamic_shared {
                c.shared(shared, "the int8 tiles, their scales, the raw weights' stages and the grid (dynamic)".into());
            }
            let table = rules::lookup_table(quant).map_or(0, |(_, elem, len)| elem * len);
            if t.table_bytes != table {
                c.fail("the staged lookup grid", format!("{} bytes", t.table_bytes), format!("{table} bytes"));
            }
            if !t.pad.is_multiple_of(16) || !t.tile_k.is_multiple_of(64) {
                c.fail(
                    "the int8 tiles' rows",
                    format!("{} features, {} bytes of padding", t.tile_k, t.pad),
                    "whole 64-feature steps in 16-byte rows".into(),
                );
            }
            let row_bytes = quant.row_bytes(u64::from(cols)).unwrap_or(1);
            if !(row_bytes.is_multiple_of(16) || ragged && row_bytes.is_multiple_of(2)) {
                c.fail("the row length", format!("{row_bytes} bytes"), "whole 16-byte pieces".into());
            }
            // A copy issued at step s is waited for at the end of step s + 1: the raw
            // weights must be needed two steps later at the earliest, and the input
            // ring must hold the tile multiplied, the one landed and the one in flight.
            let ahead = (t.raw_stages.saturating_sub(1)) * (t.raw_k / t.tile_k.max(1));
            if ahead < 2 || t.x_stages < 3 {
                c.fail(
                    "the copies in flight",
                    format!("raw weights {ahead} steps ahead, {} input stages", t.x_stages),
                    "raw weights 2 steps ahead at least, 3 input stages".into(),
                );
            }
            if !t.wave_tokens.is_multiple_of(8) || t.wave_tokens == 0 || t.min_blocks == 0 {
                c.fail(
                    "the wave tile and blocks an SM",
                    format!("{} tokens a wave, {} blocks", t.wave_tokens, t.min_blocks),
                    "whole 16x8 tiles, one block at least".into(),
                );
            }
            let wave = (Gemm::wave_tile(k.launch.wave_size).0, t.wave_tokens.max(8));
            ((t.tile_rows, t.tile_tokens, t.tile_k, t.raw_k, t.waves, wave), vec![("xq", cols), ("xd", cols / 16)])
        }
        _ => {
            c.tuning_missing("a GEMM needs its tiles");
            return None;
        }
    };
    let (tile_rows, tile_tokens, tile_k, raw_k, waves, (wave_rows, wave_tokens)) = tiles;
    let whole_blocks = raw_k.is_multiple_of(tile_k.max(1))
        && u64::from(raw_k).is_multiple_of(quant.block_len().max(1) as u64)
        && cols.is_multiple_of(raw_k.max(1));
    if !whole_blocks {
        c.fail(
            "the raw weights' super-steps",
            format!("{raw_k} features"),
            format!("whole {} blocks, whole steps, dividing {cols} columns", quant.name()),
        );
    }
    for (what, n) in [("tile rows", tile_rows), ("tile tokens", tile_tokens)] {
        if n == 0 || !n.is_multiple_of(16) {
            c.fail(what, n.to_string(), "tiles are whole 16x16 matrix-unit tiles".into());
        }
    }
    if tile_k == 0 || !tile_k.is_multiple_of(32) || !cols.is_multiple_of(tile_k) {
        c.fail("the features of a step", tile_k.to_string(), format!("whole 32-chunks dividing the {cols} columns"));
    }
    let tiled = tile_rows.is_multiple_of(wave_rows) && tile_tokens.is_multiple_of(wave_tokens);
    let wanted = (tile_rows / wave_rows) * (tile_tokens / wave_tokens);
    if !tiled || waves != wanted || k.launch.waves != wanted {
        c.fail(
            "waves per block",
            format!("{waves} (launch {})", k.launch.waves),
            format!("{tile_rows}x{tile_tokens} tiles in {wave_rows}x{wave_tokens} per wave"),
        );
    }
    let blocks = match &k.tuning {
        Tuning::GemmQ8(t) => t.blocks,
        Tuning::Gemm(t) => t.blocks,
        _ => 0,
    };
    Some(Tiles { rows: tile_rows, tokens: tile_tokens, blocks, inputs })
}

/// Whether an int8 GEMM's rows are not whole 16-byte pieces, so that the template stages
/// each row's super-step from the 16-byte boundary below it and decodes it at its phase
/// (the grouped expert GEMM's; a dense GEMM's rows are whole pieces).
pub fn ragged_rows(k: &KernelRecord, quant: GgmlType, cols: u32) -> bool {
    matches!(k.tuning, Tuning::GemmQ8(_)) && !quant.row_bytes(u64::from(cols)).unwrap_or(0).is_multiple_of(16)
}

/// Each of `buffers` holds its number of elements a token.
pub(super) fn check_extents<'a>(k: &KernelRecord, c: &mut Checker, buffers: impl Iterator<Item = (&'a str, u32)>) {
    for (name, per_row) in buffers {
        let extent = k.buffers.iter().find(|b| b.name == name).map(|b| &b.extent);
        let ok =
            matches!(extent, Some(Extent::PerArg { arg, per_row: n }) if arg == "tokens" && *n == u64::from(per_row));
        if !ok {
            c.fail(&format!("the extent of {name}"), format!("{extent:?}"), format!("{per_row} elements per token"));
        }
    }
}

/// A stream-K GEMM's grid and workspace: `blocks` blocks along x (they walk every
/// tile, whatever the rows and tokens), and the partial tiles and counts they need.
fn check_stream_k(k: &KernelRecord, blocks: u32, tile_rows: u32, tile_tokens: u32, c: &mut Checker) {
    let grid = [Dim::Fixed(blocks), Dim::Fixed(1), Dim::Fixed(1)];
    if k.launch.grid != grid {
        c.fail("the stream-K grid", format!("{:?}", k.launch.grid), format!("{blocks} blocks along x"));
    }
    let (part, flags) = Gemm::stream_k_workspace(blocks, tile_rows, tile_tokens);
    for (name, elem, n) in [("part", Elem::F32, part), ("flags", Elem::I32, flags)] {
        let ok = k
            .buffers
            .iter()
            .any(|b| b.name == name && b.workspace && b.writes && b.elem == elem && b.extent == Extent::Fixed(n));
        if !ok {
            c.fail(&format!("the workspace {name}"), "missing or another size".into(), format!("{n} {elem:?}s"));
        }
    }
}

/// The int8 decoder (`templates/quant/`) an int8 GEMM of `quant` uses: the GEMV's
/// `strata_decode32_<type>`, but for Q4_0 its signed form, whose weights need no offset
/// term (a multiply-add for every output and chunk).
pub fn q8_decoder(quant: GgmlType) -> String {
    let name = quant.name().to_ascii_lowercase();
    match quant {
        GgmlType::Q4_0 => format!("strata_decode32_signed_{name}"),
        _ => format!("strata_decode32_{name}"),
    }
}

/// What [`q8_decoder`] leaves for the int8 GEMM's scaling, as (offset, halves): whether
/// its offset `b` (times the input chunk's sum) can be nonzero, and whether its two
/// 16-element halves have scales of their own (`s0`, `s1`: two k = 16 products a chunk
/// instead of one k = 32). Never both: `gemm_q8.cu.hbs` keeps the second half's terms where
/// an offset type keeps its offset.
pub fn q8_decoder_terms(quant: GgmlType) -> (bool, bool) {
    use GgmlType::*;
    (matches!(quant, Q4_1 | Q4_K), matches!(quant, Q6_K | IQ1_M | IQ2_XS))
}

/// The int8 template's context (see `templates/ops/gemm_q8.cu.hbs`).
pub(super) fn q8_context(k: &KernelRecord, quant: GgmlType, rows: u32, cols: u32, t: &GemmQ8Tuning) -> Value {
    let threads = k.launch.threads.max(1);
    let (wave_rows, wave_tokens) = (Gemm::wave_tile(k.launch.wave_size).0, t.wave_tokens.max(8));
    let chunks = t.tile_k / 32;
    let w_tasks = t.tile_rows * chunks;
    // A token's copies of a step: its quants in 16-byte pieces, then its (scale, sum)
    // pairs, two chunks a piece.
    let (x_pieces, d_pieces) = (t.tile_k / 16, t.tile_k / 64);
    let x_tasks = t.tile_tokens * (x_pieces + d_pieces);
    let raw_slot = Gemm::raw_slot(quant, t.raw_k);
    let raw_tasks = t.tile_rows * (raw_slot / 16);
    let table = rules::lookup_table(quant);
    let (offset, halves) = q8_decoder_terms(quant);
    let shape = json!({
        "quant": quant.name().to_ascii_lowercase(), "quant_name": quant.name(), "unit": t.unit.name(),
        "rows": rows, "cols": cols, "row_bytes": quant.row_bytes(u64::from(cols)).unwrap_or(0),
        "w_len": fixed(k, "w"), "offset": offset, "halves": halves, "decoder": q8_decoder(quant),
        "block_len": quant.block_len(), "block_bytes": quant.block_bytes(),
        "tile_rows": t.tile_rows, "tile_tokens": t.tile_tokens, "tile_k": t.tile_k, "chunks": chunks,
        "stride": t.tile_k + t.pad, "steps": cols / t.tile_k.max(64), "chunks_per_row": cols / 32,
        "x_rows": "tokens", "ragged_rows": ragged_rows(k, quant, cols),
    });
    let staging = json!({
        "raw_stages": t.raw_stages, "raw_steps": cols / t.raw_k.max(64), "per_raw": t.raw_k / t.tile_k.max(64),
        "raw_span": u64::from(t.raw_k) / quant.block_len().max(1) as u64 * quant.block_bytes() as u64,
        "raw_slot": raw_slot, "raw_pieces": raw_slot / 16, "raw_tasks": raw_tasks,
        "raw_per_thread": raw_tasks.div_ceil(threads), "raw_ragged": !raw_tasks.is_multiple_of(threads),
        "x_stages": t.x_stages, "x_pieces": x_pieces, "d_pieces": d_pieces, "x_tasks": x_tasks,
        "x_per_thread": x_tasks.div_ceil(threads), "x_ragged": !x_tasks.is_multiple_of(threads),
        "w_tasks": w_tasks, "w_per_thread": w_tasks.div_ceil(threads), "w_ragged": !w_tasks.is_multiple_of(threads),
        "wave_rows": wave_rows, "wave_tokens": wave_tokens, "waves_t": (t.tile_tokens / wave_tokens).max(1),
        "wm": wave_rows / 16, "wn": wave_tokens / 8, "min_blocks": t.min_blocks,
        "table": table.map(|(name, _, _)| name),
        "table_type": table.map(|(_, bytes, _)| if bytes == 8 { "u64" } else { "u32" }),
        "table_len": table.map(|(_, _, n)| n),
    });
    let acc = wave_rows / 16 * (wave_tokens / 8) * 4;
    let stream_k = stream_k_context(k, rows, (t.blocks, t.tile_rows), Gemm::q8_word_at(quant, t), acc);
    super::merge(super::merge(shape, staging), stream_k)
}

/// The context of both templates' driver (`templates/ops/gemm_stream_k.cu.hbs`): stream-K
/// where `blocks` > 0, each thread's `acc` accumulators stored in a partial tile.
fn stream_k_context(k: &KernelRecord, rows: u32, (blocks, tile_rows): (u32, u32), word_at: u32, acc: u32) -> Value {
    json!({
        "stream_k": blocks > 0, "blocks": blocks, "row_tiles": rows.div_ceil(tile_rows.max(1)),
        "word_at": word_at, "part_len": fixed(k, "part"), "acc": acc,
        "whole_eighths": rules::STREAM_K_WHOLE_EIGHTHS,
    })
}

#[cfg(test)]
mod tests {
    use super::{Gemm, q8_decoder, q8_decoder_terms};
    use crate::ops::Op;
    use crate::plan::rules::{self, INT8_DOT};
    use crate::plan::{Dim, Extent, Options, Plan, Tuning};
    use crate::quant::GgmlType;
    use crate::target::Target;

    /// Both GEMMs walk the tiles stream-K on NVIDIA, one block an SM, with the workspace
    /// their grid needs; AMD, and `stream_k: false`, keep one block a tile and no
    /// workspace. A record whose workspace does not match its grid fails the check.
    #[test]
    fn stream_k_where_measured_with_its_workspace() {
        for (quant, int8) in [(GgmlType::Q4_0, true), (GgmlType::Q5_0, false)] {
            let op = Op::Gemm(Gemm { quant, rows: 4096, cols: 4096 });
            for (name, stream_k) in [("sm_90", true), ("sm_86", true), ("gfx1100", false), ("gfx90a", false)] {
                let target = Target::load(name).expect("known");
                for options in [Options::default(), Options { stream_k: false, ..Options::default() }] {
                    let k = rules::kernel_with(op.clone(), &target, &options);
                    let (blocks, tile) = match &k.tuning {
                        Tuning::GemmQ8(t) => (t.blocks, (t.tile_rows, t.tile_tokens)),
                        Tuning::Gemm(t) => (t.blocks, (t.tile_rows, t.tile_tokens)),
                        other => panic!("{other:?}"),
                    };
                    assert_eq!(matches!(k.tuning, Tuning::GemmQ8(_)), int8 && stream_k, "{name} {quant}");
                    let want = if stream_k && options.stream_k { target.device.compute_units } else { 0 };
                    assert_eq!(blocks, want, "{name} {quant}");
                    let part = k.buffers.iter().find(|b| b.name == "part");
                    assert_eq!(part.is_some(), want > 0, "{name} {quant}");
                    if want > 0 {
                        assert_eq!(k.launch.grid, [Dim::Fixed(want), Dim::Fixed(1), Dim::Fixed(1)]);
                        let (n, _) = Gemm::stream_k_workspace(want, tile.0, tile.1);
                        assert_eq!(part.map(|b| &b.extent), Some(&Extent::Fixed(n)));
                    }
                }
            }
        }
        let target = Target::load("sm_90").expect("known");
        let mut k = rules::kernel(Op::Gemm(Gemm { quant: GgmlType::Q4_0, rows: 4096, cols: 4096 }), &target);
        let plan = |k| Plan { target: "sm_90".into(), options: Options::default(), kernels: vec![k] };
        assert!(crate::check::check(&plan(k.clone()), &target).is_empty());
        k.buffers.retain(|b| b.name != "flags");
        let errors: Vec<String> = crate::check::check(&plan(k), &target).iter().map(ToString::to_string).collect();
        assert!(errors.iter().any(|e| e.contains("the workspace flags")), "{errors:?}");
    }

    /// The terms the int8 GEMM assumes of each decoder are the ones its source sets: an
    /// offset unless its last word on `c.b` is `c.b = 0.0f`, half scales unless it (or
    /// the decoder it wraps) writes `c.s0 = c.s1`. A wrong guess would drop a term (or
    /// multiply by an unset scale) on the device only.
    #[test]
    fn decoder_terms_are_the_decoders_own() {
        for quant in INT8_DOT {
            let name = quant.name().to_ascii_lowercase();
            let path = format!("{}/../templates/quant/{name}.cuh", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).expect("the type's template");
            let body = |decoder: &str| {
                let start = text.find(&format!("{decoder}(const")).expect("the decoder");
                &text[start..start + text[start..].find("return c;").expect("returns c")]
            };
            let (decoder, own) = (q8_decoder(quant), format!("strata_decode32_{name}"));
            // A wrapper's body after the decoder it calls: its assignments come last.
            let wrapped = if decoder == own { String::new() } else { body(&own).to_string() };
            let all = wrapped + body(&decoder);
            let offset = all.rfind("c.b = ").is_some_and(|at| !all[at..].starts_with("c.b = 0.0f;"));
            assert_eq!(q8_decoder_terms(quant), (offset, !all.contains("c.s0 = c.s1")), "{name}");
            assert!(!offset || all.contains("c.s0 = c.s1"), "{name}: an offset and half scales");
        }
    }
}
