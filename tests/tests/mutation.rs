//! Mutation test of the pack reader: thousands of damaged packs (truncations, byte
//! flips, rewritten length and type fields) must each give an error or a valid pack —
//! never a panic, and never a hang.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::time::Duration;

use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_compiler::inspect;
use strata_compiler::pack::{Pack, parse};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::Preset;
use strata_tests::synthetic_pack;

/// Random mutants after the exhaustive truncations.
const MUTANTS: usize = 30_000;

/// Everything a user-facing command does with a pack: parse, describe, dequantize a row
/// of every tensor. Returns whether the bytes were a valid pack.
fn use_pack(bytes: &[u8]) -> bool {
    if parse(bytes).is_err() {
        return false;
    }
    let Ok(pack) = Pack::from_bytes("mutant.gguf", bytes.to_vec()) else { return true };
    let _ = inspect::inspect(&pack).to_text();
    for t in pack.tensors().iter().filter(|t| t.ty.is_supported()) {
        let row = &pack.data(t)[..t.ty.row_bytes(t.row_len()).unwrap_or(0) as usize];
        let mut out = vec![0f32; t.row_len() as usize];
        t.ty.dequantize(row, &mut out).expect("validated rows dequantize");
    }
    true
}

/// One damage: a truncation, or bytes written at positions.
enum Damage {
    Truncate(usize),
    Write(Vec<(usize, Vec<u8>)>),
}

fn damage(len: usize, header: usize, rng: &mut impl Rng, kind: usize) -> Damage {
    match kind {
        0 => Damage::Truncate(rng.random_range(0..len)),
        1 => Damage::Write(
            (0..rng.random_range(1..=8))
                .map(|_| {
                    let end = if rng.random_bool(0.9) { header } else { len };
                    (rng.random_range(0..end), vec![rng.random()])
                })
                .collect(),
        ),
        _ => {
            let value: u64 = match rng.random_range(0..6) {
                0 => 0,
                1 => u64::MAX,
                2 => rng.random_range(0..64),
                3 => 1 << rng.random_range(0..64),
                4 => (1 << rng.random_range(0..64)) - 1,
                _ => rng.random(),
            };
            let width = if rng.random_bool(0.5) { 8 } else { 4 };
            let at = rng.random_range(0..header - width);
            Damage::Write(vec![(at, value.to_le_bytes()[..width].to_vec())])
        }
    }
}

#[test]
fn damaged_packs_never_panic_or_hang() {
    let base = synthetic_pack(Preset::TinyQwen3Moe, 1, &[GgmlType::IQ1_M, GgmlType::Q4_K, GgmlType::IQ3_S]);
    let header = parse(&base).expect("base is valid").data_offset as usize;
    assert!(header > 2000, "the header should be large enough to be worth mutating");

    let (done, finished) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
        let mut work = base.clone();
        let (mut panics, mut valid, mut runs) = (Vec::new(), 0usize, 0usize);
        let mut run = |bytes: &[u8], what: &dyn Fn() -> String| {
            runs += 1;
            match catch_unwind(AssertUnwindSafe(|| use_pack(bytes))) {
                Ok(ok) => valid += usize::from(ok),
                Err(_) => panics.push(what()),
            }
        };
        for cut in 0..header {
            run(&base[..cut], &|| format!("truncated to {cut}"));
        }
        for i in 0..MUTANTS {
            match damage(base.len(), header, &mut rng, i % 3) {
                Damage::Truncate(cut) => run(&base[..cut], &|| format!("truncated to {cut}")),
                Damage::Write(writes) => {
                    for (at, bytes) in &writes {
                        work[*at..at + bytes.len()].copy_from_slice(bytes);
                    }
                    run(&work, &|| format!("wrote {writes:?}"));
                    for (at, bytes) in &writes {
                        work[*at..at + bytes.len()].copy_from_slice(&base[*at..at + bytes.len()]);
                    }
                }
            }
        }
        let _ = done.send((panics, valid, runs));
    });
    let (panics, valid, runs) = finished
        .recv_timeout(Duration::from_secs(300))
        .expect("the mutation run hung: a damaged pack made the reader loop");
    worker.join().expect("worker finished");
    assert!(
        panics.is_empty(),
        "{} of {runs} mutants panicked, e.g. {:?}",
        panics.len(),
        &panics[..panics.len().min(5)]
    );
    // Flips in tensor data leave valid packs: the run must cover both outcomes.
    assert!(valid > 100 && valid < runs / 2, "{valid} of {runs} mutants were valid packs");
    eprintln!("{runs} mutants, {valid} still valid packs, no panic");
}
