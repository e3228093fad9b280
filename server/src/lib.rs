//! `strata-run serve`: an OpenAI-compatible HTTP server (axum/tokio) over the runtime.
//!
//! The socket is bound first and answers `/health` with 503 while the model loads; the
//! engine thread (see [`engine`]) owns the model and serves `--parallel` sequences; the
//! handlers admit a request (slots plus `--queue`, else 503), parse, validate and
//! tokenize it on a blocking thread ([`api`], [`prompt`]), queue it, and turn engine
//! events into JSON responses or server-sent events. [`http`] bounds connections and
//! stops gracefully on SIGTERM. [`observe`] gives every request an id and logs it.
//!
//! Everything the server says goes through `tracing` events (the binary installs the
//! subscriber): `listening: URL`, `loading: STAGE`, `ready: URL/v1` and `stopping: ...` at
//! `info`, one `request` event per request (target `strata_server::request`), warnings
//! and errors.

pub mod api;
pub mod engine;
pub mod http;
pub mod metrics;
mod observe;
mod prompt;
mod reasoning;
mod reply_grammar;
mod routes;
mod tool_calls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use strata_runtime::constrain::Grammars;
use strata_runtime::session::{self, Event, OpenOptions};
use strata_runtime::tokenizer::Tokenizer;
use strata_runtime::watchdog::Watchdog;
use tokio::sync::Semaphore;

use crate::engine::Job;
use crate::metrics::Metrics;

/// How to serve.
#[derive(Clone, Debug)]
pub struct Config {
    /// The pack.
    pub pack: PathBuf,
    /// How to open it (backend, artifacts, context, slots).
    pub open: OpenOptions,
    /// Address to listen on.
    pub host: String,
    /// Port (0: any free port).
    pub port: u16,
    /// Bearer token required on `/v1/*` and `/metrics`, if set.
    pub api_key: Option<String>,
    /// Names the model is served under (`--served-model-name`): `/v1/models` lists them
    /// and a request's `model` must be one of them. Empty: the pack's file name is
    /// listed and any `model` is answered.
    pub served_model_names: Vec<String>,
    /// Largest request body, bytes.
    pub body_limit: usize,
    /// Requests admitted beyond the slots; more get 503 with `Retry-After`.
    pub max_queue: usize,
    /// Tokens one round of the engine reads at most (`--batch-tokens`).
    pub batch_tokens: usize,
    /// Parse special-token text in `/v1/completions` prompts (trusted clients only).
    pub parse_special: bool,
    /// Connection limits, timeouts and the graceful stop.
    pub limits: http::Limits,
}

/// What the handlers need once the model is loaded.
struct Ready {
    jobs: Mutex<std::sync::mpsc::Sender<Job>>,
    tokenizer: Arc<Tokenizer>,
    n_ctx: u32,
    /// The KV pool requests reserve their pages from.
    kv: engine::KvPool,
    /// Prompts longer than this cannot fit the context ([`prompt::max_prompt_bytes`]).
    max_prompt_bytes: usize,
    /// The vocabulary as constrained decoding reads it; `None` for a pack without an
    /// end-of-generation token (its requests for a grammar get a 400).
    grammars: Option<Grammars>,
}

/// Shared by every handler.
struct State {
    /// The names `/v1/models` lists (at least one); the first is the main one.
    model_ids: Vec<String>,
    /// Whether a request's `model` must be one of `model_ids`.
    strict_model: bool,
    api_key: Option<String>,
    ready: OnceLock<Ready>,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
    /// One permit per request in a slot or queued.
    admission: Arc<Semaphore>,
    parse_special: bool,
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// Loading the model failed.
    #[error("{0}")]
    Load(String),
    /// The server failed while serving.
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves until SIGTERM or Ctrl-C, then stops gracefully (see [`http`]). Logs
/// `listening: URL` once the socket is bound and `ready: URL/v1` once the model serves;
/// a load failure ends `serve` with an error.
pub async fn serve(config: Config) -> Result<(), ServeError> {
    let stop = http::stop_signal()?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
    let local: SocketAddr = listener.local_addr()?;
    let url = format!("http://{local}");
    if !local.ip().is_loopback() && config.api_key.is_none() {
        tracing::warn!("listening on {local} without --api-key: anyone who can reach this address can use the model");
    }
    tracing::info!("listening: {url}");
    let strict_model = !config.served_model_names.is_empty();
    let model_ids = if strict_model {
        config.served_model_names.clone()
    } else {
        vec![config.pack.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())]
    };
    let state = Arc::new(State {
        model_ids,
        strict_model,
        api_key: config.api_key.clone(),
        ready: OnceLock::new(),
        metrics: Arc::new(Metrics::default()),
        next_id: AtomicU64::new(1),
        admission: Arc::new(Semaphore::new(config.open.slots.max(1).saturating_add(config.max_queue))),
        parse_special: config.parse_special,
    });

    // The first failure of the start ends `serve`: the loader's error, or the watchdog's
    // stall (the stalled loader thread is left behind).
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    let failed = Arc::new(Mutex::new(Some(failed_tx)));
    let fail = move |message: String| {
        if let Some(tx) = failed.lock().ok().and_then(|mut f| f.take()) {
            let _ = tx.send(message);
        }
    };
    let stalled = fail.clone();
    let dog = Watchdog::start(config.open.startup_timeout, move |stall| stalled(stall.to_string()));
    let loader_state = Arc::clone(&state);
    std::thread::Builder::new().name("strata-engine".into()).spawn(move || {
        if let Ok(ms) = std::env::var("STRATA_TEST_LOAD_DELAY_MS") {
            // Test hook: keeps the server in its loading state for a while.
            std::thread::sleep(std::time::Duration::from_millis(ms.parse().unwrap_or(0)));
        }
        let mut stage = "pack";
        let opened = session::open(&config.pack, &config.open, &mut |event| {
            match event {
                Event::Stage(s) => {
                    tracing::info!("loading: {s}");
                    stage = s;
                }
                Event::Skipped(backend, why) => tracing::warn!("--backend auto: {backend} not used: {why}"),
                Event::Device(d) => tracing::info!("device: {} ({}, {})", d.name, d.arch, d.backend),
                _ => {}
            }
            dog.progress(stage);
        });
        dog.finish();
        match opened {
            Ok(session) => {
                let tokenizer = Arc::clone(&session.tokenizer);
                let (jobs, queue) = std::sync::mpsc::channel();
                let n_ctx = session.model.n_ctx();
                let max_prompt_bytes = prompt::max_prompt_bytes(&tokenizer, n_ctx);
                let grammars = Grammars::new(&tokenizer)
                    .inspect_err(|e| tracing::warn!("structured output and forced tool calls are off: {e}"))
                    .ok();
                let kv = engine::KvPool::of(&session);
                // The pool as /metrics shows it from the first ready moment.
                loader_state.metrics.set_kv(session.model.kv_pages().0, 0, kv.pages, kv.block);
                let ready = Ready { jobs: Mutex::new(jobs), tokenizer, n_ctx, kv, max_prompt_bytes, grammars };
                let _ = loader_state.ready.set(ready);
                tracing::info!(
                    "ready: {url}/v1 (model {}, {} slot(s), context {n_ctx}, KV pool of {} positions in {} pages)",
                    loader_state.model_ids.join(", "),
                    config.open.slots.max(1),
                    kv.pages as u64 * u64::from(kv.block),
                    kv.pages,
                );
                engine::run(session, queue, Arc::clone(&loader_state.metrics), config.batch_tokens);
            }
            Err(e) => fail(e.to_string()),
        }
    })?;

    let app = routes::router(Arc::clone(&state), config.body_limit);
    let served = http::serve(listener, app, config.limits, stop);
    tokio::select! {
        cut = served => {
            if cut > 0 {
                tracing::warn!("stopped after --shutdown-timeout with {cut} connection(s) still open");
            }
            Ok(())
        }
        Ok(message) = failed_rx => Err(ServeError::Load(message)),
    }
}
