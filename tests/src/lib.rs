//! Helpers shared by the integration tests in `tests/`: synthetic packs in memory and
//! the location of the real default model.

use std::path::PathBuf;

use strata_compiler::quant::GgmlType;
use strata_compiler::synth::{self, Preset, Tokenizer, Types};

/// A synthetic pack of `preset` with `layers` layers, weights cycling through
/// `weights`, written to memory (byte-level tokenizer, seed 1).
pub fn synthetic_pack(preset: Preset, layers: u32, weights: &[GgmlType]) -> Vec<u8> {
    let mut shape = preset.shape();
    shape.layers = layers;
    let types = Types { weights: weights.to_vec(), embedding: GgmlType::Q8_0, output: GgmlType::Q6_K };
    let planned = synth::plan(&shape, &types, &Tokenizer::byte_level(), "test").expect("valid synthetic spec");
    planned.writer.to_bytes(|i, out| planned.fill(1, i, out))
}

/// The SmolLM2-135M-Instruct Q4_1 pack fetched by `scripts/fetch-model.sh`, if present:
/// `$STRATA_SMOLLM2`, else `${STRATA_CACHE:-~/.cache/strata}/models/...`.
///
/// When `STRATA_REQUIRE_MODELS` is set (CI sets it), a missing file fails the test
/// instead of skipping it.
pub fn smollm2() -> Option<PathBuf> {
    let path = std::env::var_os("STRATA_SMOLLM2").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("STRATA_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/strata"));
        cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("STRATA_REQUIRE_MODELS").is_none(),
        "{} is missing: run scripts/fetch-model.sh",
        path.display()
    );
    eprintln!("skipping: {} not found (run scripts/fetch-model.sh)", path.display());
    None
}
