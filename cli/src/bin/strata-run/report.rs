//! What `strata-run` prints besides generated text: start-up events, expert placement
//! and cache statistics, and the benchmark tables.

use std::collections::BTreeMap;

use indicatif::{ProgressBar, ProgressStyle};
use strata_compiler::build::sass::HotLoop;
use strata_runtime::bench::KernelReport;
use strata_runtime::model::{ExpertStats, Placement};
use strata_runtime::session::Event;

/// Prints one start-up event.
pub(crate) fn report(event: Event<'_>, bar: &ProgressBar, tested: &mut usize, verbose_selftest: bool) {
    match event {
        Event::Stage(_) => {}
        Event::Unsupported(d) => eprintln!(
            "strata-run: skipping device {} ({}, {}): strata has no target for {}",
            d.ordinal, d.name, d.arch, d.arch
        ),
        Event::Skipped(backend, why) => eprintln!("strata-run: --backend auto: {backend} not used: {why}"),
        Event::Device(d) => eprintln!("strata-run: device: {} ({}, {})", d.name, d.arch, d.backend),
        Event::Compile(stage) => eprintln!("strata-compile: {stage:?}"),
        Event::Artifacts(dir) => eprintln!("strata-run: artifacts: {}", dir.display()),
        Event::SelfTestCached => eprintln!("strata-run: self-test: passed before on this device"),
        Event::SelfTest(o) => {
            *tested += 1;
            if verbose_selftest {
                let status = if o.passed() { "ok" } else { "FAIL" };
                println!(
                    "{:<44} {:>4} {:>10.2e} {:>9.1e} {:>9.1} us",
                    o.kernel,
                    status,
                    o.max_error,
                    o.tolerance,
                    o.time.as_secs_f64() * 1e6
                );
            } else if !o.passed() {
                eprintln!("strata-run: self-test: {}", o.failure());
            }
        }
        Event::Upload(done, total) => {
            if bar.is_hidden() && total > 0 {
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                bar.set_length(total);
                bar.set_style(
                    ProgressStyle::with_template("strata-run: uploading weights {bar:30} {bytes}/{total_bytes}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
            }
            bar.set_position(done);
        }
        Event::Experts(p) => bar.suspend(|| eprintln!("strata-run: {}", placement_line(p))),
    }
}

/// One line on where the experts went.
pub(crate) fn placement_line(p: &Placement) -> String {
    let mib = p.bytes as f64 / (1 << 20) as f64;
    if p.resident() {
        return format!("experts: all {} resident ({mib:.0} MiB)", p.experts);
    }
    let pcie = p.pcie.map_or(String::new(), |b| format!("; PCIe host to device {:.1} GB/s", b / 1e9));
    format!(
        "experts: {} of {} resident ({:.0}% of {mib:.0} MiB), the rest streamed from host memory, {} eviction{pcie}",
        p.slots,
        p.experts,
        100.0 * f64::from(p.slots) / f64::from(p.experts),
        format!("{:?}", p.policy).to_lowercase()
    )
}

/// One line on the expert cache's work.
pub(crate) fn expert_stats_line(p: &Placement, st: &ExpertStats) -> String {
    format!(
        "experts: {} of {} resident ({:.0}% of {:.0} MiB), hit {:.1}%, {:.1} MiB/token streamed, stall {:.2} ms/token, pcie {:.1} GB/s",
        p.slots,
        p.experts,
        100.0 * f64::from(p.slots) / f64::from(p.experts),
        p.bytes as f64 / (1 << 20) as f64,
        100.0 * st.hit_rate(),
        st.mib_per_token(),
        st.stall_ms_per_token(),
        p.pcie.unwrap_or(0.0) / 1e9
    )
}

/// The issue slots a weight of kernel `name` at `columns` columns, from its hot loop in the
/// artifacts' manifest ("-" where none was read: no cuobjdump at compile time, or no dot
/// or matrix-unit loop).
fn slots(hot: &BTreeMap<String, HotLoop>, name: &str, columns: u32) -> String {
    hot.get(name).and_then(|h| h.slots_per_weight(columns)).map_or_else(|| "-".into(), |s| format!("{s:.2}"))
}

/// The per-kernel table of `strata-run bench --kernels`; `hot` holds the kernels' hot
/// loops (the manifest's, by name) for the instructions a weight.
pub(crate) fn print_kernel_report(r: &KernelReport, hot: &BTreeMap<String, HotLoop>) {
    let copy = r.copy_bytes_per_s / 1e9;
    println!("copy bandwidth {copy:.0} GB/s (device to device, bytes read + written)");
    println!("{:<40} {:>12} {:>10} {:>9} {:>7} {:>9}", "kernel", "bytes", "time (us)", "GB/s", "% copy", "slots/wt");
    for k in &r.kernels {
        let gbs = k.bytes as f64 / k.seconds / 1e9;
        println!(
            "{:<40} {:>12} {:>10.2} {:>9.0} {:>6.1}% {:>9}",
            k.name,
            k.bytes,
            k.seconds * 1e6,
            gbs,
            100.0 * gbs / copy,
            slots(hot, &k.name, k.window)
        );
    }
    if !hot.is_empty() {
        println!(
            "slots/wt: instructions a lane issues a weight in the kernel's hot loop (its SASS, read at compile time)"
        );
    }
    print_gemm_report(r);
}

/// The GEMM table: each prompt-chunk product's rate, and the F16 ceiling where there is one.
fn print_gemm_report(r: &KernelReport) {
    if r.gemms.is_empty() {
        return;
    }
    println!();
    println!("GEMMs (TFLOP/s = 2 rows cols tokens / time)");
    println!("{:<40} {:>6} {:>10} {:>9}", "kernel", "tokens", "time (us)", "TFLOP/s");
    for g in &r.gemms {
        println!("{:<40} {:>6} {:>10.2} {:>9.1}", g.name, g.tokens, g.seconds * 1e6, g.tflops());
    }
    match &r.gemm_ceiling {
        Some(c) => println!("ceiling (F16, nothing to dequantize): {} {:.1} TFLOP/s", c.name, c.tflops()),
        None => println!("ceiling: no F16 GEMM in this model (an F16 pack measures it)"),
    }
}

/// The verify-window tables of `strata-run bench --kernels --windows`: one per GEMV shape,
/// rows indented so that scripts matching the per-kernel table's `^gemv_` lines skip them.
pub(crate) fn print_window_report(r: &KernelReport, hot: &BTreeMap<String, HotLoop>) {
    if r.windows.is_empty() {
        return;
    }
    println!();
    println!(
        "verify windows: each GEMV shape at every compiled window T (weights read once a launch; T past 16: the batch GEMV)"
    );
    for s in &r.windows {
        let one = s.timings.iter().find(|k| k.window == 1).map(|k| k.seconds);
        println!();
        println!("  {} ({} rows x {} cols, {})", s.base, s.rows, s.cols, s.quant);
        println!(
            "  {:<40} {:>3} {:>10} {:>10} {:>7} {:>7} {:>9}",
            "kernel", "T", "time (us)", "us/token", "x T=1", "GB/s", "slots/wt"
        );
        for k in &s.timings {
            let ratio = one.map_or(f64::NAN, |t| k.seconds / t);
            let mark = if k.window == 8 { "  <- T=8 (goal <= 1.25x)" } else { "" };
            println!(
                "  {:<40} {:>3} {:>10.2} {:>10.2} {:>6.2}x {:>7.0} {:>9}{mark}",
                s.base,
                k.window,
                k.seconds * 1e6,
                k.seconds * 1e6 / f64::from(k.window),
                ratio,
                k.bytes as f64 / k.seconds / 1e9,
                slots(hot, &k.name, k.window)
            );
        }
    }
}

/// `bench --batch --profile`'s table: the launches of one batched step grouped by kernel,
/// the costliest first, each with its launches, device µs and share of the step.
pub(crate) fn print_batch_profile(seqs: usize, times: &[(String, f64)]) {
    let mut kernels: Vec<(&str, usize, f64)> = Vec::new();
    for (name, seconds) in times {
        match kernels.iter_mut().find(|k| k.0 == name) {
            Some(k) => (k.1, k.2) = (k.1 + 1, k.2 + seconds),
            None => kernels.push((name, 1, *seconds)),
        }
    }
    kernels.sort_by(|a, b| b.2.total_cmp(&a.2));
    let total: f64 = times.iter().map(|t| t.1).sum();
    println!("step of {seqs} sequences, launch by launch: {:.1} us in {} launches", total * 1e6, times.len());
    println!("{:<44} {:>8} {:>10} {:>9} {:>6}", "kernel", "launches", "us a step", "us each", "share");
    for (name, launches, seconds) in kernels {
        let (us, share) = (seconds * 1e6, 100.0 * seconds / total.max(f64::MIN_POSITIVE));
        println!("{name:<44} {launches:>8} {us:>10.1} {:>9.2} {share:>5.1}%", us / launches as f64);
    }
}
