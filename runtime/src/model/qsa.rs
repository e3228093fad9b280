//! QSA (query-aware block-sparse decode attention, after Quest): which passes attend
//! sparsely, and to how many KV blocks.
//!
//! Decode steps and verify windows past the budget select, per token and KV head, the
//! blocks whose key summaries bound the query's scores highest, and attend to those
//! only. Prefill, the first [`DENSE_LAYERS`] layers and contexts within the budget stay
//! dense: there sparsity would save little or cost accuracy.

/// Layers that always attend densely (their attention is broad; Quest keeps them so).
pub const DENSE_LAYERS: usize = 2;
/// Tokens kept per (token, KV head) unless `--qsa-budget` says otherwise.
pub const DEFAULT_BUDGET: u32 = 2048;

/// `--qsa`, `--qsa-budget`, `--qsa-block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QsaConfig {
    /// Whether decode passes past the budget attend sparsely.
    pub enabled: bool,
    /// KV positions kept per (token, KV head), the first and newest blocks included: a
    /// multiple of the block, at least two blocks.
    pub budget: u32,
    /// The block the user expects (it must be the one the kernels were compiled with).
    pub block: Option<u32>,
}

impl QsaConfig {
    /// Dense attention everywhere.
    pub const OFF: QsaConfig = QsaConfig { enabled: false, budget: DEFAULT_BUDGET, block: None };

    /// Blocks kept per (token, KV head) with blocks of `compiled` positions, or why the
    /// settings do not fit them.
    pub fn blocks(&self, compiled: u32) -> Result<u32, String> {
        if let Some(block) = self.block
            && block != compiled
        {
            return Err(format!(
                "--qsa-block {block}: these kernels keep key summaries per {compiled} positions; compile with strata-compile --qsa-block {block}"
            ));
        }
        if compiled == 0 || !self.budget.is_multiple_of(compiled) || self.budget < 2 * compiled {
            return Err(format!(
                "--qsa-budget {} must be a multiple of the {compiled}-position block, at least {}",
                self.budget,
                2 * compiled
            ));
        }
        Ok(self.budget / compiled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_whole_blocks_and_blocks_must_match() {
        let qsa = |budget, block| QsaConfig { enabled: true, budget, block };
        assert_eq!(qsa(2048, None).blocks(16), Ok(128));
        assert_eq!(qsa(32, Some(16)).blocks(16), Ok(2));
        assert!(qsa(16, None).blocks(16).unwrap_err().contains("at least 32"));
        assert!(qsa(100, None).blocks(16).unwrap_err().contains("multiple of the 16-position block"));
        assert!(qsa(2048, Some(32)).blocks(16).unwrap_err().contains("strata-compile --qsa-block 32"));
    }
}
