//! The start-up watchdog: a start that stops making progress becomes an error naming the
//! stage it stopped in, instead of a process that never says "ready".
//!
//! Each kernel launch already has a deadline (`Backend::sync_within`); this covers what
//! lies outside one: a driver call that never returns, a compile or an upload that stalls.
//! Progress is any start-up event, so the limit bounds silence, not the whole start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where a start stalled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("start-up stalled: no progress in stage \"{stage}\" for {:.1} s (limit: --startup-timeout {})", quiet.as_secs_f64(), limit.as_secs_f64())]
pub struct Stall {
    /// The stage it stalled in.
    pub stage: &'static str,
    /// How long nothing happened.
    pub quiet: Duration,
    /// The limit.
    pub limit: Duration,
}

/// Watches a start from another thread; dropping it (or [`Watchdog::finish`]) stops it.
pub struct Watchdog {
    state: Arc<Mutex<(&'static str, Instant)>>,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    /// Starts watching; `on_stall` runs once, on the watchdog's thread, if `limit` passes
    /// without progress. It cannot interrupt the stalled call, so it should end the
    /// process (or the server) with the message.
    pub fn start(limit: Duration, on_stall: impl FnOnce(Stall) + Send + 'static) -> Watchdog {
        let state = Arc::new(Mutex::new(("start", Instant::now())));
        let done = Arc::new(AtomicBool::new(false));
        let (watched, stop) = (Arc::clone(&state), Arc::clone(&done));
        let tick = (limit / 20).clamp(Duration::from_millis(1), Duration::from_millis(100));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(tick);
                let (stage, since) = *watched.lock().unwrap_or_else(|e| e.into_inner());
                let quiet = since.elapsed();
                if quiet >= limit && !stop.load(Ordering::Acquire) {
                    on_stall(Stall { stage, quiet, limit });
                    return;
                }
            }
        });
        Watchdog { state, done }
    }

    /// Progress in `stage` (the current one, or the next).
    pub fn progress(&self, stage: &'static str) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = (stage, Instant::now());
    }

    /// The start is over: stop watching.
    pub fn finish(self) {}
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_past_the_limit_names_the_stage() {
        let (tx, rx) = std::sync::mpsc::channel();
        let dog = Watchdog::start(Duration::from_millis(200), move |s| tx.send(s).unwrap_or(()));
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(60));
            dog.progress("self-test");
        }
        assert!(rx.try_recv().is_err(), "progress keeps it quiet");
        dog.progress("warm-up");
        let stall = rx.recv_timeout(Duration::from_secs(5)).expect("reported");
        assert_eq!(stall.stage, "warm-up");
        assert!(stall.quiet >= Duration::from_millis(200));
        assert!(stall.to_string().starts_with("start-up stalled: no progress in stage \"warm-up\" for "), "{stall}");
    }

    #[test]
    fn a_finished_start_reports_nothing() {
        let (tx, rx) = std::sync::mpsc::channel();
        Watchdog::start(Duration::from_millis(50), move |s| tx.send(s).unwrap_or(())).finish();
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    }
}
