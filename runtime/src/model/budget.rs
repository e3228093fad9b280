//! The memory a context needs, checked against a budget before anything is allocated.
//!
//! A pack's training context may be 2^24 positions or more; its KV caches and RoPE
//! table would then ask for terabytes. An allocation that large aborts the process (or,
//! committed lazily, gets it killed later) instead of failing, so the sizes are computed
//! with checked arithmetic first and refused with what was too large and the budget.

use strata_compiler::inspect::bytes;
use strata_compiler::model::{MAX_CONTEXT, ModelDesc};

use crate::backend::{DeviceInfo, RunError};

/// Memory the model may use: the device's, or on the CPU what the host has available.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// Bytes.
    pub bytes: u64,
    /// Where the number comes from, for messages.
    pub source: &'static str,
}

impl Budget {
    /// The budget of `device`: its memory, else the host's available memory (what it can
    /// give without swapping: more would be committed lazily and end in the OOM killer);
    /// `None` where neither is known (allocations then still fail as errors, not aborts).
    pub fn of(device: &DeviceInfo) -> Option<Budget> {
        if device.memory > 0 {
            return Some(Budget { bytes: device.memory, source: "device memory" });
        }
        host_memory().map(|bytes| Budget { bytes, source: "available host memory" })
    }
}

/// `MemAvailable` of `/proc/meminfo`.
fn host_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What a context of `n_ctx` positions costs: the KV caches of every slot and layer
/// (keys and values as f16, with their block summaries) and the RoPE table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ContextBytes {
    /// KV caches and summaries of all slots.
    pub kv: u64,
    /// The RoPE tables (two with sliding-window layers).
    pub rope: u64,
}

impl ContextBytes {
    /// The sizes, or `None` where they overflow a u64.
    pub fn of(desc: &ModelDesc, n_ctx: u32, block: u32, slots: usize) -> Option<ContextBytes> {
        let kv_width = u64::from(desc.kv_heads).checked_mul(u64::from(desc.head_dim_k))?;
        let cache = u64::from(n_ctx).checked_mul(kv_width)?.checked_mul(2)?;
        let summary = u64::from(n_ctx.div_ceil(block.max(1))).checked_mul(4 * kv_width)?;
        let layer = cache.checked_mul(2)?.checked_add(summary)?;
        let kv = layer.checked_mul(u64::from(desc.layers))?.checked_mul(slots as u64)?;
        // Sliding-window layers have a RoPE table of their own.
        let tables = if desc.sliding.is_some() { 2 } else { 1 };
        let rope = u64::from(n_ctx).checked_mul(u64::from(desc.rope_dims))?.checked_mul(4 * tables)?;
        Some(ContextBytes { kv, rope })
    }
}

/// Refuses a context whose KV caches and RoPE table do not fit `budget` beside
/// `weights` bytes of weights, naming the sizes, the budget and its source.
pub(crate) fn check_context(
    desc: &ModelDesc,
    n_ctx: u32,
    block: u32,
    slots: usize,
    weights: u64,
    budget: Option<Budget>,
) -> Result<(), RunError> {
    let what =
        format!("a context of {n_ctx} positions (--ctx, or the pack's context_length {} when absent)", desc.context);
    if n_ctx > MAX_CONTEXT {
        return Err(RunError::Other(format!("{what} is too large: at most {MAX_CONTEXT} positions")));
    }
    let Some(need) = ContextBytes::of(desc, n_ctx, block, slots) else {
        return Err(RunError::Other(format!("{what} needs more than 2^64 bytes of KV cache")));
    };
    let Some(budget) = budget else { return Ok(()) };
    let left = budget.bytes.saturating_sub(weights);
    if need.kv.saturating_add(need.rope) > left {
        return Err(RunError::Other(format!(
            "{what} needs {} of KV cache ({slots} slot(s) × {} layers) and {} of RoPE table, but the budget is {} ({}) less {} of weights: pass a smaller --ctx",
            bytes(need.kv),
            desc.layers,
            bytes(need.rope),
            bytes(budget.bytes),
            budget.source,
            bytes(weights),
        )));
    }
    Ok(())
}
