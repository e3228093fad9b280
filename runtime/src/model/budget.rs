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

/// What a context of `n_ctx` positions costs: the KV pool of `pages` pages of `block`
/// positions in every layer (keys and values as f16, with their block summaries) and the
/// RoPE table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ContextBytes {
    /// The KV pools and their summaries.
    pub kv: u64,
    /// The RoPE tables (two with sliding-window layers).
    pub rope: u64,
}

impl ContextBytes {
    /// Bytes of one page of every layer's pool, or `None` where it overflows a u64.
    pub fn page(desc: &ModelDesc, block: u32) -> Option<u64> {
        let kv_width = u64::from(desc.kv_heads).checked_mul(u64::from(desc.head_dim_k))?;
        let rows = u64::from(block).checked_mul(kv_width)?.checked_mul(4)?;
        rows.checked_add(4 * kv_width)?.checked_mul(u64::from(desc.layers))
    }

    /// The sizes, or `None` where they overflow a u64.
    pub fn of(desc: &ModelDesc, n_ctx: u32, block: u32, pages: u64) -> Option<ContextBytes> {
        let kv = Self::page(desc, block)?.checked_mul(pages)?;
        // Sliding-window layers have a RoPE table of their own.
        let tables = if desc.sliding.is_some() { 2 } else { 1 };
        let rope = u64::from(n_ctx).checked_mul(u64::from(desc.rope_dims))?.checked_mul(4 * tables)?;
        Some(ContextBytes { kv, rope })
    }
}

/// The KV pool asked for: a byte budget (`--kv-budget`) or, by default, a whole context
/// for each of `slots` slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvBudget {
    /// `--ctx` positions for every slot.
    #[default]
    PerSlot,
    /// This many bytes of pool (every layer's pages together).
    Bytes(u64),
}

/// Pages of `block` positions the pool holds under `kv`, for `slots` slots of `n_ctx`
/// positions: at least one page, at most every slot's whole context (more could never be
/// used).
pub(crate) fn pool_pages(
    desc: &ModelDesc,
    n_ctx: u32,
    block: u32,
    slots: usize,
    kv: KvBudget,
) -> Result<u64, RunError> {
    let most = u64::from(n_ctx.div_ceil(block.max(1))).saturating_mul(slots as u64);
    let pages = match kv {
        KvBudget::PerSlot => most,
        KvBudget::Bytes(asked) => {
            let page = ContextBytes::page(desc, block).filter(|&p| p > 0).unwrap_or(u64::MAX);
            if asked < page {
                return Err(RunError::Other(format!(
                    "--kv-budget {} is less than one KV page ({block} positions of every layer: {})",
                    bytes(asked),
                    bytes(page)
                )));
            }
            (asked / page).min(most)
        }
    };
    Ok(pages)
}

/// Refuses a context whose KV pool (`pages` pages) and RoPE table do not fit `budget`
/// beside `weights` bytes of weights, naming the sizes, the budget and its source.
pub(crate) fn check_context(
    desc: &ModelDesc,
    n_ctx: u32,
    block: u32,
    pages: u64,
    weights: u64,
    budget: Option<Budget>,
) -> Result<(), RunError> {
    let what =
        format!("a context of {n_ctx} positions (--ctx, or the pack's context_length {} when absent)", desc.context);
    if n_ctx > MAX_CONTEXT {
        return Err(RunError::Other(format!("{what} is too large: at most {MAX_CONTEXT} positions")));
    }
    let Some(need) = ContextBytes::of(desc, n_ctx, block, pages) else {
        return Err(RunError::Other(format!("{what} needs more than 2^64 bytes of KV cache")));
    };
    let Some(budget) = budget else { return Ok(()) };
    let left = budget.bytes.saturating_sub(weights);
    if need.kv.saturating_add(need.rope) > left {
        let tokens = pages.saturating_mul(u64::from(block));
        return Err(RunError::Other(format!(
            "{what} needs {} of KV cache (a pool of {tokens} positions × {} layers) and {} of RoPE table, but the budget is {} ({}) less {} of weights: pass a smaller --ctx, --parallel or --kv-budget",
            bytes(need.kv),
            desc.layers,
            bytes(need.rope),
            bytes(budget.bytes),
            budget.source,
            bytes(weights),
        )));
    }
    if pages.saturating_mul(u64::from(block)) > u64::from(u32::MAX) {
        return Err(RunError::Other(format!(
            "{what}: a KV pool of {pages} pages of {block} positions is over the 2^32 rows a pool may hold: pass a smaller --ctx, --parallel or --kv-budget"
        )));
    }
    Ok(())
}
