//! A GGUF (version 3) writer, single file or split shards, for synthetic packs and tests.
//!
//! Tensor data is produced by a fill callback straight into the memory-mapped output,
//! in parallel across tensors, so multi-gigabyte benchmark packs are written at memory
//! speed without holding them twice.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::gguf::DEFAULT_ALIGNMENT;
use super::value::{Array, Value};
use crate::quant::GgmlType;

/// A tensor to be written: its table entry, before offsets are known.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in ggml order (`shape[0]` is the row length).
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// Bytes of the tensor's data.
    pub fn bytes(&self) -> Option<u64> {
        let rows: u64 = self.shape[1..].iter().product();
        self.ty.row_bytes(self.shape[0]).map(|r| r * rows)
    }
}

/// Builds one GGUF file (or a set of shards) from metadata and tensor specs.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorSpec>,
}

/// Fills tensor `index`'s data (in the writer's tensor order) into the given bytes.
pub trait Fill: Fn(usize, &mut [u8]) + Sync {}
impl<F: Fn(usize, &mut [u8]) + Sync> Fill for F {}

impl GgufWriter {
    /// An empty file description.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a metadata entry (entries keep their first position).
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// Adds a tensor. Its row length must be a whole number of blocks of its type.
    pub fn tensor(&mut self, name: &str, ty: GgmlType, shape: &[u64]) -> io::Result<&mut Self> {
        let spec = TensorSpec { name: name.to_owned(), ty, shape: shape.to_vec() };
        if shape.is_empty() || shape.len() > 4 || spec.bytes().is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tensor {name}: shape {shape:?} is not whole {ty} blocks of 1 to 4 dimensions"),
            ));
        }
        self.tensors.push(spec);
        Ok(self)
    }

    /// Keeps only the tensors for which `keep` is true (tests use it to break packs).
    pub fn retain_tensors(&mut self, keep: impl Fn(&TensorSpec) -> bool) -> &mut Self {
        self.tensors.retain(keep);
        self
    }

    /// The tensors added so far, in order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// The whole file in memory (for tests and small packs).
    pub fn to_bytes(&self, fill: impl Fill) -> Vec<u8> {
        let all: Vec<usize> = (0..self.tensors.len()).collect();
        let (header, offsets, total) = self.layout(&self.metadata, &all);
        let mut out = vec![0u8; total as usize];
        out[..header.len()].copy_from_slice(&header);
        fill_tensors(&mut out, &all, &offsets, &self.tensors, &fill);
        out
    }

    /// Writes one file at `path`.
    pub fn write(&self, path: &Path, fill: impl Fill) -> io::Result<()> {
        let all: Vec<usize> = (0..self.tensors.len()).collect();
        self.write_part(path, &self.metadata, &all, &fill)
    }

    /// Writes `shards` files named `BASE-0000k-of-0000N.gguf` the way llama.cpp's
    /// gguf-split does: tensors split in order into near-equal counts, all metadata in
    /// the first shard, and `split.no` / `split.count` / `split.tensors.count` in each.
    /// Returns the shard paths.
    pub fn write_split(&self, base: &Path, shards: usize, fill: impl Fill) -> io::Result<Vec<PathBuf>> {
        let n = self.tensors.len();
        if shards == 0 || shards > n.max(1) || shards > usize::from(u16::MAX) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot split {n} tensors into {shards} shards"),
            ));
        }
        let mut paths = Vec::new();
        for k in 0..shards {
            let part: Vec<usize> = (k * n / shards..(k + 1) * n / shards).collect();
            let mut metadata = if k == 0 { self.metadata.clone() } else { Vec::new() };
            metadata.retain(|(key, _)| !key.starts_with("split."));
            metadata.push(("split.no".into(), Value::U16(k as u16)));
            metadata.push(("split.count".into(), Value::U16(shards as u16)));
            metadata.push(("split.tensors.count".into(), Value::I32(n as i32)));
            let path = PathBuf::from(format!("{}-{:05}-of-{:05}.gguf", base.display(), k + 1, shards));
            self.write_part(&path, &metadata, &part, &fill)?;
            paths.push(path);
        }
        Ok(paths)
    }

    fn write_part(
        &self,
        path: &Path,
        metadata: &[(String, Value)],
        part: &[usize],
        fill: &(dyn Fn(usize, &mut [u8]) + Sync),
    ) -> io::Result<()> {
        let (header, offsets, total) = self.layout(metadata, part);
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        file.set_len(total)?;
        if total == 0 {
            return Ok(());
        }
        let mut map = map_mut(&file)?;
        map[..header.len()].copy_from_slice(&header);
        fill_tensors(&mut map, part, &offsets, &self.tensors, fill);
        map.flush()
    }

    /// Header bytes (padded to the data section), each tensor's absolute offset, and
    /// the total file size.
    fn layout(&self, metadata: &[(String, Value)], part: &[usize]) -> (Vec<u8>, Vec<u64>, u64) {
        let mut relative = Vec::with_capacity(part.len());
        let mut data_len = 0u64;
        for &i in part {
            relative.push(data_len);
            let bytes = self.tensors[i].bytes().unwrap_or(0);
            data_len = (data_len + bytes).next_multiple_of(DEFAULT_ALIGNMENT);
        }
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(part.len() as u64).to_le_bytes());
        h.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            put_string(&mut h, key);
            h.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            put_value(&mut h, value);
        }
        for (&i, &offset) in part.iter().zip(&relative) {
            let t = &self.tensors[i];
            put_string(&mut h, &t.name);
            h.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
        }
        let data_offset = (h.len() as u64).next_multiple_of(DEFAULT_ALIGNMENT);
        h.resize(data_offset as usize, 0);
        let absolute = relative.iter().map(|r| data_offset + r).collect();
        // Every tensor, the last one too, is padded to the alignment, as ggml sizes it.
        (h, absolute, data_offset + data_len)
    }
}

/// Maps the freshly sized output file for writing.
fn map_mut(file: &File) -> io::Result<memmap2::MmapMut> {
    // SAFETY: the file was just created and sized by this process and is not shared;
    // nothing else maps or truncates it while the mapping lives.
    unsafe { memmap2::MmapMut::map_mut(file) }
}

/// Runs `fill` for each tensor of `part` over its slice of `out`, on all cores.
fn fill_tensors(
    out: &mut [u8],
    part: &[usize],
    offsets: &[u64],
    tensors: &[TensorSpec],
    fill: &(dyn Fn(usize, &mut [u8]) + Sync),
) {
    let mut jobs = Vec::with_capacity(part.len());
    let mut rest = out;
    let mut consumed = 0u64;
    for (&i, &offset) in part.iter().zip(offsets) {
        let skip = (offset - consumed) as usize;
        let len = tensors[i].bytes().unwrap_or(0) as usize;
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let (data, tail) = tail.split_at_mut(len);
        rest = tail;
        consumed = offset + len as u64;
        jobs.push((i, data));
    }
    // Largest first, so one big tensor does not finish last on its own.
    jobs.sort_by_key(|(_, data)| std::cmp::Reverse(data.len()));
    let queue = Mutex::new(jobs.into_iter());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let job = queue.lock().map(|mut q| q.next()).ok().flatten();
                    let Some((i, data)) = job else { break };
                    fill(i, data);
                }
            });
        }
    });
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_string(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, array: &Array) {
    out.extend_from_slice(&(array.element_type() as u32).to_le_bytes());
    out.extend_from_slice(&(array.len() as u64).to_le_bytes());
    macro_rules! numbers {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match array {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => numbers!(v),
        Array::U16(v) => numbers!(v),
        Array::I16(v) => numbers!(v),
        Array::U32(v) => numbers!(v),
        Array::I32(v) => numbers!(v),
        Array::U64(v) => numbers!(v),
        Array::I64(v) => numbers!(v),
        Array::F32(v) => numbers!(v),
        Array::F64(v) => numbers!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_string(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
    }
}
