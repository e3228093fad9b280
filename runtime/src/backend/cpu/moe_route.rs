//! The `moe_route` reference: each token's top experts and their weights, and the
//! window's union of experts with which choice each is, laid out as [`RouteLayout`]
//! says. The choice and weight rules ([`top_experts`], [`route_weights`]) are public for
//! the tests that check routing on their own.

use strata_compiler::ops::{self, RouteLayout};
use strata_compiler::plan::MAX_WINDOW;

use super::RunError;
use super::io::OpIo;

/// Routes `tokens` rows of `experts` router logits into `route` and `weights` (entries
/// past what this window fills keep what they held).
pub(super) fn run(op: &ops::MoeRoute, io: &mut OpIo) -> Result<(), RunError> {
    let ops::MoeRoute { experts, used } = *op;
    let (e, k, tokens) = (experts as usize, used as usize, io.scalar("tokens") as usize);
    let layout = RouteLayout::new(experts, used);
    let mut route = io.ints("route", layout.len() as usize);
    let mut weights = io.floats("weights", MAX_WINDOW as usize * k);
    moe_route(&io.floats("logits", tokens * e), e, layout, &mut route, &mut weights);
    io.output_ints("route", &route);
    io.output_floats("weights", &weights);
    Ok(())
}

/// Routes each row of `logits` (one token's `experts` router logits, at most
/// [`MAX_WINDOW`] tokens) as `moe_route` does: each token's choices and weights, and the
/// window's union with its picks, into `route` and `weights` where [`RouteLayout`] puts
/// them (union entries past its size are left as they are).
pub fn moe_route(logits: &[f32], experts: usize, layout: RouteLayout, route: &mut [i32], weights: &mut [f32]) {
    let k = layout.used as usize;
    let choices: Vec<Vec<usize>> =
        logits.chunks_exact(experts).take(MAX_WINDOW as usize).map(|row| top_experts(row, k)).collect();
    for (t, chosen) in choices.iter().enumerate() {
        weights[t * k..(t + 1) * k].copy_from_slice(&route_weights(&logits[t * experts..(t + 1) * experts], chosen));
    }
    let mut union: Vec<usize> = choices.iter().flatten().copied().collect();
    union.sort_unstable();
    union.dedup();
    route[0] = union.len() as i32;
    for (u, &expert) in union.iter().enumerate() {
        route[1 + u] = expert as i32;
        for t in 0..MAX_WINDOW {
            let j = choices.get(t as usize).and_then(|c| c.iter().position(|&x| x == expert));
            route[layout.pick(u as u32, t) as usize] = j.map_or(-1, |j| j as i32);
        }
    }
}

/// The `k` experts of the largest router logits, largest first (ties: the lower expert;
/// an expert whose logit compares false with everything is taken only when nothing else
/// is left), as `moe_route` chooses them.
pub fn top_experts(logits: &[f32], k: usize) -> Vec<usize> {
    let mut taken = vec![false; logits.len()];
    let mut chosen = Vec::with_capacity(k);
    for _ in 0..k.min(logits.len()) {
        let mut best: Option<usize> = None;
        for (e, &x) in logits.iter().enumerate() {
            if !taken[e] && best.is_none_or(|b| x > logits[b]) {
                best = Some(e);
            }
        }
        if let Some(b) = best {
            taken[b] = true;
            chosen.push(b);
        }
    }
    chosen
}

/// The routing weights of `chosen` (largest logit first): the softmax over their logits,
/// summed in choice order.
pub fn route_weights(logits: &[f32], chosen: &[usize]) -> Vec<f32> {
    let top = chosen.first().map_or(0.0, |&e| logits[e]);
    let sum: f32 = chosen.iter().map(|&e| (logits[e] - top).exp()).sum();
    chosen.iter().map(|&e| (logits[e] - top).exp() / sum).collect()
}
