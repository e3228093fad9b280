//! `strata-run serve`: an OpenAI-compatible HTTP server (axum/tokio) over the runtime.
//!
//! The socket is bound first and answers `/health` with 503 while the model loads; the
//! engine thread (see [`engine`]) owns the model and serves `--parallel` sequences; the
//! handlers parse and validate requests ([`api`]), tokenize them, queue them, and turn
//! engine events into JSON responses or server-sent events.

pub mod api;
pub mod engine;
pub mod metrics;
mod routes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use strata_runtime::session::{self, Event, OpenOptions};
use strata_runtime::tokenizer::Tokenizer;
use strata_runtime::watchdog::Watchdog;

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
    /// Bearer token required on `/v1/*`, if set.
    pub api_key: Option<String>,
    /// Largest request body, bytes.
    pub body_limit: usize,
}

/// What the handlers need once the model is loaded.
struct Ready {
    jobs: Mutex<std::sync::mpsc::Sender<Job>>,
    tokenizer: Arc<Tokenizer>,
    n_ctx: u32,
}

/// Shared by every handler.
struct State {
    model_id: String,
    api_key: Option<String>,
    ready: OnceLock<Ready>,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
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

/// Serves until the process ends. `say` hears `listening: URL` once the socket is bound
/// and `ready: URL/v1` once the model serves; a load failure ends `serve` with an error.
pub async fn serve(config: Config, say: impl Fn(&str) + Send + Sync + 'static) -> Result<(), ServeError> {
    let addr = format!("{}:{}", config.host, config.port);
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
    let local: SocketAddr = listener.local_addr()?;
    let url = format!("http://{local}");
    say(&format!("listening: {url}"));
    let model_id = config.pack.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    let state = Arc::new(State {
        model_id,
        api_key: config.api_key.clone(),
        ready: OnceLock::new(),
        metrics: Arc::new(Metrics::default()),
        next_id: AtomicU64::new(1),
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
            if let Event::Stage(s) = event {
                stage = s;
            }
            dog.progress(stage);
        });
        dog.finish();
        match opened {
            Ok(session) => {
                let tokenizer = Arc::clone(&session.tokenizer);
                let (jobs, queue) = std::sync::mpsc::channel();
                let n_ctx = session.model.n_ctx();
                let _ = loader_state.ready.set(Ready { jobs: Mutex::new(jobs), tokenizer, n_ctx });
                say(&format!("ready: {url}/v1"));
                engine::run(session, queue, Arc::clone(&loader_state.metrics));
            }
            Err(e) => fail(e.to_string()),
        }
    })?;

    let app = routes::router(Arc::clone(&state), config.body_limit);
    let server = axum::serve(listener, app).into_future();
    tokio::select! {
        result = server => result.map_err(ServeError::Io),
        Ok(message) = failed_rx => Err(ServeError::Load(message)),
    }
}
