//! Helpers shared by the integration tests in `tests/`: synthetic packs in memory and
//! the location of the real default model.

use std::path::PathBuf;

use strata_compiler::build::Toolchain;
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::{self, Preset, Tokenizer, Types};

/// A synthetic pack of `preset` with `layers` layers, weights cycling through
/// `weights`, written to memory (byte-level tokenizer, seed 1).
pub fn synthetic_pack(preset: Preset, layers: u32, weights: &[GgmlType]) -> Vec<u8> {
    let mut shape = preset.shape();
    shape.layers = layers;
    synthetic_pack_of(&shape, weights)
}

/// A synthetic pack of `shape`, weights cycling through `weights`, written to memory
/// (byte-level tokenizer, seed 1).
pub fn synthetic_pack_of(shape: &synth::Shape, weights: &[GgmlType]) -> Vec<u8> {
    let types = Types { weights: weights.to_vec(), embedding: GgmlType::Q8_0, output: GgmlType::Q6_K };
    let planned = synth::plan(shape, &types, &Tokenizer::byte_level(), "test").expect("valid synthetic spec");
    planned.writer.to_bytes(|i, out| planned.fill(1, i, out))
}

/// A tiny Qwen3-shape pack (random weights) with SmolLM2's tokenizer and `template` as
/// its chat template, written to `path`: for tests of what a template makes of a
/// request, where the text the model writes does not matter. `None` where
/// [`smollm2`] is.
pub fn pack_with_template(path: &std::path::Path, template: &str) -> Option<PathBuf> {
    let pack = strata_compiler::pack::Pack::open(&smollm2()?).expect("the SmolLM2 pack opens");
    let tokenizer = Tokenizer::from_pack(&pack).expect("a tokenizer").with_chat_template(template);
    let shape = synth::Shape { vocab: None, ..Preset::TinyQwen3.shape() };
    let types = Types { weights: vec![GgmlType::Q8_0], embedding: GgmlType::Q8_0, output: GgmlType::Q8_0 };
    synth::write(&shape, &types, &tokenizer, 1, path, 1).expect("written");
    Some(path.to_owned())
}

/// The SmolLM2-135M-Instruct Q4_1 pack fetched by `scripts/fetch-model.sh`, if present:
/// `$STRATA_SMOLLM2`, else `${STRATA_CACHE:-~/.cache/strata}/models/...`.
///
/// When `STRATA_REQUIRE` is set (`scripts/test.sh`, and so CI, sets it), a missing file
/// fails the test instead of skipping it.
pub fn smollm2() -> Option<PathBuf> {
    cached_model("STRATA_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/fetch-model.sh")
}

/// The Gemma 3 test pack (Gemma 3 270M Q4_K_M): `STRATA_GEMMA3`, else the cache where
/// `scripts/fetch-gemma3.sh` puts it; as [`smollm2`], `None` skips unless `STRATA_REQUIRE`.
pub fn gemma3() -> Option<PathBuf> {
    cached_model("STRATA_GEMMA3", "gemma-3-270m-q4_k_m.gguf", "scripts/fetch-gemma3.sh")
}

fn cached_model(var: &str, file: &str, fetch: &str) -> Option<PathBuf> {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("STRATA_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/strata"));
        cache.join("models").join(file)
    });
    if path.exists() {
        return Some(path);
    }
    assert!(std::env::var_os("STRATA_REQUIRE").is_none(), "{} is missing: run {fetch}", path.display());
    eprintln!("skipping: {} not found (run {fetch})", path.display());
    None
}

/// clang 19+ (and llvm-readelf), found as `strata-compile` finds them; `None` skips the
/// test locally, and fails it when `STRATA_REQUIRE` is set.
pub fn toolchain() -> Option<Toolchain> {
    match Toolchain::discover() {
        Ok(t) if t.readelf.is_some() => Some(t),
        other => {
            assert!(
                std::env::var_os("STRATA_REQUIRE").is_none(),
                "clang-19, lld-19 and llvm-19 are needed: run scripts/setup.sh ({other:?})"
            );
            eprintln!("skipping: no clang 19+ with llvm-readelf (run scripts/setup.sh)");
            None
        }
    }
}

/// The `strata-run` arguments of the backend that tests of behaviour (the CLI, the
/// server) run on: the host backend, one worker so that tests running side by side do
/// not share cores, where this CPU has a host target and clang 19+ is here; else the CPU
/// reference, which is about ten times slower (a test of the reference itself names
/// `cpu`).
pub fn behaviour_backend() -> &'static [&'static str] {
    let host = strata_compiler::host::HostTarget::detect().is_some() && toolchain().is_some();
    if host { &["--backend", "host", "--threads", "1"] } else { &["--backend", "cpu"] }
}

/// Three small synthetic packs that together hold every supported quant type, in every
/// kernel role (linear, expert, embedding, output) and every family's forward pass but
/// qwen2's, written to `dir`.
pub fn every_type_packs(dir: &std::path::Path) -> Vec<PathBuf> {
    use GgmlType as G;
    // The types mix-a does not hold.
    let rest = [
        G::Q5_0,
        G::Q5_1,
        G::Q2_K,
        G::Q3_K,
        G::Q5_K,
        G::IQ2_XXS,
        G::IQ2_S,
        G::IQ1_S,
        G::IQ4_NL,
        G::IQ4_XS,
        G::F16,
        G::BF16,
        G::F32,
    ];
    let specs = [
        (
            Preset::TinyLlama,
            "mix-a",
            vec![G::IQ1_M, G::IQ2_XS, G::IQ3_XXS, G::IQ3_S, G::Q4_0, G::Q4_1, G::Q8_0, G::Q4_K, G::Q6_K],
            G::Q8_0,
        ),
        (Preset::TinyQwen3Moe, "mix-b", rest.to_vec(), G::Q4_K),
        // mix-b's types again as dense products (GEMMs too), in Gemma 3's forward pass.
        (Preset::TinyGemma3, "mix-c", rest.to_vec(), G::Q8_0),
    ];
    specs
        .into_iter()
        .map(|(preset, name, weights, embedding)| {
            let path = dir.join(format!("{name}.gguf"));
            let types = Types { weights, embedding, output: GgmlType::Q6_K };
            synth::write(&preset.shape(), &types, &Tokenizer::byte_level(), 1, &path, 1).expect("written");
            path
        })
        .collect()
}
