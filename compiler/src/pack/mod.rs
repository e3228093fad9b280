//! Packs: GGUF models as users download them, one file or `NAME-0000k-of-0000N.gguf`
//! shards, opened as one memory-mapped, validated tensor table.

mod error;
mod gguf;
mod value;
mod write;

pub use error::{PackError, PackErrorKind, escaped};
pub use gguf::{DEFAULT_ALIGNMENT, GgufFile, MAX_DIMS, TensorInfo, parse, parse_metadata};
pub use value::{Array, Metadata, Value, ValueType};
pub use write::{Fill, GgufWriter, TensorSpec};

use std::collections::HashMap;
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The bytes of one shard: a read-only file mapping, or a buffer (tests, tiny files).
enum Bytes {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Bytes of a pack that outlive it: a tensor's (or adjacent tensors') bytes in the
/// shard's mapping, which stays mapped while any view is held. The host backend reads
/// weights through these in place instead of copying them.
#[derive(Clone)]
pub struct SharedBytes {
    shard: Arc<Bytes>,
    range: Range<usize>,
}

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.shard[self.range.clone()]
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({:?})", self.range)
    }
}

/// One file of a pack.
struct Shard {
    path: PathBuf,
    bytes: Arc<Bytes>,
    version: u32,
    /// Bytes before the data section: header, metadata and tensor table.
    header_len: usize,
}

/// A validated pack: metadata from the first shard, tensors from all of them, and
/// zero-copy access to each tensor's bytes.
pub struct Pack {
    shards: Vec<Shard>,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for Pack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pack")
            .field("files", &self.paths().collect::<Vec<_>>())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Pack {
    /// Opens the pack at `path`: a single GGUF file, or any shard of a split pack (the
    /// set is opened from its first shard, and every shard must be present).
    pub fn open(path: &Path) -> Result<Pack, PackError> {
        let first = match SplitName::parse(path) {
            Some(name) if name.index != 1 => name.path(1),
            _ => path.to_path_buf(),
        };
        let shard = Shard::open(&first)?;
        let parsed = gguf::parse(&shard.bytes).map_err(|k| k.in_file(&first))?;
        let count = parsed.metadata.u64("split.count").map_err(|k| k.in_file(&first))?.unwrap_or(1);
        if count <= 1 {
            return Self::assemble(vec![(shard, parsed)]);
        }
        let Some(name) = SplitName::parse(&first).filter(|n| u64::from(n.count) == count) else {
            return Err(PackErrorKind::key(
                "split.count",
                format!(
                    "is {count}, but the file name does not end in -00001-of-{count:05}.gguf, so the other shards cannot be found"
                ),
            )
            .in_file(&first));
        };
        let mut parts = vec![(shard, parsed)];
        for index in 2..=name.count {
            let path = name.path(index);
            if !path.exists() {
                let file = path.file_name().map_or_else(|| path.display().to_string(), |f| f.display().to_string());
                return Err(PackErrorKind::Pack(format!(
                    "shard {index} of {} is missing: expected {} beside the first shard",
                    name.count,
                    escaped(&file)
                ))
                .in_file(&first));
            }
            let shard = Shard::open(&path)?;
            let parsed = gguf::parse(&shard.bytes).map_err(|k| k.in_file(&path))?;
            parts.push((shard, parsed));
        }
        Self::assemble(parts)
    }

    /// A single-file pack held in memory (tests, fuzzing); `name` stands in for its path.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Pack, PackError> {
        let parsed = gguf::parse(&bytes).map_err(|k| k.in_file(name))?;
        let shard =
            Shard { path: name.into(), bytes: Arc::new(Bytes::Owned(bytes)), version: parsed.version, header_len: 0 };
        Self::assemble(vec![(shard, parsed)])
    }

    /// Joins parsed shards into one pack, checking that they belong together.
    fn assemble(parts: Vec<(Shard, GgufFile)>) -> Result<Pack, PackError> {
        let count = parts.len();
        let mut tensors = Vec::new();
        let mut metadata = None;
        let mut shards = Vec::with_capacity(count);
        for (index, (mut shard, parsed)) in parts.into_iter().enumerate() {
            let in_file = |k: PackErrorKind| k.in_file(&shard.path);
            if count > 1 {
                let no = parsed.metadata.u64("split.no").map_err(in_file)?;
                let of = parsed.metadata.u64("split.count").map_err(in_file)?;
                if no != Some(index as u64) || of != Some(count as u64) {
                    return Err(in_file(PackErrorKind::Pack(format!(
                        "expected shard {} of {count} (split.no = {index}), found split.no = {}, split.count = {}",
                        index + 1,
                        or_absent(no),
                        or_absent(of)
                    ))));
                }
            }
            tensors.extend(parsed.tensors.into_iter().map(|t| TensorInfo { shard: index, ..t }));
            shard.version = parsed.version;
            shard.header_len = (parsed.data_offset as usize).min(shard.bytes.len());
            metadata.get_or_insert(parsed.metadata);
            shards.push(shard);
        }
        let metadata = metadata.unwrap_or_default();
        let first = shards[0].path.clone();
        gguf::check_names_and_overlaps(&tensors).map_err(|k| k.in_file(&first))?;
        if count > 1 {
            let expected = metadata.u64("split.tensors.count").map_err(|k| k.in_file(&first))?;
            if expected != Some(tensors.len() as u64) {
                return Err(PackErrorKind::key(
                    "split.tensors.count",
                    format!("is {}, but the {count} shards hold {} tensors", or_absent(expected), tensors.len()),
                )
                .in_file(&first));
            }
        }
        let by_name = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Pack { shards, metadata, tensors, by_name })
    }

    /// The files of the pack, first shard first.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// The first file's path, which names the pack in messages.
    pub fn path(&self) -> &Path {
        &self.shards[0].path
    }

    /// GGUF version of the first file.
    pub fn version(&self) -> u32 {
        self.shards[0].version
    }

    /// Total bytes of all files.
    pub fn file_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.bytes.len() as u64).sum()
    }

    /// Metadata of the pack (the first shard's).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Every tensor, in shard and file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor of this pack, without copying.
    pub fn data(&self, tensor: &TensorInfo) -> &[u8] {
        let start = tensor.offset as usize;
        &self.shards[tensor.shard].bytes[start..start + tensor.bytes as usize]
    }

    /// The bytes of `tensors`, which must lie one after another in one shard in this
    /// order, as one view that outlives the pack; `None` where they do not.
    pub fn shared(&self, tensors: &[&TensorInfo]) -> Option<SharedBytes> {
        let first = tensors.first()?;
        let mut end = first.offset;
        for t in tensors {
            if t.shard != first.shard || t.offset != end {
                return None;
            }
            end += t.bytes;
        }
        let shard = Arc::clone(&self.shards[first.shard].bytes);
        Some(SharedBytes { shard, range: first.offset as usize..end as usize })
    }

    /// Identifies the pack's content cheaply: SHA-256 over each file's size, header,
    /// metadata and tensor table (not the tensor data). Artifacts record it, and the
    /// runtime refuses artifacts whose fingerprint differs from the pack's.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for s in &self.shards {
            h.update((s.bytes.len() as u64).to_le_bytes());
            h.update(&s.bytes[..s.header_len]);
        }
        crate::digest::hex(&h.finalize())
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, PackError> {
        self.metadata
            .str("general.architecture")
            .map_err(|k| self.error(k))?
            .ok_or_else(|| self.error(PackErrorKind::key("general.architecture", "missing")))
    }

    /// An error about this pack as a whole, naming its first file.
    pub fn error(&self, kind: PackErrorKind) -> PackError {
        kind.in_file(self.path())
    }
}

/// A key's number, or `absent`: never Rust's `Some(0)` in a message.
fn or_absent(v: Option<u64>) -> String {
    v.map_or_else(|| "absent".into(), |v| v.to_string())
}

/// The GGUF version and metadata of the file at `path`, read even where its tensor
/// table or data is damaged or cut short (for `inspect` beside the error).
pub fn read_metadata(path: &Path) -> Result<(u32, Metadata), PackError> {
    let shard = Shard::open(path)?;
    gguf::parse_metadata(&shard.bytes).map_err(|k| k.in_file(path))
}

impl Shard {
    fn open(path: &Path) -> Result<Shard, PackError> {
        let io = |e: std::io::Error| PackErrorKind::Io(e.to_string()).in_file(path);
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let bytes = Arc::new(if len == 0 {
            Bytes::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is read-only. Packs are treated as immutable while
            // open, as every GGUF engine does; a file truncated underneath would fault,
            // which no safe API can prevent for mapped files.
            Bytes::Map(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        });
        Ok(Shard { path: path.to_path_buf(), bytes, version: 0, header_len: 0 })
    }
}

/// A shard file name `PREFIX-0000k-of-0000N.gguf` taken apart.
#[derive(Debug, PartialEq)]
struct SplitName {
    prefix: String,
    index: u16,
    count: u16,
}

impl SplitName {
    fn parse(path: &Path) -> Option<SplitName> {
        let name = path.to_str()?.strip_suffix(".gguf")?;
        let (rest, count) = name.rsplit_once("-of-")?;
        let (prefix, index) = rest.rsplit_once('-')?;
        let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(index) || !digits(count) {
            return None;
        }
        let (index, count) = (index.parse().ok()?, count.parse().ok()?);
        (1..=count).contains(&index).then(|| SplitName { prefix: prefix.to_owned(), index, count })
    }

    fn path(&self, index: u16) -> PathBuf {
        PathBuf::from(format!("{}-{index:05}-of-{:05}.gguf", self.prefix, self.count))
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn split_names() {
        let n = SplitName::parse(Path::new("/m/Qwen3-30B-00002-of-00003.gguf")).expect("split");
        assert_eq!((n.prefix.as_str(), n.index, n.count), ("/m/Qwen3-30B", 2, 3));
        assert_eq!(n.path(1), PathBuf::from("/m/Qwen3-30B-00001-of-00003.gguf"));
        assert_eq!(SplitName::parse(Path::new("model.gguf")), None);
        assert_eq!(SplitName::parse(Path::new("m-00004-of-00003.gguf")), None);
        assert_eq!(SplitName::parse(Path::new("m-1-of-3.gguf")), None);
    }
}
