//! The host backend's workers: threads that wait for a launch's parts by spinning a
//! moment and then sleeping, so the back-to-back launches of a forward pass reach them
//! in well under a microsecond, while an idle backend costs no CPU. The calling thread
//! runs part 0 itself.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spins of a waiting worker before it sleeps (a few milliseconds).
const SPINS: u32 = 1 << 18;

/// `threads - 1` worker threads beside the caller.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

struct Shared {
    /// Bumped once per job; workers run the job of each new value.
    generation: AtomicU64,
    /// The job: its closure's address and the function that calls it.
    data: AtomicUsize,
    call: AtomicUsize,
    /// Workers yet to finish the current job.
    pending: AtomicUsize,
    stop: AtomicBool,
    /// Workers asleep, and their wake-up.
    sleeping: Mutex<usize>,
    wake: Condvar,
}

/// Calls the job closure `F` at `data` for part `part`.
fn trampoline<F: Fn(usize) + Sync>(data: usize, part: usize) {
    // SAFETY: `data` is the address of the `F` that `run` keeps borrowed until every
    // worker has finished this job.
    let f = unsafe { &*(data as *const F) };
    f(part);
}

impl Pool {
    /// A pool of `threads` parts in all (at least one: the caller).
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            data: AtomicUsize::new(0),
            call: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            sleeping: Mutex::new(0),
            wake: Condvar::new(),
        });
        let mut workers = Vec::new();
        for part in 1..threads.max(1) {
            let shared = Arc::clone(&shared);
            workers.push(
                std::thread::Builder::new().name(format!("strata-host-{part}")).spawn(move || work(&shared, part))?,
            );
        }
        Ok(Pool { shared, workers })
    }

    /// Runs `f(part)` for every part, part 0 on this thread, and returns when all are done.
    pub fn run<F: Fn(usize) + Sync>(&self, f: &F) {
        let s = &*self.shared;
        if self.workers.is_empty() {
            f(0);
            return;
        }
        s.data.store(f as *const F as usize, Ordering::Relaxed);
        s.call.store(trampoline::<F> as fn(usize, usize) as usize, Ordering::Relaxed);
        s.pending.store(self.workers.len(), Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::Release);
        if *s.sleeping.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
            s.wake.notify_all();
        }
        f(0);
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < SPINS {
                spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

fn work(s: &Shared, part: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let generation = loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                break g;
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            spins += 1;
            if spins < SPINS {
                spin_loop();
                continue;
            }
            // Sleep until the next job: the generation is checked again under the lock
            // that `run` takes to wake sleepers after bumping it, so no wake-up is lost.
            let mut sleeping = s.sleeping.lock().unwrap_or_else(|e| e.into_inner());
            *sleeping += 1;
            while s.generation.load(Ordering::Acquire) == seen && !s.stop.load(Ordering::Relaxed) {
                sleeping = s.wake.wait(sleeping).unwrap_or_else(|e| e.into_inner());
            }
            *sleeping -= 1;
            spins = 0;
        };
        seen = generation;
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        let (data, call) = (s.data.load(Ordering::Relaxed), s.call.load(Ordering::Relaxed));
        // SAFETY: `call` is the `trampoline` that `run` stored with `data` before
        // publishing this generation (Release/Acquire on `generation`).
        let call: fn(usize, usize) = unsafe { std::mem::transmute::<usize, fn(usize, usize)>(call) };
        call(data, part);
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.generation.fetch_add(1, Ordering::Release);
        drop(self.shared.sleeping.lock().unwrap_or_else(|e| e.into_inner()));
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_runs_once_per_job_across_many_jobs_and_sleeps() {
        let pool = Pool::new(3).expect("threads");
        let hits = [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)];
        for round in 0..2000 {
            pool.run(&|part| {
                hits[part].fetch_add(1, Ordering::Relaxed);
            });
            if round == 1000 {
                // Long enough for the workers to fall asleep.
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 2000));
    }
}
