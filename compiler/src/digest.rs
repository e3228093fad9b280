//! Content hashes as lower-case hex: kernel sources, binaries, build keys and pack
//! fingerprints are all compared as SHA-256 strings.

use sha2::{Digest, Sha256};

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}
