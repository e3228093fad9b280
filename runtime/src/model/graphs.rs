//! Captured steps: the decode step (greedy, or leaving its logits), the verify windows
//! and the batched decode steps of several sequences, each captured once per (number of
//! sequences, window, argmax or logits, sparse) as a graph (a CUDA graph on CUDA) and
//! replayed after, so that a step costs one launch from the host.
//!
//! A step bakes in how many sequences it holds, its window size and whether it attends
//! sparsely. Which slots those are travels with their token ids and positions (the
//! `pos` buffer) before each replay, and their pages are in the page table: a batch of
//! any 8 slots replays the one graph of 8, however the server's set of running requests
//! changes.
//! Where a mixture of experts is cached, the host picks experts between layers, so those
//! passes run uncaptured.

use super::experts::Experts;
use super::{Logits, Model};
use crate::backend::RunError;

/// A batched decode step's greedy tokens: on the device still (its first slot and its
/// sequences), or computed already (one sequence, or `--checked` passes each alone).
#[must_use = "the tokens are read with Model::batch_ids"]
pub struct BatchIds(Ids);

enum Ids {
    Running { first: usize, n: usize },
    Ready(Vec<u32>),
}

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
        self.write_positions(&[(self.pos[slot], slot)], 1)?;
        self.replay_step(1, &[slot], true)?;
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
        self.replay_step(1, &[self.slot], false)?;
        self.pos[self.slot] += 1;
        Ok(())
    }

    /// Decodes one token for each of several sequences, `(slot, token)`, in one pass
    /// (each product reads its weights once for all of them; each sequence attends over
    /// its own cache) and returns each one's greedy next token. Up to [`Model::window`]
    /// sequences, each row is computed as decoding that token alone computes it (to
    /// rounding where the window's GEMVs take the matrix unit and one token's do not,
    /// `Options::gemv_mma_from`); a wider
    /// batch (up to [`Model::batch_width`]) runs its products on the GEMMs, whose sums
    /// may differ from the window GEMVs' in the last bits. Each sequence in its slot
    /// once, none attending sparsely (QSA: those decode alone).
    pub fn decode_batch_greedy(&mut self, batch: &[(usize, u32)]) -> Result<Vec<u32>, RunError> {
        let running = self.launch_batch_greedy(batch)?;
        self.batch_ids(running)
    }

    /// Starts [`Model::decode_batch_greedy`]'s pass without waiting for the device, so
    /// that the host works while it computes (a server reports the last round's tokens);
    /// [`Model::batch_ids`] reads the ids. Nothing else may run a pass in between (the
    /// ids are left where every argmax leaves its own).
    pub fn launch_batch_greedy(&mut self, batch: &[(usize, u32)]) -> Result<BatchIds, RunError> {
        if let [(slot, token)] = batch {
            self.select(*slot)?;
            return Ok(BatchIds(Ids::Ready(vec![self.decode_greedy(*token)?])));
        }
        if self.checked {
            // One checked pass each.
            let mut ids = Vec::with_capacity(batch.len());
            for &(slot, token) in batch {
                self.select(slot)?;
                ids.push(self.decode_greedy(token)?);
            }
            return Ok(BatchIds(Ids::Ready(ids)));
        }
        self.on_device = None;
        self.batch_step(batch, true)?;
        Ok(BatchIds(Ids::Running { first: batch[0].0, n: batch.len() }))
    }

    /// The greedy next tokens of a batch [`Model::launch_batch_greedy`] started, in its
    /// order (waiting for the device).
    pub fn batch_ids(&mut self, running: BatchIds) -> Result<Vec<u32>, RunError> {
        let (first, n) = match running.0 {
            Ids::Running { first, n } => (first, n),
            Ids::Ready(ids) => return Ok(ids),
        };
        let ids = self.read_next(n)?;
        self.on_device = ids.first().map(|&id| (first, id));
        Ok(ids)
    }

    /// As [`Model::decode_batch_greedy`], leaving each sequence's row of logits, in
    /// batch order, for [`Model::logits`] (to sample).
    pub fn decode_batch(&mut self, batch: &[(usize, u32)]) -> Result<(), RunError> {
        if self.checked || batch.len() == 1 {
            // One pass each, their logits gathered in order.
            let mut rows = Vec::with_capacity(batch.len());
            for &(slot, token) in batch {
                self.select(slot)?;
                self.decode(token)?;
                rows.extend(self.logits(1)?);
            }
            let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
            return self.backend.write(self.s.logits, 0, &bytes);
        }
        self.batch_step(batch, false)
    }

    /// Checks a batch, writes its tokens and positions, and replays its pass.
    fn batch_step(&mut self, batch: &[(usize, u32)], argmax: bool) -> Result<(), RunError> {
        let slots = self.stage_batch(batch)?;
        self.replay_step(batch.len() as u32, &slots, argmax)?;
        for slot in slots {
            self.pos[slot] += 1;
        }
        Ok(())
    }

    /// Runs [`Model::decode_batch_greedy`]'s pass of `batch` launch by launch instead of
    /// as its graph, with a timing mark after each, and returns each launch's kernel and
    /// device seconds in order (the argmax last): where a batched step's time goes. Each
    /// launch waits on the host's queueing, so short kernels read longer than in the
    /// graph; the next tokens are left on the device, unread.
    pub fn profile_batch(&mut self, batch: &[(usize, u32)]) -> Result<Vec<(String, f64)>, RunError> {
        let slots = self.stage_batch(batch)?;
        let t = batch.len() as u32;
        let steps = self.steps_of(t, &slots, Logits::All, false)?;
        let mut marks = vec![(String::new(), self.backend.mark()?)];
        for step in steps.iter() {
            if let Some(spec) = self.run_step(step, self.s.ids)? {
                marks.push((spec.name, self.backend.mark()?));
            }
        }
        self.enqueue_argmax(t)?;
        marks.push((self.kernels.get(&self.ops.argmax())?.name, self.backend.mark()?));
        self.end_pass(t)?;
        for slot in slots {
            self.pos[slot] += 1;
        }
        self.on_device = None;
        let mut times = Vec::with_capacity(marks.len());
        for pair in marks.windows(2) {
            times.push((pair[1].0.clone(), self.backend.seconds(pair[0].1, pair[1].1)?));
        }
        Ok(times)
    }

    /// Checks a batch and writes its tokens and positions; returns its slots.
    fn stage_batch(&mut self, batch: &[(usize, u32)]) -> Result<Vec<usize>, RunError> {
        let n = batch.len();
        if n == 0 || n > self.batch as usize {
            return Err(RunError::Other(format!("a batch takes 1 to {} sequences, not {n}", self.batch)));
        }
        let slots: Vec<usize> = batch.iter().map(|&(slot, _)| slot).collect();
        for (i, &slot) in slots.iter().enumerate() {
            if slot >= self.pos.len() || slots[..i].contains(&slot) {
                return Err(RunError::Other(format!("a batch names slot {slot} twice or of {}", self.pos.len())));
            }
            if self.pos[slot] >= self.n_ctx {
                return Err(RunError::Other(format!("slot {slot}: the context is full at --ctx {}", self.n_ctx)));
            }
            if self.sparse_at(slot, 1) {
                return Err(RunError::Other(format!("slot {slot} attends sparsely (QSA): it decodes alone")));
            }
        }
        let ids: Vec<u8> = batch.iter().flat_map(|&(_, id)| (id as i32).to_le_bytes()).collect();
        let seqs: Vec<(u32, usize)> = slots.iter().map(|&slot| (self.pos[slot], slot)).collect();
        self.backend.write(self.s.ids, 0, &ids)?;
        self.write_positions(&seqs, 1)?;
        Ok(slots)
    }

    /// Runs a verify window (`tokens` at the next positions, in one pass of window
    /// GEMVs) and returns the greedy token after each of them, reading back only the
    /// ids. Row `i` is computed as decoding `tokens[i]` alone would compute it: exactly,
    /// or to rounding where the window's GEMVs take the matrix unit and one token's do
    /// not (`Options::gemv_mma_from`).
    pub fn verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>, RunError> {
        if let [token] = tokens {
            return Ok(vec![self.decode_greedy(*token)?]);
        }
        if self.checked {
            return self.checked_greedy(tokens);
        }
        let t = self.room(tokens.len())?;
        self.upload_ids(tokens)?;
        self.replay_step(t, &[self.slot], true)?;
        self.pos[self.slot] += t;
        let ids = self.read_next(tokens.len())?;
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
        self.replay_step(t, &[self.slot], false)?;
        self.pos[self.slot] += t;
        self.logits(t)
    }

    /// Whether `slot`'s next token must be decoded alone, not in a batch: its pass
    /// attends sparsely (QSA), or its context is full.
    pub fn decodes_alone(&self, slot: usize) -> bool {
        self.pos.get(slot).is_none_or(|&pos| pos >= self.n_ctx) || self.sparse_at(slot, 1)
    }

    /// Whether a pass of `t` tokens at `slot`'s position attends sparsely: QSA is on and
    /// some token of it sees more than the budget.
    fn sparse_at(&self, slot: usize, t: u32) -> bool {
        self.qsa.is_some_and(|blocks| self.pos[slot] + t > blocks * self.block)
    }

    /// Replays the captured pass of `t` tokens of the sequences in `slots` at their
    /// positions (capturing it on first use), leaving every row's logits and, with
    /// `argmax`, their greedy ids in `next`. Its token ids are read from `next` for a
    /// greedy single token (where the last argmax left them), else from `ids`.
    fn replay_step(&mut self, t: u32, slots: &[usize], argmax: bool) -> Result<(), RunError> {
        let sparse = slots.len() == 1 && self.sparse_at(slots[0], t);
        let ids = if t == 1 && argmax { self.s.next } else { self.s.ids };
        let key = (u32::try_from(slots.len()).unwrap_or(u32::MAX), t, argmax, sparse);
        if self.experts.as_ref().is_some_and(Experts::cached) {
            // The host picks experts between layers: nothing to capture.
            self.enqueue(ids, t, slots, Logits::All, sparse)?;
            if argmax {
                self.enqueue_argmax(t)?;
            }
            return self.end_pass(t);
        }
        let graph = match self.graphs.get(&key) {
            Some(&g) => g,
            None => {
                self.backend.begin_capture()?;
                let queued = self
                    .enqueue(ids, t, slots, Logits::All, sparse)
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
