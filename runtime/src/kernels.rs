//! The kernels a run may launch, by op: loaded from a manifest for a GPU, or planned on
//! demand for the CPU reference (which takes any shape and window).

use std::collections::HashMap;

use strata_compiler::ops::{self, Op};
use strata_compiler::plan::{Int8Dot, KernelRecord, Options, rules};
use strata_compiler::target::Target;

use crate::backend::RunError;

/// Kernel records by name.
#[derive(Clone, Debug)]
pub struct Kernels {
    by_name: HashMap<String, KernelRecord>,
    /// Where set, ops with no record are planned for this target on demand (CPU runs),
    /// with int8 GEMVs as the second field says.
    on_demand: Option<(Target, Options)>,
}

impl Kernels {
    /// The kernels of a manifest: ops with no compiled kernel are refused by name.
    pub fn compiled(specs: impl IntoIterator<Item = KernelRecord>) -> Kernels {
        Kernels { by_name: specs.into_iter().map(|s| (s.name.clone(), s)).collect(), on_demand: None }
    }

    /// Kernel records planned on demand (the CPU backend ignores launch geometry, so
    /// the target only fills the records' launch fields; its GEMMs take no stream-K
    /// workspace, its GEMVs are the int8-dot or float ones it computes).
    pub fn planned(target: Target, int8: Int8Dot) -> Kernels {
        let options = Options { int8, stream_k: false, gemv_mma_from: None, ..Options::default() };
        Kernels { by_name: HashMap::new(), on_demand: Some((target, options)) }
    }

    /// Kernels planned on demand with QSA blocks of `block` positions (the target's rule
    /// when `None`); compiled kernels keep theirs.
    pub fn with_qsa_block(mut self, block: Option<u32>) -> Kernels {
        if let Some((_, options)) = &mut self.on_demand {
            options.qsa_block = block.or(options.qsa_block);
        }
        self
    }

    /// The record of `op`.
    pub fn get(&mut self, op: &Op) -> Result<KernelRecord, RunError> {
        let name = op.kernel_name();
        if let Some(spec) = self.by_name.get(&name) {
            return Ok(spec.clone());
        }
        match &self.on_demand {
            Some((target, options)) => {
                let spec = rules::kernel_with(op.clone(), target, options);
                self.by_name.insert(name, spec.clone());
                Ok(spec)
            }
            None => Err(RunError::Other(format!(
                "kernel {name} is not in the artifacts; recompile them for this pack (strata-compile)"
            ))),
        }
    }

    /// The kernels known so far (all compiled ones; those planned on demand once asked for).
    pub fn specs(&self) -> impl Iterator<Item = &KernelRecord> {
        self.by_name.values()
    }

    /// KV positions per QSA block these kernels were planned with (their key summaries'
    /// granularity): the compiled rope_store's, or the target's rule when planning here.
    pub fn qsa_block(&self) -> Option<u32> {
        if let Some((target, options)) = &self.on_demand {
            return Some(options.qsa_block.unwrap_or_else(|| rules::qsa_block(target)));
        }
        self.by_name.values().find_map(|k| match k.op {
            Op::RopeStore(ops::RopeStore { block, .. }) => Some(block),
            _ => None,
        })
    }

    /// Whether a compiled kernel of this op exists (always true when planned on demand).
    pub fn has(&self, op: &Op) -> bool {
        self.on_demand.is_some() || self.by_name.contains_key(&op.kernel_name())
    }
}
