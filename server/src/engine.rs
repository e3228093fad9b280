//! The engine: one thread owns the model and serves up to `slots` sequences at once, with a
//! first-come queue beyond that. Each round gives every sequence one turn: one token
//! reported (the decoding sequences go first), or a prompt chunk while its prompt is read;
//! a long prompt holds the others for one chunk a round, not for its whole length. A round
//! reads at most `--batch-tokens`: one a decoding sequence, and prompt chunks (`--prefill`
//! tokens at most) within the rest, the shortest rest of a prompt first while the oldest
//! request keeps at least half of it (and one token), `prompt_budgets`; a smaller budget
//! keeps the decoding sequences' token gaps short. The round's prompt chunks are read
//! together, several requests' sharing a pass (`Model::read_prompts`), all but a prompt's
//! last token: that one is decoded with the others. Then the sequences that need their next
//! token are decoded together, in the batched passes `Model::batch_passes` gives, whose
//! products read the weights once for all of a pass, each sequence attending over its own
//! cache. The round's tokens are reported while the first of those passes runs (the host's
//! text, stop strings and sending overlap the device's work). A request whose client went
//! away is dropped before its next chunk or token, and a queued one as soon as the engine
//! looks at its queue.
//!
//! Some sequences decode alone: a request with log-probabilities or a grammar
//! (`response_format`, a forced tool call), its grammar's mask computed while the model
//! runs; one whose pass attends sparsely (QSA); and, speculating (`--spec`), the only
//! sequence that needs a token in a round, whose step may yield several tokens (passed
//! on one a round). With more than one, batching serves them better than drafts.
//!
//! The KV cache is paged (see `strata_runtime::model`): a request is admitted once the
//! pool can reserve the pages of its prompt and of every token it may generate, so that
//! the requests in the slots never run out of pages; the oldest waits in the queue until
//! then. A slot keeps its KV cache after a request (not after a failure or a client that
//! went away): the next request goes to the free slot whose cache shares the longest
//! prefix with its prompt and reads only the rest (a chat's next turn reads only the new
//! turn), or starts from the whole pages of a longer prefix another slot holds, running or
//! idle, sharing them (a system prompt many conversations start with is held once); idle
//! caches give up their pages, least recently used first, when running requests need them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use strata_runtime::backend::RunError;
use strata_runtime::constrain::Constraint;
use strata_runtime::generate;
use strata_runtime::model::BatchIds;
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
    /// Whether the prompt may start from a slot's cached prefix (`cache_prompt`).
    pub cache_prompt: bool,
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
        /// Of the prompt tokens, those whose KV entries a slot held already.
        cached_tokens: usize,
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
    /// Prompt tokens in this slot's KV cache so far (from the start, those it held); the
    /// last counts once it joins the round's decode batch, which reads it.
    read: usize,
    /// Prompt tokens the slot held from an earlier request.
    cached: usize,
    /// KV pages reserved for the request: its prompt and every token it may generate.
    pages: u32,
    /// Tokens computed but not yet reported (the model has read all but the last);
    /// empty before the prompt is read.
    pending: VecDeque<(u32, Option<TokenLogprob>)>,
    /// The token taken this round, to report while the device computes the next.
    unreported: Option<(u32, Option<TokenLogprob>)>,
    /// This sequence's speculative decoder.
    spec: Speculator,
    /// When the last token was reported.
    last_token: Option<Instant>,
    ttft: Option<Duration>,
    /// The closing event, sent once the request has left its slot (so that a client
    /// that has seen the end also sees it in /metrics).
    done: Option<Event>,
}

impl Active {
    fn new(job: Job, spec: Speculator, cached: usize, pages: u32) -> Active {
        Active {
            read: cached,
            cached,
            pages,
            sampler: Sampler::new(job.sampler.clone()),
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(job.stop.clone()),
            history: job.prompt.clone(),
            generated: Vec::new(),
            pending: VecDeque::new(),
            unreported: None,
            spec,
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
            cached_tokens: self.cached,
            completion_tokens: self.generated.len(),
            ttft: self.ttft,
        });
    }

    /// The tokens the slot's KV entries are computed from, the first `pos` of them
    /// (the model's position): the history, then the tokens computed ahead.
    fn known(&self, pos: usize) -> impl Iterator<Item = &u32> {
        self.history.iter().chain(self.pending.iter().map(|(t, _)| t)).take(pos)
    }

    /// The tokens whose KV entries the slot holds once this request leaves it.
    fn held(&self, pos: usize) -> Vec<u32> {
        self.known(pos).copied().collect()
    }
}

/// How many leading tokens `held` and `prompt` share, leaving at least one prompt token
/// to read (its logits pick the first generated token).
fn shared_prefix<'a>(held: impl IntoIterator<Item = &'a u32>, prompt: &[u32]) -> usize {
    let same = held.into_iter().zip(prompt).take_while(|(a, b)| a == b).count();
    same.min(prompt.len().saturating_sub(1))
}

/// The prompt tokens each slot may read this round (none where a slot decodes or holds
/// nothing): `budget` less one a decoding sequence, the shortest rest of a prompt first
/// (a short prompt arriving behind a long one is read at once, not after it: measured
/// on the device, its time to first token was the long prompt's), while the oldest
/// request keeps at least half of it (and at least one token), so that a stream of short
/// prompts never stalls a long one.
fn prompt_budgets(slots: &[Option<Active>], budget: usize) -> Vec<usize> {
    let rest = |i: usize| slots[i].as_ref().map_or(0, |a| a.job.prompt.len().saturating_sub(a.read));
    let decoding = slots.iter().flatten().filter(|a| a.read >= a.job.prompt.len()).count();
    let mut left = budget.saturating_sub(decoding);
    let mut order: Vec<usize> = (0..slots.len()).filter(|&i| rest(i) > 0).collect();
    let age = |i: usize| slots[i].as_ref().map(|a| a.job.received);
    let oldest = order.iter().copied().min_by_key(|&i| age(i));
    let mut reserve = oldest.map_or(0, |i| rest(i).min((left / 2).max(1)));
    order.sort_by_key(|&i| (rest(i), age(i)));
    let mut budgets = vec![0; slots.len()];
    for i in order {
        let take = if Some(i) == oldest {
            let take = rest(i).min(left.max(reserve));
            reserve = 0;
            take
        } else {
            rest(i).min(left.saturating_sub(reserve))
        };
        budgets[i] = take;
        left = left.saturating_sub(take);
    }
    budgets
}

/// The order of a round's turns: the decoding requests' (a token taken), then those
/// reading their prompts (a chunk), each in slot order. The tokens are taken before any
/// chunk is queued and reported together, so a decoding request's tokens come one round
/// apart wherever the round waits on the device (a prompt's last chunk waits for its
/// first token). In slot order alone, a stream whose slot came after such a wait saw gaps
/// of a few milliseconds and of two chunks in turn (measured on the H100 while a 16k
/// prompt was read).
fn turn_order(slots: &[Option<Active>]) -> Vec<usize> {
    let reading = |i: usize| slots[i].as_ref().is_some_and(|a| a.read < a.job.prompt.len());
    let (chunks, tokens): (Vec<usize>, Vec<usize>) =
        (0..slots.len()).filter(|&i| slots[i].is_some()).partition(|&i| reading(i));
    tokens.into_iter().chain(chunks).collect()
}

/// The KV pool as admission sees it: what a request reserves, and what the pool can give.
#[derive(Clone, Copy, Debug)]
pub struct KvPool {
    /// Pages in the pool.
    pub pages: u32,
    /// Positions a page.
    pub block: u32,
    /// The context: the most positions a sequence holds.
    pub n_ctx: u32,
    /// Draft tokens a verify window may write past a sequence's last.
    pub window: u32,
    /// Sequence slots.
    pub slots: u32,
}

impl KvPool {
    /// The pool of `s`'s model.
    pub fn of(s: &Session) -> KvPool {
        let block = s.model.qsa_block().max(1);
        let slots = s.model.slots() as u32;
        KvPool { pages: s.model.kv_pages().1, block, n_ctx: s.model.n_ctx(), window: s.model.window(), slots }
    }

    /// The pages a request reserves: its prompt, every token it may generate and a
    /// verify window's draft tokens past them, within the context.
    pub fn pages_for(&self, prompt: usize, max_tokens: usize) -> u32 {
        let positions = prompt.saturating_add(max_tokens).saturating_add(self.window as usize).min(self.n_ctx as usize);
        (positions as u32).div_ceil(self.block.max(1))
    }

    /// The most prompt and generated tokens together that `pages` pages hold.
    pub fn positions(&self, pages: u32) -> usize {
        let tokens = pages as usize * self.block as usize;
        if tokens >= self.n_ctx as usize { self.n_ctx as usize } else { tokens.saturating_sub(self.window as usize) }
    }

    /// Positions the whole pool holds for one request.
    pub fn most(&self) -> usize {
        self.positions(self.pages)
    }

    /// Positions a slot's share of the pool holds (a request without `max_tokens` may
    /// generate up to it, or up to the whole pool where its prompt needs more).
    pub fn share(&self) -> usize {
        self.positions(self.pages / self.slots.max(1))
    }
}

/// Empties idle slots' caches, least recently used first, until the pool's free pages
/// cover what the running requests may still take (their reservations less what they
/// hold): then no request runs out of pages mid-way. An idle slot's cache is kept only
/// as a prefix for a later request.
fn make_room(s: &mut Session, slots: &[Option<Active>], held: &mut [Vec<u32>], used: &[u64]) -> Result<(), RunError> {
    let owed: u32 =
        (0..slots.len()).filter_map(|i| Some(slots[i].as_ref()?.pages.saturating_sub(s.model.kv_held(i)))).sum();
    while s.model.kv_pages().0 < owed {
        let idle = (0..slots.len()).filter(|&i| slots[i].is_none() && s.model.kv_held(i) > 0).min_by_key(|&i| used[i]);
        let Some(i) = idle else {
            return Err(RunError::Other(format!(
                "the KV pool cannot cover its reservations: {owed} pages owed, {} free",
                s.model.kv_pages().0
            )));
        };
        s.model.select(i)?;
        s.model.reset();
        held[i].clear();
    }
    Ok(())
}

/// Puts `job` on a free slot: the one whose cache shares the longest prefix with its
/// prompt (else the one holding least, so that a new conversation keeps others' prefixes
/// where it can), which keeps that prefix; where another slot, running or idle, shares
/// more whole pages, the slot starts from those pages instead (a system prompt another
/// conversation holds). Returns the slot and the prompt tokens its cache holds; `None`
/// where no slot is free.
fn place(
    s: &mut Session,
    slots: &[Option<Active>],
    held: &[Vec<u32>],
    job: &Job,
) -> Result<Option<(usize, usize)>, RunError> {
    // Per slot, the prompt tokens its cache shares and the tokens it holds (read in place:
    // a running request's history may be a long context).
    let caches: Vec<(usize, usize)> = (0..slots.len())
        .map(|i| {
            let (shared, len) = match &slots[i] {
                Some(a) => {
                    let pos = s.model.pos_of(i) as usize;
                    (shared_prefix(a.known(pos), &job.prompt), a.known(pos).count())
                }
                None => (shared_prefix(&held[i], &job.prompt), held[i].len()),
            };
            (if job.cache_prompt { shared } else { 0 }, len)
        })
        .collect();
    let shared = |i: usize| caches[i].0;
    let free = (0..slots.len()).filter(|&i| slots[i].is_none());
    let Some(slot) = free.max_by_key(|&i| (shared(i), std::cmp::Reverse(caches[i].1))) else { return Ok(None) };
    // The slot forgets what follows the shared prefix (all of it for a new conversation).
    s.model.select(slot)?;
    let mut cached = s.model.keep_prefix(shared(slot) as u32)? as usize;
    let block = s.model.qsa_block().max(1) as usize;
    let borrowed = (0..slots.len()).filter(|&i| i != slot).map(|i| (shared(i) / block * block, i)).max();
    if let Some((whole, from)) = borrowed
        && whole > cached
    {
        s.model.share_prefix(from, whole as u32)?;
        cached = whole;
    }
    Ok(Some((slot, cached)))
}

/// Serves jobs from `jobs` until every sender is gone, reading at most `batch_tokens`
/// tokens a round (prompt chunks and decoded tokens).
pub fn run(mut s: Session, jobs: Receiver<Job>, metrics: Arc<Metrics>, batch_tokens: usize) {
    let mut slots: Vec<Option<Active>> = (0..s.model.slots()).map(|_| None).collect();
    // Per slot, the tokens its KV cache holds from the request it served last: a new
    // request goes to the free slot sharing the longest prefix with its prompt, and
    // reads only the rest (a chat's next turn, a shared system prompt).
    let mut held: Vec<Vec<u32>> = vec![Vec::new(); slots.len()];
    // Per slot, when its last request ended (a round count): idle caches give way least
    // recently used first.
    let mut used: Vec<u64> = vec![0; slots.len()];
    let mut round: u64 = 0;
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let pool = KvPool::of(&s);
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
        round += 1;
        while slots.iter().any(Option::is_none) {
            let Some(job) = waiting.front() else { break };
            // The oldest request waits until the pool can reserve its pages (the server
            // refused those the whole pool cannot hold).
            let reserved: u32 = slots.iter().flatten().map(|a| a.pages).sum();
            let need = pool.pages_for(job.prompt.len(), job.max_tokens);
            if reserved + need > pool.pages {
                break;
            }
            let Some(job) = waiting.pop_front() else { break };
            if job.events.is_closed() {
                continue;
            }
            let (slot, cached) = match place(&mut s, &slots, &held, &job) {
                Ok(Some(placed)) => placed,
                Ok(None) => break,
                Err(e) => {
                    let _ = job.events.send(Event::Error(e.to_string()));
                    continue;
                }
            };
            held[slot].clear();
            slots[slot] = Some(Active::new(job, Speculator::new(s.spec), cached, need));
            if let Err(e) = make_room(&mut s, &slots, &mut held, &used)
                && let Some(a) = slots[slot].take()
            {
                let _ = a.job.events.send(Event::Error(e.to_string()));
            }
        }
        metrics.set_load(slots.iter().filter(|s| s.is_some()).count(), waiting.len());
        kv_metrics(&s, &slots, &metrics);
        // Every request's turn: its token taken (reported below), or a prompt chunk within
        // the round's budget (read together after the tokens).
        let budgets = prompt_budgets(&slots, batch_tokens);
        let (mut needs, mut reads, mut reports) = (Vec::new(), Vec::new(), Vec::new());
        for i in turn_order(&slots) {
            let Some(active) = &mut slots[i] else { continue };
            if active.read < active.job.prompt.len() && !active.job.events.is_closed() {
                if budgets[i] > 0 {
                    reads.push((i, budgets[i]));
                }
                continue;
            }
            match take(&s, i, active) {
                Ok(Turn::Over) => retire(&mut s, &mut slots, &mut held, i, false, &metrics, waiting.len()),
                Ok(turn) => {
                    if let Turn::Next(token) = turn {
                        needs.push((i, token));
                    }
                    reports.push((i, matches!(turn, Turn::Last)));
                }
                Err(e) => fail(&mut s, &mut slots, &mut held, [i], &e, &metrics, waiting.len()),
            }
        }
        if let Err((e, failed)) = read_prompts(&mut s, &mut slots, &reads, &metrics, &mut needs) {
            fail(&mut s, &mut slots, &mut held, failed, &e, &metrics, waiting.len());
        }
        // Then the next tokens: alone where a request needs it, the rest in batches. The
        // first batch is started before the round's tokens are reported, so that the host's
        // work per token (text, stop strings, sending) runs while the device computes; a
        // request a stop string or its client ends then leaves a token computed for nothing.
        let alone = |slots: &[Option<Active>], i: usize, s: &Session| {
            slots[i].as_ref().is_some_and(|a| a.job.logprobs.is_some() || a.job.constraint.is_some())
                || s.model.decodes_alone(i)
        };
        let (single, batch): (Vec<_>, Vec<_>) = needs.into_iter().partition(|&(i, _)| alone(&slots, i, &s));
        let single = if batch.len() == 1 { single.into_iter().chain(batch.iter().copied()).collect() } else { single };
        let mut reports = Some(reports);
        let passes = if batch.len() > 1 { s.model.batch_passes(batch.len()) } else { Vec::new() };
        for pass in passes {
            let part = &batch[pass];
            let done = launch_batch(&mut s, &slots, part).and_then(|running| {
                if let Some(reports) = reports.take() {
                    report_all(&mut s, &mut slots, &mut held, reports, &metrics, waiting.len());
                }
                finish_batch(&mut s, &mut slots, part, running, &metrics)
            });
            if let Err(e) = done {
                fail(&mut s, &mut slots, &mut held, part.iter().map(|&(i, _)| i), &e, &metrics, waiting.len());
            }
        }
        if let Some(reports) = reports {
            report_all(&mut s, &mut slots, &mut held, reports, &metrics, waiting.len());
        }
        for (i, token) in single {
            let Some(active) = &mut slots[i] else { continue };
            if let Err(e) = next_alone(&mut s, i, active, token, &metrics) {
                fail(&mut s, &mut slots, &mut held, [i], &e, &metrics, waiting.len());
            }
        }
        if let Some(experts) = s.model.take_expert_stats() {
            metrics.experts(&experts);
        }
        for (i, slot) in slots.iter().enumerate() {
            if slot.is_some() {
                used[i] = round;
            }
        }
        metrics.set_load(slots.iter().filter(|s| s.is_some()).count(), waiting.len());
        kv_metrics(&s, &slots, &metrics);
    }
}

/// The KV pool's pages as `/metrics` shows them: free, reserved by running requests, in all.
fn kv_metrics(s: &Session, slots: &[Option<Active>], metrics: &Metrics) {
    let (free, total) = s.model.kv_pages();
    let reserved = slots.iter().flatten().map(|a| a.pages).sum();
    metrics.set_kv(free, reserved, total, s.model.qsa_block());
}

/// Takes the request out of slot `i` (it is over, or `failed` on the device), keeps what
/// the slot's cache holds for the next request (or gives up its pages, after a failure or
/// a client that went away), and sends the closing event once the load metrics show it
/// gone (a client that has seen the end sees it in /metrics).
fn retire(
    s: &mut Session,
    slots: &mut [Option<Active>],
    held: &mut [Vec<u32>],
    i: usize,
    failed: bool,
    metrics: &Metrics,
    waiting: usize,
) {
    let Some(ended) = slots[i].take() else { return };
    metrics.set_load(slots.iter().filter(|s| s.is_some()).count(), waiting);
    // What the slot holds now, kept as a prefix for a later request; its pages are
    // given up where the device failed under it or the client went away.
    let gone = failed || ended.job.events.is_closed();
    let pos = s.model.select(i).map(|()| s.model.pos() as usize);
    held[i] = match pos {
        Ok(pos) if !gone => ended.held(pos),
        Ok(_) => {
            s.model.reset();
            Vec::new()
        }
        Err(_) => Vec::new(),
    };
    kv_metrics(s, slots, metrics);
    if let Some(event) = ended.done {
        let _ = ended.job.events.send(event);
    }
}

/// What a request needs after its turn.
enum Turn {
    /// It is over.
    Over,
    /// Its token is its last (`max_tokens`, or the context is full): it is over once the
    /// token is reported.
    Last,
    /// Nothing to compute this round: it has tokens computed ahead.
    Busy,
    /// The token after this one (to report, and not yet read by the model).
    Next(u32),
}

/// One turn of a request whose prompt is read: takes its next computed token, to report
/// ([`report`]), saying whether the token after it is still to compute.
fn take(s: &Session, slot: usize, a: &mut Active) -> Result<Turn, RunError> {
    if a.job.events.is_closed() {
        return Ok(Turn::Over); // the client went away
    }
    let Some((token, logprob)) = a.pending.pop_front() else {
        return Err(RunError::Other("the engine lost its next token".into()));
    };
    a.history.push(token); // the model may read it: the slot's held tokens keep their order
    if s.tokenizer.is_eog(token) {
        a.finish(Finish::Stop);
        return Ok(Turn::Over);
    }
    a.generated.push(token);
    a.unreported = Some((token, logprob));
    let full = a.pending.is_empty() && s.model.pos_of(slot) >= s.model.n_ctx();
    Ok(if a.generated.len() >= a.job.max_tokens || full {
        Turn::Last
    } else if a.pending.is_empty() {
        Turn::Next(token)
    } else {
        Turn::Busy
    })
}

/// Reports the token [`take`] took (its text, once UTF-8 and stop strings allow);
/// whether the request is over: its `last` token, a stop string, or a client gone.
fn report(s: &Session, a: &mut Active, last: bool, metrics: &Metrics) -> bool {
    let Some((token, logprob)) = a.unreported.take() else { return false };
    metrics.completion_token();
    let now = Instant::now();
    match a.last_token {
        None => {
            let ttft = now.saturating_duration_since(a.job.received);
            a.ttft = Some(ttft);
            metrics.first_token(ttft);
        }
        Some(before) => metrics.inter_token(now.saturating_duration_since(before)),
    }
    a.last_token = Some(now);
    let piece = a.decoder.push(&s.tokenizer, token);
    let (text, stopped) = a.stops.push(&piece);
    if a.job.events.send(Event::Token { text, logprob }).is_err() {
        return true;
    }
    if stopped {
        a.finish(Finish::Stop);
        return true;
    }
    if last {
        let rest = a.decoder.finish();
        if !rest.is_empty() {
            let (text, _) = a.stops.push(&rest);
            let _ = a.job.events.send(Event::Token { text, logprob: None });
        }
        a.finish(Finish::Length);
    }
    last
}

/// Reports each `(slot, last)`'s token, retiring the requests that are over.
fn report_all(
    s: &mut Session,
    slots: &mut [Option<Active>],
    held: &mut [Vec<u32>],
    reports: Vec<(usize, bool)>,
    metrics: &Metrics,
    waiting: usize,
) {
    for (i, last) in reports {
        if slots[i].as_mut().is_some_and(|a| report(s, a, last, metrics)) {
            retire(s, slots, held, i, false, metrics, waiting);
        }
    }
}

/// Reads the round's prompt chunks, `(slot, most tokens)`, a chunk (`--prefill`) at most
/// each, in shared passes (`Model::read_prompts`): each request's tokens but its prompt's
/// last, which joins `needs` (as a decoding request's reported token does) once the rest
/// is read, its logits picking the first token in the round's decode batch. A prompt
/// whose rest fits a window is read in window passes, each row as reading it alone
/// computes it (so a short request's text is the same batched or alone); longer ones
/// share the GEMMs' passes. On a failure, the error and the slots of every request whose
/// chunk was in the passes.
fn read_prompts(
    s: &mut Session,
    slots: &mut [Option<Active>],
    reads: &[(usize, usize)],
    metrics: &Metrics,
    needs: &mut Vec<(usize, u32)>,
) -> Result<(), (RunError, Vec<usize>)> {
    let (window, chunk) = (s.model.window(), s.model.chunk().max(1));
    // Per request: the prompt tokens it reads in the passes, whether its last follows, and
    // whether the rest of its prompt fits a window.
    let mut runs = Vec::with_capacity(reads.len());
    for &(i, most) in reads {
        let Some(a) = &slots[i] else { continue };
        let (len, body) = (a.job.prompt.len(), a.job.prompt.len().saturating_sub(1));
        let end = (a.read + most.min(chunk as usize)).min(len);
        runs.push((i, a.read..end.min(body), end == len, body - a.read.min(body) <= window as usize));
    }
    for short in [true, false] {
        let parts: Vec<(usize, &[u32])> = runs
            .iter()
            .filter(|(_, run, _, fits)| !run.is_empty() && *fits == short)
            .filter_map(|(i, run, _, _)| Some((*i, &slots[*i].as_ref()?.job.prompt[run.clone()])))
            .collect();
        if let Err(e) = s.model.read_prompts(&parts, if short { window } else { chunk }) {
            return Err((e, parts.iter().map(|&(i, _)| i).collect()));
        }
        for (i, run, last, _) in runs.iter().filter(|(.., fits)| *fits == short) {
            let Some(a) = &mut slots[*i] else { continue };
            a.read = run.end;
            if let (true, Some(&token)) = (*last, a.job.prompt.last()) {
                a.read = a.job.prompt.len();
                metrics.prompt_tokens(a.read, a.cached);
                needs.push((*i, token));
            }
        }
    }
    Ok(())
}

/// Computes the token after `token` for one request alone: speculating where it may (the
/// step may yield several), else one decode step (a grammar masks its logits).
fn next_alone(s: &mut Session, slot: usize, a: &mut Active, token: u32, metrics: &Metrics) -> Result<(), RunError> {
    s.model.select(slot)?;
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
            None => s.model.decode(token)?,
        }
        let next = pick(s, a)?;
        a.pending.push_back(next);
    }
    Ok(())
}

/// A batched pass started on the device.
enum Running {
    /// Greedy: the ids come back.
    Greedy(BatchIds),
    /// Sampled: each row of logits comes back.
    Sampled,
}

/// Starts the pass that computes the next token of each request of `part` (`(slot, its
/// last token)`): greedy ones from the device's argmax, sampled ones from their rows.
fn launch_batch(s: &mut Session, slots: &[Option<Active>], part: &[(usize, u32)]) -> Result<Running, RunError> {
    if part.iter().all(|&(i, _)| slots[i].as_ref().is_some_and(|a| a.sampler.is_greedy())) {
        return Ok(Running::Greedy(s.model.launch_batch_greedy(part)?));
    }
    s.model.decode_batch(part)?;
    Ok(Running::Sampled)
}

/// Waits for [`launch_batch`]'s pass and gives each request still in its slot its token.
fn finish_batch(
    s: &mut Session,
    slots: &mut [Option<Active>],
    part: &[(usize, u32)],
    running: Running,
    metrics: &Metrics,
) -> Result<(), RunError> {
    let next = match running {
        Running::Greedy(ids) => s.model.batch_ids(ids)?,
        Running::Sampled => {
            let vocab = s.model.desc.vocab as usize;
            let logits = s.model.logits(part.len() as u32)?;
            let rows = part.iter().zip(logits.chunks_exact(vocab));
            rows.map(|(&(i, _), row)| {
                slots[i].as_mut().map_or(0, |a| a.sampler.sample_with(row, &a.history, &a.generated))
            })
            .collect()
        }
    };
    metrics.batch(part.len());
    for (&(i, _), token) in part.iter().zip(next) {
        if let Some(a) = slots[i].as_mut() {
            a.pending.push_back((token, None));
        }
    }
    Ok(())
}

/// Sends `e` to the requests of `failed` (slots) and retires them.
fn fail(
    s: &mut Session,
    slots: &mut [Option<Active>],
    held: &mut [Vec<u32>],
    failed: impl IntoIterator<Item = usize>,
    e: &RunError,
    metrics: &Metrics,
    waiting: usize,
) {
    for i in failed {
        if let Some(active) = &slots[i] {
            let _ = active.job.events.send(Event::Error(e.to_string()));
        }
        retire(s, slots, held, i, true, metrics, waiting);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A request in a slot: a prompt of `len` tokens, `read` of them read, arrived
    /// `age` milliseconds before `now`.
    fn active(len: usize, read: usize, now: Instant, age: u64) -> Active {
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        let admission = Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().expect("a permit");
        let job = Job {
            prompt: vec![1; len],
            max_tokens: 1,
            sampler: SamplerConfig::default(),
            stop: Vec::new(),
            logprobs: None,
            constraint: None,
            cache_prompt: true,
            events,
            admission,
            received: now - Duration::from_millis(age),
        };
        let mut a = Active::new(job, Speculator::new(strata_runtime::speculative::SpeculativeConfig::OFF), 0, 1);
        a.read = read;
        a
    }

    #[test]
    fn a_round_reads_the_shortest_prompts_first_within_the_budget_left_by_decoding() {
        let now = Instant::now();
        // Two decoding, a young long prompt, an old one, an empty slot.
        let slots = vec![
            Some(active(10, 10, now, 50)),
            Some(active(1000, 100, now, 10)),
            Some(active(300, 0, now, 90)),
            None,
            Some(active(5, 5, now, 0)),
        ];
        assert_eq!(prompt_budgets(&slots, 512), vec![0, 210, 300, 0, 0]);
        assert_eq!(prompt_budgets(&slots, 100), vec![0, 0, 98, 0, 0]);
        // Decoding takes the whole budget: the oldest prompt still reads a token.
        assert_eq!(prompt_budgets(&slots, 2), vec![0, 0, 1, 0, 0]);
        assert_eq!(prompt_budgets(&[Some(active(40, 39, now, 0))], 8), vec![1]);
    }

    #[test]
    fn a_round_takes_every_decoding_request_s_token_before_any_prompt_chunk() {
        let now = Instant::now();
        // A long prompt on slot 0, a short one on slot 1 (its last chunk waits on the
        // device), decoding requests after them and on either side of an empty slot.
        let slots = vec![
            Some(active(16000, 512, now, 0)),
            Some(active(70, 0, now, 0)),
            Some(active(10, 10, now, 0)),
            None,
            Some(active(10, 10, now, 0)),
            Some(active(40, 39, now, 0)),
        ];
        assert_eq!(turn_order(&slots), vec![2, 4, 0, 1, 5]);
    }

    #[test]
    fn a_short_prompt_is_not_held_behind_a_long_one_nor_the_long_one_starved() {
        let now = Instant::now();
        let decoding = || Some(active(10, 10, now, 500));
        // Eight streams decoding, a 16k prompt being read, a short prompt arriving.
        let mut slots: Vec<_> = (0..8).map(|_| decoding()).collect();
        slots.push(Some(active(16_000, 4096, now, 300)));
        slots.push(Some(active(20, 0, now, 0)));
        assert_eq!(prompt_budgets(&slots, 512)[8..], [484, 20]);
        // Short prompts enough to fill the round: the oldest still reads half of it.
        let mut slots = vec![Some(active(16_000, 0, now, 300))];
        slots.extend((0..10).map(|_| Some(active(100, 0, now, 0))));
        let budgets = prompt_budgets(&slots, 512);
        assert_eq!(budgets[0], 256);
        assert_eq!(budgets.iter().sum::<usize>(), 512);
        assert_eq!(budgets[1..4], [100, 100, 56]);
        // An old short prompt reads whole before a younger long one.
        let slots = vec![Some(active(5000, 0, now, 0)), Some(active(30, 0, now, 9))];
        assert_eq!(prompt_budgets(&slots, 512), vec![482, 30]);
    }

    #[test]
    fn a_shared_prefix_leaves_a_token_to_read() {
        assert_eq!(shared_prefix(&[1, 2, 3, 9], &[1, 2, 3, 4, 5]), 3);
        assert_eq!(shared_prefix(&[1, 2, 3], &[1, 2, 3]), 2, "the last prompt token is read again for its logits");
        assert_eq!(shared_prefix(&[], &[1, 2]), 0);
        assert_eq!(shared_prefix(&[7], &[1]), 0);
    }
}
