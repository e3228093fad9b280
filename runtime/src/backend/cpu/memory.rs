//! A CPU buffer: memory of its own, or a pack's tensors read in place from its file
//! mapping (the CPU backends' weights: no copy, and pages shared with the page cache).

use std::ops::Deref;

use strata_compiler::pack::SharedBytes;

use super::RunError;

/// The bytes behind one buffer of the CPU backends.
pub(crate) enum Memory {
    /// Allocated by the backend: activations, caches, and weights it was given to copy.
    Owned(Vec<u8>),
    /// A view of a pack's mapping, read-only.
    Mapped(SharedBytes),
}

impl Memory {
    /// The bytes, to write; an error for a mapped pack, which no kernel or copy may
    /// change.
    pub(crate) fn bytes_mut(&mut self) -> Result<&mut [u8], RunError> {
        match self {
            Memory::Owned(v) => Ok(v),
            Memory::Mapped(_) => Err(RunError::Other("a write to a pack's weights, which are read in place".into())),
        }
    }
}

impl Deref for Memory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Memory::Owned(v) => v,
            Memory::Mapped(m) => m,
        }
    }
}

/// `bytes` zeros, or an error naming the size where the allocator refuses (`vec![0;
/// n]` would abort the process instead). The pages come zeroed from the system and are
/// committed only as they are touched: a KV cache sized for the whole context costs
/// what the conversation fills.
pub(super) fn zeroed(bytes: usize) -> Result<Vec<u8>, RunError> {
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let refused = || RunError::Other(format!("cannot allocate a {bytes}-byte buffer in host memory"));
    let layout = std::alloc::Layout::array::<u8>(bytes).map_err(|_| refused())?;
    // SAFETY: the layout is not zero-sized; a null return is the allocator's refusal.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(refused());
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `bytes`
    // u8s, which `Vec<u8>` of capacity `bytes` deallocates with; all of it is
    // initialized (zero).
    Ok(unsafe { Vec::from_raw_parts(ptr, bytes, bytes) })
}
