//! strata-compiler: from a GGUF pack and a target to the kernels that pack needs.
pub mod quant;
