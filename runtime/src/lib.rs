//! strata-runtime: loads compiled artifacts beside a pack's weights, self-tests every
//! kernel against the CPU reference and runs models.
//!
//! Empty until the runtime issue lands; the crate exists so the workspace has its final
//! shape and the CLI can depend on it.
