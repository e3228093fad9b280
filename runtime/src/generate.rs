//! Running a session: prefill in chunks, then decode (greedy through the captured decode
//! step, sampled otherwise; several tokens a step with speculative decoding; one token a
//! step under a grammar); scoring every position of a prompt; perplexity over a text.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::backend::RunError;
use crate::constrain::Constraint;
use crate::model::{ExpertStats, Logits, Model};
use crate::sampler::{self, Sampler};
use crate::session::Session;
use crate::speculative::{SpecStats, Speculator};
use crate::tokenizer::Tokenizer;

/// Timing of one generation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Prompt tokens read.
    pub prompt_tokens: usize,
    /// Time to read the prompt (until the first generated token is known).
    pub prefill: Duration,
    /// Tokens generated after the first.
    pub decoded: usize,
    /// Time for those.
    pub decode: Duration,
    /// Speculative decoding's tallies (all zero without it).
    pub spec: SpecStats,
}

impl Stats {
    /// Prompt tokens per second.
    pub fn prefill_rate(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }

    /// Generated tokens per second (after the first).
    pub fn decode_rate(&self) -> f64 {
        self.decoded as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// Reads `tokens` into the KV cache in chunks of the model's widest pass, leaving the
/// last token's logits.
pub fn prefill(s: &mut Session, tokens: &[u32]) -> Result<(), RunError> {
    let mut read = 0;
    while read < tokens.len() {
        read = prefill_chunk(s, tokens, read)?;
    }
    Ok(())
}

/// Reads the next chunk of `tokens` after the `read` already in the KV cache and returns
/// how many are read now; the last chunk leaves the last token's logits.
pub fn prefill_chunk(s: &mut Session, tokens: &[u32], read: usize) -> Result<usize, RunError> {
    let rest = tokens.len().saturating_sub(read);
    let end = read + s.model.prompt_passes(rest).first().map_or(0, |p| p.end);
    let Some(part) = tokens.get(read..end).filter(|p| !p.is_empty()) else {
        return Err(RunError::Other(format!("no prompt tokens after {read} of {}", tokens.len())));
    };
    s.model.forward(part, if end == tokens.len() { Logits::Last } else { Logits::None })?;
    Ok(end)
}

/// Generates up to `max_tokens` after `prompt` (a new sequence), speculatively where
/// the session says so. `on_token` sees each token (with the tokenizer, to decode it) as
/// it comes and returns false to stop; generation also stops at an end-of-generation
/// token (which is not passed on) unless `ignore_eos`.
pub fn generate(
    s: &mut Session,
    prompt: &[u32],
    max_tokens: usize,
    ignore_eos: bool,
    sampler: &mut Sampler,
    on_token: &mut dyn FnMut(&Tokenizer, u32) -> bool,
) -> Result<Stats, RunError> {
    s.model.reset();
    generate_after(s, prompt, 0, max_tokens, ignore_eos, sampler, on_token)
}

/// [`generate`] continuing a sequence: the KV cache holds `prompt[..cached]` already (a
/// chat's earlier turns), so only the rest of `prompt` is read (it must not be empty);
/// positions past `cached` are forgotten first. `Stats::prompt_tokens` counts the
/// tokens read now.
pub fn generate_after(
    s: &mut Session,
    prompt: &[u32],
    cached: usize,
    max_tokens: usize,
    ignore_eos: bool,
    sampler: &mut Sampler,
    on_token: &mut dyn FnMut(&Tokenizer, u32) -> bool,
) -> Result<Stats, RunError> {
    if prompt.len() <= cached {
        return Err(RunError::Other("the prompt has no tokens".into()));
    }
    let room = (s.model.n_ctx() as usize).saturating_sub(prompt.len());
    let max_tokens = max_tokens.min(room);
    s.model.rewind(u32::try_from(cached).map_err(|e| RunError::Other(e.to_string()))?)?;
    let mut stats = Stats { prompt_tokens: prompt.len() - cached, ..Stats::default() };
    let start = Instant::now();
    let mut read = cached;
    while read < prompt.len() {
        read = prefill_chunk(s, prompt, read)?;
    }
    let mut history = prompt.to_vec();
    let mut generated = Vec::new();
    let first = if sampler.is_greedy() {
        s.model.argmax(1)?[0]
    } else {
        sampler.sample_with(&s.model.logits(1)?, &history, &[])
    };
    stats.prefill = start.elapsed();
    let start = Instant::now();
    let mut spec = Speculator::new(s.spec);
    // Tokens computed but not yet passed on; the model has read all but the last.
    let mut pending = VecDeque::from([first]);
    while generated.len() < max_tokens
        && let Some(token) = pending.pop_front()
    {
        if (!ignore_eos && s.tokenizer.is_eog(token)) || !on_token(&s.tokenizer, token) {
            break;
        }
        generated.push(token);
        history.push(token);
        if pending.is_empty() && generated.len() < max_tokens {
            pending.extend(spec.step(&mut s.model, s.draft.as_mut(), sampler, &history, &generated)?);
        }
    }
    stats.decode = start.elapsed();
    // Tokens passed on after the first (a speculative step may have made more).
    stats.decoded = generated.len().saturating_sub(1);
    stats.spec = spec.stats();
    Ok(stats)
}

/// [`generate`] under a grammar: each token drawn from logits masked by `constraint`,
/// one token a step (no speculation: a draft's tokens would each need their own mask),
/// the next mask computed while the model reads the token ([`forward_constrained`]).
/// Generation ends at an end-of-generation token, which the grammar allows only once
/// the output is complete.
pub fn generate_constrained(
    s: &mut Session,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    constraint: &mut Constraint,
    on_token: &mut dyn FnMut(&Tokenizer, u32) -> bool,
) -> Result<Stats, RunError> {
    s.model.reset();
    let max_tokens = max_tokens.min((s.model.n_ctx() as usize).saturating_sub(prompt.len()));
    let mut stats = Stats { prompt_tokens: prompt.len(), ..Stats::default() };
    let start = Instant::now();
    prefill(s, prompt)?;
    stats.prefill = start.elapsed();
    let start = Instant::now();
    let (mut history, mut generated) = (prompt.to_vec(), Vec::new());
    let step_err = |e: crate::constrain::ConstraintError| RunError::Other(e.to_string());
    while generated.len() < max_tokens {
        let mut logits = s.model.logits(1)?;
        constraint.mask(&mut logits).map_err(step_err)?;
        let token = sampler.sample_with(&logits, &history, &generated);
        if s.tokenizer.is_eog(token) {
            break;
        }
        constraint.accept(token).map_err(step_err)?;
        if !on_token(&s.tokenizer, token) {
            break;
        }
        generated.push(token);
        history.push(token);
        if generated.len() < max_tokens {
            forward_constrained(&mut s.model, token, constraint)?;
        }
    }
    stats.decode = start.elapsed();
    stats.decoded = generated.len().saturating_sub(1);
    Ok(stats)
}

/// Decodes `token` (the captured step) while `constraint` computes its next mask on
/// another thread: the mask depends on the tokens so far, not on the logits, so on a
/// GPU it is off the critical path.
pub fn forward_constrained(model: &mut Model, token: u32, constraint: &mut Constraint) -> Result<(), RunError> {
    let (forward, prepared) = std::thread::scope(|scope| {
        let mask = scope.spawn(|| constraint.prepare());
        (model.decode(token), mask.join())
    });
    forward?;
    match prepared {
        Ok(done) => done.map_err(|e| RunError::Other(e.to_string())),
        Err(_) => Err(RunError::Other("the grammar's thread panicked".into())),
    }
}

/// One scored position: its token and the highest (id, logit) pairs there.
pub type Scored = (u32, Vec<(u32, f32)>);

/// For every position of `tokens`, the token and the `k` highest (id, logit) pairs of
/// the logits computed there (which predict the next token), highest first.
pub fn score(s: &mut Session, tokens: &[u32], k: usize) -> Result<Vec<Scored>, RunError> {
    if tokens.len() > s.model.n_ctx() as usize {
        return Err(RunError::Other(format!("{} tokens do not fit --ctx {}", tokens.len(), s.model.n_ctx())));
    }
    s.model.reset();
    let mut out = Vec::with_capacity(tokens.len());
    for pass in s.model.prompt_passes(tokens.len()) {
        let chunk = &tokens[pass];
        s.model.forward(chunk, Logits::All)?;
        let logits = s.model.logits(chunk.len() as u32)?;
        let vocab = s.model.desc.vocab as usize;
        for (i, &tok) in chunk.iter().enumerate() {
            out.push((tok, sampler::top_k(&logits[i * vocab..(i + 1) * vocab], k)));
        }
    }
    Ok(out)
}

/// Perplexity of `tokens` over consecutive windows of `ctx` tokens: each window is
/// evaluated from an empty cache and its second half is scored (as llama.cpp does, so
/// every scored token sees at least half a window of context). Returns the perplexity
/// and the number of tokens scored.
pub fn perplexity(s: &mut Session, tokens: &[u32], ctx: usize) -> Result<(f64, usize), RunError> {
    let ctx = ctx.min(s.model.n_ctx() as usize);
    if ctx < 2 || tokens.len() < ctx {
        return Err(RunError::Other(format!(
            "perplexity needs at least one window of {ctx} tokens; the text has {}",
            tokens.len()
        )));
    }
    let vocab = s.model.desc.vocab as usize;
    let (mut nll, mut count) = (0f64, 0usize);
    for window in tokens.chunks_exact(ctx) {
        s.model.reset();
        let mut at = 0;
        for pass in s.model.prompt_passes(window.len()) {
            let chunk = &window[pass];
            s.model.forward(chunk, Logits::All)?;
            let logits = s.model.logits(chunk.len() as u32)?;
            for i in 0..chunk.len() {
                let p = at + i;
                if p + 1 < ctx && p >= ctx / 2 {
                    let row = &logits[i * vocab..(i + 1) * vocab];
                    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
                    let target = window[p + 1] as usize;
                    nll -= f64::from(row[target] - max) - sum.ln();
                    count += 1;
                }
            }
            at += chunk.len();
        }
    }
    Ok(((nll / count.max(1) as f64).exp(), count))
}

/// Throughput as llama-bench measures it: `pp` prompt tokens read from an empty cache
/// (`ppN`), and `tg` tokens decoded one at a time from an empty cache (`tgN`), each the
/// mean of `reps` runs after one warm-up. Token ids are arbitrary; speed does not
/// depend on them. Returns (prompt tokens/s, decode tokens/s).
pub fn bench(s: &mut Session, pp: usize, tg: usize, reps: usize) -> Result<(f64, f64), RunError> {
    bench_at(s, pp, tg, reps, 0).map(|(pp, tg, _)| (pp, tg))
}

/// [`bench`] with decoding from `depth` KV positions filled synthetically
/// ([`crate::model::Model::fill_context`]), as llama-bench's `-d` measures decoding deep
/// in a context; `depth` > 0 needs `pp` = 0. Also returns, for mixture-of-experts packs,
/// the expert cache's counters over the timed decoding.
pub fn bench_at(
    s: &mut Session,
    pp: usize,
    tg: usize,
    reps: usize,
    depth: u32,
) -> Result<(f64, f64, Option<ExpertStats>), RunError> {
    if depth > 0 && pp > 0 {
        return Err(RunError::Other("decoding at a depth is timed alone: add -p 0".into()));
    }
    let vocab = s.model.desc.vocab as usize;
    let tokens: Vec<u32> = (0..pp.max(1)).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    let tg = tg.min((s.model.n_ctx() - depth.min(s.model.n_ctx())) as usize);
    let (mut pp_time, mut tg_time) = (Duration::ZERO, Duration::ZERO);
    let mut experts: Option<ExpertStats> = None;
    if depth > 0 {
        s.model.reset();
        s.model.fill_context(depth, 1)?;
    }
    for rep in 0..=reps {
        let mut prefill_time = Duration::ZERO;
        if depth == 0 {
            s.model.reset();
            let start = Instant::now();
            prefill(s, &tokens)?;
            s.model.argmax(1)?;
            prefill_time = start.elapsed();
            s.model.reset();
        } else {
            s.model.rewind(depth)?;
        }
        // The expert cache's counters cover the timed decode only.
        let _ = s.model.take_expert_stats();
        // Like llama-bench, each step reads an arbitrary token (not the last one's
        // argmax): a model whose greedy output repeats would otherwise route every token
        // alike.
        let start = Instant::now();
        for i in 0..tg {
            s.model.decode_greedy(((i * 6151 + 101) % vocab) as u32)?;
        }
        if rep > 0 {
            pp_time += prefill_time;
            tg_time += start.elapsed();
            if let Some(now) = s.model.take_expert_stats() {
                experts.get_or_insert_default().add(&now);
            }
        }
    }
    let reps = reps.max(1) as f64;
    let pp_rate = if depth == 0 { tokens.len() as f64 * reps / pp_time.as_secs_f64() } else { 0.0 };
    Ok((pp_rate, tg as f64 * reps / tg_time.as_secs_f64(), experts))
}

/// Aggregate decode throughput of `seqs` sequences decoded together, as llama.cpp's
/// `llama-batched-bench` measures it (its `S_TG`), without a server: each sequence reads
/// `pp` prompt tokens into its own slot, then `tg` steps decode them all in batched passes
/// ([`crate::model::Model::decode_batch_greedy`], [`crate::model::Model::batch_passes`]), each
/// feeding back its argmax. Returns all sequences' decoded tokens per second of the
/// decoding, over `reps` runs after one warm-up; the session needs `seqs` slots.
pub fn bench_batch(s: &mut Session, seqs: usize, pp: usize, tg: usize, reps: usize) -> Result<f64, RunError> {
    let tg = tg.min(s.model.n_ctx().saturating_sub(pp.max(1) as u32) as usize);
    let mut time = Duration::ZERO;
    for rep in 0..=reps {
        let mut next = start_batch(s, seqs, pp)?;
        let start = Instant::now();
        for _ in 0..tg {
            let mut tokens = Vec::with_capacity(seqs);
            for pass in s.model.batch_passes(seqs) {
                tokens.extend(s.model.decode_batch_greedy(&next[pass])?);
            }
            for (n, token) in next.iter_mut().zip(tokens) {
                n.1 = token;
            }
        }
        if rep > 0 {
            time += start.elapsed();
        }
    }
    Ok((seqs * tg * reps.max(1)) as f64 / time.as_secs_f64())
}

/// Where [`bench_batch`]'s decode step of `seqs` sequences spends its time: after one
/// step in its graphs, one more launch by launch ([`crate::model::Model::profile_batch`],
/// each of [`crate::model::Model::batch_passes`]); each launch's kernel and device seconds.
pub fn profile_batch(s: &mut Session, seqs: usize, pp: usize) -> Result<Vec<(String, f64)>, RunError> {
    let next = start_batch(s, seqs, pp)?;
    let passes = s.model.batch_passes(seqs);
    let mut tokens = Vec::with_capacity(seqs);
    for pass in passes.clone() {
        tokens.extend(s.model.decode_batch_greedy(&next[pass])?);
    }
    let next: Vec<(usize, u32)> = next.iter().zip(tokens).map(|(&(slot, _), token)| (slot, token)).collect();
    let mut times = Vec::new();
    for pass in passes {
        times.extend(s.model.profile_batch(&next[pass])?);
    }
    Ok(times)
}

/// Slots 0 to `seqs` each read the same `pp`-token prompt from an empty cache; returns
/// each one's greedy next token.
fn start_batch(s: &mut Session, seqs: usize, pp: usize) -> Result<Vec<(usize, u32)>, RunError> {
    if seqs == 0 || seqs > s.model.slots() {
        return Err(RunError::Other(format!("a batch of {seqs} needs as many slots; there are {}", s.model.slots())));
    }
    let vocab = s.model.desc.vocab as usize;
    let prompt: Vec<u32> = (0..pp.max(1)).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    let mut next = Vec::with_capacity(seqs);
    for slot in 0..seqs {
        s.model.select(slot)?;
        s.model.reset();
        prefill(s, &prompt)?;
        next.push((slot, s.model.argmax(1)?[0]));
    }
    Ok(next)
}

/// llama.cpp's figures for the same measurement, from its `llama-bench` binary at
/// `binary` on `pack` (all layers on the GPU, flash attention, JSON output): (prompt
/// tokens/s, decode tokens/s), each llama-bench's mean over `reps` runs; with `threads`,
/// on that many CPU threads (a CPU build's comparison with the host backend).
pub fn llama_bench(
    binary: &std::path::Path,
    pack: &std::path::Path,
    pp: usize,
    tg: usize,
    reps: usize,
    threads: Option<usize>,
) -> Result<(f64, f64), RunError> {
    let fail = |what: String| RunError::Other(format!("llama-bench ({}): {what}", binary.display()));
    let out = std::process::Command::new(binary)
        .arg("-m")
        .arg(pack)
        .args(["-ngl", "99", "-fa", "1", "-o", "json"])
        .args(["-p", &pp.to_string(), "-n", &tg.to_string(), "-r", &reps.max(1).to_string()])
        .args(threads.map(|t| ["-t".to_string(), t.to_string()]).into_iter().flatten())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(fail(format!("{}: {}", out.status, err.lines().last().unwrap_or(""))));
    }
    let runs: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).map_err(|e| fail(format!("unreadable JSON: {e}")))?;
    let rate = |prompt: bool| {
        runs.iter()
            .find(|r| {
                let (p, g) = (r["n_prompt"].as_u64().unwrap_or(0), r["n_gen"].as_u64().unwrap_or(0));
                if prompt { p > 0 && g == 0 } else { g > 0 && p == 0 }
            })
            .and_then(|r| r["avg_ts"].as_f64())
            .ok_or_else(|| fail(format!("no {} result in its output", if prompt { "prompt" } else { "decode" })))
    };
    Ok((if pp > 0 { rate(true)? } else { 0.0 }, if tg > 0 { rate(false)? } else { 0.0 }))
}
