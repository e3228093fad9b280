//! `strata-run chat`: a multi-turn conversation in the terminal, in the pack's chat
//! template. The conversation stays in the KV cache between turns: each turn reads only
//! the text the template adds after what the cache holds (the new user message and the
//! markup around it); `/clear` empties it, `/exit` (or end of input) quits. Ctrl-C stops
//! a reply; at the prompt it quits.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use strata_runtime::chat::{self, Message};
use strata_runtime::generate;
use strata_runtime::sampler::Sampler;
use strata_runtime::session::Session;
use strata_runtime::tokenizer::StreamDecoder;

/// Where the terminal is, for Ctrl-C.
const AT_PROMPT: u8 = 0;
const REPLYING: u8 = 1;

/// Ctrl-C: stops the reply in progress (`stop`), or quits at the prompt.
fn watch_interrupts(state: Arc<AtomicU8>, stop: Arc<AtomicBool>) -> Result<()> {
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the Ctrl-C watcher")?;
    // Registered now, so that a Ctrl-C from here on is ours, not the default exit.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        rt.block_on(async move {
            let mut sig = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ready_tx.send(());
                    return;
                }
            };
            let _ = ready_tx.send(());
            while sig.recv().await.is_some() {
                if state.load(Ordering::SeqCst) == REPLYING {
                    stop.store(true, Ordering::SeqCst);
                } else {
                    println!();
                    std::process::exit(130);
                }
            }
        })
    });
    let _ = ready_rx.recv();
    Ok(())
}

/// The conversation and what the KV cache holds of it.
struct Conversation {
    system: Option<String>,
    messages: Vec<Message>,
    /// Tokens in the KV cache (the model's position), in order.
    cached: Vec<u32>,
    /// The text the cache's tokens stand for, plus the reply's last token's text where
    /// that token is not read yet (`unread`).
    text: String,
    /// A generated token the model has not read (the last of a reply, or the
    /// end-of-turn token it stopped at).
    unread: Option<u32>,
}

impl Conversation {
    fn new(system: Option<String>) -> Self {
        Conversation { system, messages: Vec::new(), cached: Vec::new(), text: String::new(), unread: None }
    }

    fn clear(&mut self) {
        *self = Conversation::new(self.system.take());
    }

    fn render(&self, s: &Session) -> Result<String> {
        let t = &s.tokenizer;
        let template = t.chat_template().unwrap_or(chat::CHATML);
        let text_of = |id: Option<u32>| id.map(|i| t.token_text(i).to_string()).unwrap_or_default();
        let mut all = Vec::new();
        if let Some(sys) = &self.system {
            all.push(Message::new("system", sys.clone()));
        }
        all.extend(self.messages.iter().cloned());
        Ok(chat::render(template, &all, true, &text_of(t.bos()), &text_of(t.eos()))?)
    }

    /// The whole conversation's tokens for the next reply, and how many of them the KV
    /// cache holds already.
    fn next_prompt(&self, s: &Session) -> Result<(Vec<u32>, usize)> {
        let full = self.render(s)?;
        let t = &s.tokenizer;
        if !self.cached.is_empty()
            && !self.text.is_empty()
            && let Some(delta) = full.strip_prefix(&self.text)
        {
            // Only what the template adds: the reply's unread token, its end-of-turn
            // markup and the new turn.
            let mut tokens = self.cached.clone();
            tokens.extend(self.unread);
            // The new message is text: a control token typed in it is not parsed.
            let plain: Vec<_> = self
                .messages
                .last()
                .and_then(|m| delta.rfind(&m.content).map(|at| at..at + m.content.len()))
                .into_iter()
                .collect();
            let mut more = t.encode_marked(delta, true, &plain);
            // The BOS a pack puts before every encoded text belongs at the start only.
            let leading = t.encode("", true).first().copied();
            if leading.is_some() && leading == t.bos() && more.first().copied() == leading {
                more.remove(0);
            }
            tokens.extend(more);
            return Ok((tokens, self.cached.len()));
        }
        // The template rewrote earlier turns (or this is the first): keep what matches.
        let tokens = t.encode(&full, true);
        let same = tokens.iter().zip(&self.cached).take_while(|(a, b)| a == b).count();
        let keep = same.min(tokens.len().saturating_sub(1));
        Ok((tokens, keep))
    }
}

/// Settings of the replies.
pub struct ChatOptions {
    /// The system message, kept through `/clear`.
    pub system: Option<String>,
    /// Most tokens a reply.
    pub max_tokens: usize,
}

/// Runs the conversation on standard input and output until `/exit` or end of input.
pub fn run(s: &mut Session, sampler: &mut Sampler, opts: &ChatOptions) -> Result<()> {
    let state = Arc::new(AtomicU8::new(AT_PROMPT));
    let stop = Arc::new(AtomicBool::new(false));
    watch_interrupts(Arc::clone(&state), Arc::clone(&stop))?;
    let mut conv = Conversation::new(opts.system.clone());
    eprintln!(
        "strata-run: chatting with {} tokens of context; /clear starts over, /exit quits, Ctrl-C stops a reply",
        s.model.n_ctx()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        print!("> ");
        std::io::stdout().flush()?;
        let Some(line) = lines.next() else {
            println!();
            return Ok(());
        };
        let line = line.context("reading standard input")?;
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/clear" => {
                conv.clear();
                s.model.reset();
                println!("(conversation cleared)");
                continue;
            }
            _ if input.starts_with('/') => {
                println!("(commands: /clear, /exit)");
                continue;
            }
            _ => {}
        }
        conv.messages.push(Message::new("user", input));
        let (tokens, cached) = conv.next_prompt(s)?;
        let room = (s.model.n_ctx() as usize).saturating_sub(tokens.len());
        if room == 0 {
            conv.messages.pop();
            println!("(the conversation fills the context of {} tokens: /clear to start over)", s.model.n_ctx());
            continue;
        }
        stop.store(false, Ordering::SeqCst);
        state.store(REPLYING, Ordering::SeqCst);
        let mut decoder = StreamDecoder::new();
        let mut reply = String::new();
        let mut generated = Vec::new();
        let mut stdout = std::io::stdout();
        let start = Instant::now();
        let result = generate::generate_after(s, &tokens, cached, opts.max_tokens, false, sampler, &mut |tok, id| {
            if stop.load(Ordering::SeqCst) {
                return false;
            }
            generated.push(id);
            let text = decoder.push(tok, id);
            reply.push_str(&text);
            let _ = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush());
            true
        });
        state.store(AT_PROMPT, Ordering::SeqCst);
        let tail = decoder.finish();
        reply.push_str(&tail);
        print!("{tail}");
        let stats = match result {
            Ok(stats) => stats,
            Err(e) => {
                // The cache may hold part of the turn: start the next one from scratch.
                println!("\n(error: {e}; the conversation is kept, its cache rebuilt next turn)");
                conv.messages.pop();
                conv.cached.clear();
                conv.text.clear();
                conv.unread = None;
                s.model.reset();
                continue;
            }
        };
        let interrupted = stop.load(Ordering::SeqCst);
        let elapsed = start.elapsed().as_secs_f64();
        // The model read the prompt and the reply's tokens, all of them or all but the
        // last (an end-of-turn token it stopped at is neither passed on nor read).
        let prompt_text = conv.render(s)?;
        let pos = s.model.pos() as usize;
        let read = pos.saturating_sub(tokens.len());
        conv.cached = tokens;
        if pos >= conv.cached.len() && (read == generated.len() || read + 1 == generated.len()) {
            conv.cached.extend(&generated[..read]);
            conv.unread = generated.get(read).copied();
            conv.text = prompt_text + &reply;
        } else {
            // Speculation read further: keep the prompt, re-read the reply next turn.
            let keep = conv.cached.len().min(pos);
            conv.cached.truncate(keep);
            conv.text.clear();
            conv.unread = None;
            s.model.rewind(keep as u32)?;
        }
        conv.messages.push(Message::new("assistant", reply));
        println!(
            "{}\n[{} prompt tokens, {} generated, {:.1} t/s]",
            if interrupted { " (stopped)" } else { "" },
            stats.prompt_tokens,
            generated.len(),
            generated.len() as f64 / elapsed.max(1e-9)
        );
    }
}
