//! `strata-compile inspect`: what a pack holds, for people (text) and tools (JSON).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};

use serde::Serialize;
use serde_json::json;

use crate::model::ModelDesc;
use crate::pack::{Array, Metadata, Pack, Value, escaped};
use crate::quant::GgmlType;

/// Arrays longer than this are summarized as `[N × type]`.
const MAX_ITEMS: usize = 16;

/// A description of one pack.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// The pack's files, first shard first.
    pub files: Vec<String>,
    /// GGUF version.
    pub gguf_version: u32,
    /// Total bytes of all files.
    pub file_bytes: u64,
    /// `general.architecture`, when present.
    pub architecture: Option<String>,
    /// The model description, when the pack is a complete model of a supported family.
    pub model: Option<ModelDesc>,
    /// Why there is no model description.
    pub model_error: Option<String>,
    /// Metadata entries in file order (long arrays summarized).
    pub metadata: Vec<MetaEntry>,
    /// Tensor table in file order.
    pub tensors: Vec<TensorRow>,
    /// Tensor count and bytes per element type, largest first.
    pub bytes_by_type: Vec<TypeBytes>,
}

/// One metadata entry.
#[derive(Clone, Debug, Serialize)]
pub struct MetaEntry {
    /// Key.
    pub key: String,
    /// GGUF value type (`array<string>` for arrays).
    #[serde(rename = "type")]
    pub ty: String,
    /// The value; arrays over 16 elements are `{"len": N}`.
    pub value: serde_json::Value,
}

/// One tensor.
#[derive(Clone, Debug, Serialize)]
pub struct TensorRow {
    /// Name.
    pub name: String,
    /// Element type.
    #[serde(rename = "type")]
    pub ty: String,
    /// Shape in ggml order.
    pub shape: Vec<u64>,
    /// Bytes of data.
    pub bytes: u64,
    /// Shard index (into `files`).
    pub shard: usize,
    /// Byte offset of the data in its shard file.
    pub offset: u64,
}

/// Totals for one element type.
#[derive(Clone, Debug, Serialize)]
pub struct TypeBytes {
    /// Element type.
    #[serde(rename = "type")]
    pub ty: String,
    /// Tensors of this type.
    pub tensors: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Describes `pack`.
pub fn inspect(pack: &Pack) -> Inspection {
    let (model, model_error) = match ModelDesc::from_pack(pack) {
        Ok(m) => (Some(m), None),
        Err(e) => (None, Some(e.kind.to_string())),
    };
    let mut by_type: BTreeMap<GgmlType, (usize, u64)> = BTreeMap::new();
    for t in pack.tensors() {
        let entry = by_type.entry(t.ty).or_default();
        entry.0 += 1;
        entry.1 += t.bytes;
    }
    let mut bytes_by_type: Vec<TypeBytes> =
        by_type.into_iter().map(|(ty, (tensors, bytes))| TypeBytes { ty: ty.name().into(), tensors, bytes }).collect();
    bytes_by_type.sort_by_key(|t| std::cmp::Reverse(t.bytes));
    Inspection {
        files: pack.paths().map(|p| p.display().to_string()).collect(),
        gguf_version: pack.version(),
        file_bytes: pack.file_bytes(),
        architecture: pack.architecture().ok().map(str::to_owned),
        model,
        model_error,
        metadata: metadata_entries(pack.metadata()),
        tensors: pack
            .tensors()
            .iter()
            .map(|t| TensorRow {
                name: t.name.clone(),
                ty: t.ty.name().into(),
                shape: t.shape.clone(),
                bytes: t.bytes,
                shard: t.shard,
                offset: t.offset,
            })
            .collect(),
        bytes_by_type,
    }
}

/// The metadata entries of a table, long arrays summarized.
pub fn metadata_entries(metadata: &Metadata) -> Vec<MetaEntry> {
    metadata
        .iter()
        .map(|(key, value)| MetaEntry { key: key.into(), ty: type_name(value), value: to_json(value) })
        .collect()
}

/// What `inspect` shows of a file it cannot open as a pack: the version and metadata
/// read before the damage.
pub fn metadata_text(version: u32, metadata: &Metadata) -> String {
    let mut s = format!("GGUF v{version}, metadata read before the error:\n");
    write_metadata(&mut s, &metadata_entries(metadata));
    s
}

/// The metadata section of the text report; keys escaped so that none forges a line.
fn write_metadata(s: &mut String, entries: &[MetaEntry]) {
    let _ = writeln!(s, "metadata ({} keys):", entries.len());
    for m in entries {
        let value = match &m.value {
            serde_json::Value::Object(o) => format!("[{} items]", o.get("len").cloned().unwrap_or_default()),
            v => {
                let text = v.to_string();
                if text.len() > 100 {
                    format!("{}… ({} chars)", &text[..text.floor_char_boundary(100)], text.len())
                } else {
                    text
                }
            }
        };
        let _ = writeln!(s, "  {:<44} {:<14} {value}", escaped(&m.key), m.ty);
    }
}

fn type_name(value: &Value) -> String {
    match value {
        Value::Array(a) => format!("array<{}>", a.element_type().name()),
        v => v.value_type().name().into(),
    }
}

fn to_json(value: &Value) -> serde_json::Value {
    match value {
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        // Through the shortest decimal of the f32, so 1e-5 prints as 1e-5.
        Value::F32(v) => json!(v.to_string().parse::<f64>().ok()),
        Value::F64(v) => json!(v),
        Value::Array(a) => array_json(a),
        v => v.as_u64().map_or_else(|| json!(v.as_f64()), |u| json!(u)),
    }
}

fn array_json(a: &Array) -> serde_json::Value {
    if a.len() > MAX_ITEMS {
        return json!({ "len": a.len() });
    }
    serde_json::Value::Array((0..a.len()).filter_map(|i| a.get(i)).map(|v| to_json(&v)).collect())
}

impl Inspection {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let files: Vec<_> = self.files.iter().map(|f| escaped(f)).collect();
        let _ = writeln!(s, "pack: {} (GGUF v{}, {})", files.join(" + "), self.gguf_version, bytes(self.file_bytes));
        let _ = writeln!(s, "architecture: {}", self.architecture.as_deref().map_or("(none)".into(), escaped));
        match (&self.model, &self.model_error) {
            (Some(m), _) => {
                let _ = writeln!(s, "model:");
                let _ = writeln!(
                    s,
                    "  layers {}, embedding {}, ffn {}, vocab {}, context {}",
                    m.layers, m.embd, m.ffn, m.vocab, m.context
                );
                let _ = writeln!(
                    s,
                    "  heads {} (kv {}), head dim k/v {}/{}, rope base {} dims {}, rms eps {:e}",
                    m.heads, m.kv_heads, m.head_dim_k, m.head_dim_v, m.rope_base, m.rope_dims, m.rms_eps
                );
                if let Some(x) = m.experts {
                    let _ = writeln!(s, "  experts {} (used {}), expert ffn {}", x.count, x.used, x.ffn);
                }
                let _ = writeln!(s, "  output {}", if m.tied_output { "tied to the embedding" } else { "separate" });
            }
            (None, Some(e)) => {
                let _ = writeln!(s, "model: not runnable: {e}");
            }
            (None, None) => {}
        }
        write_metadata(&mut s, &self.metadata);
        let _ = writeln!(s, "bytes by type:");
        for t in &self.bytes_by_type {
            let _ = writeln!(s, "  {:<8} {:>5} tensors {:>12}", t.ty, t.tensors, bytes(t.bytes));
        }
        let _ = writeln!(s, "tensors ({}):", self.tensors.len());
        let width = self.tensors.iter().map(|t| escaped(&t.name).len()).max().unwrap_or(0);
        for t in &self.tensors {
            let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
            let name = escaped(&t.name);
            let _ = writeln!(s, "  {name:<width$}  {:<8} {:<22} {:>12}", t.ty, shape.join(" × "), bytes(t.bytes));
        }
        s
    }
}

/// `1234567` → `1.18 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.2} {}", UNITS[unit]) }
}

/// Why a tensor cannot be dequantized to a file.
#[derive(Debug, thiserror::Error)]
pub enum DequantError {
    /// No tensor of that name.
    #[error("{}: no tensor named {name:?}", escaped(pack))]
    NoTensor {
        /// The pack.
        pack: String,
        /// The name asked for.
        name: String,
    },
    /// The type has no dequantizer.
    #[error("tensor {name}: {source}")]
    Quant {
        /// The tensor.
        name: String,
        /// Why.
        source: crate::quant::QuantError,
    },
    /// Writing failed.
    #[error("writing: {0}")]
    Io(#[from] io::Error),
}

/// Writes tensor `name` dequantized as little-endian f32, rows in file order; returns
/// the number of values written.
pub fn dequantize_tensor(pack: &Pack, name: &str, out: &mut impl Write) -> Result<u64, DequantError> {
    let t = pack
        .tensor(name)
        .ok_or_else(|| DequantError::NoTensor { pack: pack.path().display().to_string(), name: name.into() })?;
    let data = pack.data(t);
    let row_len = t.row_len() as usize;
    let row_bytes = data.len() / t.rows() as usize;
    let mut values = vec![0f32; row_len];
    let mut buf = Vec::with_capacity(row_len * 4);
    for row in data.chunks_exact(row_bytes) {
        t.ty.dequantize(row, &mut values).map_err(|source| DequantError::Quant { name: name.into(), source })?;
        buf.clear();
        buf.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        out.write_all(&buf)?;
    }
    Ok(t.elements())
}
