//! strata-compiler: from a GGUF pack and a target to the kernels that pack needs.
//!
//! Stages are pure functions over plain data: [`pack`] reads and validates the GGUF
//! container, [`model`] derives the typed model description, [`quant`] holds the block
//! formats and their CPU reference dequantizers. [`synth`] writes synthetic packs and
//! [`inspect`] describes a pack for people and tools.

pub mod artifacts;
pub mod build;
pub mod check;
pub mod digest;
pub mod emit;
pub mod forward;
pub mod host;
pub mod inspect;
pub mod model;
pub mod ops;
pub mod pack;
pub mod plan;
pub mod quant;
pub mod synth;
pub mod target;
