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

use crate::digest::sha256_hex;
use crate::plan::{ERROR_BUFFER, Elem, Fault, KernelRecord, MatrixUnit, Plan, rules};
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
    /// C++ for the host CPU, compiled to a shared library (`crate::host`).
    Host,
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
            Dialect::Host => "cc",
        }
    }
}

/// Every template, compiled into the binary: (registry name, text).
const TEMPLATES: &[(&str, &str)] = &[
    ("types", include_str!("../../templates/types.cuh")),
    ("cuda/prelude", include_str!("../../templates/cuda/prelude.cuh")),
    ("hip/prelude", include_str!("../../templates/hip/prelude.cuh")),
    ("host/prelude", include_str!("../../templates/host/prelude.cuh")),
    ("host/x86_64", include_str!("../../templates/host/x86_64.cuh")),
    ("host/x86_64/iq2_xs", include_str!("../../templates/host/x86_64/iq2_xs.cuh")),
    ("host/x86_64/q4_0", include_str!("../../templates/host/x86_64/q4_0.cuh")),
    ("host/aarch64", include_str!("../../templates/host/aarch64.cuh")),
    ("host/ops/gemv", include_str!("../../templates/host/ops/gemv.cc.hbs")),
    ("host/ops/gemm", include_str!("../../templates/host/ops/gemm.cc.hbs")),
    ("host/ops/quantize_q8", include_str!("../../templates/host/ops/quantize_q8.cc.hbs")),
    ("host/ops/attention_prefill", include_str!("../../templates/host/ops/attention_prefill.cc.hbs")),
    ("host/ops/attention", include_str!("../../templates/host/ops/attention.cc.hbs")),
    ("host/ops/attention_merge", include_str!("../../templates/host/ops/attention_merge.cc.hbs")),
    ("host/ops/rope_store", include_str!("../../templates/host/ops/rope_store.cc.hbs")),
    ("host/ops/rmsnorm", include_str!("../../templates/host/ops/rmsnorm.cc.hbs")),
    ("host/ops/add_rmsnorm", include_str!("../../templates/host/ops/add_rmsnorm.cc.hbs")),
    ("host/ops/silu_mul", include_str!("../../templates/host/ops/silu_mul.cc.hbs")),
    ("common", include_str!("../../templates/common.cuh")),
    ("matrix/mma_sync", include_str!("../../templates/matrix/mma_sync.cuh")),
    ("matrix/fma", include_str!("../../templates/matrix/fma.cuh")),
    ("matrix/wmma", include_str!("../../templates/matrix/wmma.cuh")),
    ("matrix/mfma", include_str!("../../templates/matrix/mfma.cuh")),
    ("ops/gemm", include_str!("../../templates/ops/gemm.cu.hbs")),
    ("ops/gemv", include_str!("../../templates/ops/gemv.cu.hbs")),
    ("ops/gemv_q8", include_str!("../../templates/ops/gemv_q8.cu.hbs")),
    ("ops/gemv_mma", include_str!("../../templates/ops/gemv_mma.cu.hbs")),
    ("ops/gemm_q8", include_str!("../../templates/ops/gemm_q8.cu.hbs")),
    ("ops/gemm_stream_k", include_str!("../../templates/ops/gemm_stream_k.cu.hbs")),
    ("ops/expert_select", include_str!("../../templates/ops/expert_select.cu.hbs")),
    ("ops/quantize_q8", include_str!("../../templates/ops/quantize_q8.cu.hbs")),
    ("ops/rmsnorm", include_str!("../../templates/ops/rmsnorm.cu.hbs")),
    ("ops/add_rmsnorm", include_str!("../../templates/ops/add_rmsnorm.cu.hbs")),
    ("ops/rope_store", include_str!("../../templates/ops/rope_store.cu.hbs")),
    ("ops/silu_mul", include_str!("../../templates/ops/silu_mul.cu.hbs")),
    ("ops/moe_route", include_str!("../../templates/ops/moe_route.cu.hbs")),
    ("ops/moe_group", include_str!("../../templates/ops/moe_group.cu.hbs")),
    ("ops/route_choice", include_str!("../../templates/ops/route_choice.cu.hbs")),
    ("ops/moe_sum", include_str!("../../templates/ops/moe_sum.cu.hbs")),
    ("ops/add", include_str!("../../templates/ops/add.cu.hbs")),
    ("ops/embed", include_str!("../../templates/ops/embed.cu.hbs")),
    ("ops/attention", include_str!("../../templates/ops/attention.cu.hbs")),
    ("ops/attention_merge", include_str!("../../templates/ops/attention_merge.cu.hbs")),
    ("ops/attention_prefill", include_str!("../../templates/ops/attention_prefill.cu.hbs")),
    ("ops/attention_prefill_mma", include_str!("../../templates/ops/attention_prefill_mma.cu.hbs")),
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

pub(crate) fn registry() -> Handlebars<'static> {
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
    // The matrix unit, where a kernel uses one: the preludes then define its instruction
    // primitive (`wmma`, `mfma`; the CUDA prelude emulates gfx11's WMMA).
    let unit = plan.kernels.iter().any(|k| k.op.def().uses_matrix_unit(k)).then(|| rules::matrix_unit(target));
    let head = json!({
        "target": target.name,
        "arch": target.build.arch,
        "wave_size": target.device.wave_size,
        "checked": plan.options.checked,
        "sdot4": target.features.sdot4,
        "sudot4": target.features.sudot4,
        "grid_dependency": target.features.grid_dependency,
        "cp_async": target.features.cp_async,
        "wmma": unit == Some(MatrixUnit::Wmma),
        "mfma": unit == Some(MatrixUnit::Mfma),
    });
    let prelude = match dialect {
        Dialect::Cuda => "cuda/prelude",
        Dialect::Hip => "hip/prelude",
        Dialect::Host => {
            return Err(EmitError { what: "module".into(), message: "host modules are rendered by host::emit".into() });
        }
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
    if let Some(unit) = unit {
        let unit = unit.name();
        source.push_str(&render(&format!("matrix/{unit}"), &format!("the {unit} matrix unit"), &head)?);
    }

    let quants: BTreeSet<GgmlType> = plan.kernels.iter().filter_map(|k| k.op.def().weights()).collect();
    source.push_str(&tables(&quants));
    for q in &quants {
        let name = q.name().to_ascii_lowercase();
        source.push_str(&render(&format!("quant/{name}"), &format!("the {q} decoder"), &head)?);
    }

    let mut kernels = Vec::with_capacity(plan.kernels.len());
    for (id, spec) in plan.kernels.iter().enumerate() {
        let ctx = context(spec, id, target);
        let template = spec.op.def().template(spec).unwrap_or(spec.op.kind());
        let mut text = render(&format!("ops/{template}"), &spec.name, &ctx)?;
        if plan.options.fault == Some(Fault::Hang(spec.name.clone())) {
            text = plant_hang(&text, &spec.name);
        }
        let _ = write!(source, "\n#line 1 \"{}.{}\"\n", spec.name, dialect.extension());
        source.push_str(&text);
        let hash = sha256_hex(text.as_bytes());
        kernels.push(KernelSource { name: spec.name.clone(), text, hash });
    }
    Ok(Module { dialect, source, kernels })
}

/// The block decoders of `quants` as host C++ (the host prelude), each behind an
/// `extern "C"` entry point: `strata_host_dequant32_<type>(row, chunk, w)`; for the
/// types with an int8 path, `strata_host_dot32_<type>(row, chunk, q, qsum)` (its lookup
/// grid passed as the GEMV passes it); for those with matrix-unit fragments,
/// `strata_host_frag8_<type>(row, chunk, q, words, terms)` (lane q's lo and hi words, its
/// zero point, and the lo and hi words with it taken out, `strata_frag8_signed`; then d
/// and m). Tests build it into a shared library and compare the GPU decoders' own
/// code with the CPU reference.
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
            // The int8 GEMM's decoder (which may differ from the GEMV's), dotted the same way.
            let decoder = crate::ops::gemm::q8_decoder(*q);
            let _ = writeln!(
                source,
                "extern \"C\" float strata_host_gemm_dot32_{name}(const u8* row, u32 chunk, const i32* q, i32 qsum) {{ \
                 return strata_dot_w32({decoder}(row, chunk, {table}), q, qsum); }}"
            );
        }
        if rules::MMA_FRAGMENTS.contains(q) {
            let _ = writeln!(
                source,
                "extern \"C\" void strata_host_frag8_{name}(const u8* row, u32 chunk, u32 q, u32* words, float* terms) {{ \
                 const strata_frag8 f = strata_frag8_{name}(row, chunk, q), s = strata_frag8_signed(f); \
                 words[0] = f.lo; words[1] = f.hi; words[2] = f.z; words[3] = s.lo; words[4] = s.hi; \
                 terms[0] = f.d; terms[1] = f.m; terms[2] = f.d2; }}"
            );
        }
    }
    Ok(source)
}

/// The lookup tables the given quant types read, as C arrays from `quant::grids`.
pub(crate) fn tables(quants: &BTreeSet<GgmlType>) -> String {
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

/// The template context of one kernel: what every template reads (name, id, buffer
/// positions, threads, the signature made from the record) and the op's own values.
fn context(spec: &KernelRecord, id: usize, target: &Target) -> Value {
    let l = &spec.launch;
    // Each buffer's position in the signature: what `--checked` kernels record.
    let buf: serde_json::Map<String, Value> =
        spec.buffers.iter().enumerate().map(|(i, b)| (b.name.clone(), json!(i))).collect();
    let mut ctx = json!({
        "name": spec.name,
        "id": id,
        "buf": buf,
        "threads": l.threads,
        "waves": l.waves,
        "wave_size": l.wave_size,
        "signature": signature(spec),
    });
    if let (Value::Object(ctx), Value::Object(extra)) = (&mut ctx, spec.op.def().context(spec, target)) {
        ctx.extend(extra);
    }
    ctx
}

/// A kernel's parameter list, from its record: the buffers (`const` unless written,
/// `restrict` unless the op may run in place), then the scalars, then a `--checked`
/// build's error buffer (`STRATA_ERR_PARAM`, empty otherwise).
pub fn signature(spec: &KernelRecord) -> String {
    let restrict = if spec.op.def().in_place() { "" } else { " STRATA_RESTRICT" };
    let mut params: Vec<String> = spec
        .buffers
        .iter()
        .filter(|b| b.name != ERROR_BUFFER)
        .map(|b| {
            let ty = match b.elem {
                Elem::U8 => "u8",
                Elem::F32 => "float",
                Elem::F16 => "u16",
                Elem::I32 => "i32",
            };
            format!("{}{ty}*{restrict} {}", if b.writes { "" } else { "const " }, b.name)
        })
        .collect();
    params.extend(spec.scalars.iter().map(|s| format!("u32 {}", s.name)));
    format!("{} STRATA_ERR_PARAM", params.join(", "))
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
    fn every_template_parses() {
        let mut h = Handlebars::new();
        for (name, text) in TEMPLATES {
            h.register_template_string(name, *text).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
