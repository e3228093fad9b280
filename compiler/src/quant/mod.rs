//! ggml's tensor element types: ids, block geometry and the CPU dequantizers.
//!
//! The dequantizers here are the reference every GPU kernel is tested against, so they
//! are written for clarity and bit-exactness with ggml (same arithmetic, same order of
//! float operations, no fused multiply-adds), not for speed.

mod finite;
mod float;
#[rustfmt::skip]
pub mod grids;
mod iquants;
mod kquants;
mod legacy;
mod random;

pub use finite::{NonFinite, first_non_finite};
pub use iquants::IQ4NL_VALUES;
pub use random::{random_blocks, random_floats};

use std::fmt;

/// One element type of a GGUF tensor, named and numbered exactly as ggml does.
///
/// Every type ggml has assigned an id to is listed, so a pack holding one we cannot
/// compute with still opens (and `inspect` can show it); [`GgmlType::dequantize`]
/// says which ones we can.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// Geometry of one type: ggml's id, name, elements per block and bytes per block.
struct Layout {
    ty: GgmlType,
    id: u32,
    name: &'static str,
    block_len: usize,
    block_bytes: usize,
}

const fn layout(ty: GgmlType, id: u32, name: &'static str, block_len: usize, block_bytes: usize) -> Layout {
    Layout { ty, id, name, block_len, block_bytes }
}

/// Super-block length of the K and IQ families.
pub const QK_K: usize = 256;

use GgmlType as G;

/// ggml's type table (ggml.h `enum ggml_type`, ggml.c `type_traits`). Ids 4, 5, 31-33
/// and 36-38 belonged to removed types and stay unassigned.
const LAYOUTS: [Layout; 32] = [
    layout(G::F32, 0, "F32", 1, 4),
    layout(G::F16, 1, "F16", 1, 2),
    layout(G::Q4_0, 2, "Q4_0", 32, 18),
    layout(G::Q4_1, 3, "Q4_1", 32, 20),
    layout(G::Q5_0, 6, "Q5_0", 32, 22),
    layout(G::Q5_1, 7, "Q5_1", 32, 24),
    layout(G::Q8_0, 8, "Q8_0", 32, 34),
    layout(G::Q8_1, 9, "Q8_1", 32, 36),
    layout(G::Q2_K, 10, "Q2_K", QK_K, 84),
    layout(G::Q3_K, 11, "Q3_K", QK_K, 110),
    layout(G::Q4_K, 12, "Q4_K", QK_K, 144),
    layout(G::Q5_K, 13, "Q5_K", QK_K, 176),
    layout(G::Q6_K, 14, "Q6_K", QK_K, 210),
    layout(G::Q8_K, 15, "Q8_K", QK_K, 292),
    layout(G::IQ2_XXS, 16, "IQ2_XXS", QK_K, 66),
    layout(G::IQ2_XS, 17, "IQ2_XS", QK_K, 74),
    layout(G::IQ3_XXS, 18, "IQ3_XXS", QK_K, 98),
    layout(G::IQ1_S, 19, "IQ1_S", QK_K, 50),
    layout(G::IQ4_NL, 20, "IQ4_NL", 32, 18),
    layout(G::IQ3_S, 21, "IQ3_S", QK_K, 110),
    layout(G::IQ2_S, 22, "IQ2_S", QK_K, 82),
    layout(G::IQ4_XS, 23, "IQ4_XS", QK_K, 136),
    layout(G::I8, 24, "I8", 1, 1),
    layout(G::I16, 25, "I16", 1, 2),
    layout(G::I32, 26, "I32", 1, 4),
    layout(G::I64, 27, "I64", 1, 8),
    layout(G::F64, 28, "F64", 1, 8),
    layout(G::IQ1_M, 29, "IQ1_M", QK_K, 56),
    layout(G::BF16, 30, "BF16", 1, 2),
    layout(G::TQ1_0, 34, "TQ1_0", QK_K, 54),
    layout(G::TQ2_0, 35, "TQ2_0", QK_K, 66),
    layout(G::MXFP4, 39, "MXFP4", 32, 17),
];

/// The types strata dequantizes and generates kernels for, in ggml id order.
pub const SUPPORTED: [GgmlType; 22] = [
    G::F32,
    G::F16,
    G::Q4_0,
    G::Q4_1,
    G::Q5_0,
    G::Q5_1,
    G::Q8_0,
    G::Q2_K,
    G::Q3_K,
    G::Q4_K,
    G::Q5_K,
    G::Q6_K,
    G::IQ2_XXS,
    G::IQ2_XS,
    G::IQ3_XXS,
    G::IQ1_S,
    G::IQ4_NL,
    G::IQ3_S,
    G::IQ2_S,
    G::IQ4_XS,
    G::IQ1_M,
    G::BF16,
];

impl GgmlType {
    fn layout(self) -> &'static Layout {
        // The table is in enum order, which the unit test `table_is_in_enum_order` pins.
        &LAYOUTS[self as usize]
    }

    /// The type with ggml id `id`, if ggml has one.
    pub fn from_id(id: u32) -> Option<Self> {
        LAYOUTS.iter().find(|l| l.id == id).map(|l| l.ty)
    }

    /// The type named `name` as ggml spells it ("Q4_K", "IQ1_M"), case-insensitively.
    pub fn from_name(name: &str) -> Option<Self> {
        LAYOUTS.iter().find(|l| l.name.eq_ignore_ascii_case(name)).map(|l| l.ty)
    }

    /// ggml's numeric id, as stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.layout().id
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        self.layout().name
    }

    /// Elements per block (1 for plain number types).
    pub fn block_len(self) -> usize {
        self.layout().block_len
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.layout().block_bytes
    }

    /// Whether strata can dequantize (and so compute with) this type.
    pub fn is_supported(self) -> bool {
        SUPPORTED.contains(&self)
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let len = self.block_len() as u64;
        n.is_multiple_of(len).then(|| n / len * self.block_bytes() as u64)
    }

    /// Dequantizes whole blocks: `bytes` holds `out.len() / block_len` blocks.
    ///
    /// Results are bit-identical to ggml's `dequantize_row_*` (see the fixture tests).
    pub fn dequantize(self, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
        let (len, size) = (self.block_len(), self.block_bytes());
        if !out.len().is_multiple_of(len) || bytes.len() != out.len() / len * size {
            return Err(QuantError::Length { ty: self, bytes: bytes.len(), values: out.len() });
        }
        match self {
            G::F32 => float::f32s(bytes, out),
            G::F16 => float::f16s(bytes, out),
            G::BF16 => float::bf16s(bytes, out),
            G::Q4_0 => each_block(bytes, out, legacy::q4_0),
            G::Q4_1 => each_block(bytes, out, legacy::q4_1),
            G::Q5_0 => each_block(bytes, out, legacy::q5_0),
            G::Q5_1 => each_block(bytes, out, legacy::q5_1),
            G::Q8_0 => each_block(bytes, out, legacy::q8_0),
            G::Q2_K => each_block(bytes, out, kquants::q2_k),
            G::Q3_K => each_block(bytes, out, kquants::q3_k),
            G::Q4_K => each_block(bytes, out, kquants::q4_k),
            G::Q5_K => each_block(bytes, out, kquants::q5_k),
            G::Q6_K => each_block(bytes, out, kquants::q6_k),
            G::IQ2_XXS => each_block(bytes, out, iquants::iq2_xxs),
            G::IQ2_XS => each_block(bytes, out, iquants::iq2_xs),
            G::IQ2_S => each_block(bytes, out, iquants::iq2_s),
            G::IQ3_XXS => each_block(bytes, out, iquants::iq3_xxs),
            G::IQ3_S => each_block(bytes, out, iquants::iq3_s),
            G::IQ1_S => each_block(bytes, out, iquants::iq1_s),
            G::IQ1_M => each_block(bytes, out, iquants::iq1_m),
            G::IQ4_NL => each_block(bytes, out, iquants::iq4_nl),
            G::IQ4_XS => each_block(bytes, out, iquants::iq4_xs),
            G::Q8_1 | G::Q8_K | G::I8 | G::I16 | G::I32 | G::I64 | G::F64 | G::TQ1_0 | G::TQ2_0 | G::MXFP4 => {
                return Err(QuantError::Unsupported(self));
            }
        }
        Ok(())
    }
}

impl serde::Serialize for GgmlType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for GgmlType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        GgmlType::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown ggml type {name:?}")))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a dequantization could not run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    /// The type has an id in ggml but no dequantizer in strata.
    #[error("type {0} is not supported by strata (supported: {list})", list = supported_list())]
    Unsupported(GgmlType),
    /// Input and output sizes do not describe whole blocks of the same count.
    #[error("{ty}: {bytes} bytes do not hold exactly {values} values")]
    Length {
        /// The type being dequantized.
        ty: GgmlType,
        /// Bytes given.
        bytes: usize,
        /// Values asked for.
        values: usize,
    },
}

/// The supported type names, comma-separated, for error messages.
pub fn supported_list() -> String {
    SUPPORTED.map(GgmlType::name).join(", ")
}

/// Runs a fixed-size block dequantizer over every block.
fn each_block<const BYTES: usize, const LEN: usize>(
    bytes: &[u8],
    out: &mut [f32],
    block: fn(&[u8; BYTES], &mut [f32; LEN]),
) {
    let (blocks, _) = bytes.as_chunks::<BYTES>();
    let (outs, _) = out.as_chunks_mut::<LEN>();
    for (b, o) in blocks.iter().zip(outs) {
        block(b, o);
    }
}

/// Reads the little-endian fp16 at `at` as f32 (exact, subnormals included).
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16_at(b, at)).to_f32()
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_enum_order() {
        for (i, l) in LAYOUTS.iter().enumerate() {
            assert_eq!(l.ty as usize, i, "{}", l.name);
            assert_eq!(GgmlType::from_id(l.id), Some(l.ty));
            assert_eq!(GgmlType::from_name(l.name), Some(l.ty));
            assert_eq!(format!("{:?}", l.ty), l.name);
        }
    }

    #[test]
    fn removed_ids_are_unknown() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 40, 1000] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
    }

    #[test]
    fn lengths_are_checked() {
        let mut out = [0f32; 32];
        assert!(G::Q4_0.dequantize(&[0; 17], &mut out).is_err());
        assert!(G::Q4_0.dequantize(&[0; 18], &mut out[..31]).is_err());
        assert!(G::Q4_0.dequantize(&[0; 18], &mut out).is_ok());
        assert_eq!(G::MXFP4.dequantize(&[0; 17], &mut out), Err(QuantError::Unsupported(G::MXFP4)));
    }

    #[test]
    fn row_bytes() {
        assert_eq!(G::Q4_K.row_bytes(4096), Some(16 * 144));
        assert_eq!(G::Q4_K.row_bytes(576), None);
        assert_eq!(G::F32.row_bytes(3), Some(12));
    }
}
