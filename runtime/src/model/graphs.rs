//! Captured steps: the decode step (greedy, or leaving its logits) and the verify
//! windows, each captured once per (slot, window, argmax or logits, sparse) as a graph (a
//! CUDA graph on CUDA) and replayed after, so that a step costs one launch from the host.
//!
//! A step bakes in its slot's caches, its window size and whether it attends sparsely;
//! only the token ids and the position travel to the device before a replay. Where a
//! mixture of experts is cached, the host picks experts between layers, so those passes
//! run uncaptured.

use super::experts::Experts;
use super::{Logits, Model};
use crate::backend::RunError;

impl Model {
    /// Decodes one token and returns the greedy next token, reading back only its id.
    /// The step is captured on first use and replayed after.
    pub fn decode_greedy(&mut self, token: u32) -> Result<u32, RunError> {
        if self.checked {
            return Ok(self.checked_greedy(&[token])?[0]);
        }
        let slot = self.slot;
        self.room(1)?;
        // The step reads its token from where the last argmax left it: when it is that
        // token (greedy decoding), only the position travels to the device.
        if self.on_device != Some((slot, token)) {
            self.backend.write(self.s.next, 0, &(token as i32).to_le_bytes())?;
        }
        self.backend.write(self.s.pos, 0, &(self.pos[slot] as i32).to_le_bytes())?;
        self.replay_step(1, true)?;
        self.pos[slot] += 1;
        let mut out = [0u8; 4];
        self.backend.read(self.s.next, 0, &mut out)?;
        let next = i32::from_le_bytes(out) as u32;
        self.on_device = Some((slot, next));
        Ok(next)
    }

    /// Decodes one token and leaves its logits for [`Model::logits`] (to sample, to
    /// mask with a grammar, for log-probabilities): the step is captured on first use and
    /// replayed after, as [`Model::decode_greedy`]'s is.
    pub fn decode(&mut self, token: u32) -> Result<(), RunError> {
        if self.checked {
            return self.forward(&[token], Logits::All);
        }
        self.room(1)?;
        self.upload_ids(&[token])?;
        self.replay_step(1, false)?;
        self.pos[self.slot] += 1;
        Ok(())
    }

    /// Runs a verify window (`tokens` at the next positions, in one pass of window
    /// GEMVs) and returns the greedy token after each of them, reading back only the
    /// ids. Row `i` is computed exactly as decoding `tokens[i]` alone would compute it.
    pub fn verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>, RunError> {
        if let [token] = tokens {
            return Ok(vec![self.decode_greedy(*token)?]);
        }
        if self.checked {
            return self.checked_greedy(tokens);
        }
        let t = self.room(tokens.len())?;
        self.upload_ids(tokens)?;
        self.replay_step(t, true)?;
        self.pos[self.slot] += t;
        let mut out = vec![0u8; tokens.len() * 4];
        self.backend.read(self.s.next, 0, &mut out)?;
        let ids: Vec<u32> = out.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32).collect();
        self.on_device = ids.first().map(|&id| (self.slot, id));
        Ok(ids)
    }

    /// Runs a verify window as [`Model::verify_greedy`] does and returns every row of
    /// logits (for sampling).
    pub fn verify_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RunError> {
        if self.checked {
            self.forward(tokens, Logits::All)?;
            return self.logits(tokens.len() as u32);
        }
        let t = self.room(tokens.len())?;
        self.upload_ids(tokens)?;
        self.replay_step(t, false)?;
        self.pos[self.slot] += t;
        self.logits(t)
    }

    /// Whether a pass of `t` tokens at the slot's position attends sparsely: QSA is on
    /// and some token of it sees more than the budget.
    fn sparse(&self, t: u32) -> bool {
        self.qsa.is_some_and(|blocks| self.pos[self.slot] + t > blocks * self.block)
    }

    /// Replays the captured pass of `t` tokens at the slot's position (capturing it on
    /// first use), leaving every row's logits and, with `argmax`, their greedy ids in
    /// `next`. Its token ids are read from `next` for a greedy single token (where the
    /// last argmax left them), else from `ids`.
    fn replay_step(&mut self, t: u32, argmax: bool) -> Result<(), RunError> {
        let sparse = self.sparse(t);
        if self.experts.as_ref().is_some_and(Experts::cached) {
            // The host picks experts between layers: nothing to capture.
            let ids = if t == 1 && argmax { self.s.next } else { self.s.ids };
            self.enqueue(ids, t, Logits::All, sparse)?;
            if argmax {
                self.enqueue_argmax(t)?;
            }
            return self.end_pass(t);
        }
        let key = (self.slot, t, argmax, sparse);
        let graph = match self.graphs.get(&key) {
            Some(&g) => g,
            None => {
                let ids = if t == 1 && argmax { self.s.next } else { self.s.ids };
                self.backend.begin_capture()?;
                let queued = self
                    .enqueue(ids, t, Logits::All, sparse)
                    .and_then(|()| if argmax { self.enqueue_argmax(t) } else { Ok(()) });
                let graph = self.backend.end_capture();
                queued?;
                let g = graph?;
                self.graphs.insert(key, g);
                g
            }
        };
        self.backend.replay(graph)?;
        self.end_pass(t)
    }
}
