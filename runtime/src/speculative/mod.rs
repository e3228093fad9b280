//! Speculative decoding. Each step drafts up to T − 1 tokens after the sequence (n-gram
//! lookup over the sequence itself, or a draft model), runs the pending token and the
//! drafts through the target in one verify window, whose GEMVs read the weights once for
//! all T columns, and keeps the longest run of drafts the target agrees with plus one
//! token of the target's own. The KV entries of rejected drafts are dropped by rewinding
//! the sequence's position.
//!
//! Greedy verification accepts a draft where it equals the target's argmax; a verify
//! window computes each row as decoding that token alone does, so the output is the
//! output without speculation, token for token (up to near-ties where the window's GEMVs
//! take the matrix unit and one token's do not: their sums differ by rounding,
//! `Options::gemv_mma_from`). Sampled verification is speculative
//! rejection sampling ([`verify::accept_sampled`]), which keeps the target's distribution.

pub mod draft;
pub mod ngram;
pub mod verify;

use crate::backend::RunError;
use crate::model::Model;
use crate::sampler::{Dist, Sampler};
use draft::DraftModel;

/// What speculation does (`--spec`, `--spec-ngram`, `--spec-draft`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// The verify window T: up to T − 1 drafts a step; 0 or 1 turns speculation off.
    pub window: u32,
    /// The n-gram drafter's longest suffix to match (it tries down to 2).
    pub ngram: usize,
    /// Most drafts a step, below T − 1 if set; the drafter adapts under it.
    pub draft_max: Option<usize>,
}

impl SpeculativeConfig {
    /// No speculation.
    pub const OFF: SpeculativeConfig = SpeculativeConfig { window: 0, ngram: 3, draft_max: None };

    /// Whether steps draft at all.
    pub fn enabled(&self) -> bool {
        self.window >= 2 && self.most_drafts() > 0
    }

    /// The most drafts one step proposes.
    pub fn most_drafts(&self) -> usize {
        let window = self.window.saturating_sub(1) as usize;
        self.draft_max.map_or(window, |m| m.min(window))
    }
}

/// How speculation went, summed over steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify passes (steps with at least one draft).
    pub verified: u64,
    /// Draft tokens proposed to them.
    pub drafted: u64,
    /// Draft tokens the target accepted.
    pub accepted: u64,
}

impl SpecStats {
    /// Accepted drafts over proposed ones.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Drafts accepted per verify pass (each pass also yields one token of the target's).
    pub fn mean_accepted(&self) -> f64 {
        self.accepted as f64 / self.verified.max(1) as f64
    }

    /// What was tallied after `before` (an earlier reading of the same tallies).
    pub fn since(&self, before: SpecStats) -> SpecStats {
        SpecStats {
            verified: self.verified - before.verified,
            drafted: self.drafted - before.drafted,
            accepted: self.accepted - before.accepted,
        }
    }
}

/// One sequence's speculative decoder: its settings, its adaptive draft length and its
/// tallies.
#[derive(Clone, Debug)]
pub struct Speculator {
    cfg: SpeculativeConfig,
    /// Drafts the next step asks for: grows by one after a step whose drafts were all
    /// accepted, halves after one that accepted fewer than half (at least one).
    draft_len: usize,
    stats: SpecStats,
}

impl Speculator {
    /// A decoder for one sequence.
    pub fn new(cfg: SpeculativeConfig) -> Speculator {
        Speculator { cfg, draft_len: cfg.most_drafts(), stats: SpecStats::default() }
    }

    /// The tallies so far.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// One step after `history`, whose last token the model has computed but not read
    /// (the model's KV cache holds the others, in its selected slot). Returns the new
    /// tokens, at least one: the accepted drafts and the target's next token, which is
    /// in turn pending. `generated` (the part of `history` generated so far) feeds the
    /// sampler's presence and frequency penalties. Without drafts this is one decode
    /// step.
    pub fn step(
        &mut self,
        model: &mut Model,
        draft: Option<&mut DraftModel>,
        sampler: &mut Sampler,
        history: &[u32],
        generated: &[u32],
    ) -> Result<Vec<u32>, RunError> {
        let Some(&last) = history.last() else {
            return Err(RunError::Other("a decode step needs a pending token".into()));
        };
        // Room in the window and in the context for the pending token and the drafts.
        let room = (model.n_ctx() as usize).saturating_sub(model.pos() as usize + 1);
        let room = room.min(model.window() as usize - 1);
        let want = if self.cfg.enabled() { self.draft_len.min(room) } else { 0 };
        let (drafts, dists) = match draft {
            _ if want == 0 => (Vec::new(), Vec::new()),
            Some(d) => d.propose(model.slot(), history, generated, want, sampler)?,
            None => {
                let drafts = ngram::propose(history, self.cfg.ngram, want);
                let dists = drafts.iter().map(|&d| vec![(d, 1.0)]).collect();
                (drafts, dists)
            }
        };
        if drafts.is_empty() {
            return Ok(vec![plain_step(model, sampler, last, history, generated)?]);
        }
        let start = model.pos();
        let mut window = Vec::with_capacity(drafts.len() + 1);
        window.push(last);
        window.extend_from_slice(&drafts);
        let (accepted, next) = if sampler.is_greedy() {
            let target = model.verify_greedy(&window)?;
            let m = verify::accept_greedy(&drafts, &target);
            (m, target[m])
        } else {
            let logits = model.verify_logits(&window)?;
            // Drawn up front: the target's distributions borrow the sampler too. A step
            // takes at most one draw per draft and one for its last token.
            let draws: Vec<f64> = (0..=drafts.len() + 1).map(|_| sampler.uniform()).collect();
            let mut uniforms = draws.into_iter();
            let vocab = model.desc.vocab as usize;
            let (mut seen, mut made) = (history.to_vec(), generated.to_vec());
            let mut reached = 0;
            let mut target = |i: usize| -> Dist {
                // Positions are asked for in order: extend the context to drafts[..i].
                for &d in &drafts[reached..i] {
                    seen.push(d);
                    made.push(d);
                }
                reached = reached.max(i);
                let row = logits.get(i * vocab..(i + 1) * vocab).unwrap_or(&[]);
                sampler.distribution(row, &seen, &made)
            };
            verify::accept_sampled(&drafts, &dists, &mut target, &mut || uniforms.next().unwrap_or(0.5))
        };
        model.rewind(start + 1 + accepted as u32)?;
        self.stats.verified += 1;
        self.stats.drafted += drafts.len() as u64;
        self.stats.accepted += accepted as u64;
        self.draft_len = if accepted == drafts.len() {
            (self.draft_len + 1).min(self.cfg.most_drafts())
        } else if 2 * accepted < drafts.len() {
            (self.draft_len / 2).max(1)
        } else {
            self.draft_len
        };
        let mut out = drafts[..accepted].to_vec();
        out.push(next);
        Ok(out)
    }
}

/// One token through the captured one-token step: the greedy token, or a draw from its
/// logits.
fn plain_step(
    model: &mut Model,
    sampler: &mut Sampler,
    token: u32,
    history: &[u32],
    generated: &[u32],
) -> Result<u32, RunError> {
    if sampler.is_greedy() {
        return model.decode_greedy(token);
    }
    let logits = model.verify_logits(&[token])?;
    Ok(sampler.sample_with(&logits, history, generated))
}
