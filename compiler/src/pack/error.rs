//! Pack errors: one line each, naming the file, the key or tensor, and what was expected.

use std::path::PathBuf;

/// A pack that cannot be used, and why. File, key and tensor names are printed with
/// control characters escaped: they come from the file, and a name holding a newline
/// must not forge a line of output.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", escaped(&file.display().to_string()))]
pub struct PackError {
    /// The file (shard) at fault.
    pub file: PathBuf,
    /// What is wrong with it.
    pub kind: PackErrorKind,
}

/// What is wrong with a pack file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PackErrorKind {
    /// The file could not be opened or mapped.
    #[error("cannot read: {0}")]
    Io(String),
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic {0:02x?}, expected \"GGUF\"")]
    Magic([u8; 4]),
    /// A GGUF version we do not read.
    #[error("GGUF version {0} is not supported (expected 2 or 3)")]
    Version(u32),
    /// The version field reads as a byte-swapped small number.
    #[error("big-endian GGUF is not supported")]
    BigEndian,
    /// A read ran past the end of the file.
    #[error("{what}: needs {need} bytes at offset {at}, but the file ends at {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where the read started.
        at: u64,
        /// How many bytes it needed.
        need: u64,
        /// File length.
        len: u64,
    },
    /// The tensor table is whole but the data section ends early: a download or copy
    /// cut short.
    #[error("the file is truncated: its tensor table needs {expected} bytes, but the file has {actual}")]
    TruncatedFile {
        /// File size the tensor table implies.
        expected: u64,
        /// Actual file size.
        actual: u64,
    },
    /// A count in the header that the rest of the file cannot hold.
    #[error("{what}: count {count} cannot fit in the {left} bytes left after offset {at}")]
    Count {
        /// What was being counted.
        what: String,
        /// The count found.
        count: u64,
        /// Where it was read.
        at: u64,
        /// Bytes left in the file.
        left: u64,
    },
    /// Bytes that are present but cannot be what the format says is there.
    #[error("{what} at offset {at}")]
    Malformed {
        /// What was wrong.
        what: String,
        /// Where.
        at: u64,
    },
    /// A metadata key with a bad value.
    #[error("key {}: {what}", escaped(key))]
    Key {
        /// The key.
        key: String,
        /// What was expected.
        what: String,
    },
    /// A tensor that is malformed, misplaced, or wrong for the architecture.
    #[error("tensor {}: {what}", escaped(name))]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What was expected.
        what: String,
    },
    /// Anything else about the file as a whole (shard sets, architecture).
    #[error("{0}")]
    Pack(String),
}

/// `s` with control and other non-printing characters (and backslashes) escaped as
/// Rust's `escape_debug` writes them, printable Unicode and quotes kept: how every name
/// read from a file is printed.
pub fn escaped(s: &str) -> std::borrow::Cow<'_, str> {
    let plain = |c: char| c == '"' || c == '\'' || c.escape_debug().len() == 1;
    if s.chars().all(plain) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match plain(c) {
            true => out.push(c),
            false => out.extend(c.escape_debug()),
        }
    }
    out.into()
}

impl PackErrorKind {
    /// Attaches the file name.
    pub fn in_file(self, file: impl Into<PathBuf>) -> PackError {
        PackError { file: file.into(), kind: self }
    }

    pub(crate) fn key(key: &str, what: impl Into<String>) -> Self {
        PackErrorKind::Key { key: key.to_owned(), what: what.into() }
    }

    pub(crate) fn tensor(name: &str, what: impl Into<String>) -> Self {
        PackErrorKind::Tensor { name: name.to_owned(), what: what.into() }
    }
}
