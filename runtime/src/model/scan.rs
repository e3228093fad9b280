//! The load-time scan for non-finite weights: every element of the norms, biases and
//! float matrices, the fp16 scale(s) of every block of the quantized ones. A NaN there
//! flows into every token's logits and greedy argmax answers token 0 (an empty answer,
//! exit 0), so a pack holding one is refused at load, naming the tensor and where.
//!
//! Quantized tensors cost a read of two to four bytes a block (a few percent of their
//! bytes, the cache lines the upload then copies anyway); the tensors are scanned in
//! parallel. `tests/tests/finite_scan.rs` measures the cost against the whole load.

use rayon::prelude::*;
use strata_compiler::pack::{Pack, escaped};
use strata_compiler::quant::first_non_finite;

use crate::backend::RunError;

/// Refuses the first tensor (in file order) holding a non-finite element or block scale.
pub fn check_finite(pack: &Pack) -> Result<(), RunError> {
    let found = pack
        .tensors()
        .par_iter()
        .enumerate()
        .filter_map(|(i, t)| first_non_finite(t.ty, pack.data(t)).map(|bad| (i, t, bad)))
        .min_by_key(|(i, _, _)| *i);
    match found {
        Some((_, t, bad)) => Err(RunError::Other(format!(
            "{}: tensor {}: {bad}: the pack's weights are damaged (refusing to load)",
            escaped(&pack.path().display().to_string()),
            escaped(&t.name)
        ))),
        None => Ok(()),
    }
}
