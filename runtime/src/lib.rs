//! strata-runtime: loads compiled artifacts beside a pack's weights, self-tests every
//! kernel against the CPU reference and runs models.

pub mod artifacts;
pub mod backend;
pub mod bench;
pub mod chat;
pub mod constrain;
pub mod generate;
pub mod kernels;
pub mod model;
pub mod sampler;
pub mod selftest;
pub mod session;
pub mod speculative;
pub mod tokenizer;
pub mod watchdog;
