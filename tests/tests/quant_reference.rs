//! Every dequantizer against the outside reference, bit for bit.
//!
//! The fixtures in `fixtures/quant/` were produced by `scripts/reference/gen_quant_fixtures.py`
//! with the Python `gguf` package: random valid blocks (fp16 scales realistic, zero,
//! large and subnormal) and that package's dequantization of them.

use std::path::PathBuf;

use strata_compiler::quant::{GgmlType, SUPPORTED};

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/quant").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn dequantization_is_bit_exact_with_the_reference() {
    for ty in SUPPORTED {
        let blocks = fixture(&format!("{}.blocks", ty.name()));
        let expected: Vec<f32> = fixture(&format!("{}.f32", ty.name()))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(blocks.len() % ty.block_bytes(), 0, "{ty}");
        assert_eq!(expected.len(), blocks.len() / ty.block_bytes() * ty.block_len(), "{ty}");
        let mut got = vec![f32::NAN; expected.len()];
        ty.dequantize(&blocks, &mut got).expect("supported type");
        let mismatches: Vec<_> = got
            .iter()
            .zip(&expected)
            .enumerate()
            .filter(|(_, (g, e))| g.to_bits() != e.to_bits())
            .take(4)
            .map(|(i, (g, e))| format!("[{i}] (block {}) {g:e} != {e:e}", i / ty.block_len()))
            .collect();
        assert!(mismatches.is_empty(), "{ty}: {}", mismatches.join(", "));
    }
}

#[test]
fn fixtures_cover_subnormal_scales() {
    // The generator gives the first six blocks of every quantized type an fp16
    // subnormal scale; check that the fixtures really hold some, so the test above
    // exercises them.
    let blocks = fixture("Q4_0.blocks");
    let d = u16::from_le_bytes([blocks[0], blocks[1]]);
    assert_eq!(d & 0x7C00, 0, "exponent bits of a subnormal are zero");
    assert_ne!(d & 0x03FF, 0);
    let _ = GgmlType::Q4_0;
}
