//! Counters for `/metrics`, in Prometheus' text format.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use strata_runtime::model::ExpertStats;
use strata_runtime::speculative::SpecStats;

/// Upper bounds (seconds) of the time-to-first-token buckets.
const TTFT_BUCKETS: [f64; 14] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0];

/// Upper bounds (seconds) of the inter-token latency buckets.
/// Fine enough between 10 and 250 ms to tell whether a decode step stays within twice the
/// median while a long prompt is read (issue 22).
const ITL_BUCKETS: [f64; 21] = [
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25,
    0.5, 1.0, 2.5,
];

/// A Prometheus histogram with fixed buckets.
struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), then the count above the last bound.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    fn observe(&mut self, seconds: f64) {
        let i = self.bounds.iter().position(|&b| seconds <= b).unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += seconds;
    }

    /// The text exposition: cumulative `_bucket` series, `_sum` and `_count`.
    fn render(&self, out: &mut String, name: &str, help: &str) {
        out.push_str(&format!("# HELP strata_{name} {help}\n# TYPE strata_{name} histogram\n"));
        let mut total = 0;
        for (i, n) in self.counts.iter().enumerate() {
            total += n;
            let le = self.bounds.get(i).map_or_else(|| "+Inf".to_owned(), f64::to_string);
            out.push_str(&format!("strata_{name}_bucket{{le=\"{le}\"}} {total}\n"));
        }
        out.push_str(&format!("strata_{name}_sum {:.6}\nstrata_{name}_count {total}\n", self.sum));
    }
}

/// The latency histograms.
struct Latencies {
    ttft: Histogram,
    itl: Histogram,
}

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies { ttft: Histogram::new(&TTFT_BUCKETS), itl: Histogram::new(&ITL_BUCKETS) }
    }
}

/// What the server has done so far.
#[derive(Default)]
pub struct Metrics {
    prompt_tokens: AtomicU64,
    prompt_tokens_cached: AtomicU64,
    completion_tokens: AtomicU64,
    requests: AtomicU64,
    running: AtomicUsize,
    spec_verified: AtomicU64,
    spec_drafted: AtomicU64,
    spec_accepted: AtomicU64,
    /// Batched decode passes and the sequences they held.
    batches: AtomicU64,
    batched: AtomicU64,
    /// The most sequences one of those passes held.
    widest: AtomicU64,
    waiting: AtomicUsize,
    /// The KV pool: pages free, reserved by running requests, in all; positions a page.
    kv: Mutex<[u32; 4]>,
    /// The expert cache's counters (mixture-of-experts packs).
    experts: Mutex<ExpertStats>,
    /// Completion tokens in the last few seconds, oldest first, for a current decode rate
    /// (expired ones leave from the front: a token's cost does not grow with the rate).
    recent: Mutex<VecDeque<Instant>>,
    /// Time to first token and between tokens.
    latencies: Mutex<Latencies>,
}

/// The window the decode rate is measured over.
const RATE_WINDOW: Duration = Duration::from_secs(5);

/// Drops the tokens older than the rate window from the front of `recent`.
fn expire(recent: &mut VecDeque<Instant>, now: Instant) {
    while recent.front().is_some_and(|t| now.saturating_duration_since(*t) >= RATE_WINDOW) {
        recent.pop_front();
    }
}

impl Metrics {
    /// A request was accepted.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A prompt of `n` tokens was read, `cached` of them from a slot's KV cache.
    pub fn prompt_tokens(&self, n: usize, cached: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
        self.prompt_tokens_cached.fetch_add(cached as u64, Ordering::Relaxed);
    }

    /// A token was generated.
    pub fn completion_token(&self) {
        self.completion_tokens.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut recent) = self.recent.lock() {
            let now = Instant::now();
            expire(&mut recent, now);
            recent.push_back(now);
        }
    }

    /// A request's first token was reported, `took` after the request arrived.
    pub fn first_token(&self, took: Duration) {
        if let Ok(mut l) = self.latencies.lock() {
            l.ttft.observe(took.as_secs_f64());
        }
    }

    /// A later token was reported, `gap` after the request's previous one.
    pub fn inter_token(&self, gap: Duration) {
        if let Ok(mut l) = self.latencies.lock() {
            l.itl.observe(gap.as_secs_f64());
        }
    }

    /// A speculative step's tallies.
    pub fn spec(&self, step: SpecStats) {
        self.spec_verified.fetch_add(step.verified, Ordering::Relaxed);
        self.spec_drafted.fetch_add(step.drafted, Ordering::Relaxed);
        self.spec_accepted.fetch_add(step.accepted, Ordering::Relaxed);
    }

    /// A batched decode pass of `sequences` sequences ran.
    pub fn batch(&self, sequences: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched.fetch_add(sequences as u64, Ordering::Relaxed);
        self.widest.fetch_max(sequences as u64, Ordering::Relaxed);
    }

    /// The expert cache's counters since the last report.
    pub fn experts(&self, step: &ExpertStats) {
        if let Ok(mut total) = self.experts.lock() {
            total.add(step);
        }
    }

    /// Requests in slots and in the queue.
    pub fn set_load(&self, running: usize, waiting: usize) {
        self.running.store(running, Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Relaxed);
    }

    /// The KV pool's pages: free, reserved by the running requests, in all, and the
    /// positions a page holds.
    pub fn set_kv(&self, free: u32, reserved: u32, total: u32, block: u32) {
        if let Ok(mut kv) = self.kv.lock() {
            *kv = [free, reserved, total, block];
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let rate = self.recent.lock().map_or(0.0, |mut recent| {
            let now = Instant::now();
            expire(&mut recent, now);
            recent.len() as f64 / RATE_WINDOW.as_secs_f64()
        });
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            out.push_str(&format!("# HELP strata_{name} {help}\n# TYPE strata_{name} {kind}\nstrata_{name} {value}\n"));
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        metric("prompt_tokens_total", "counter", "Prompt tokens of the requests served.", load(&self.prompt_tokens));
        metric(
            "prompt_tokens_cached_total",
            "counter",
            "Of those, tokens a slot's KV cache held already (not computed again).",
            load(&self.prompt_tokens_cached),
        );
        metric("completion_tokens_total", "counter", "Tokens generated.", load(&self.completion_tokens));
        metric("requests_total", "counter", "Generation requests accepted.", load(&self.requests));
        metric(
            "decode_tokens_per_second",
            "gauge",
            "Tokens generated per second over the last 5 s.",
            format!("{rate:.3}"),
        );
        let (verified, drafted, accepted) = (
            self.spec_verified.load(Ordering::Relaxed),
            self.spec_drafted.load(Ordering::Relaxed),
            self.spec_accepted.load(Ordering::Relaxed),
        );
        metric("spec_verify_passes_total", "counter", "Speculative verify passes.", verified.to_string());
        metric("spec_draft_tokens_total", "counter", "Draft tokens proposed to verify passes.", drafted.to_string());
        metric("spec_accepted_tokens_total", "counter", "Draft tokens accepted.", accepted.to_string());
        let ratio = SpecStats { verified, drafted, accepted };
        metric(
            "spec_acceptance_ratio",
            "gauge",
            "Accepted over proposed draft tokens since start.",
            format!("{:.4}", ratio.acceptance()),
        );
        metric(
            "spec_mean_accepted_length",
            "gauge",
            "Draft tokens accepted per verify pass since start.",
            format!("{:.4}", ratio.mean_accepted()),
        );
        metric(
            "decode_batches_total",
            "counter",
            "Decode passes that advanced several requests at once.",
            load(&self.batches),
        );
        metric(
            "decode_batched_sequences_total",
            "counter",
            "Requests those passes advanced (over decode_batches_total: the mean batch).",
            load(&self.batched),
        );
        metric(
            "decode_batch_widest",
            "gauge",
            "The most requests one decode pass advanced since start (past 16: a pass on the GEMMs).",
            load(&self.widest),
        );
        let experts = self.experts.lock().map(|e| e.clone()).unwrap_or_default();
        metric("expert_lookups_total", "counter", "Experts a layer's pass needed.", experts.lookups.to_string());
        metric("expert_hits_total", "counter", "Of those, already on the device.", experts.hits.to_string());
        metric(
            "expert_streamed_bytes_total",
            "counter",
            "Expert bytes uploaded from host memory (misses and prefetches).",
            experts.uploaded.to_string(),
        );
        metric(
            "expert_stall_seconds_total",
            "counter",
            "Seconds kernels waited for expert uploads.",
            format!("{:.6}", experts.stall),
        );
        metric("requests_running", "gauge", "Requests in a slot.", self.running.load(Ordering::Relaxed).to_string());
        metric(
            "requests_waiting",
            "gauge",
            "Requests queued for a slot or for KV pages.",
            self.waiting.load(Ordering::Relaxed).to_string(),
        );
        let [free, reserved, total, block] = self.kv.lock().map_or([0; 4], |kv| *kv);
        metric("kv_pages_total", "gauge", "Pages of the KV cache pool.", total.to_string());
        metric("kv_page_positions", "gauge", "KV positions a page holds.", block.to_string());
        metric(
            "kv_pages_free",
            "gauge",
            "Pages no slot holds (the rest hold running requests or idle slots' cached prefixes).",
            free.to_string(),
        );
        metric(
            "kv_pages_reserved",
            "gauge",
            "Pages reserved for the running requests (prompt and every token each may generate).",
            reserved.to_string(),
        );
        if let Ok(l) = self.latencies.lock() {
            l.ttft.render(
                &mut out,
                "time_to_first_token_seconds",
                "Seconds from a request's arrival to its first generated token.",
            );
            l.itl.render(
                &mut out,
                "inter_token_latency_seconds",
                "Seconds between consecutive generated tokens of a request.",
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_window_drops_expired_tokens_from_the_front_only() {
        let now = Instant::now();
        let mut recent: VecDeque<Instant> =
            [7, 5, 4, 1].iter().filter_map(|&s| now.checked_sub(Duration::from_secs(s))).collect();
        if recent.len() < 4 {
            return; // the clock started less than 7 s ago
        }
        expire(&mut recent, now);
        assert_eq!(recent.len(), 2);
        expire(&mut recent, now);
        assert_eq!(recent.len(), 2);
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let m = Metrics::default();
        m.first_token(Duration::from_millis(30));
        m.first_token(Duration::from_secs(100));
        m.inter_token(Duration::from_millis(4));
        let text = m.render();
        assert!(text.contains("# TYPE strata_time_to_first_token_seconds histogram\n"), "{text}");
        assert!(text.contains("strata_time_to_first_token_seconds_bucket{le=\"0.025\"} 0\n"), "{text}");
        assert!(text.contains("strata_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"), "{text}");
        assert!(text.contains("strata_time_to_first_token_seconds_bucket{le=\"80\"} 1\n"), "{text}");
        assert!(text.contains("strata_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("strata_time_to_first_token_seconds_count 2\n"), "{text}");
        assert!(text.contains("strata_time_to_first_token_seconds_sum 100.030000\n"), "{text}");
        assert!(text.contains("strata_inter_token_latency_seconds_bucket{le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("strata_inter_token_latency_seconds_count 1\n"), "{text}");
    }
}
