//! The engine: one thread owns the model and serves up to `slots` sequences at once, one
//! step per sequence per turn (a fair round robin), with a first-come queue beyond
//! that. A step is one prompt chunk (`--prefill` tokens) while a prompt is read, then
//! one token: a long prompt holds the other slots for one chunk a turn, not for its
//! whole length. A request whose client went away is dropped before its next chunk or
//! token, and a queued one as soon as the engine looks at its queue. With speculative
//! decoding a step may yield several tokens; they are passed on one a turn before the
//! next step. A request with log-probabilities or a grammar (`response_format`, a forced
//! tool call) decodes one token a step, its grammar's mask computed while the model runs.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use strata_runtime::backend::RunError;
use strata_runtime::constrain::Constraint;
use strata_runtime::generate;
use strata_runtime::model::Logits;
use strata_runtime::sampler::{Sampler, SamplerConfig, StopMatcher, top_k};
use strata_runtime::session::Session;
use strata_runtime::speculative::Speculator;
use strata_runtime::tokenizer::StreamDecoder;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;

/// One generation request, tokenized and validated.
pub struct Job {
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Alternatives to report per token (`Some(0)`: only the chosen token's log-probability).
    pub logprobs: Option<usize>,
    /// The grammar the reply must follow (`response_format`, a forced tool call).
    pub constraint: Option<Constraint>,
    /// Where events go; dropped by the client side when it disconnects.
    pub events: UnboundedSender<Event>,
    /// The request's place among those admitted (slots plus queue), given back when the
    /// job is dropped.
    pub admission: OwnedSemaphorePermit,
    /// When the request arrived (time to first token counts from here).
    pub received: Instant,
}

/// A log-probability report for one generated token.
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives: (bytes, log-probability), best first.
    pub top: Vec<(Vec<u8>, f32)>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// End of generation or a stop string.
    Stop,
    /// `max_tokens` or the context.
    Length,
}

impl Finish {
    /// OpenAI's name.
    pub fn name(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What a request hears back.
#[derive(Debug)]
pub enum Event {
    /// Text of one token (possibly empty while UTF-8 or a stop string is pending).
    Token {
        /// Text to append.
        text: String,
        /// When log-probabilities were asked for.
        logprob: Option<TokenLogprob>,
    },
    /// The end, with exact token counts.
    Done {
        /// Why.
        finish: Finish,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens (end-of-generation tokens not counted).
        completion_tokens: usize,
        /// From the request's arrival to its first generated token (none if it had none).
        ttft: Option<Duration>,
    },
    /// The request failed on the device.
    Error(String),
}

/// A request in a slot.
struct Active {
    job: Job,
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopMatcher,
    /// Prompt and generated tokens.
    history: Vec<u32>,
    generated: Vec<u32>,
    /// Prompt tokens read into this slot's KV cache so far.
    read: usize,
    /// Tokens computed but not yet reported (the model has read all but the last);
    /// empty before the prompt is read.
    pending: VecDeque<(u32, Option<TokenLogprob>)>,
    /// This sequence's speculative decoder.
    spec: Speculator,
    started: Instant,
    /// When the last token was reported.
    last_token: Option<Instant>,
    ttft: Option<Duration>,
    /// The closing event, sent once the request has left its slot (so that a client
    /// that has seen the end also sees it in /metrics).
    done: Option<Event>,
}

impl Active {
    fn new(job: Job, spec: Speculator) -> Active {
        Active {
            sampler: Sampler::new(job.sampler.clone()),
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(job.stop.clone()),
            history: job.prompt.clone(),
            generated: Vec::new(),
            read: 0,
            pending: VecDeque::new(),
            spec,
            started: Instant::now(),
            last_token: None,
            ttft: None,
            done: None,
            job,
        }
    }

    fn finish(&mut self, finish: Finish) {
        let tail = self.stops.finish();
        if !tail.is_empty() {
            let _ = self.job.events.send(Event::Token { text: tail, logprob: None });
        }
        self.done = Some(Event::Done {
            finish,
            prompt_tokens: self.job.prompt.len(),
            completion_tokens: self.generated.len(),
            ttft: self.ttft,
        });
    }
}

/// Serves jobs from `jobs` until every sender is gone.
pub fn run(mut s: Session, jobs: Receiver<Job>, metrics: Arc<Metrics>) {
    let mut slots: Vec<Option<Active>> = (0..s.model.slots()).map(|_| None).collect();
    let mut waiting: VecDeque<Job> = VecDeque::new();
    loop {
        if slots.iter().all(Option::is_none) && waiting.is_empty() {
            match jobs.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => return,
            }
        }
        loop {
            match jobs.try_recv() {
                Ok(job) => waiting.push_back(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if slots.iter().all(Option::is_none) && waiting.is_empty() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        // Queued requests whose clients went away give their places back now.
        waiting.retain(|job| !job.events.is_closed());
        for slot in slots.iter_mut().filter(|s| s.is_none()) {
            while let Some(job) = waiting.pop_front() {
                if !job.events.is_closed() {
                    *slot = Some(Active::new(job, Speculator::new(s.spec)));
                    break;
                }
            }
        }
        metrics.set_load(slots.iter().filter(|s| s.is_some()).count(), waiting.len());
        for i in 0..slots.len() {
            let Some(active) = &mut slots[i] else { continue };
            let result = step(&mut s, i, active, &metrics);
            if let Some(experts) = s.model.take_expert_stats() {
                metrics.experts(&experts);
            }
            let done = match result {
                Ok(done) => done,
                Err(e) => {
                    let _ = active.job.events.send(Event::Error(e.to_string()));
                    true
                }
            };
            if let Some(ended) = done.then(|| slots[i].take()).flatten() {
                metrics.set_load(slots.iter().filter(|s| s.is_some()).count(), waiting.len());
                if let Some(event) = ended.done {
                    let _ = ended.job.events.send(event);
                }
            }
        }
        metrics.set_load(slots.iter().filter(|s| s.is_some()).count(), waiting.len());
    }
}

/// One turn of one request: reads one chunk of the prompt while there is one left (the
/// last chunk picks the first token), then reports one token and computes the next.
/// Returns whether the request is over.
fn step(s: &mut Session, slot: usize, a: &mut Active, metrics: &Metrics) -> Result<bool, RunError> {
    if a.job.events.is_closed() {
        return Ok(true); // the client went away
    }
    s.model.select(slot)?;
    if a.read < a.job.prompt.len() {
        if a.read == 0 {
            s.model.reset();
        }
        a.read = generate::prefill_chunk(s, &a.job.prompt, a.read)?;
        if a.read == a.job.prompt.len() {
            let first = pick(s, a)?;
            a.pending.push_back(first);
            metrics.prompt_tokens(a.job.prompt.len(), a.started.elapsed());
        }
        return Ok(false);
    }
    let Some((token, logprob)) = a.pending.pop_front() else {
        return Err(RunError::Other("the engine lost its next token".into()));
    };
    if s.tokenizer.is_eog(token) {
        a.finish(Finish::Stop);
        return Ok(true);
    }
    a.generated.push(token);
    a.history.push(token);
    metrics.completion_token();
    let now = Instant::now();
    match a.last_token {
        None => {
            let ttft = now.saturating_duration_since(a.job.received);
            a.ttft = Some(ttft);
            metrics.first_token(ttft);
        }
        Some(last) => metrics.inter_token(now.saturating_duration_since(last)),
    }
    a.last_token = Some(now);
    let piece = a.decoder.push(&s.tokenizer, token);
    let (text, stopped) = a.stops.push(&piece);
    if a.job.events.send(Event::Token { text, logprob }).is_err() {
        return Ok(true);
    }
    if stopped {
        a.finish(Finish::Stop);
        return Ok(true);
    }
    let full = a.pending.is_empty() && s.model.pos() >= s.model.n_ctx();
    if a.generated.len() >= a.job.max_tokens || full {
        let rest = a.decoder.finish();
        if !rest.is_empty() {
            let (text, _) = a.stops.push(&rest);
            let _ = a.job.events.send(Event::Token { text, logprob: None });
        }
        a.finish(Finish::Length);
        return Ok(true);
    }
    if !a.pending.is_empty() {
        return Ok(false);
    }
    if a.job.logprobs.is_none() && a.job.constraint.is_none() {
        let before = a.spec.stats();
        let new = a.spec.step(&mut s.model, s.draft.as_mut(), &mut a.sampler, &a.history, &a.generated)?;
        metrics.spec(a.spec.stats().since(before));
        a.pending.extend(new.into_iter().map(|t| (t, None)));
    } else {
        // Log-probabilities are reported from each token's own logits, and a grammar
        // masks each token's logits: no speculation.
        match &mut a.job.constraint {
            Some(c) => generate::forward_constrained(&mut s.model, token, c)?,
            None => s.model.forward(&[token], Logits::Last)?,
        }
        let next = pick(s, a)?;
        a.pending.push_back(next);
    }
    Ok(false)
}

/// The next token from the logits the last forward pass left (greedy on the device
/// where possible), with its log-probabilities when asked for.
fn pick(s: &mut Session, a: &mut Active) -> Result<(u32, Option<TokenLogprob>), RunError> {
    if a.sampler.is_greedy() && a.job.logprobs.is_none() && a.job.constraint.is_none() {
        return Ok((s.model.argmax(1)?[0], None));
    }
    let mut logits = s.model.logits(1)?;
    if let Some(c) = &mut a.job.constraint {
        c.mask(&mut logits).map_err(|e| RunError::Other(e.to_string()))?;
    }
    let token = a.sampler.sample_with(&logits, &a.history, &a.generated);
    if let Some(c) = a.job.constraint.as_mut().filter(|_| !s.tokenizer.is_eog(token)) {
        c.accept(token).map_err(|e| RunError::Other(e.to_string()))?;
    }
    let logprob = a.job.logprobs.map(|k| {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_sum = logits.iter().map(|&v| f64::from(v - max).exp()).sum::<f64>().ln() as f32 + max;
        TokenLogprob {
            bytes: s.tokenizer.token_bytes(token),
            logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |l| l - log_sum),
            top: top_k(&logits, k).into_iter().map(|(id, l)| (s.tokenizer.token_bytes(id), l - log_sum)).collect(),
        }
    });
    Ok((token, logprob))
}
