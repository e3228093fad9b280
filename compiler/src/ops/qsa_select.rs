//! `qsa_select`: QSA's per-token top-k KV blocks by score, in block order.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Checker, KernelOp, Parts, buffer, fixed_len, launch, per, rows, scalar, untuned};
use crate::plan::rules::{self, MAX_CONTEXT, QSA_SELECT_BINS, QSA_SELECT_THREADS};
use crate::plan::{Dim, Elem, KernelRecord, MAX_WINDOW, Options};
use crate::target::Target;

/// QSA's selection: for each (token, KV head), the `budget` blocks of the largest
/// score among the token's `pos/block + 1` (ties: the lower block), listed in
/// ascending order, and their count; every block where there are no more than
/// `budget`. Each token selects for itself, so a verify window selects exactly what
/// decoding its tokens one by one would.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QsaSelect {
    /// KV heads.
    pub kv_heads: u32,
    /// KV positions per block.
    pub block: u32,
}

impl KernelOp for QsaSelect {
    fn kernel_name(&self) -> String {
        format!("qsa_select_{}_b{}", self.kv_heads, self.block)
    }

    fn record(&self, target: &Target, _options: &Options) -> Parts {
        let kv_heads = self.kv_heads;
        let threads = QSA_SELECT_THREADS.min(target.device.max_threads_per_block);
        let staged = rules::qsa_select_staged(target.device.shared_bytes_per_block, threads);
        untuned(
            launch(
                target,
                [Dim::Fixed(kv_heads), rows("tokens"), Dim::Fixed(1)],
                threads,
                rules::qsa_select_fixed_bytes(threads) + 4 * staged,
            ),
            vec![
                buffer("scores", Elem::F32, per("n_blocks", MAX_WINDOW * kv_heads), false),
                buffer("list", Elem::I32, per("n_blocks", MAX_WINDOW * kv_heads), true),
                buffer("count", Elem::I32, fixed_len(MAX_WINDOW * kv_heads), true),
                buffer("pos", Elem::I32, fixed_len(1u32), false),
            ],
            vec![scalar("tokens", MAX_WINDOW), scalar("n_blocks", MAX_CONTEXT), scalar("budget", MAX_CONTEXT)],
        )
    }

    fn check(&self, k: &KernelRecord, c: &mut Checker) {
        let l = &k.launch;
        let needed = rules::qsa_select_fixed_bytes(l.threads) + 4 * l.threads;
        if l.threads < QSA_SELECT_BINS || l.shared_bytes < needed {
            c.fail(
                "threads and shared memory",
                format!("{} threads, {} bytes", l.threads, l.shared_bytes),
                format!(
                    "a thread per radix bin ({QSA_SELECT_BINS}) and at least {needed} bytes (a staged key a thread)"
                ),
            );
        }
        c.extents.push(("count", u64::from(MAX_WINDOW * self.kv_heads)));
        c.extents.push(("pos", 1));
    }

    fn tolerance(&self) -> f64 {
        // The same float operations as the CPU reference: bit for bit.
        0.0
    }

    fn context(&self, k: &KernelRecord, _target: &Target) -> Value {
        let l = &k.launch;
        json!({
            "kv_heads": self.kv_heads, "block": self.block, "bins": QSA_SELECT_BINS,
            "max_window": MAX_WINDOW, "staged": l.shared_bytes.saturating_sub(rules::qsa_select_fixed_bytes(l.threads)) / 4,
        })
    }
}
