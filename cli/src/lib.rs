//! What the `strata-compile` and `strata-run` binaries share beyond the library crates:
//! getting models from the Hugging Face hub (kept here so that the runtime and the server
//! stay free of an HTTP client).

pub mod pull;
