//! The host cost of sampling one token from a 49,152-token vocabulary (SmolLM2's) with
//! the default filters (temperature 1, top-k 40, top-p 0.95, min-p 0.05): 2,000 draws
//! over 64 fixed rows of logits. Prints µs a token and a checksum of the tokens drawn, so
//! two builds can be compared for speed and for the same draws.
//!
//! `cargo run --release --locked -p strata-runtime --example sampler_cost`

use strata_runtime::sampler::{Sampler, SamplerConfig};

fn main() {
    const VOCAB: u32 = 49_152;
    const DRAWS: usize = 2_000;
    let rows: Vec<Vec<f32>> = (0..64u32)
        .map(|row| {
            (0..VOCAB)
                .map(|i| {
                    let x = i.wrapping_mul(2_654_435_761).wrapping_add(row.wrapping_mul(40_503)) >> 8;
                    (x % 20_000) as f32 / 1_000.0 - 10.0
                })
                .collect()
        })
        .collect();
    let mut sampler = Sampler::new(SamplerConfig { temperature: 1.0, ..SamplerConfig::default() });
    let mut checksum = 0u64;
    let start = std::time::Instant::now();
    for draw in 0..DRAWS {
        checksum += u64::from(sampler.sample(&rows[draw % rows.len()], &[]));
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / DRAWS as f64;
    println!("{us:.1} us a token (vocabulary {VOCAB}, {DRAWS} draws), token checksum {checksum}");
}
