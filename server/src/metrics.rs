//! Counters for `/metrics`, in Prometheus' text format.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use strata_runtime::model::ExpertStats;
use strata_runtime::speculative::SpecStats;

/// What the server has done so far.
#[derive(Default)]
pub struct Metrics {
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    requests: AtomicU64,
    running: AtomicUsize,
    spec_verified: AtomicU64,
    spec_drafted: AtomicU64,
    spec_accepted: AtomicU64,
    waiting: AtomicUsize,
    /// The expert cache's counters (mixture-of-experts packs).
    experts: Mutex<ExpertStats>,
    /// Completion tokens in the last few seconds, for a current decode rate.
    recent: Mutex<Vec<Instant>>,
}

/// The window the decode rate is measured over.
const RATE_WINDOW: Duration = Duration::from_secs(5);

impl Metrics {
    /// A request was accepted.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A prompt was read.
    pub fn prompt_tokens(&self, n: usize, _took: Duration) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A token was generated.
    pub fn completion_token(&self) {
        self.completion_tokens.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut recent) = self.recent.lock() {
            let now = Instant::now();
            recent.retain(|t| now.duration_since(*t) < RATE_WINDOW);
            recent.push(now);
        }
    }

    /// A speculative step's tallies.
    pub fn spec(&self, step: SpecStats) {
        self.spec_verified.fetch_add(step.verified, Ordering::Relaxed);
        self.spec_drafted.fetch_add(step.drafted, Ordering::Relaxed);
        self.spec_accepted.fetch_add(step.accepted, Ordering::Relaxed);
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

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let rate = self.recent.lock().map_or(0.0, |mut recent| {
            let now = Instant::now();
            recent.retain(|t| now.duration_since(*t) < RATE_WINDOW);
            recent.len() as f64 / RATE_WINDOW.as_secs_f64()
        });
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            out.push_str(&format!("# HELP strata_{name} {help}\n# TYPE strata_{name} {kind}\nstrata_{name} {value}\n"));
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        metric("prompt_tokens_total", "counter", "Prompt tokens read.", load(&self.prompt_tokens));
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
            "Requests queued for a slot.",
            self.waiting.load(Ordering::Relaxed).to_string(),
        );
        out
    }
}
