//! The GGUF container: a pure parser from bytes to header, metadata and tensor table.
//!
//! Format (gguf.md, versions 2 and 3 are identical for little-endian files):
//! `"GGUF" u32:version u64:n_tensors u64:n_kv`, then `n_kv` entries
//! `string:key u32:type value`, then `n_tensors` infos
//! `string:name u32:n_dims u64[n_dims]:ne u32:type u64:offset`, then padding to
//! `general.alignment` (default 32) and the data section. Strings are `u64:len bytes`;
//! arrays are `u32:element_type u64:count elements`.
//!
//! Every length is checked against what is left of the file before anything is
//! allocated, nesting is bounded, and every read is bounds-checked, so no input can
//! make the parser panic, allocate without bound or loop.

use super::error::PackErrorKind;
use super::value::{Array, Metadata, Value, ValueType};
use crate::quant::GgmlType;

/// `GGUF` read as a little-endian u32.
const MAGIC: [u8; 4] = *b"GGUF";
/// The data section's alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest array nesting accepted (real packs use one level).
const MAX_DEPTH: u32 = 8;
/// Most dimensions a ggml tensor has.
pub const MAX_DIMS: usize = 4;

/// One tensor's entry in the table.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in ggml order: `shape[0]` is the contiguous row length.
    pub shape: Vec<u64>,
    /// Byte offset of the data in its shard file (absolute, data section included).
    pub offset: u64,
    /// Byte size of the data.
    pub bytes: u64,
    /// Index of the shard file holding the data (0 for single-file packs).
    pub shard: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Row length (elements along the contiguous dimension).
    pub fn row_len(&self) -> u64 {
        self.shape[0]
    }

    /// Number of rows (product of the other dimensions).
    pub fn rows(&self) -> u64 {
        self.shape[1..].iter().product()
    }
}

/// A parsed GGUF file.
#[derive(Clone, Debug)]
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    /// Data section alignment.
    pub alignment: u64,
    /// Key-value metadata.
    pub metadata: Metadata,
    /// Tensor table in file order, offsets absolute.
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

/// Parses the header and metadata only: what `inspect` can still show of a file whose
/// tensor table or data is damaged or cut short.
pub fn parse_metadata(bytes: &[u8]) -> Result<(u32, Metadata), PackErrorKind> {
    let mut c = Cursor { buf: bytes, pos: 0 };
    let (version, _, metadata) = head(&mut c)?;
    Ok((version, metadata))
}

/// Header and metadata: version, tensor count and the key-value table.
fn head(c: &mut Cursor<'_>) -> Result<(u32, u64, Metadata), PackErrorKind> {
    let magic = c.take(4, &|| "magic".into())?;
    if magic != MAGIC {
        return Err(PackErrorKind::Magic([magic[0], magic[1], magic[2], magic[3]]));
    }
    let version = c.u32(&|| "version".into())?;
    match version {
        2 | 3 => {}
        v if v.swap_bytes() <= 3 => return Err(PackErrorKind::BigEndian),
        v => return Err(PackErrorKind::Version(v)),
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;
    // Smallest metadata entry: 8-byte key length, 4-byte type, 1-byte value.
    c.check_count(n_kv, 13, "metadata count")?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata entry #{i} key"))?;
        let what = || format!("metadata key {key:?}");
        let type_id = c.u32(&what)?;
        let ty = ValueType::from_id(type_id)
            .ok_or_else(|| PackErrorKind::key(&key, format!("unknown value type id {type_id}")))?;
        let value = c.value(ty, 0, &what)?;
        if metadata.insert(key.clone(), value).is_err() {
            return Err(PackErrorKind::key(&key, "appears twice"));
        }
    }
    Ok((version, n_tensors, metadata))
}

/// Parses and validates a whole GGUF file held in `bytes`.
pub fn parse(bytes: &[u8]) -> Result<GgufFile, PackErrorKind> {
    let mut c = Cursor { buf: bytes, pos: 0 };
    let (version, n_tensors, metadata) = head(&mut c)?;

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(v) => {
            return Err(PackErrorKind::key(
                "general.alignment",
                format!("expected a u32 power of two, found {} {}", v.value_type().name(), v.display(4)),
            ));
        }
    };

    // Smallest tensor info: 8-byte name length, 4-byte n_dims, one 8-byte dim,
    // 4-byte type, 8-byte offset.
    c.check_count(n_tensors, 32, "tensor count")?;
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        tensors.push(c.tensor_info(i, alignment)?);
    }
    let data_offset = c.pos as u64;
    let data_offset = data_offset.next_multiple_of(alignment);

    let len = bytes.len() as u64;
    if let Some(expected) = tight_end(&tensors, data_offset, alignment).filter(|&end| end > len) {
        return Err(PackErrorKind::TruncatedFile { expected, actual: len });
    }
    for t in &mut tensors {
        let start = data_offset.checked_add(t.offset);
        match start.and_then(|s| s.checked_add(t.bytes)) {
            Some(end) if end <= len => t.offset += data_offset,
            _ => {
                return Err(PackErrorKind::tensor(
                    &t.name,
                    format!(
                        "data at offset {} + {} bytes runs past the end of the file ({len} bytes)",
                        data_offset.saturating_add(t.offset),
                        t.bytes
                    ),
                ));
            }
        }
    }
    check_names_and_overlaps(&tensors)?;
    Ok(GgufFile { version, alignment, metadata, tensors, data_offset })
}

/// Where the data section ends when the tensors lie one after another as writers lay
/// them out (their aligned sizes add up to the span of their offsets); `None` for a
/// table whose offsets are scattered, whose damage is a bad offset rather than a cut.
fn tight_end(tensors: &[TensorInfo], data_offset: u64, alignment: u64) -> Option<u64> {
    let mut end = 0u64;
    let mut sum = 0u64;
    for t in tensors {
        end = end.max(t.offset.checked_add(t.bytes)?);
        sum = sum.checked_add(t.bytes.checked_next_multiple_of(alignment)?)?;
    }
    (end <= sum).then(|| data_offset.checked_add(end)).flatten()
}

/// Refuses duplicate names and tensors whose data ranges overlap.
pub(crate) fn check_names_and_overlaps(tensors: &[TensorInfo]) -> Result<(), PackErrorKind> {
    let mut names = std::collections::HashSet::new();
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            return Err(PackErrorKind::tensor(&t.name, "appears twice in the tensor table"));
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| (t.shard, t.offset));
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.shard == b.shard && a.offset + a.bytes > b.offset {
            return Err(PackErrorKind::tensor(
                &b.name,
                format!("data at offset {} overlaps {} (offset {}, {} bytes)", b.offset, a.name, a.offset, a.bytes),
            ));
        }
    }
    Ok(())
}

/// A bounds-checked reader over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

type What<'w> = &'w dyn Fn() -> String;

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: What<'_>) -> Result<&'a [u8], PackErrorKind> {
        if n > self.left() {
            return Err(PackErrorKind::Truncated {
                what: what(),
                at: self.pos as u64,
                need: n,
                len: self.buf.len() as u64,
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: What<'_>) -> Result<[u8; N], PackErrorKind> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: What<'_>) -> Result<u32, PackErrorKind> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: What<'_>) -> Result<u64, PackErrorKind> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Refuses a count whose items, at `min_bytes` each, cannot fit in the rest of the file.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str) -> Result<(), PackErrorKind> {
        if count.saturating_mul(min_bytes) > self.left() {
            return Err(PackErrorKind::Count { what: what.to_owned(), count, at: self.pos as u64, left: self.left() });
        }
        Ok(())
    }

    fn string(&mut self, what: What<'_>) -> Result<String, PackErrorKind> {
        let len = self.u64(&|| format!("{} (string length)", what()))?;
        let at = self.pos;
        let bytes = self.take(len, &|| format!("{} (string of {len} bytes)", what()))?;
        String::from_utf8(bytes.to_vec()).map_err(|e| PackErrorKind::Malformed {
            what: format!("{}: string is not UTF-8 ({e})", what()),
            at: at as u64,
        })
    }

    fn value(&mut self, ty: ValueType, depth: u32, what: What<'_>) -> Result<Value, PackErrorKind> {
        use ValueType as T;
        Ok(match ty {
            T::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            T::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            T::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            T::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            T::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            T::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            T::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            T::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            T::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            T::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            T::Bool => Value::Bool(self.bool(what)?),
            T::String => Value::String(self.string(what)?),
            T::Array => Value::Array(self.array_value(depth + 1, what)?),
        })
    }

    fn bool(&mut self, what: What<'_>) -> Result<bool, PackErrorKind> {
        let at = self.pos;
        match self.array::<1>(what)? {
            [0] => Ok(false),
            [1] => Ok(true),
            [b] => Err(PackErrorKind::Malformed {
                what: format!("{}: bool byte {b} is neither 0 nor 1", what()),
                at: at as u64,
            }),
        }
    }

    fn array_value(&mut self, depth: u32, what: What<'_>) -> Result<Array, PackErrorKind> {
        if depth > MAX_DEPTH {
            return Err(PackErrorKind::Malformed {
                what: format!("{}: arrays nested deeper than {MAX_DEPTH} levels", what()),
                at: self.pos as u64,
            });
        }
        let type_id = self.u32(&|| format!("{} (array element type)", what()))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| PackErrorKind::Malformed {
            what: format!("{}: array of unknown value type id {type_id}", what()),
            at: self.pos as u64 - 4,
        })?;
        let count = self.u64(&|| format!("{} (array length)", what()))?;
        self.check_count(count, ty.min_bytes(), &format!("{} (array length)", what()))?;
        let n = count as usize;

        macro_rules! numbers {
            ($variant:ident, $t:ty) => {{
                let size = std::mem::size_of::<$t>();
                let bytes = self.take(count * size as u64, what)?;
                Array::$variant(
                    bytes.chunks_exact(size).map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default())).collect(),
                )
            }};
        }
        use ValueType as T;
        Ok(match ty {
            T::U8 => Array::U8(self.take(count, what)?.to_vec()),
            T::I8 => numbers!(I8, i8),
            T::U16 => numbers!(U16, u16),
            T::I16 => numbers!(I16, i16),
            T::U32 => numbers!(U32, u32),
            T::I32 => numbers!(I32, i32),
            T::U64 => numbers!(U64, u64),
            T::I64 => numbers!(I64, i64),
            T::F32 => numbers!(F32, f32),
            T::F64 => numbers!(F64, f64),
            T::Bool => Array::Bool((0..n).map(|_| self.bool(what)).collect::<Result<_, _>>()?),
            T::String => Array::String((0..n).map(|_| self.string(what)).collect::<Result<_, _>>()?),
            T::Array => Array::Array((0..n).map(|_| self.array_value(depth + 1, what)).collect::<Result<_, _>>()?),
        })
    }

    fn tensor_info(&mut self, i: u64, alignment: u64) -> Result<TensorInfo, PackErrorKind> {
        let name = self.string(&|| format!("tensor info #{i} name"))?;
        let what = || format!("tensor info {name:?}");
        let n_dims = self.u32(&what)?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(PackErrorKind::tensor(&name, format!("{n_dims} dimensions (expected 1 to {MAX_DIMS})")));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            shape.push(self.u64(&what)?);
        }
        let type_id = self.u32(&what)?;
        let offset = self.u64(&what)?;
        let ty = GgmlType::from_id(type_id)
            .ok_or_else(|| PackErrorKind::tensor(&name, format!("unknown ggml type id {type_id}")))?;
        if let Some(d) = shape.iter().position(|&d| d == 0) {
            return Err(PackErrorKind::tensor(&name, format!("dimension {d} is zero (shape {shape:?})")));
        }
        let elements = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n < 1 << 60)
            .ok_or_else(|| PackErrorKind::tensor(&name, format!("shape {shape:?} is too large")))?;
        let row_bytes = ty.row_bytes(shape[0]).ok_or_else(|| {
            PackErrorKind::tensor(
                &name,
                format!("row length {} is not a multiple of the {ty} block size {}", shape[0], ty.block_len()),
            )
        })?;
        let bytes = row_bytes * (elements / shape[0]);
        if offset % alignment != 0 {
            return Err(PackErrorKind::tensor(
                &name,
                format!("data offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        Ok(TensorInfo { name, ty, shape, offset, bytes, shard: 0 })
    }
}
