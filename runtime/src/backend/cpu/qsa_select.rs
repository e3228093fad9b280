//! The `qsa_select` reference: from QSA's block scores, each (token, KV head)'s list of
//! blocks to attend to; the rule itself is [`qsa_select`].

use strata_compiler::plan::MAX_WINDOW;

use super::RunError;
use super::io::{OpIo, ints};
use strata_compiler::ops;

/// Writes `list` and `count` for `tokens` tokens from position `pos`: each (token, KV
/// head)'s selection of at most `budget` of the blocks up to its newest.
pub(super) fn run(op: &ops::QsaSelect, io: &mut OpIo) -> Result<(), RunError> {
    let ops::QsaSelect { kv_heads, block } = *op;
    let (kv_heads, block) = (kv_heads as usize, block as usize);
    let (tokens, n_blocks, budget) =
        (io.scalar("tokens") as usize, io.scalar("n_blocks") as usize, io.scalar("budget") as usize);
    let pos = io.ints("pos", 1)[0] as usize;
    let scores = io.floats("scores", MAX_WINDOW as usize * kv_heads * n_blocks);
    let mut list = ints(io.target("list")?, MAX_WINDOW as usize * kv_heads * n_blocks);
    let mut count = ints(io.target("count")?, MAX_WINDOW as usize * kv_heads);
    for t in 0..tokens {
        let n = ((pos + t) / block + 1).min(n_blocks);
        for kvh in 0..kv_heads {
            let row = (t * kv_heads + kvh) * n_blocks;
            let chosen = qsa_select(&scores[row..row + n], budget);
            for (i, b) in chosen.iter().enumerate() {
                list[row + i] = *b as i32;
            }
            count[t * kv_heads + kvh] = chosen.len() as i32;
        }
    }
    io.output_ints("list", &list);
    io.output_ints("count", &count);
    Ok(())
}

/// QSA's selection from one (token, KV head)'s block scores: every block where there
/// are no more than `budget`, else the `budget` of the largest score (ties: the lower
/// block), in ascending order. Scores compare as the kernel's keys do (-0 as +0).
pub fn qsa_select(scores: &[f32], budget: usize) -> Vec<usize> {
    if scores.len() <= budget {
        return (0..scores.len()).collect();
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| (scores[b] + 0.0).total_cmp(&(scores[a] + 0.0)).then(a.cmp(&b)));
    order.truncate(budget);
    order.sort_unstable();
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_keeps_the_highest_scores_in_block_order() {
        let scores = [f32::INFINITY, 0.5, 2.0, -0.0, 0.0, 2.0, 1.0, f32::INFINITY];
        assert_eq!(qsa_select(&scores, 8), (0..8).collect::<Vec<_>>());
        assert_eq!(qsa_select(&scores, 4), vec![0, 2, 5, 7]);
        // Ties go to the lower block; -0 and +0 tie.
        assert_eq!(qsa_select(&scores, 3), vec![0, 2, 7]);
        assert_eq!(qsa_select(&scores, 7), vec![0, 1, 2, 3, 5, 6, 7]);
    }
}
