//! Emit: renders a plan's kernels into one CUDA or HIP module from the templates.
//!
//! A module is the vendor prelude, the vendor-neutral helpers, the lookup tables and
//! block decoders of the quant types the plan uses, then every kernel. Each kernel's
//! text starts with a `#line 1 "<kernel>.cu"` marker, so a compiler error names the
//! kernel and the line of its own generated source (also written out on its own).
//! Output is a pure, deterministic function of the plan and the dialect.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use handlebars::Handlebars;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::plan::{
    Dim, ExpertInput, Extent, Fault, KernelSpec, MAX_WINDOW, Op, Plan, RopeStyle, RouteLayout, Tuning, rules,
};
use crate::quant::{GgmlType, grids};
use crate::target::{Target, Vendor};

/// The source language of a module: decides the prelude and the compiler mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// CUDA, compiled to PTX.
    Cuda,
    /// HIP, compiled to an AMDGPU code object.
    Hip,
}

impl Dialect {
    /// The dialect a target's own vendor uses.
    pub fn native(target: &Target) -> Dialect {
        match target.vendor {
            Vendor::Nvidia => Dialect::Cuda,
            Vendor::Amd => Dialect::Hip,
        }
    }

    /// Source file extension.
    pub fn extension(self) -> &'static str {
        match self {
            Dialect::Cuda => "cu",
            Dialect::Hip => "hip",
        }
    }
}

/// Every template, compiled into the binary: (registry name, text).
const TEMPLATES: &[(&str, &str)] = &[
    ("types", include_str!("../../templates/types.cuh")),
    ("cuda/prelude", include_str!("../../templates/cuda/prelude.cuh")),
    ("hip/prelude", include_str!("../../templates/hip/prelude.cuh")),
    ("host/prelude", include_str!("../../templates/host/prelude.cuh")),
    ("common", include_str!("../../templates/common.cuh")),
    ("ops/gemv", include_str!("../../templates/ops/gemv.cu.hbs")),
    ("ops/gemv_q8", include_str!("../../templates/ops/gemv_q8.cu.hbs")),
    ("ops/expert_select", include_str!("../../templates/ops/expert_select.cu.hbs")),
    ("ops/quantize_q8", include_str!("../../templates/ops/quantize_q8.cu.hbs")),
    ("ops/rmsnorm", include_str!("../../templates/ops/rmsnorm.cu.hbs")),
    ("ops/add_rmsnorm", include_str!("../../templates/ops/add_rmsnorm.cu.hbs")),
    ("ops/rope_store", include_str!("../../templates/ops/rope_store.cu.hbs")),
    ("ops/silu_mul", include_str!("../../templates/ops/silu_mul.cu.hbs")),
    ("ops/moe_route", include_str!("../../templates/ops/moe_route.cu.hbs")),
    ("ops/moe_sum", include_str!("../../templates/ops/moe_sum.cu.hbs")),
    ("ops/add", include_str!("../../templates/ops/add.cu.hbs")),
    ("ops/embed", include_str!("../../templates/ops/embed.cu.hbs")),
    ("ops/attention", include_str!("../../templates/ops/attention.cu.hbs")),
    ("ops/attention_merge", include_str!("../../templates/ops/attention_merge.cu.hbs")),
    ("ops/qsa_score", include_str!("../../templates/ops/qsa_score.cu.hbs")),
    ("ops/qsa_select", include_str!("../../templates/ops/qsa_select.cu.hbs")),
    ("ops/softmax", include_str!("../../templates/ops/softmax.cu.hbs")),
    ("ops/argmax", include_str!("../../templates/ops/argmax.cu.hbs")),
    ("quant/f32", include_str!("../../templates/quant/f32.cuh")),
    ("quant/f16", include_str!("../../templates/quant/f16.cuh")),
    ("quant/bf16", include_str!("../../templates/quant/bf16.cuh")),
    ("quant/q4_0", include_str!("../../templates/quant/q4_0.cuh")),
    ("quant/q4_1", include_str!("../../templates/quant/q4_1.cuh")),
    ("quant/q5_0", include_str!("../../templates/quant/q5_0.cuh")),
    ("quant/q5_1", include_str!("../../templates/quant/q5_1.cuh")),
    ("quant/q8_0", include_str!("../../templates/quant/q8_0.cuh")),
    ("quant/q2_k", include_str!("../../templates/quant/q2_k.cuh")),
    ("quant/q3_k", include_str!("../../templates/quant/q3_k.cuh")),
    ("quant/q4_k", include_str!("../../templates/quant/q4_k.cuh")),
    ("quant/q5_k", include_str!("../../templates/quant/q5_k.cuh")),
    ("quant/q6_k", include_str!("../../templates/quant/q6_k.cuh")),
    ("quant/iq2_xxs", include_str!("../../templates/quant/iq2_xxs.cuh")),
    ("quant/iq2_xs", include_str!("../../templates/quant/iq2_xs.cuh")),
    ("quant/iq2_s", include_str!("../../templates/quant/iq2_s.cuh")),
    ("quant/iq3_xxs", include_str!("../../templates/quant/iq3_xxs.cuh")),
    ("quant/iq3_s", include_str!("../../templates/quant/iq3_s.cuh")),
    ("quant/iq1_s", include_str!("../../templates/quant/iq1_s.cuh")),
    ("quant/iq1_m", include_str!("../../templates/quant/iq1_m.cuh")),
    ("quant/iq4_nl", include_str!("../../templates/quant/iq4_nl.cuh")),
    ("quant/iq4_xs", include_str!("../../templates/quant/iq4_xs.cuh")),
];

/// A rendered module.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    /// Source language.
    pub dialect: Dialect,
    /// The whole translation unit.
    pub source: String,
    /// Each kernel's own text (what follows its `#line` marker), in plan order.
    pub kernels: Vec<KernelSource>,
}

/// One kernel's generated source.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSource {
    /// Kernel name.
    pub name: String,
    /// Its text.
    pub text: String,
    /// SHA-256 of the text, hex.
    pub hash: String,
}

/// A template failed to render (a bug in strata: plan and template disagree).
#[derive(Debug, thiserror::Error)]
#[error("rendering {what}: {message}")]
pub struct EmitError {
    /// Kernel or section being rendered.
    pub what: String,
    /// The template engine's message.
    pub message: String,
}

fn registry() -> Handlebars<'static> {
    let mut h = Handlebars::new();
    h.set_strict_mode(true);
    h.register_escape_fn(handlebars::no_escape);
    for (name, text) in TEMPLATES {
        // The templates are part of the binary and covered by the snapshot tests; a
        // syntax error is caught there, and rendering reports the missing template.
        let _ = h.register_template_string(name, *text);
    }
    h
}

/// Renders `plan` (made for `target`) in `dialect`. The dialect is normally the
/// target's own; rendering a wave32 AMD target in CUDA is cross-vendor execution.
pub fn emit(plan: &Plan, target: &Target, dialect: Dialect) -> Result<Module, EmitError> {
    let h = registry();
    let render = |template: &str, what: &str, ctx: &Value| {
        h.render(template, ctx).map_err(|e| EmitError { what: what.into(), message: e.to_string() })
    };
    let head = json!({
        "target": target.name,
        "arch": target.build.arch,
        "wave_size": target.device.wave_size,
        "checked": plan.options.checked,
        "sdot4": target.features.sdot4,
        "sudot4": target.features.sudot4,
        "grid_dependency": target.features.grid_dependency,
    });
    let prelude = match dialect {
        Dialect::Cuda => "cuda/prelude",
        Dialect::Hip => "hip/prelude",
    };
    let mut source = String::new();
    let _ = writeln!(
        source,
        "// Generated by strata-compile {} for {} ({} dialect, {} kernels). Do not edit.",
        env!("CARGO_PKG_VERSION"),
        target.name,
        dialect.extension(),
        plan.kernels.len()
    );
    source.push_str(&render("types", "types", &head)?);
    source.push_str(&render(prelude, "prelude", &head)?);
    source.push_str(&render("common", "common helpers", &head)?);

    let quants: BTreeSet<GgmlType> = plan.kernels.iter().filter_map(|k| quant_of(&k.op)).collect();
    source.push_str(&tables(&quants));
    for q in &quants {
        let name = q.name().to_ascii_lowercase();
        source.push_str(&render(&format!("quant/{name}"), &format!("the {q} decoder"), &head)?);
    }

    let mut kernels = Vec::with_capacity(plan.kernels.len());
    for (id, spec) in plan.kernels.iter().enumerate() {
        let ctx = context(spec, id, target);
        let template = match (&spec.tuning, &spec.op) {
            (Tuning::GemvQ8(_), _) => "gemv_q8",
            (_, Op::ExpertGemv { .. }) => "gemv",
            _ => spec.op.kind(),
        };
        let mut text = render(&format!("ops/{template}"), &spec.name, &ctx)?;
        if plan.options.fault == Some(Fault::Hang(spec.name.clone())) {
            text = plant_hang(&text, &spec.name);
        }
        let _ = write!(source, "\n#line 1 \"{}.{}\"\n", spec.name, dialect.extension());
        source.push_str(&text);
        let hash = hex(&Sha256::digest(text.as_bytes()));
        kernels.push(KernelSource { name: spec.name.clone(), text, hash });
    }
    Ok(Module { dialect, source, kernels })
}

/// The block decoders of `quants` as host C++ (the host prelude), each behind an
/// `extern "C"` entry point: `strata_host_dequant32_<type>(row, chunk, w)` and, for the
/// types with an int8 path, `strata_host_dot32_<type>(row, chunk, q, qsum)` (its lookup
/// grid passed as the GEMV passes it). Tests build it into a shared library and compare
/// the GPU decoders' own code with the CPU reference.
pub fn host_decoders(quants: &BTreeSet<GgmlType>) -> Result<String, EmitError> {
    let h = registry();
    let render = |template: &str, what: &str| {
        h.render(template, &json!({ "checked": false }))
            .map_err(|e| EmitError { what: what.into(), message: e.to_string() })
    };
    let mut source = render("types", "types")?;
    source.push_str(&render("host/prelude", "prelude")?);
    source.push_str(&render("common", "common helpers")?);
    source.push_str(&tables(quants));
    for q in quants {
        let name = q.name().to_ascii_lowercase();
        source.push_str(&render(&format!("quant/{name}"), &format!("the {q} decoder"))?);
        let _ = writeln!(
            source,
            "extern \"C\" void strata_host_dequant32_{name}(const u8* row, u32 chunk, float* w) {{ \
             strata_dequant32_{name}(row, chunk, w); }}"
        );
        if rules::INT8_DOT.contains(q) {
            let table = rules::lookup_table(*q).map_or("0", |(table, _, _)| table);
            let _ = writeln!(
                source,
                "extern \"C\" float strata_host_dot32_{name}(const u8* row, u32 chunk, const i32* q, i32 qsum) {{ \
                 return strata_dot32_{name}(row, chunk, q, qsum, {table}); }}"
            );
        }
    }
    Ok(source)
}

fn quant_of(op: &Op) -> Option<GgmlType> {
    match op {
        Op::Gemv { quant, .. } | Op::Embed { quant, .. } | Op::ExpertGemv { quant, .. } => Some(*quant),
        _ => None,
    }
}

/// The lookup tables the given quant types read, as C arrays from `quant::grids`.
fn tables(quants: &BTreeSet<GgmlType>) -> String {
    use GgmlType as G;
    let mut out = String::from("\n// ---- lookup tables (format facts, from quant::grids) ----\n");
    let has = |ts: &[G]| ts.iter().any(|t| quants.contains(t));
    let u64s = |name: &str, v: &[u64]| {
        let items: Vec<String> = v.iter().map(|x| format!("0x{x:016x}ull")).collect();
        format!("STRATA_TABLE u64 {name}[{}] = {{\n{}\n}};\n", v.len(), wrap(&items, 4))
    };
    let u32s = |name: &str, v: &[u32]| {
        let items: Vec<String> = v.iter().map(|x| format!("0x{x:08x}u")).collect();
        format!("STRATA_TABLE u32 {name}[{}] = {{\n{}\n}};\n", v.len(), wrap(&items, 8))
    };
    if has(&[G::IQ2_XXS]) {
        out += &u64s("strata_iq2xxs_grid", &grids::IQ2XXS_GRID);
    }
    if has(&[G::IQ2_XS]) {
        out += &u64s("strata_iq2xs_grid", &grids::IQ2XS_GRID);
    }
    if has(&[G::IQ2_S]) {
        out += &u64s("strata_iq2s_grid", &grids::IQ2S_GRID);
    }
    if has(&[G::IQ3_XXS]) {
        out += &u32s("strata_iq3xxs_grid", &grids::IQ3XXS_GRID);
    }
    if has(&[G::IQ3_S]) {
        out += &u32s("strata_iq3s_grid", &grids::IQ3S_GRID);
    }
    if has(&[G::IQ1_S, G::IQ1_M]) {
        out += &u64s("strata_iq1s_grid", &grids::IQ1S_GRID);
    }
    if has(&[G::IQ4_NL, G::IQ4_XS]) {
        let items: Vec<String> = crate::quant::IQ4NL_VALUES.iter().map(i8::to_string).collect();
        out += &format!("STRATA_TABLE i8 strata_iq4nl_values[16] = {{{}}};\n", items.join(", "));
    }
    out
}

fn wrap(items: &[String], per_line: usize) -> String {
    items.chunks(per_line).map(|c| format!("    {},", c.join(", "))).collect::<Vec<_>>().join("\n")
}

/// An f32 as a C float literal that reads back to the same value.
fn c_float(v: f32) -> String {
    let s = format!("{v:e}");
    format!("{s}f")
}

/// Elements of a fixed extent (0 for runtime-sized ones).
fn fixed(spec: &KernelSpec, buffer: &str) -> u64 {
    spec.buffers.iter().find(|b| b.name == buffer).map_or(0, |b| if let Extent::Fixed(n) = b.extent { n } else { 0 })
}

/// The template context of one kernel: its record plus values derived from it.
fn context(spec: &KernelSpec, id: usize, target: &Target) -> Value {
    let l = &spec.launch;
    // Each buffer's position in the signature: what `--checked` kernels record.
    let buf: serde_json::Map<String, Value> =
        spec.buffers.iter().enumerate().map(|(i, b)| (b.name.clone(), json!(i))).collect();
    let ctx = json!({
        "name": spec.name,
        "id": id,
        "buf": buf,
        "threads": l.threads,
        "waves": l.waves,
        "wave_size": l.wave_size,
    });
    let extra = match &spec.op {
        Op::Gemv { quant, rows, cols, window } | Op::ExpertGemv { quant, rows, cols, window, .. }
            if matches!(spec.tuning, Tuning::GemvQ8(_)) =>
        {
            let Tuning::GemvQ8(t) = &spec.tuning else { return ctx };
            let row_bytes = quant.row_bytes(u64::from(*cols)).unwrap_or(0);
            let table = rules::lookup_table(*quant);
            let gemv = json!({
                "quant": quant.name().to_ascii_lowercase(),
                "quant_name": quant.name(),
                "rows": rows, "cols": cols, "window": window, "row_bytes": row_bytes,
                "chunks": cols / 32, "vector_bytes": t.vector_bytes,
                "vector": match t.vector_bytes { 16 => "strata_u4", 8 => "strata_u2", 4 => "u32", _ => "u16" },
                "row_vecs": row_bytes / u64::from(t.vector_bytes),
                "slab_bytes": t.slab_bytes, "slab_vecs": t.slab_bytes / t.vector_bytes, "slab_chunks": t.slab_chunks,
                "slab_stride": t.slab_bytes.next_multiple_of(16),
                "table": table.map(|(name, _, _)| name),
                "table_type": table.map(|(_, bytes, _)| if bytes == 8 { "u64" } else { "u32" }),
                "table_len": table.map(|(_, _, n)| n),
                "slabs": (row_bytes as u32).div_ceil(t.slab_bytes),
                "rows_per_wave": t.rows_per_wave, "groups": rows.div_ceil(t.rows_per_wave),
                "blocks": match l.grid[0] { Dim::Fixed(n) => n, Dim::Runtime { .. } => 0 },
                "loads": t.loads, "chunks_per_lane": t.slab_chunks / target.device.wave_size,
                "xq_len": fixed(spec, "xq"), "xd_len": fixed(spec, "xd"), "y_len": fixed(spec, "y"),
            });
            merge(gemv, experts(spec))
        }
        Op::QuantizeQ8 { cols } => json!({ "cols": cols, "chunks": cols / 32 }),
        Op::Gemv { quant, rows, cols, window } | Op::ExpertGemv { quant, rows, cols, window, .. } => {
            let Tuning::Gemv(t) = &spec.tuning else { return ctx };
            let gemv = json!({
                "quant": quant.name().to_ascii_lowercase(),
                "quant_name": quant.name(),
                "rows": rows, "cols": cols, "window": window,
                "row_bytes": quant.row_bytes(u64::from(*cols)).unwrap_or(0),
                "block_len": quant.block_len(), "block_bytes": quant.block_bytes(),
                "chunks": cols / 32,
                "tile_cols": t.tile_cols, "tile_chunks": t.tile_cols / 32, "chunk_stride": t.chunk_stride,
                "tile_floats": t.tile_cols / 32 * t.chunk_stride,
                "split": t.split, "split_k": t.split > 1, "rows_per_block": t.rows_per_block,
                "lanes": t.split * target.device.wave_size,
                "x_len": fixed(spec, "x"), "y_len": fixed(spec, "y"),
            });
            merge(gemv, experts(spec))
        }
        Op::RmsNorm { n, eps, qk } => json!({
            "n": n, "eps": c_float(*eps), "per_thread": n.div_ceil(l.threads),
            "qk": qk.is_some(), "q_heads": qk.map_or(0, |[q, _]| q), "period": qk.map_or(1, |[q, k]| q + k),
        }),
        Op::AddRmsNorm { n, eps, q8, experts } => {
            json!({ "n": n, "eps": c_float(*eps), "q8": q8, "experts": experts, "per_thread": n.div_ceil(l.threads) })
        }
        Op::RopeStore { style, heads, kv_heads, head_dim, rope_dims, block } => {
            let rope_half = rope_dims / 2;
            let (a, b, pairing) = match style {
                RopeStyle::Normal => ("2u * i".to_owned(), "2u * i + 1u".to_owned(), "adjacent elements (2i, 2i+1)"),
                RopeStyle::Neox => ("i".to_owned(), format!("i + {rope_half}u"), "halves (i, i + d/2)"),
            };
            json!({
                "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "half": head_dim / 2,
                "rope_dims": rope_dims, "rope_half": rope_half, "kv_width": kv_heads * head_dim,
                "pair_a": a, "pair_b": b, "pairing": pairing, "block": block,
            })
        }
        Op::SiluMul { n, q8, paired } => json!({ "n": n, "q8": q8, "paired": paired }),
        Op::MoeRoute { experts, used } => json!({
            "experts": experts, "used": used, "max_window": MAX_WINDOW, "words": experts.div_ceil(32),
            "per_lane": experts.div_ceil(l.wave_size), "capacity": RouteLayout::new(*experts, *used).capacity,
            "route_len": RouteLayout::new(*experts, *used).len(),
        }),
        Op::MoeSum { n, used } => json!({ "n": n, "used": used }),
        Op::Add { n, broadcast } => {
            json!({ "n": n, "broadcast": broadcast, "b_index": if *broadcast { "i" } else { "at" } })
        }
        Op::Embed { quant, cols, vocab } => json!({
            "quant": quant.name().to_ascii_lowercase(), "quant_name": quant.name(),
            "cols": cols, "vocab": vocab, "chunks": cols / 32,
            "row_bytes": quant.row_bytes(u64::from(*cols)).unwrap_or(0),
            "table_len": fixed(spec, "table"),
        }),
        Op::Attention { heads, kv_heads, head_dim, scale, block, sparse } => {
            let Tuning::Attention(t) = &spec.tuning else { return ctx };
            json!({
                "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "block": block, "sparse": sparse,
                "group": heads / kv_heads, "kv_width": kv_heads * head_dim,
                "scale": c_float(*scale), "splits": t.splits, "split_blocks": t.split_blocks,
                "state": head_dim + 2, "max_window": MAX_WINDOW,
                "v_lanes": head_dim / 8, "v_rows": l.wave_size / (head_dim / 8).max(1),
            })
        }
        Op::AttentionMerge { heads, head_dim, q8 } => {
            let Tuning::Attention(t) = &spec.tuning else { return ctx };
            json!({ "heads": heads, "head_dim": head_dim, "splits": t.splits, "state": head_dim + 2, "q8": q8 })
        }
        Op::QsaScore { heads, kv_heads, head_dim, block } => {
            let group = heads / kv_heads;
            let tile = rules::qsa_tokens_per_tile(*heads, *kv_heads);
            let (lanes, per_group) = (rules::qsa_score_lanes(*head_dim), rules::QSA_SCORE_BLOCKS_PER_GROUP);
            json!({
                "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "block": block, "group": group,
                "tile_tokens": tile, "tile_queries": tile * group, "max_window": MAX_WINDOW,
                "lanes": lanes, "dims": head_dim / lanes, "chunks": head_dim / lanes / 4,
                "groups": l.threads / lanes, "per_group": per_group, "per_cta": l.threads / lanes * per_group,
            })
        }
        Op::QsaSelect { kv_heads, block } => json!({
            "kv_heads": kv_heads, "block": block, "bins": rules::QSA_SELECT_BINS,
            "max_window": MAX_WINDOW, "staged": l.shared_bytes.saturating_sub(rules::qsa_select_fixed_bytes(l.threads)) / 4,
        }),
        Op::Softmax { n } | Op::Argmax { n } => json!({ "n": n }),
    };
    merge(ctx, extra)
}

/// `a` with `b`'s fields added.
fn merge(mut a: Value, b: Value) -> Value {
    if let (Value::Object(a), Value::Object(b)) = (&mut a, b) {
        a.extend(b);
    }
    a
}

/// A GEMV's weight addressing: for an expert product, the union's routing and the
/// expert's matrix in its pool (see `ops/expert_select`); else the one matrix.
fn experts(spec: &KernelSpec) -> Value {
    let Op::ExpertGemv { quant, rows, cols, used, experts, input, .. } = &spec.op else {
        return json!({ "experts": false, "w_base": "", "w_len": format!("{}ull", fixed(spec, "w")) });
    };
    let matrix_bytes = u64::from(*rows) * quant.row_bytes(u64::from(*cols)).unwrap_or(0);
    let layout = RouteLayout::new(*experts, *used);
    json!({
        "experts": experts, "used": used, "choice_input": *input == ExpertInput::Choice,
        "matrix_bytes": matrix_bytes, "max_window": MAX_WINDOW,
        "pick_base": layout.pick(0, 0), "route_len": layout.len(),
        "w_base": format!("(u64)slot * {matrix_bytes}u + "),
        "w_len": format!("(u64)slots * {matrix_bytes}u"),
    })
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes a kernel spin forever (the `hang` fault): a volatile loop at the top of its
/// body, which the compiler must keep.
fn plant_hang(text: &str, name: &str) -> String {
    let body = text.find(&format!("void {name}(")).and_then(|at| text[at..].find('{').map(|b| at + b + 1));
    match body {
        Some(at) => {
            format!("{}\n    for (volatile u32 strata_spin = 1u; strata_spin;) {{}}{}", &text[..at], &text[at..])
        }
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_floats_read_back_exactly() {
        for v in [1e-5f32, 1e-6, 0.125, 1.0 / 8f32.sqrt(), 100_000.0] {
            let s = c_float(v);
            let back: f32 = s.trim_end_matches('f').parse().expect("a float");
            assert_eq!(back.to_bits(), v.to_bits(), "{s}");
        }
    }

    #[test]
    fn every_template_parses() {
        let mut h = Handlebars::new();
        for (name, text) in TEMPLATES {
            h.register_template_string(name, *text).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
