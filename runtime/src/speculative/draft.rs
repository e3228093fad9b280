//! The draft-model drafter: a smaller pack with the same vocabulary, on the same device,
//! proposes the next tokens one decode step at a time. Its KV cache follows the target's
//! sequence: before each proposal it rewinds to the longest prefix it shares with the
//! sequence and reads what it has not seen.

use crate::backend::RunError;
use crate::model::{Logits, Model};
use crate::sampler::{Dist, Sampler};
use crate::session::Session;
use crate::tokenizer::Tokenizer;

/// A draft model and, per sequence slot, the tokens in its KV cache.
pub struct DraftModel {
    model: Model,
    fed: Vec<Vec<u32>>,
}

impl DraftModel {
    /// Takes an opened draft pack for a target whose tokenizer is `target`; refuses one
    /// whose vocabulary differs (its ids would mean other text) or with fewer slots.
    pub fn new(session: Session, target: &Tokenizer, slots: usize) -> Result<DraftModel, RunError> {
        let draft = &session.tokenizer;
        if draft.vocab_size() != target.vocab_size() {
            return Err(RunError::Other(format!(
                "the draft pack's vocabulary has {} tokens, the target's {}: a draft model must share the target's vocabulary",
                draft.vocab_size(),
                target.vocab_size()
            )));
        }
        if let Some(id) = (0..target.vocab_size() as u32).find(|&id| draft.token_text(id) != target.token_text(id)) {
            return Err(RunError::Other(format!(
                "the draft pack's token {id} is {:?}, the target's {:?}: a draft model must share the target's vocabulary",
                draft.token_text(id),
                target.token_text(id)
            )));
        }
        if session.model.slots() < slots {
            return Err(RunError::Other(format!("the draft model has {} slots, not {slots}", session.model.slots())));
        }
        Ok(DraftModel { model: session.model, fed: vec![Vec::new(); slots] })
    }

    /// Up to `max` draft tokens after `history` (whose last token the target has not
    /// read yet) for the sequence in `slot`, each with the distribution it was drawn
    /// from: the draft's greedy token (one-hot) when `sampler` is greedy, else a draw
    /// from the draft's distribution under the same sampling settings. Fewer where the
    /// draft's context is full.
    pub fn propose(
        &mut self,
        slot: usize,
        history: &[u32],
        generated: &[u32],
        max: usize,
        sampler: &mut Sampler,
    ) -> Result<(Vec<u32>, Vec<Dist>), RunError> {
        let (Some(&last), Some(fed)) = (history.last(), self.fed.get_mut(slot)) else {
            return Ok((Vec::new(), Vec::new()));
        };
        let model = &mut self.model;
        model.select(slot)?;
        // Keep the shared prefix, and read at least the last token again.
        let common = fed.iter().zip(history).take_while(|(a, b)| a == b).count().min(history.len() - 1);
        model.rewind(common as u32)?;
        fed.truncate(common);
        let room = (model.n_ctx() as usize).saturating_sub(history.len());
        let max = max.min(room);
        if max == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let prompt = &history[common..history.len() - 1];
        for pass in model.prompt_passes(prompt.len()) {
            let chunk = &prompt[pass];
            model.forward(chunk, Logits::None)?;
            fed.extend_from_slice(chunk);
        }
        let (mut drafts, mut dists) = (Vec::with_capacity(max), Vec::with_capacity(max));
        let (mut seen, mut made) = (history.to_vec(), generated.to_vec());
        let mut token = last;
        while drafts.len() < max {
            let next = if sampler.is_greedy() {
                let next = model.decode_greedy(token)?;
                dists.push(vec![(next, 1.0)]);
                next
            } else {
                model.decode(token)?;
                let q = sampler.distribution(&model.logits(1)?, &seen, &made);
                let next = sampler.draw(&q);
                dists.push(q);
                next
            };
            fed.push(token);
            drafts.push(next);
            seen.push(next);
            made.push(next);
            token = next;
        }
        Ok((drafts, dists))
    }
}
