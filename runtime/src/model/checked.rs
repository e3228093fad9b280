//! Checked runs: greedy tokens are never taken from non-finite logits. With checking on
//! (`strata-run --checked`, or artifacts compiled `--checked`), every greedy pick reads
//! its logits back first; where one is NaN or infinite, the last pass is replayed step by
//! step, each kernel's f32 outputs read back after it, and the error names the first
//! layer (and kernel, buffer, element) whose output is not finite. Greedy decoding runs
//! uncaptured while checking, so the pass to replay is always the last `forward`.

use strata_compiler::forward::{Buf, Step};
use strata_compiler::plan::{Elem, Extent};

use super::{Logits, Model};
use crate::backend::{Arg, RunError};

impl Model {
    /// Turns checking of greedy picks on or off.
    pub fn set_checked(&mut self, on: bool) {
        self.checked = on;
        self.graphs.clear();
    }

    /// Whether greedy picks are checked.
    pub fn checked(&self) -> bool {
        self.checked
    }

    /// Refuses `rows` rows of logits holding a non-finite value, naming where the last
    /// pass first produced one.
    pub(super) fn check_logits(&mut self, rows: u32) -> Result<(), RunError> {
        let logits = self.read_logits(rows)?;
        let Some(i) = logits.iter().position(|v| !v.is_finite()) else { return Ok(()) };
        let vocab = self.desc.vocab as usize;
        let first = self.locate_non_finite()?;
        Err(RunError::Other(format!(
            "non-finite logits (row {}, token {} is {}): {first}",
            i / vocab,
            i % vocab,
            logits[i]
        )))
    }

    /// Replays the last pass step by step and names the first step whose f32 output
    /// holds a non-finite value, by layer, kernel, buffer and element.
    fn locate_non_finite(&mut self) -> Result<String, RunError> {
        let Some((t, logits)) = self.last_pass else { return Ok("no pass to replay".into()) };
        let Some(steps) = self.pass_steps(t, logits) else { return Ok("no pass to replay".into()) };
        let slot = self.slot;
        let end = self.pos[slot];
        self.pos[slot] = end.saturating_sub(t);
        self.write_positions(&[(self.pos[slot], slot)], t)?;
        let found = self.replay_checked(&steps);
        self.pos[slot] = end;
        Ok(found?.unwrap_or_else(|| "the replayed pass found no non-finite output".into()))
    }

    fn replay_checked(&mut self, steps: &[Step]) -> Result<Option<String>, RunError> {
        let ids = self.s.ids;
        for step in steps {
            let Some(spec) = self.run_step(step, ids)? else { continue };
            let Step::Launch { args, scalars, .. } = step else { continue };
            self.backend.sync()?;
            for (name, at) in args {
                let Some(b) =
                    spec.buffers.iter().find(|b| b.name == *name && b.writes && !b.workspace && b.elem == Elem::F32)
                else {
                    continue;
                };
                // Only rows this pass wrote: per-row buffers sized by a runtime count.
                let Extent::PerArg { arg, per_row } = &b.extent else { continue };
                let Some(rows) = scalars.iter().find(|(n, _)| n == arg).map(|(_, v)| self.value(*v)) else {
                    continue;
                };
                let Arg::Buf(buf, offset) = self.bind(*at, ids)? else { continue };
                let mut raw = vec![0u8; (u64::from(rows) * per_row * 4) as usize];
                self.backend.read(buf, offset, &mut raw)?;
                let bad = raw
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .enumerate()
                    .find(|(_, v)| !v.is_finite());
                if let Some((i, v)) = bad {
                    let layer = args.iter().find_map(|(_, at)| layer_of(at.buf));
                    let layer = layer.map_or_else(|| "after the last layer".into(), |l| format!("layer {l}"));
                    return Ok(Some(format!(
                        "first non-finite output in {layer}: kernel {} wrote {v} to {name} at element {i}",
                        spec.name
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Logits as stored, unchecked.
    pub(super) fn read_logits(&mut self, rows: u32) -> Result<Vec<f32>, RunError> {
        let mut out = vec![0u8; rows as usize * self.desc.vocab as usize * 4];
        self.backend.read(self.s.logits, 0, &mut out)?;
        Ok(out.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// A greedy step while checking: an uncaptured pass, then the checked argmax.
    pub(super) fn checked_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>, RunError> {
        self.forward(tokens, Logits::All)?;
        self.argmax(tokens.len() as u32)
    }
}

/// The layer whose weights or caches a step's buffer belongs to.
fn layer_of(buf: Buf) -> Option<u32> {
    match buf {
        Buf::Layer(l, _)
        | Buf::KCaches(l)
        | Buf::VCaches(l)
        | Buf::KSummaries(l)
        | Buf::SlotOf(l)
        | Buf::Pool(l, _) => Some(l),
        _ => None,
    }
}
