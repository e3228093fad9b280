//! Fuzzing the GGUF parser and the model loader with proptest: real synthetic packs
//! (a dense llama and a mixture of experts) damaged by bit flips, truncations, huge
//! counts, bad offsets and random values written over the header, metadata and tensor
//! table, then parsed, described, tokenized, scanned and (where all that passes)
//! loaded and run for a token on the CPU. Every case must end in a value or an error:
//! no panic, no abort, and within a time bound.
//!
//! CI runs the default 3000 cases (about 16 s on two cores); `PROPTEST_CASES=N` runs
//! more. A failure prints the minimal damage that reproduces it.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use strata_compiler::model::ModelDesc;
use strata_compiler::pack::{Pack, parse};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::Preset;
use strata_runtime::model::check_finite;
use strata_runtime::session::{self, BackendChoice, OpenOptions};
use strata_runtime::tokenizer::Tokenizer;
use strata_tests::synthetic_pack;

/// Cases in a default run.
const CASES: u32 = 3000;
/// The longest one case may take: a hang, not a speed bound (a load and a token of a
/// tiny model take ~50 ms).
const CASE_LIMIT: Duration = Duration::from_secs(30);

/// The undamaged packs and where each one's data section starts.
fn bases() -> &'static [(Vec<u8>, usize)] {
    static BASES: OnceLock<Vec<(Vec<u8>, usize)>> = OnceLock::new();
    BASES.get_or_init(|| {
        [
            synthetic_pack(Preset::TinyLlama, 2, &[GgmlType::Q4_0]),
            synthetic_pack(Preset::TinyQwen3Moe, 1, &[GgmlType::Q8_0]),
        ]
        .into_iter()
        .map(|bytes| {
            let header = parse(&bytes).expect("valid base").data_offset as usize;
            (bytes, header)
        })
        .collect()
    })
}

/// One damage. Positions are fractions of the header (where every length, count, type
/// and offset lives) or of the whole file.
#[derive(Clone, Debug)]
enum Damage {
    /// Flip one bit.
    Flip { at: f64, bit: u8, whole_file: bool },
    /// Cut the file.
    Truncate { at: f64 },
    /// Write a little-endian u64 (huge counts, lengths and offsets).
    Write64 { at: f64, value: u64 },
    /// Write a little-endian u32 (type ids, dimensions, small counts).
    Write32 { at: f64, value: u32 },
}

fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(u64::MAX),
        Just(1 << 24),
        Just(30_000_000),
        Just(u32::MAX as u64),
        (0u32..64).prop_map(|s| 1u64 << s),
        (0u32..64).prop_map(|s| (1u64 << s) - 1),
        any::<u64>(),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0.0..1.0f64, 0u8..8, prop::bool::weighted(0.2)).prop_map(|(at, bit, whole_file)| Damage::Flip {
            at,
            bit,
            whole_file
        }),
        (0.0..1.0f64).prop_map(|at| Damage::Truncate { at }),
        (0.0..1.0f64, interesting_u64()).prop_map(|(at, value)| Damage::Write64 { at, value }),
        (0.0..1.0f64, prop_oneof![Just(0u32), Just(u32::MAX), 0u32..40, any::<u32>()])
            .prop_map(|(at, value)| Damage::Write32 { at, value }),
    ]
}

fn apply(bytes: &mut Vec<u8>, header: usize, d: &Damage) {
    // An earlier truncation may have cut the file shorter than the header.
    let header = header.min(bytes.len());
    if header == 0 {
        return;
    }
    let pos = |at: f64, span: usize| ((at * span as f64) as usize).min(span.saturating_sub(1));
    let mut write = |at: f64, v: &[u8]| {
        let p = pos(at, header);
        let end = (p + v.len()).min(bytes.len());
        bytes[p..end].copy_from_slice(&v[..end - p]);
    };
    match *d {
        Damage::Flip { at, bit, whole_file } => {
            let p = pos(at, if whole_file { bytes.len() } else { header });
            bytes[p] ^= 1 << bit;
        }
        Damage::Truncate { at } => bytes.truncate(pos(at, bytes.len())),
        Damage::Write64 { at, value } => write(at, &value.to_le_bytes()),
        Damage::Write32 { at, value } => write(at, &value.to_le_bytes()),
    }
}

/// Everything a start does with a pack, as far as it gets; how far, for the tallies.
fn use_pack(bytes: Vec<u8>, dir: &std::path::Path) -> usize {
    if parse(&bytes).is_err() {
        return 0;
    }
    let Ok(pack) = Pack::from_bytes("fuzz.gguf", bytes.clone()) else { return 1 };
    if ModelDesc::from_pack(&pack).is_err() || Tokenizer::from_pack(&pack).is_err() || check_finite(&pack).is_err() {
        return 2;
    }
    let path = dir.join("fuzz.gguf");
    std::fs::write(&path, &bytes).expect("written");
    let opts = OpenOptions { backend: BackendChoice::Cpu, ctx: Some(32), ..OpenOptions::default() };
    match session::open(&path, &opts, &mut |_| {}) {
        Ok(mut s) => {
            let _ = s.model.forward(&[1, 2], strata_runtime::model::Logits::Last);
            let _ = s.model.argmax(1);
            4
        }
        Err(_) => 3,
    }
}

#[test]
fn damaged_packs_end_in_a_value_or_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let reached: [std::cell::Cell<usize>; 5] = Default::default();
    let config = ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(CASES),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let strategy = (0usize..2, prop::collection::vec(damage(), 1..4));
    let result = runner.run(&strategy, |(base, damages)| {
        let (bytes, header) = &bases()[base];
        let mut bytes = bytes.clone();
        for d in &damages {
            apply(&mut bytes, *header, d);
        }
        let case = Instant::now();
        let stage = use_pack(bytes, dir.path());
        reached[stage].set(reached[stage].get() + 1);
        prop_assert!(case.elapsed() < CASE_LIMIT, "a case took {:?}", case.elapsed());
        Ok(())
    });
    let reached = reached.map(std::cell::Cell::into_inner);
    eprintln!(
        "fuzz: {} cases in {:.1} s; stopped at parse {}, pack {}, model/tokenizer/scan {}, open {}; ran a token {}",
        reached.iter().sum::<usize>(),
        started.elapsed().as_secs_f64(),
        reached[0],
        reached[1],
        reached[2],
        reached[3],
        reached[4]
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
