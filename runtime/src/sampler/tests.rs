//! The sampler's unit tests: each filter, seeds, penalties, stop strings, and draws
//! against their distribution.

use super::*;

fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplerConfig {
    SamplerConfig { temperature, top_k, top_p, min_p, ..SamplerConfig::default() }
}

/// Deterministic pseudo-random logits without pulling the RNG into the expectations.
fn logits(n: usize, salt: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let x = i.wrapping_mul(2_654_435_761).wrapping_add(salt.wrapping_mul(40_503)) >> 8;
            (x % 2000) as f32 / 200.0 - 5.0
        })
        .collect()
}

#[test]
fn greedy_equals_argmax() {
    let mut s = Sampler::new(SamplerConfig::greedy());
    for salt in 0..20 {
        let l = logits(1000, salt);
        assert_eq!(s.sample(&l, &[1, 2, 3]), argmax(&l));
        assert_eq!(argmax(&l), top_k(&l, 1)[0].0);
    }
    assert!(SamplerConfig::greedy().is_greedy());
    assert!(!SamplerConfig::default().is_greedy());
    assert!(s.is_greedy());
    let penalised = SamplerConfig { repeat_penalty: 1.1, ..SamplerConfig::greedy() };
    assert!(!Sampler::new(penalised).is_greedy());
}

#[test]
fn argmax_ties_and_nan() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 0.5, f32::NAN, 0.5]), 1);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[]), 0);
    assert_eq!(top_k(&[1.0, 3.0, f32::NAN, 3.0, 2.0], 3), vec![(1, 3.0), (3, 3.0), (4, 2.0)]);
    assert_eq!(top_k(&[1.0, 2.0], 5), vec![(1, 2.0), (0, 1.0)]);
    assert!(top_k(&[1.0], 0).is_empty());
}

#[test]
fn nan_logits_never_picked() {
    let mut l = logits(100, 7);
    for i in (0..100).step_by(3) {
        l[i] = f32::NAN;
    }
    let mut s = Sampler::new(SamplerConfig { top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplerConfig::default() });
    for _ in 0..500 {
        assert_ne!(s.sample(&l, &[]) % 3, 0);
    }
    let mut g = Sampler::new(SamplerConfig::greedy());
    assert_eq!(g.sample(&[f32::NAN; 4], &[]), 0);
    assert_eq!(Sampler::new(SamplerConfig::default()).sample(&[], &[]), 0);
}

#[test]
fn same_seed_same_sequence() {
    let run = |seed| {
        let mut s = Sampler::new(SamplerConfig { seed, temperature: 1.5, ..SamplerConfig::default() });
        (0..64).map(|i| s.sample(&logits(500, i % 3), &[])).collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
fn top_k_one_is_greedy_at_any_temperature() {
    for &t in &[0.1_f32, 1.0, 5.0, 100.0] {
        let mut s = Sampler::new(cfg(t, 1, 1.0, 0.0));
        for salt in 0..10 {
            let l = logits(300, salt);
            assert_eq!(s.sample(&l, &[]), argmax(&l));
        }
    }
}

#[test]
fn tiny_top_p_keeps_only_the_best() {
    for top_k in [0, 40] {
        let mut s = Sampler::new(cfg(50.0, top_k, 1e-6, 0.0));
        for salt in 0..20 {
            let l = logits(300, salt);
            assert_eq!(s.sample(&l, &[]), argmax(&l));
        }
    }
}

#[test]
fn min_p_filters() {
    // p(1)/p(0) = e^-0.1 ≈ 0.90 survives min_p 0.5; the others (≤ e^-10) do not.
    let l = [10.0, 9.9, 0.0, -5.0, 9.0 - 10.0];
    let mut s = Sampler::new(cfg(100.0, 0, 1.0, 0.5));
    let mut seen = [0_usize; 5];
    for _ in 0..2000 {
        seen[s.sample(&l, &[]) as usize] += 1;
    }
    assert_eq!(seen[2] + seen[3] + seen[4], 0);
    assert!(seen[0] > 500 && seen[1] > 500, "{seen:?}");
    // Without min_p the high temperature lets the tail through.
    let mut s = Sampler::new(cfg(100.0, 0, 1.0, 0.0));
    let tail = (0..2000).filter(|_| s.sample(&l, &[]) >= 2).count();
    assert!(tail > 500, "{tail}");
}

#[test]
fn presence_and_frequency_penalties_follow_openai() {
    let l = [2.0, 1.5, -3.0];
    let presence = SamplerConfig { presence_penalty: 0.6, ..SamplerConfig::greedy() };
    let mut s = Sampler::new(presence);
    assert!(!s.is_greedy(), "penalties need the logits");
    // 2.0 - 0.6 = 1.4 < 1.5, however often token 0 was generated.
    assert_eq!(s.sample_with(&l, &[], &[0]), 1);
    assert_eq!(s.sample_with(&l, &[], &[]), 0, "nothing generated yet: no penalty");
    // Frequency scales with the count: 2.0 - 2 * 0.2 = 1.6 > 1.5, 2.0 - 3 * 0.2 = 1.4 < 1.5.
    let mut f = Sampler::new(SamplerConfig { frequency_penalty: 0.2, ..SamplerConfig::greedy() });
    assert_eq!(f.sample_with(&l, &[], &[0, 0]), 0);
    assert_eq!(f.sample_with(&l, &[], &[0, 0, 0]), 1);
}

#[test]
fn repetition_penalty_changes_the_pick() {
    let pen = |last_n| SamplerConfig { repeat_penalty: 1.5, repeat_last_n: last_n, ..SamplerConfig::greedy() };
    // Positive logit divided: 2.0 / 1.5 = 1.33 < 1.9.
    let l = [2.0, 1.9, -3.0];
    assert_eq!(Sampler::new(SamplerConfig::greedy()).sample(&l, &[0]), 0);
    assert_eq!(Sampler::new(pen(64)).sample(&l, &[0]), 1);
    // Negative logit multiplied: -1.0 * 1.5 = -1.5 < -1.2.
    assert_eq!(Sampler::new(pen(64)).sample(&[-1.0, -1.2], &[0, 0, 0]), 1);
    // Applied once per distinct token, not once per occurrence: 2.0 / 1.5 > 1.3.
    assert_eq!(Sampler::new(pen(64)).sample(&[2.0, 1.3], &[0, 0, 0, 0]), 0);
    // Outside the window: only the last 2 history tokens count.
    assert_eq!(Sampler::new(pen(2)).sample(&l, &[0, 2, 2]), 0);
    // Out-of-vocab history ids are ignored.
    assert_eq!(Sampler::new(pen(64)).sample(&l, &[99]), 0);
    // Also applies on the sampling path: top_k 1 after the penalty.
    let sampled = SamplerConfig { top_k: 1, temperature: 1.0, ..pen(64) };
    assert_eq!(Sampler::new(sampled).sample(&l, &[0]), 1);
}

/// Draw counts vs. softmax(l / t): Pearson chi-square with a loose bound (5 dof; the
/// 0.1% critical value is 20.5, so 40 flags real bias, not noise).
#[test]
fn draws_follow_softmax() {
    let l = [1.0_f32, 2.0, 0.5, 3.0, -1.0, 2.5];
    for &t in &[1.0_f32, 0.7] {
        let mut s = Sampler::new(SamplerConfig { seed: 7, ..cfg(t, 0, 1.0, 0.0) });
        let n = 20_000;
        let mut counts = [0_usize; 6];
        for _ in 0..n {
            counts[s.sample(&l, &[]) as usize] += 1;
        }
        let w: Vec<f64> = l.iter().map(|&x| f64::from(x / t).exp()).collect();
        let z: f64 = w.iter().sum();
        let chi2: f64 = counts
            .iter()
            .zip(&w)
            .map(|(&c, &wi)| {
                let e = n as f64 * wi / z;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        assert!(chi2 < 40.0, "t={t} chi2={chi2} counts={counts:?}");
    }
}

#[test]
fn top_k_restricts_support() {
    let l = [0.0_f32, 1.0, 2.0, 3.0, 4.0];
    let mut s = Sampler::new(cfg(10.0, 2, 1.0, 0.0));
    let mut seen = [0_usize; 5];
    for _ in 0..1000 {
        seen[s.sample(&l, &[]) as usize] += 1;
    }
    assert_eq!(seen[0] + seen[1] + seen[2], 0);
    assert!(seen[3] > 300 && seen[4] > 300, "{seen:?}");
}

/// Settings that exercise every filter and penalty at once.
fn everything(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 0.7,
        top_k: 20,
        top_p: 0.9,
        min_p: 0.05,
        repeat_penalty: 1.3,
        repeat_last_n: 8,
        presence_penalty: 0.5,
        frequency_penalty: 0.2,
        seed,
        logit_bias: vec![(3, 1.5), (11, -2.0)],
    }
}

#[test]
fn greedy_distribution_is_one_hot_on_the_pick() {
    let configs = [
        SamplerConfig::greedy(),
        SamplerConfig { repeat_penalty: 1.5, ..SamplerConfig::greedy() },
        SamplerConfig { presence_penalty: 0.6, frequency_penalty: 0.3, ..SamplerConfig::greedy() },
    ];
    for c in configs {
        let mut s = Sampler::new(c);
        for salt in 0..20 {
            let l = logits(300, salt);
            let history: Vec<u32> = (0..10).map(|i| argmax(&logits(300, salt + i))).collect();
            let pick = s.sample_with(&l, &history, &history[5..]);
            assert_eq!(s.distribution(&l, &history, &history[5..]), vec![(pick, 1.0)]);
        }
    }
    let mut s = Sampler::new(SamplerConfig::default());
    assert!(s.distribution(&[], &[], &[]).is_empty());
    assert_eq!(s.draw(&[]), 0, "as sample_with does for empty logits");
}

/// `distribution` is what `sample_with` draws from: it sums to 1 and, fed the same
/// uniform draw (same seed), `draw` picks exactly the token `sample_with` picks.
#[test]
fn distribution_is_what_sample_with_draws_from() {
    let (mut a, mut b) = (Sampler::new(everything(5)), Sampler::new(everything(5)));
    let mut history = vec![1_u32, 2, 3];
    for step in 0..400 {
        let l = logits(200, step % 7);
        let generated = &history[3..];
        let dist = b.distribution(&l, &history, generated);
        let sum: f64 = dist.iter().map(|&(_, p)| p).sum();
        assert!((sum - 1.0).abs() < 1e-9, "{sum}");
        assert!(dist.iter().all(|&(_, p)| p > 0.0));
        assert!(dist.len() <= 20, "top_k bounds the support");
        let mut ids: Vec<u32> = dist.iter().map(|&(t, _)| t).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), dist.len(), "each token once");
        let token = a.sample_with(&l, &history, generated);
        assert_eq!(b.draw(&dist), token, "step {step}");
        history.push(token);
    }
}

/// `draw`'s frequencies against the distribution (loose chi-square bound, as above).
#[test]
fn draws_follow_the_distribution() {
    let l = [1.0_f32, 2.0, 0.5, 3.0, -1.0, 2.5];
    let mut s = Sampler::new(SamplerConfig { seed: 9, ..cfg(0.8, 0, 1.0, 0.0) });
    let dist = s.distribution(&l, &[], &[]);
    assert_eq!(dist.len(), 6);
    let n = 20_000;
    let mut counts = [0_usize; 6];
    for _ in 0..n {
        counts[s.draw(&dist) as usize] += 1;
    }
    let chi2: f64 = dist
        .iter()
        .map(|&(t, p)| {
            let e = n as f64 * p;
            (counts[t as usize] as f64 - e).powi(2) / e
        })
        .sum();
    assert!(chi2 < 40.0, "chi2={chi2} counts={counts:?}");
}

#[test]
fn draw_is_robust() {
    assert_eq!(draw_with(&[], 0.5), 0);
    assert_eq!(draw_with(&[(4, 0.0), (5, -1.0)], 0.5), 0);
    // NaN and infinite entries are never drawn; unnormalised weights are fine.
    let d = [(1, f64::NAN), (2, 3.0), (3, f64::INFINITY), (4, 1.0)];
    assert_eq!(draw_with(&d, 0.0), 2);
    assert_eq!(draw_with(&d, 0.74), 2);
    assert_eq!(draw_with(&d, 0.76), 4);
    // A cumulative sum that falls short returns the last positive token.
    assert_eq!(draw_with(&[(3, 0.5), (5, 0.5), (7, 0.0)], 1.0), 5);
    let mut s = Sampler::new(SamplerConfig::default());
    for _ in 0..1000 {
        let u = s.uniform();
        assert!((0.0..1.0).contains(&u), "{u}");
    }
}

fn stops(v: &[&str]) -> StopMatcher {
    StopMatcher::new(v.iter().map(|&s| s.to_owned()).collect())
}

#[test]
fn stop_across_piece_boundaries() {
    let mut m = stops(&["</s>", "\nUser:"]);
    assert_eq!(m.push("Hello <"), ("Hello ".to_owned(), false));
    assert_eq!(m.push("/s"), (String::new(), false));
    assert_eq!(m.push(">trailing"), (String::new(), true));
    assert_eq!(m.push("more"), (String::new(), true));
    assert_eq!(m.finish(), "");

    let mut m = stops(&["\nUser:"]);
    assert_eq!(m.push("ok.\nUs"), ("ok.".to_owned(), false));
    assert_eq!(m.push("er: hi"), (String::new(), true));

    // The stop inside a single piece cuts the text before it.
    let mut m = stops(&["STOP"]);
    assert_eq!(m.push("abcSTOPdef"), ("abc".to_owned(), true));
}

#[test]
fn partial_match_that_does_not_stop() {
    let mut m = stops(&["</s>"]);
    assert_eq!(m.push("a <"), ("a ".to_owned(), false));
    assert_eq!(m.push("/"), (String::new(), false));
    assert_eq!(m.push("b"), ("</b".to_owned(), false));
    assert_eq!(m.push("x</"), ("x".to_owned(), false));
    assert_eq!(m.finish(), "</");

    // A later restart of the stop inside the held text is still found.
    let mut m = stops(&["aab"]);
    assert_eq!(m.push("aa"), (String::new(), false));
    assert_eq!(m.push("a"), ("a".to_owned(), false));
    assert_eq!(m.push("b"), (String::new(), true));

    // Multi-byte text: hold-back respects char boundaries.
    let mut m = stops(&["é!"]);
    assert_eq!(m.push("café"), ("caf".to_owned(), false));
    assert_eq!(m.push("?"), ("é?".to_owned(), false));
    assert_eq!(m.finish(), "");

    // No stops / empty stops: everything passes straight through.
    let mut m = stops(&[""]);
    assert_eq!(m.push("anything"), ("anything".to_owned(), false));
}

#[test]
fn earliest_stop_wins() {
    let mut m = stops(&["cd", "bcx", "b"]);
    assert_eq!(m.push("abcd"), ("a".to_owned(), true));
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let l = logits(1000, 3);
    let best = argmax(&l);
    // -100 on the argmax: greedy takes the runner-up, which no longer ties with it.
    let banned = SamplerConfig { logit_bias: vec![(best, -100.0)], ..SamplerConfig::greedy() };
    let mut s = Sampler::new(banned);
    assert!(!s.is_greedy(), "a bias needs the logits");
    let runner_up = top_k(&l, 2)[1].0;
    assert_eq!(s.sample(&l, &[]), runner_up);
    // +100 on one token: sampling at temperature 1 draws it every time; ids past the
    // vocabulary are skipped.
    let forced = SamplerConfig {
        logit_bias: vec![(7, 100.0), (5000, 100.0)],
        temperature: 1.0,
        seed: 9,
        ..SamplerConfig::default()
    };
    let mut s = Sampler::new(forced);
    for _ in 0..50 {
        assert_eq!(s.sample(&l, &[]), 7);
    }
}

#[test]
fn keeping_the_best_k_equals_sorting_all_ties_nan_and_infinities_included() {
    for salt in 0..4 {
        // Few distinct values: many ties, which the lower id wins.
        let mut row: Vec<f32> = logits(5000, salt).into_iter().map(|l| (l * 2.0).round()).collect();
        row[7] = f32::NAN;
        row[11] = f32::INFINITY;
        row[13] = f32::NEG_INFINITY;
        let all: Vec<(u32, f32)> = row.iter().enumerate().map(|(i, &l)| (i as u32, sanitize(l))).collect();
        let mut sorted = all.clone();
        sorted.sort_unstable_by(by_logit_desc);
        for k in [0, 1, 2, 40, 4999, 5000, 6000] {
            let mut kept = all.clone();
            keep_best(&mut kept, k);
            assert_eq!(kept, sorted[..k.min(sorted.len())], "salt {salt}, k {k}");
            assert_eq!(top_k(&row, k), kept, "salt {salt}, k {k}");
        }
    }
}
