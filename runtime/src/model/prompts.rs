//! Reading several requests' prompts at once: their chunks share passes, so that N
//! prompts arriving together cost about one weight read a pass, not one each. A pass
//! holds the same number of tokens of each of its sequences (its columns are `seqs`
//! runs of equal length, as the kernels lay a pass out), so prompts of different
//! lengths take a few passes: [`prompt_batches`]. Passes of up to a window take the
//! window GEMVs, each row computed as reading its chunk alone computes it (on the CPU,
//! bit for bit); wider ones the GEMMs, to rounding.

use std::ops::Range;

use strata_compiler::forward::Logits;

use super::Model;
use crate::backend::RunError;

impl Model {
    /// Most sequences one pass of several prompts' chunks holds (1 where the kernels
    /// read one prompt a pass: artifacts whose prefill attention takes one sequence, or
    /// prompts in GEMV windows).
    pub fn prompt_seqs(&self) -> u32 {
        self.prompt_seqs
    }

    /// Reads each `(slot, tokens)` at its slot's next positions into its KV cache,
    /// leaving no logits: the chunks in as few passes of at most `most` tokens (at
    /// most a prompt chunk, [`Model::chunk`]) as [`prompt_batches`] makes of them, one
    /// prompt's alone as [`Model::forward`] reads a chunk. With `most` at most
    /// [`Model::window`], every pass takes the window GEMVs. Each slot at most once; a
    /// slot's tokens must fit its context.
    pub fn read_prompts(&mut self, parts: &[(usize, &[u32])], most: u32) -> Result<(), RunError> {
        for (i, &(slot, tokens)) in parts.iter().enumerate() {
            if slot >= self.pos.len() || parts[..i].iter().any(|&(s, _)| s == slot) {
                return Err(RunError::Other(format!("prompts name slot {slot} twice or of {}", self.pos.len())));
            }
            if self.pos[slot] as usize + tokens.len() > self.n_ctx as usize {
                return Err(RunError::Other(format!(
                    "slot {slot}: the context is full: {} + {} tokens exceed --ctx {}",
                    self.pos[slot],
                    tokens.len(),
                    self.n_ctx
                )));
            }
        }
        let lens: Vec<usize> = parts.iter().map(|(_, tokens)| tokens.len()).collect();
        let widest = if self.chunk_gemm { self.chunk.max(self.window) } else { self.window };
        for pass in prompt_batches(&lens, most.clamp(1, widest) as usize, self.prompt_seqs as usize) {
            if let [(i, range)] = pass.as_slice() {
                let (slot, tokens) = parts[*i];
                self.select(slot)?;
                for chunk in self.prompt_passes(range.len()) {
                    let at = range.start + chunk.start;
                    self.forward(&tokens[at..at + chunk.len()], Logits::None)?;
                }
                continue;
            }
            let slots: Vec<usize> = pass.iter().map(|(i, _)| parts[*i].0).collect();
            let ids: Vec<u8> = pass
                .iter()
                .flat_map(|(i, range)| &parts[*i].1[range.clone()])
                .flat_map(|&id| (id as i32).to_le_bytes())
                .collect();
            let columns = pass[0].1.len() as u32;
            let t = columns * slots.len() as u32;
            let seqs: Vec<(u32, usize)> = slots.iter().map(|&slot| (self.pos[slot], slot)).collect();
            self.backend.write(self.s.ids, 0, &ids)?;
            self.write_positions(&seqs, columns)?;
            self.enqueue(self.s.ids, t, &slots, Logits::None, false)?;
            self.end_pass(t)?;
            for slot in slots {
                self.pos[slot] += columns;
            }
        }
        Ok(())
    }
}

/// The passes that read `lens[i]` tokens of each sequence `i`, as `(sequence, its tokens
/// read in the pass)`: a pass takes the same number of tokens of each sequence it holds,
/// at most `most_seqs` sequences and `most_tokens` tokens, as many of each as the one
/// with the fewest left has (or as fit), so that the shortest finish first and every
/// sequence left takes the next pass. Sequences in order; a pass's runs follow on from
/// the last pass's.
pub fn prompt_batches(lens: &[usize], most_tokens: usize, most_seqs: usize) -> Vec<Vec<(usize, Range<usize>)>> {
    let most_seqs = most_seqs.clamp(1, most_tokens.max(1));
    let mut read = vec![0; lens.len()];
    let mut passes = Vec::new();
    loop {
        let left: Vec<usize> = (0..lens.len()).filter(|&i| read[i] < lens[i]).collect();
        if left.is_empty() {
            return passes;
        }
        for group in left.chunks(most_seqs) {
            let fewest = group.iter().map(|&i| lens[i] - read[i]).min().unwrap_or(1);
            let each = fewest.min(most_tokens / group.len()).max(1);
            passes.push(group.iter().map(|&i| (i, read[i]..read[i] + each)).collect());
            for &i in group {
                read[i] += each;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(lens: &[usize], most_tokens: usize, most_seqs: usize) -> Vec<(usize, usize)> {
        prompt_batches(lens, most_tokens, most_seqs).iter().map(|p| (p.len(), p[0].1.len())).collect()
    }

    #[test]
    fn prompts_share_passes_of_equal_runs() {
        // 32 prompts of 45 and 46 tokens in a 512-token pass: 16 each, twice, then the
        // 13 the shorter have left, then the longer's last one.
        let lens: Vec<usize> = (0..32).map(|i| 45 + i % 2).collect();
        assert_eq!(shapes(&lens, 512, 64), [(32, 16), (32, 16), (32, 13), (16, 1)]);
        // One prompt: chunks of the pass width.
        assert_eq!(shapes(&[1000], 512, 64), [(1, 512), (1, 488)]);
        // A short prompt beside long ones finishes in the first pass.
        assert_eq!(shapes(&[100, 3, 100], 512, 64), [(3, 3), (2, 97)]);
        // More sequences than a pass holds: groups in order.
        assert_eq!(shapes(&[4; 5], 512, 2), [(2, 4), (2, 4), (1, 4)]);
        // More sequences than tokens: one token each, as many as fit.
        assert_eq!(shapes(&[2; 3], 2, 64), [(2, 1), (1, 2), (2, 1)]);
        assert!(prompt_batches(&[], 512, 64).is_empty());
        assert!(prompt_batches(&[0, 0], 512, 64).is_empty());
    }

    #[test]
    fn every_token_is_read_once_in_order() {
        let lens = [7, 1, 30, 12, 0, 5];
        let mut next = vec![0; lens.len()];
        for pass in prompt_batches(&lens, 16, 4) {
            let width = pass[0].1.len();
            assert!(pass.len() <= 4 && pass.len() * width <= 16, "{pass:?}");
            for (i, run) in pass {
                assert_eq!((run.start, run.len()), (next[i], width));
                next[i] = run.end;
            }
        }
        assert_eq!(next, lens);
    }
}
