//! Token sampling on the host, after the device has produced a step's logits.
//!
//! The chain mirrors llama.cpp's default order so that results are comparable with it:
//! repetition penalty -> top-k -> top-p -> min-p -> temperature -> weighted draw. Truncation
//! therefore looks at temperature-1 probabilities, and temperature only reshapes what survives.
//! NaN logits are treated as `-inf` everywhere, so a broken logit can never be picked or panic.

use std::cmp::Ordering;

use rand::Rng;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

/// A probability distribution over token ids: (token, probability) pairs with positive
/// probabilities summing to 1; what [`Sampler::distribution`] returns and speculative
/// verification compares.
pub type Dist = Vec<(u32, f64)>;

/// Sampling settings; each filter has an "off" value so any subset of the chain can be used.
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// Divides the logits before the draw; `<= 0` means greedy (argmax), matching llama.cpp.
    pub temperature: f32,
    /// Keeps only the `top_k` highest logits; `0` turns the filter off.
    pub top_k: usize,
    /// Keeps the smallest set of best tokens whose probability reaches `top_p`; `>= 1` is off.
    pub top_p: f32,
    /// Drops tokens less likely than `min_p` times the best token's probability; `<= 0` is off.
    pub min_p: f32,
    /// Penalises recently seen tokens (llama.cpp rule); `1.0` is off.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalty looks at; `0` is off.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token already generated (OpenAI's
    /// `presence_penalty`); `0` is off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (OpenAI's
    /// `frequency_penalty`); `0` is off.
    pub frequency_penalty: f32,
    /// Seeds the `ChaCha20` generator so a run can be reproduced exactly.
    pub seed: u64,
    /// Added to the named tokens' logits before any other step (OpenAI's `logit_bias`:
    /// -100 all but bans a token, +100 all but forces it); empty is off.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults, so out-of-the-box output feels like the reference implementation.
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplerConfig {
    /// Deterministic argmax decoding, the mode used to compare against reference logits.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    /// Whether sampling reduces to argmax (temperature `<= 0`), so callers can skip the RNG path.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// Stateful sampler: owns the seeded RNG and a reusable candidate buffer (no per-step allocation).
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha20Rng,
    cands: Vec<(u32, f32)>,
    recent: Vec<u32>,
}

impl Sampler {
    /// Creates a sampler whose draws depend only on `cfg.seed`, so runs are reproducible.
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = ChaCha20Rng::seed_from_u64(cfg.seed);
        Self { cfg, rng, cands: Vec::new(), recent: Vec::new() }
    }

    /// The settings this sampler was built with, for logging and reports.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Whether [`Sampler::sample`] is exactly the argmax of the raw logits (greedy and no
    /// repetition penalty), so callers may use the device argmax and skip the logits download.
    pub fn is_greedy(&self) -> bool {
        self.cfg.is_greedy() && !self.penalises()
    }

    fn penalises(&self) -> bool {
        (self.cfg.repeat_penalty != 1.0 && self.cfg.repeat_last_n > 0)
            || self.cfg.presence_penalty != 0.0
            || self.cfg.frequency_penalty != 0.0
            || !self.cfg.logit_bias.is_empty()
    }

    /// [`Sampler::sample_with`] without presence or frequency penalties' history.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.sample_with(logits, history, &[])
    }

    /// Picks the next token from logits; `history` is the tokens so far (for the repetition
    /// penalty, llama.cpp style: positive logits divided, negative multiplied, over the last
    /// `repeat_last_n` distinct tokens), and `generated` the tokens generated so far (for
    /// the presence and frequency penalties). Returns 0 for empty logits rather than
    /// panicking.
    pub fn sample_with(&mut self, logits: &[f32], history: &[u32], generated: &[u32]) -> u32 {
        match self.filter(logits, history, generated) {
            Filtered::Empty => return 0,
            Filtered::Pick(t) => return t,
            Filtered::Cands => {}
        }
        let max = self.cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
        let total: f64 = self.cands.iter().map(|c| weight(c.1, max)).sum();
        let u = self.uniform();
        let target = u * total;
        let mut cum = 0.0;
        let mut last = self.cands[0].0;
        for c in self.cands.iter() {
            let w = weight(c.1, max);
            if w > 0.0 {
                cum += w;
                last = c.0;
                if cum > target {
                    return c.0;
                }
            }
        }
        // Only reachable through rounding at the very top of the range.
        last
    }

    /// The distribution [`Sampler::sample_with`] draws from for the same inputs (same
    /// penalties and filters), as (token, probability) pairs with probabilities > 0 summing
    /// to 1, in the order the draw walks them. Speculative verification needs the target's
    /// and the drafter's probabilities, not just a token; both come from the one filter
    /// chain, so they cannot drift from `sample_with`. Greedy configs give a one-hot on the
    /// token `sample_with` returns; empty logits give an empty distribution (whose
    /// [`Sampler::draw`] is 0, as `sample_with`'s result). Consumes no randomness.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32], generated: &[u32]) -> Dist {
        match self.filter(logits, history, generated) {
            Filtered::Empty => Vec::new(),
            Filtered::Pick(t) => vec![(t, 1.0)],
            Filtered::Cands => {
                let max = self.cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
                let total: f64 = self.cands.iter().map(|c| weight(c.1, max)).sum();
                self.cands.iter().map(|c| (c.0, weight(c.1, max) / total)).filter(|&(_, p)| p > 0.0).collect()
            }
        }
    }

    /// One uniform draw in [0, 1) (53 random bits) from this sampler's seeded RNG, the same
    /// draw `sample_with` makes, so speculative verification's accept/reject coin flips are
    /// reproducible from the seed too.
    pub fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1_u64 << 53) as f64)
    }

    /// One token from a distribution such as [`Sampler::distribution`]'s, using one
    /// [`Sampler::uniform`] draw; see [`draw_with`] for the rounding rules (never panics;
    /// 0 for an empty distribution).
    pub fn draw(&mut self, dist: &[(u32, f64)]) -> u32 {
        let u = self.uniform();
        draw_with(dist, u)
    }

    /// The filter chain shared by [`Sampler::sample_with`] and [`Sampler::distribution`]:
    /// penalties, then either the greedy pick or top-k -> top-p -> min-p -> temperature,
    /// leaving the survivors (with tempered logits, never empty) in `self.cands`.
    fn filter(&mut self, logits: &[f32], history: &[u32], generated: &[u32]) -> Filtered {
        if logits.is_empty() {
            return Filtered::Empty;
        }
        let penalise = self.cfg.repeat_penalty != 1.0 && self.cfg.repeat_last_n > 0 && !history.is_empty();
        let openai = (self.cfg.presence_penalty != 0.0 || self.cfg.frequency_penalty != 0.0) && !generated.is_empty();
        if self.cfg.is_greedy() && !penalise && !openai && self.cfg.logit_bias.is_empty() {
            return Filtered::Pick(argmax(logits));
        }

        let cands = &mut self.cands;
        cands.clear();
        cands.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, sanitize(l))));
        for &(t, bias) in &self.cfg.logit_bias {
            if let Some(c) = cands.get_mut(t as usize) {
                c.1 += bias;
            }
        }

        if openai {
            let mut counts = std::collections::HashMap::<u32, u32>::new();
            for &t in generated {
                *counts.entry(t).or_default() += 1;
            }
            for (t, n) in counts {
                if let Some(c) = cands.get_mut(t as usize) {
                    c.1 -= self.cfg.presence_penalty + self.cfg.frequency_penalty * n as f32;
                }
            }
        }

        if penalise {
            let start = history.len().saturating_sub(self.cfg.repeat_last_n);
            self.recent.clear();
            self.recent.extend_from_slice(&history[start..]);
            self.recent.sort_unstable();
            self.recent.dedup();
            let p = self.cfg.repeat_penalty;
            for &t in &self.recent {
                // Candidates are still in id order here, so the id indexes directly.
                if let Some(c) = cands.get_mut(t as usize) {
                    c.1 = if c.1 <= 0.0 { c.1 * p } else { c.1 / p };
                }
            }
        }

        if self.cfg.is_greedy() {
            return Filtered::Pick(best_of(cands));
        }

        let mut sorted = false;
        let k = self.cfg.top_k;
        if k > 0 && k < cands.len() {
            keep_best(cands, k);
            sorted = true;
        }

        if self.cfg.top_p < 1.0 {
            if !sorted {
                cands.sort_unstable_by(by_logit_desc);
                sorted = true;
            }
            let max = cands[0].1;
            let total: f64 = cands.iter().map(|c| weight(c.1, max)).sum();
            let target = f64::from(self.cfg.top_p) * total;
            let mut cum = 0.0;
            let mut keep = cands.len();
            for (i, c) in cands.iter().enumerate() {
                cum += weight(c.1, max);
                if cum >= target {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep.max(1));
        }

        if self.cfg.min_p > 0.0 {
            let max = if sorted { cands[0].1 } else { cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1)) };
            // prob >= min_p * max_prob  <=>  logit >= max_logit + ln(min_p); the max always survives.
            let threshold = max + self.cfg.min_p.ln();
            cands.retain(|c| c.1 >= threshold || c.1 == max);
        }

        let t = self.cfg.temperature;
        for c in cands.iter_mut() {
            c.1 /= t;
        }
        Filtered::Cands
    }
}

/// What [`Sampler::filter`] left: nothing to choose from, a deterministic pick, or the
/// surviving candidates (tempered logits) in the sampler's buffer.
enum Filtered {
    Empty,
    Pick(u32),
    Cands,
}

/// A token from a distribution given the uniform `u` in [0, 1): the first token whose
/// cumulative probability exceeds `u` times the total, so unnormalised weights work too
/// (speculative verification's residuals). Non-positive and non-finite entries are never
/// drawn; if rounding leaves the sum short, the last positive token is returned; an empty
/// (or all-zero) distribution gives 0, as [`Sampler::sample_with`] does for empty logits.
pub fn draw_with(dist: &[(u32, f64)], u: f64) -> u32 {
    let total: f64 = dist.iter().map(|&(_, p)| usable(p)).sum();
    let target = u * total;
    let mut cum = 0.0;
    let mut last = 0;
    for &(t, p) in dist {
        let p = usable(p);
        if p > 0.0 {
            cum += p;
            last = t;
            if cum > target {
                return t;
            }
        }
    }
    last
}

/// A probability as a weight: NaN, infinite or non-positive entries count as 0.
pub(crate) fn usable(p: f64) -> f64 {
    if p.is_finite() && p > 0.0 { p } else { 0.0 }
}

/// Greedy argmax with lowest index winning ties (same rule as the device argmax kernel).
/// NaN counts as `-inf`; empty or all-NaN input yields 0.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0_usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l > best_v {
            best = i;
            best_v = l;
        }
    }
    best as u32
}

/// The k highest (id, logit), highest first, ties by lower id; used for reports and reference
/// comparisons. NaN logits are returned as `-inf`.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut v: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, sanitize(l))).collect();
    keep_best(&mut v, k);
    v
}

/// Keeps the `k` best of `cands` (highest logit, then lowest id), best first. One pass
/// against the worst of the best so far: with k in the tens and a vocabulary of 10⁵,
/// nearly every candidate costs one comparison, where selecting in place moved them all
/// (a sampled token's largest host cost).
fn keep_best(cands: &mut Vec<(u32, f32)>, k: usize) {
    /// A candidate ordered worst last, so that a max-heap's top is the worst kept.
    #[derive(Clone, Copy)]
    struct Ranked((u32, f32));
    impl PartialEq for Ranked {
        fn eq(&self, other: &Self) -> bool {
            self.cmp(other) == Ordering::Equal
        }
    }
    impl Eq for Ranked {}
    impl PartialOrd for Ranked {
        fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Ranked {
        fn cmp(&self, other: &Self) -> Ordering {
            by_logit_desc(&self.0, &other.0)
        }
    }
    if k >= cands.len() {
        cands.sort_unstable_by(by_logit_desc);
        return;
    }
    let mut best = std::collections::BinaryHeap::with_capacity(k);
    // The worst kept logit: a candidate below it is out at one float comparison.
    let mut floor = f32::NEG_INFINITY;
    for &c in cands.iter() {
        if best.len() < k {
            best.push(Ranked(c));
        } else if c.1 >= floor && best.peek().is_some_and(|w| by_logit_desc(&c, &w.0) == Ordering::Less) {
            if let Some(mut worst) = best.peek_mut() {
                *worst = Ranked(c);
            }
        } else {
            continue;
        }
        if best.len() == k {
            floor = best.peek().map_or(floor, |w| w.0.1);
        }
    }
    cands.clear();
    cands.extend(best.into_sorted_vec().into_iter().map(|r| r.0));
}

/// NaN -> `-inf`, so comparisons are total and NaN is never chosen.
fn sanitize(l: f32) -> f32 {
    if l.is_nan() { f32::NEG_INFINITY } else { l }
}

/// Highest logit first, lower id first among equal logits (inputs are NaN-free).
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.partial_cmp(&a.1).unwrap_or(Ordering::Equal).then(a.0.cmp(&b.0))
}

/// Argmax over candidates with the lowest id winning ties.
fn best_of(cands: &[(u32, f32)]) -> u32 {
    let mut best = (0_u32, f32::NEG_INFINITY);
    for &c in cands {
        if c.1 > best.1 || (c.1 == best.1 && c.0 < best.0) {
            best = c;
        }
    }
    best.0
}

/// Unnormalised softmax weight relative to `max`; `l == max` gives 1 so `+inf`/all-`-inf`
/// inputs stay finite instead of producing NaN.
fn weight(l: f32, max: f32) -> f64 {
    if l == max { 1.0 } else { f64::from(l - max).exp() }
}

/// Detects stop strings in streamed text: holds back any suffix that could begin a stop string,
/// so a stop split across detokenised pieces is never partially shown to the user.
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Builds a matcher; empty stop strings are ignored (they would stop before any output).
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self { stops, held: String::new(), stopped: false }
    }

    /// Feeds the next decoded piece. Returns (text safe to emit, stopped?) — on a stop, the text
    /// up to (not including) the stop string. After a stop every call returns `("", true)`.
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.held.push_str(piece);
        let hit = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(pos) = hit {
            self.held.truncate(pos);
            self.stopped = true;
            return (std::mem::take(&mut self.held), true);
        }
        let keep_from = self.partial_start();
        let rest = self.held.split_off(keep_from);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// Ends the stream: returns the held-back text that turned out not to be a stop
    /// (empty if a stop was already hit).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            self.held.clear();
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Byte offset of the earliest suffix of `held` that is a proper prefix of some stop string.
    fn partial_start(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let from = self.held.len().saturating_sub(longest.saturating_sub(1));
        (from..self.held.len())
            .filter(|&i| self.held.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.held.as_bytes()[i..];
                self.stops.iter().any(|s| s.as_bytes().starts_with(tail))
            })
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests;
