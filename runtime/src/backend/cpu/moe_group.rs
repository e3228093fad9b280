//! The `moe_group` reference: a prompt chunk's routing ([`top_experts`],
//! [`route_weights`], as `moe_route` chooses and weighs) and its choices grouped by
//! expert for the grouped expert GEMMs.

use strata_compiler::ops;

use super::RunError;
use super::io::OpIo;
use super::moe_route::{route_weights, top_experts};

/// Routes `tokens` rows of router logits into `weights`, and groups the choices into
/// `offsets` and `order`.
pub(super) fn run(op: &ops::MoeGroup, io: &mut OpIo) -> Result<(), RunError> {
    let ops::MoeGroup { experts, used } = *op;
    let (e, k, tokens) = (experts as usize, used as usize, io.scalar("tokens") as usize);
    let (weights, offsets, order) = moe_group(&io.floats("logits", tokens * e), e, k);
    io.output_floats("weights", &weights);
    io.output_ints("offsets", &offsets);
    io.output_ints("order", &order);
    Ok(())
}

/// Each row of `logits` (a token's `experts` router logits) routed to its `used` top
/// experts: their weights (`t·used + j`), each expert's first position in the order
/// (`experts + 1` entries, the last the total), and the choices `t·used + j` grouped by
/// expert, tokens ascending within each.
pub fn moe_group(logits: &[f32], experts: usize, used: usize) -> (Vec<f32>, Vec<i32>, Vec<i32>) {
    let tokens = logits.len() / experts.max(1);
    let mut weights = Vec::with_capacity(tokens * used);
    let mut by_expert = vec![Vec::new(); experts];
    for t in 0..tokens {
        let row = &logits[t * experts..(t + 1) * experts];
        let chosen = top_experts(row, used);
        weights.extend(route_weights(row, &chosen));
        for (j, &x) in chosen.iter().enumerate() {
            by_expert[x].push((t * used + j) as i32);
        }
    }
    let mut offsets = Vec::with_capacity(experts + 1);
    let mut at = 0;
    for list in &by_expert {
        offsets.push(at as i32);
        at += list.len();
    }
    offsets.push(at as i32);
    (weights, offsets, by_expert.concat())
}
