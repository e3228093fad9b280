//! Verification of a speculative window, as pure functions over tokens and distributions,
//! so the acceptance rules are tested without a model: greedy (take the drafts the target's
//! argmax agrees with) and sampled (speculative rejection sampling, which keeps the target's
//! distribution exactly).

use crate::sampler::{Dist, draw_with, usable};

/// How many leading drafts the target's greedy choice agrees with. `target[i]` is the
/// target's greedy token after the window's first `i + 1` tokens (the pending token and
/// `drafts[..i]`), so `target.len() == drafts.len() + 1`; the caller then emits
/// `drafts[..m]` and `target[m]`, exactly what decoding without speculation would. On
/// inconsistent lengths it uses the shorter and keeps `m < target.len()`, so `target[m]`
/// exists whenever `target` is not empty.
pub fn accept_greedy(drafts: &[u32], target: &[u32]) -> usize {
    let most = drafts.len().min(target.len().saturating_sub(1));
    drafts[..most].iter().zip(target).take_while(|(d, t)| d == t).count()
}

/// Speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023): returns how
/// many leading drafts to keep, `m`, and the token to emit after them.
///
/// `draft[i]` is the distribution q the drafter drew `drafts[i]` from (one-hot for a
/// deterministic drafter such as n-gram lookup; a missing or empty `draft[i]` means
/// one-hot too). `target(i)` is the target's distribution p at window position `i`, after
/// `drafts[..i]`; it is called lazily, once per position reached, in order, at most up to
/// `drafts.len()`. `uniform` yields draws in [0, 1).
///
/// In order, `drafts[i] = d` is accepted with probability min(1, p(d) / q(d)); on the first
/// rejection the result is `(i, x)` with x drawn from the normalised residual max(0, p − q);
/// if all are accepted, `(drafts.len(), x)` with x drawn from `target(drafts.len())`. Each
/// emitted token is then distributed exactly as the target's p given the tokens before it,
/// whatever q is (q only changes how many drafts are kept), so sampling with speculation
/// is sampling without it.
///
/// Degenerate inputs never panic: distributions need not be normalised (non-finite and
/// non-positive entries count as 0); a draft with q(d) = 0 (which a drafter should never
/// propose) is accepted iff p(d) > 0, the limit of min(1, p/q) as q(d) → 0, which is exact
/// when q(d) merely underflowed and never emits a token the target rules out; a residual
/// with no mass (only through rounding) falls back to p; an empty p gives token 0, as the
/// sampler does for empty logits.
pub fn accept_sampled(
    drafts: &[u32],
    draft: &[Dist],
    target: &mut dyn FnMut(usize) -> Dist,
    uniform: &mut dyn FnMut() -> f64,
) -> (usize, u32) {
    for (i, &d) in drafts.iter().enumerate() {
        let p = target(i);
        let q = draft.get(i).map(Vec::as_slice).filter(|q| !q.is_empty());
        let p_d = prob(&p, d);
        let q_d = q.map_or(1.0, |q| prob(q, d));
        let accept = if q_d > 0.0 { p_d >= q_d || uniform() < p_d / q_d } else { p_d > 0.0 };
        if !accept {
            let rest = residual(&p, q, d);
            let from = if rest.is_empty() { &p } else { &rest };
            return (i, draw_with(from, uniform()));
        }
    }
    let n = drafts.len();
    (n, draw_with(&target(n), uniform()))
}

/// The probability of `token` under `dist`, normalised by the distribution's total mass
/// (0 if it has none); duplicate entries add up.
fn prob(dist: &[(u32, f64)], token: u32) -> f64 {
    let total: f64 = dist.iter().map(|&(_, p)| usable(p)).sum();
    if total <= 0.0 {
        return 0.0;
    }
    dist.iter().filter(|&&(t, _)| t == token).map(|&(_, p)| usable(p)).sum::<f64>() / total
}

/// `dist` normalised, sorted by token, duplicates merged, only positive entries.
fn normalised(dist: &[(u32, f64)]) -> Vec<(u32, f64)> {
    let mut v: Vec<(u32, f64)> = dist.iter().map(|&(t, p)| (t, usable(p))).filter(|&(_, p)| p > 0.0).collect();
    v.sort_unstable_by_key(|&(t, _)| t);
    v.dedup_by(|b, a| {
        let same = a.0 == b.0;
        if same {
            a.1 += b.1;
        }
        same
    });
    let total: f64 = v.iter().map(|&(_, p)| p).sum();
    for e in &mut v {
        e.1 /= total;
    }
    v
}

/// max(0, p − q) over p's support, unnormalised (the draw normalises); `q` of `None` is
/// one-hot on `token`. Empty when the residual has no mass.
fn residual(p: &[(u32, f64)], q: Option<&[(u32, f64)]>, token: u32) -> Vec<(u32, f64)> {
    let q = q.map_or_else(|| vec![(token, 1.0)], normalised);
    normalised(p)
        .into_iter()
        .map(|(t, pt)| {
            let qt = q.binary_search_by_key(&t, |&(u, _)| u).map_or(0.0, |j| q[j].1);
            (t, pt - qt)
        })
        .filter(|&(_, r)| r > 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{Sampler, SamplerConfig};

    /// The 0.999 quantile of the chi-square distribution with 5 degrees of freedom
    /// (6-token vocabulary): a correct sampler exceeds it one run in a thousand, and the
    /// seed is fixed, so a failure means bias.
    const CHI2_999_DOF5: f64 = 20.515;
    /// The 0.999 quantile of the chi-square distribution with 30 degrees of freedom (six
    /// conditional histograms of 5 degrees of freedom each).
    const CHI2_999_DOF30: f64 = 59.703;

    const V: usize = 6;

    /// Target at position 0.
    const P0: [f64; V] = [0.30, 0.05, 0.20, 0.15, 0.25, 0.05];
    /// Draft model at position 0: deliberately unlike P0.
    const Q0: [f64; V] = [0.10, 0.30, 0.10, 0.25, 0.05, 0.20];

    fn dist(p: &[f64]) -> Dist {
        p.iter().enumerate().map(|(t, &p)| (t as u32, p)).collect()
    }

    /// A base distribution rotated by `by`, so later positions depend on earlier tokens.
    fn rotated(base: [f64; V], by: u32) -> Dist {
        dist(&std::array::from_fn::<f64, V, _>(|b| base[(b + by as usize) % V]))
    }

    /// Target at position 1, after token `a`.
    fn p1(a: u32) -> Dist {
        rotated([0.35, 0.25, 0.15, 0.10, 0.10, 0.05], a)
    }

    /// Draft model at position 1, after token `a`.
    fn q1(a: u32) -> Dist {
        rotated([0.05, 0.10, 0.15, 0.20, 0.20, 0.30], 2 * a)
    }

    /// Target at position 2 (the bonus token after two accepted drafts).
    fn p2(b: u32) -> Dist {
        rotated([0.2, 0.2, 0.2, 0.2, 0.1, 0.1], b)
    }

    fn seeded(seed: u64) -> Sampler {
        Sampler::new(SamplerConfig { seed, ..SamplerConfig::default() })
    }

    /// Pearson's statistic of `counts` against `n * p`.
    fn chi2(counts: &[u64], p: &[(u32, f64)]) -> f64 {
        let n: u64 = counts.iter().sum();
        p.iter()
            .map(|&(t, pt)| {
                let e = n as f64 * pt;
                (counts[t as usize] as f64 - e).powi(2) / e
            })
            .sum()
    }

    /// Histograms of the first emitted token, and of the second one per first token
    /// (counted only when the first draft was accepted, so a second token exists).
    struct Tally {
        first: [u64; V],
        second: [[u64; V]; V],
    }

    impl Tally {
        fn new() -> Self {
            Self { first: [0; V], second: [[0; V]; V] }
        }

        fn add(&mut self, drafts: &[u32], (m, token): (usize, u32)) {
            let mut out = drafts[..m].to_vec();
            out.push(token);
            self.first[out[0] as usize] += 1;
            if m >= 1 {
                self.second[out[0] as usize][out[1] as usize] += 1;
            }
        }

        /// First token against P0 (5 dof), second against p1(first) summed over the six
        /// first tokens (30 dof).
        fn stats(&self) -> (f64, f64) {
            let second = (0..V as u32).map(|a| chi2(&self.second[a as usize], &p1(a))).sum();
            (chi2(&self.first, &dist(&P0)), second)
        }
    }

    /// The target's distribution at each window position, as `accept_sampled` asks for it.
    fn target_of(drafts: &[u32]) -> impl FnMut(usize) -> Dist + '_ {
        move |i| match i {
            0 => dist(&P0),
            1 => p1(drafts[0]),
            _ => p2(drafts[1]),
        }
    }

    #[test]
    fn greedy_acceptance() {
        assert_eq!(accept_greedy(&[5, 6, 7], &[5, 6, 7, 8]), 3);
        assert_eq!(accept_greedy(&[5, 6, 7], &[5, 9, 7, 8]), 1);
        assert_eq!(accept_greedy(&[5, 6, 7], &[4, 6, 7, 8]), 0);
        assert_eq!(accept_greedy(&[], &[4]), 0);
        // Inconsistent lengths: never past the shorter, and target[m] stays in range.
        assert_eq!(accept_greedy(&[5, 6, 7], &[5, 6]), 1);
        assert_eq!(accept_greedy(&[5, 6, 7], &[5, 6, 7]), 2);
        assert_eq!(accept_greedy(&[5], &[5, 6, 7, 8]), 1);
        assert_eq!(accept_greedy(&[5, 6], &[]), 0);
        assert_eq!(accept_greedy(&[], &[]), 0);
    }

    /// Draft-model style: drafts drawn from Q0 and q1, verified against P0 and p1. The
    /// emitted tokens must follow the target (chi-square below the 0.999 critical value),
    /// while always accepting the drafts (the negative control) must not.
    #[test]
    fn rejection_sampling_keeps_the_target_distribution() {
        let trials = 200_000;
        let mut s = seeded(11);
        let (mut spec, mut naive) = (Tally::new(), Tally::new());
        let mut accepted = 0;
        for _ in 0..trials {
            let d0 = s.draw(&dist(&Q0));
            let d1 = s.draw(&q1(d0));
            let drafts = [d0, d1];
            let qs = [dist(&Q0), q1(d0)];
            let out = accept_sampled(&drafts, &qs, &mut target_of(&drafts), &mut || s.uniform());
            accepted += out.0;
            spec.add(&drafts, out);
            naive.add(&drafts, (2, s.draw(&p2(d1))));
        }
        let (first, second) = spec.stats();
        let (naive_first, naive_second) = naive.stats();
        println!(
            "draft model, {trials} trials, {:.3} drafts accepted per window: first token chi2 {first:.2} \
             (critical {CHI2_999_DOF5}), second {second:.2} (critical {CHI2_999_DOF30}); always \
             accepting: first {naive_first:.1}, second {naive_second:.1}",
            accepted as f64 / trials as f64
        );
        assert!(first < CHI2_999_DOF5, "first token: chi2 {first} counts {:?}", spec.first);
        assert!(second < CHI2_999_DOF30, "second token: chi2 {second}");
        assert!(naive_first > CHI2_999_DOF5, "the negative control must fail: {naive_first}");
        assert!(naive_second > CHI2_999_DOF30, "the negative control must fail: {naive_second}");
        // P(accept d0) = sum min(P0, Q0) = 0.5, and some second drafts are accepted too.
        assert!(accepted > trials / 2, "{accepted}");
    }

    /// A subtler bug than always accepting: resampling a rejected position from p instead of
    /// the residual max(0, p - q). The statistic must catch it too.
    #[test]
    fn resampling_from_p_instead_of_the_residual_is_caught() {
        let trials = 200_000;
        let mut s = seeded(12);
        let mut counts = [0_u64; V];
        for _ in 0..trials {
            let d = s.draw(&dist(&Q0));
            let ratio = P0[d as usize] / Q0[d as usize];
            let token = if s.uniform() < ratio { d } else { s.draw(&dist(&P0)) };
            counts[token as usize] += 1;
        }
        let stat = chi2(&counts, &dist(&P0));
        println!("resampling from p: first token chi2 {stat:.1} (critical {CHI2_999_DOF5})");
        assert!(stat > CHI2_999_DOF5, "{stat}");
    }

    /// N-gram style: a deterministic drafter (always 3, then 0), with the one-hot q passed
    /// explicitly and left out (empty), must also leave the target's distribution intact.
    #[test]
    fn one_hot_drafter_keeps_the_target_distribution() {
        let trials = 100_000;
        for explicit in [true, false] {
            let mut s = seeded(13);
            let drafts = [3, 0];
            let qs: Vec<Dist> = if explicit { drafts.iter().map(|&d| vec![(d, 1.0)]).collect() } else { Vec::new() };
            let mut tally = Tally::new();
            let mut accepted = 0;
            for _ in 0..trials {
                let out = accept_sampled(&drafts, &qs, &mut target_of(&drafts), &mut || s.uniform());
                accepted += out.0;
                tally.add(&drafts, out);
            }
            let first = chi2(&tally.first, &dist(&P0));
            let second = chi2(&tally.second[3], &p1(3));
            println!(
                "one-hot drafter (explicit q: {explicit}), {trials} trials: first token chi2 {first:.2}, \
                 second {second:.2} (critical {CHI2_999_DOF5} each)"
            );
            assert!(first < CHI2_999_DOF5, "first: {first} {:?}", tally.first);
            assert!(second < CHI2_999_DOF5, "second: {second} {:?}", tally.second[3]);
            // Only the drafted first token can have a second: the others were rejections.
            assert_eq!((0..V).filter(|&a| a != 3).map(|a| tally.second[a].iter().sum::<u64>()).sum::<u64>(), 0);
            // Acceptance of a one-hot draft is p(d): 0.15 + 0.15 * p1(3)(0).
            let expect = 0.15 + 0.15 * p1(3)[0].1;
            let rate = accepted as f64 / trials as f64;
            assert!((rate - expect).abs() < 0.01, "{rate} vs {expect}");
        }
    }

    /// With a one-hot target and one-hot drafts, rejection sampling is greedy verification:
    /// the same count and the target's token after it, whatever the coin flips, and the
    /// target is asked only for the positions reached.
    #[test]
    fn one_hot_target_reduces_to_greedy() {
        let mut s = seeded(14);
        let mut pick = |n: u32| (s.uniform() * f64::from(n)) as u32;
        for case in 0..2000 {
            let k = pick(5) as usize;
            let drafts: Vec<u32> = (0..k).map(|_| pick(3)).collect();
            let greedy: Vec<u32> = (0..=k).map(|_| pick(3)).collect();
            let qs: Vec<Dist> =
                if case % 2 == 0 { drafts.iter().map(|&d| vec![(d, 1.0)]).collect() } else { Vec::new() };
            let mut asked = Vec::new();
            let mut target = |i: usize| {
                asked.push(i);
                vec![(greedy[i], 1.0)]
            };
            let mut coin = seeded(case);
            let (m, token) = accept_sampled(&drafts, &qs, &mut target, &mut || coin.uniform());
            let expect = accept_greedy(&drafts, &greedy);
            assert_eq!((m, token), (expect, greedy[expect]), "drafts {drafts:?} target {greedy:?}");
            assert_eq!(asked, (0..=m).collect::<Vec<_>>());
        }
    }

    #[test]
    fn degenerate_inputs_do_not_panic() {
        let mut half = || 0.5;
        // No drafts: one draw from target(0).
        assert_eq!(accept_sampled(&[], &[], &mut |_| vec![(4, 1.0)], &mut half), (0, 4));
        // An empty target distribution rejects and yields token 0.
        assert_eq!(accept_sampled(&[2, 3], &[], &mut |_| Vec::new(), &mut half), (0, 0));
        // q(d) = 0 with p(d) > 0: accepted (the limit of min(1, p/q)).
        let p = || vec![(1, 0.5), (2, 0.5)];
        assert_eq!(accept_sampled(&[2], &[vec![(1, 1.0)]], &mut |_| p(), &mut || 0.999).0, 1);
        // q(d) = 0 and p(d) = 0: rejected, and the token comes from p's residual.
        let (m, token) = accept_sampled(&[7], &[vec![(1, 1.0)]], &mut |_| p(), &mut half);
        assert_eq!(m, 0);
        assert_eq!(token, 2, "the residual max(0, p - q) is all on token 2");
        // Unnormalised, NaN and negative entries.
        let messy = || vec![(1, 2.0), (2, f64::NAN), (3, -1.0), (1, 2.0)];
        assert_eq!(accept_sampled(&[3], &[vec![(3, 1.0)]], &mut |_| messy(), &mut half), (0, 1));
        assert_eq!(accept_sampled(&[1], &[vec![(1, 1.0)]], &mut |_| messy(), &mut half), (1, 1));
        // More drafts than draft distributions: the missing ones count as one-hot.
        let (m, _) = accept_sampled(&[1, 1], &[vec![(1, 0.5), (2, 0.5)]], &mut |_| vec![(1, 1.0)], &mut half);
        assert_eq!(m, 2);
        // A residual without mass is empty (the caller falls back to p).
        assert!(residual(&p(), Some(&p()), 1).is_empty());
        assert_eq!(residual(&p(), None, 1), vec![(2, 0.5)]);
    }
}
