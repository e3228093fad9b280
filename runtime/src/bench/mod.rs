//! Benchmarks of a loaded [`Model`](crate::model::Model)'s kernels, behind `strata-run
//! bench`: each GEMV timed alone beside the device's copy bandwidth (`kernels.rs`), and
//! one layer's decode attention at several depths, dense and with QSA (`attention.rs`).
//!
//! They are methods of the model (they time its own kernels on its backend, in its
//! scratch and caches) but live apart from it: no forward pass calls them.

mod attention;
mod kernels;

pub use attention::AttentionTiming;
pub use kernels::{GEMM_TOKENS, GemmTiming, KernelReport, KernelTiming, WindowSweep};
