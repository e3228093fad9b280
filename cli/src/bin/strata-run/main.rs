//! `strata-run`: loads a pack with kernels compiled for this device (compiling them into
//! the cache when no artifacts are given), self-tests them, and generates, scores or
//! measures perplexity.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::ProgressBar;
use strata_cli::pull;
use strata_compiler::build::Resources;
use strata_compiler::build::sass::HotLoop;
use strata_compiler::plan::Int8Dot;
use strata_runtime::artifacts::Artifacts;
use strata_runtime::backend::RunError;
use strata_runtime::chat::{self, Message};
use strata_runtime::constrain::{Constraint, Grammars};
use strata_runtime::generate;
use strata_runtime::model::{CacheSize, ExpertOptions, KvBudget, Policy, QsaConfig};
use strata_runtime::sampler::{Sampler, SamplerConfig, StopMatcher};
use strata_runtime::session::{self, BackendChoice, Event, OpenOptions, SelfTest, Session};
use strata_runtime::speculative::SpeculativeConfig;
use strata_runtime::tokenizer::{StreamDecoder, Tokenizer};
use strata_runtime::watchdog::Watchdog;

mod repl;
mod report;
use report::{expert_stats_line, print_batch_profile, print_kernel_report, print_window_report, report};

#[derive(Parser)]
#[command(version, about = "Runs a GGUF pack with kernels compiled for this device")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generates text from a prompt, streaming it to stdout.
    Generate {
        #[command(flatten)]
        open: OpenArgs,
        #[command(flatten)]
        prompt: PromptArgs,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
        #[command(flatten)]
        sample: SampleArgs,
        /// Stop when this text is generated (repeatable).
        #[arg(long)]
        stop: Vec<String>,
        /// Go on past end-of-generation tokens (for benchmarks and comparisons).
        #[arg(long, conflicts_with_all = ["json_schema", "grammar"])]
        ignore_eos: bool,
        /// The output is one JSON value valid under the JSON schema in this file
        /// (constrained decoding; one token a step).
        #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
        json_schema: Option<PathBuf>,
        /// The output is in the language of the Lark grammar in this file (llguidance's
        /// dialect; `%json {...}` embeds a schema).
        #[arg(long, value_name = "FILE")]
        grammar: Option<PathBuf>,
    },
    /// An interactive chat in the terminal, in the pack's chat template: the conversation
    /// stays in the KV cache, so each turn reads only its new tokens. /clear starts over,
    /// /exit quits; Ctrl-C stops a reply (at the prompt, it quits).
    Chat {
        #[command(flatten)]
        open: OpenArgs,
        /// System message.
        #[arg(long)]
        system: Option<String>,
        /// Most tokens a reply.
        #[arg(long, default_value_t = 1024)]
        max_tokens: usize,
        #[command(flatten)]
        sample: SampleArgs,
    },
    /// Downloads MODEL (a Hugging Face OWNER/REPO[:QUANT] or file URL) into the cache,
    /// resuming a cut download and checking the hub's SHA-256, and prints its path.
    Pull {
        /// OWNER/REPO[:QUANT] (QUANT picks the .gguf whose name contains it), or
        /// https://huggingface.co/OWNER/REPO/resolve/REVISION/FILE.gguf.
        model: String,
    },
    /// Prints, for every prompt position, its token and the K highest logits there, as JSON.
    Score {
        #[command(flatten)]
        open: OpenArgs,
        #[command(flatten)]
        prompt: PromptArgs,
        /// Logits per position.
        #[arg(long, default_value_t = 5)]
        top_k: usize,
        /// Print JSON (the only format).
        #[arg(long)]
        json: bool,
    },
    /// Perplexity of a text file.
    Perplexity {
        #[command(flatten)]
        open: OpenArgs,
        /// The text.
        #[arg(long)]
        file: PathBuf,
        /// Tokens per evaluated window.
        #[arg(long = "window", default_value_t = 512)]
        window: usize,
    },
    /// Prompt and decode throughput, as llama-bench's ppN and tgN.
    Bench {
        #[command(flatten)]
        open: OpenArgs,
        /// Prompt tokens, read in chunks of --prefill (its time, to the first token's
        /// argmax, is also printed as ttft).
        #[arg(short = 'p', long, default_value_t = 512)]
        prompt_tokens: usize,
        /// Decoded tokens.
        #[arg(short = 'n', long, default_value_t = 128)]
        gen_tokens: usize,
        /// Repetitions (after one warm-up).
        #[arg(short = 'r', long, default_value_t = 3)]
        reps: usize,
        /// Also time each single-token matrix-vector kernel alone: bytes moved, time,
        /// GB/s, and % of the copy bandwidth measured in the same run.
        #[arg(long)]
        kernels: bool,
        /// With --kernels: also time every compiled verify window T of each GEMV shape
        /// (`strata-compile --spec`) and print, per shape, time, time per token and the
        /// ratio to T=1.
        #[arg(long, requires = "kernels")]
        windows: bool,
        /// With --kernels: the tokens each GEMM is timed at (a prompt chunk by default;
        /// at a batch GEMV's width, 32 or fewer, its weights rotate as the GEMVs' do, so
        /// its time compares with the window's or the batch's GEMV).
        #[arg(long, requires = "kernels", default_value_t = strata_runtime::bench::GEMM_TOKENS)]
        gemm_tokens: u32,
        /// A llama.cpp `llama-bench` binary: also measure llama.cpp on the same pack and
        /// print the ratios.
        #[arg(long, value_name = "PATH")]
        llama_bench: Option<PathBuf>,
        /// Decode from this many KV positions, filled with synthetic keys and values
        /// (llama-bench's -d; needs -p 0).
        #[arg(long, default_value_t = 0)]
        depth: u32,
        /// Instead: time one layer's attention of a decode token at each of --contexts,
        /// dense and with QSA at each of --qsa-budgets.
        #[arg(long)]
        attention: bool,
        /// Context depths for --attention.
        #[arg(long, value_delimiter = ',', default_values_t = [8192u32, 32768, 131072])]
        contexts: Vec<u32>,
        /// QSA budgets (tokens) for --attention.
        #[arg(long, value_delimiter = ',', default_values_t = [2048u32, 4096])]
        qsa_budgets: Vec<u32>,
        /// Instead: the aggregate decode rate of N sequences decoded together, for each N
        /// (llama-batched-bench's S_TG): each reads -p prompt tokens, then -n tokens each.
        #[arg(long, value_delimiter = ',', value_name = "N,...")]
        batch: Vec<usize>,
        /// With --batch: also run one step of each N launch by launch, a timing mark
        /// after each, and print where its time goes by kernel (each launch waits on the
        /// host's queueing, so short kernels read longer than in the step's graph).
        #[arg(long, requires = "batch")]
        profile: bool,
    },
    /// Serves an OpenAI-compatible API (`/v1/chat/completions`, `/v1/completions`,
    /// `/v1/models`, `/health`, `/metrics`).
    Serve {
        #[command(flatten)]
        open: OpenArgs,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port (0: any free port).
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Require `Authorization: Bearer KEY` on /v1/* and /metrics. The key is taken
        /// from this flag, else --api-key-file, else the STRATA_API_KEY environment
        /// variable (the file and the variable keep it out of `ps`).
        #[arg(long)]
        api_key: Option<String>,
        /// Read the API key from the first line of this file (trimmed; an unreadable or
        /// empty file is an error).
        #[arg(long, value_name = "PATH")]
        api_key_file: Option<PathBuf>,
        /// Serve the model under this name (repeatable, or comma-separated aliases):
        /// /v1/models lists them and a request's `model` must be one of them (else 404).
        /// Without it the pack's file name is listed and any `model` is answered.
        #[arg(long, value_name = "NAME", value_delimiter = ',')]
        served_model_name: Vec<String>,
        /// Log format on stderr: text or json (one object a line). Levels follow
        /// RUST_LOG (default info).
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// Requests decoded at once, each with its KV pages from the one pool (--kv-budget);
        /// up to 16 a pass on the window GEMVs, up to 32 on the batch GEMVs where compiled,
        /// more in passes of up to 64 on the GEMMs.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
        /// Largest request body in bytes (larger: 413).
        #[arg(long, default_value_t = 4 << 20)]
        body_limit: usize,
        /// Tokens one round of the engine reads at most: each decoding request's one,
        /// and prompt chunks (of --prefill at most) within the rest, the shortest rest
        /// of a prompt first, the oldest request keeping at least half (one token at
        /// least). Smaller keeps the decoding
        /// requests' token gaps short while a long prompt is read; larger reads prompts
        /// faster.
        #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
        batch_tokens: u64,
        /// Requests queued for a slot beyond --parallel; more are answered 503 with
        /// Retry-After.
        #[arg(long, default_value_t = 64)]
        queue: usize,
        /// Connections served at once; more wait in the accept backlog. Keep it under
        /// the open-file limit (`ulimit -n`).
        #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
        max_connections: u64,
        /// Seconds a connection may take to send a request head or stay idle between
        /// requests (also the longest pause inside a request body).
        #[arg(long, default_value_t = 10.0, value_name = "S")]
        header_timeout: f64,
        /// Seconds in-flight requests may run on after SIGTERM or Ctrl-C before the
        /// server exits anyway.
        #[arg(long, default_value_t = 30.0, value_name = "S")]
        shutdown_timeout: f64,
        /// Parse special-token text (`<|im_start|>`...) in /v1/completions prompts as
        /// control tokens. Only for trusted clients; chat messages are always plain text.
        #[arg(long)]
        parse_special: bool,
    },
    /// Self-tests every kernel of the artifacts on the device and prints a table.
    Selftest {
        #[command(flatten)]
        open: OpenArgs,
    },
}

#[derive(Args)]
struct SampleArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Keep the most likely tokens whose probabilities sum to P.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens less likely than P times the most likely.
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalty for repeating recent tokens (1: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SampleArgs {
    fn sampler(&self) -> Sampler {
        Sampler::new(SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            seed: self.seed,
            ..SamplerConfig::default()
        })
    }
}

#[derive(Args)]
struct OpenArgs {
    /// The model: a .gguf file (any shard of a split pack), a Hugging Face
    /// OWNER/REPO[:QUANT] (downloaded into the cache when not there yet; QUANT picks the
    /// .gguf whose name contains it), or a https://huggingface.co/.../resolve/... file URL.
    #[arg(short = 'm', long = "model", visible_alias = "pack", value_name = "MODEL")]
    model: String,
    /// Compiled artifacts (default: compile for the detected device into the cache).
    #[arg(long)]
    artifacts: Option<PathBuf>,
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Host backend worker threads (default: one per physical core).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// The GPU to run on, by its index on the backend (default: the first supported one;
    /// devices strata has no target for, such as an integrated GPU, are named and skipped).
    #[arg(long, value_name = "N")]
    device: Option<usize>,
    /// Context length (default: the pack's).
    #[arg(long)]
    ctx: Option<u32>,
    /// Tokens per prompt pass: GEMMs on the matrix units where wider than the verify
    /// window (a mixture of experts reads its prompt in window passes of up to 16).
    #[arg(long, default_value_t = strata_compiler::plan::rules::GEMM_CHUNK, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    prefill: u32,
    /// Seconds a kernel may run before it is reported as a hang.
    #[arg(long, default_value_t = 10.0)]
    deadline: f64,
    /// Seconds the start (device, artifacts, self-test, upload, warm-up) may go without
    /// progress before it is ended with an error naming the stage.
    #[arg(long, default_value_t = 300.0, value_name = "S")]
    startup_timeout: f64,
    /// Int8-dot GEMVs where kernels are planned here (CPU) or compiled into the cache:
    /// auto, large, always or never (see strata-compile --int8; the CPU reference takes
    /// auto as large).
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<Int8Dot>())]
    int8: Int8Dot,
    /// Speculative decoding with verify windows of T tokens (2 to 16; 0 or 1: off):
    /// up to T-1 drafted tokens are checked in one pass. GPU artifacts need
    /// `strata-compile --spec T` or more.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=16))]
    spec: u32,
    /// The n-gram drafter's longest suffix matched in the text so far (down to 2).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=64))]
    spec_ngram: u64,
    /// Most tokens drafted a step (default T-1); the draft length adapts below it.
    #[arg(long)]
    spec_draft_max: Option<usize>,
    /// Draft with this pack (same vocabulary) instead of n-gram lookup.
    #[arg(long, value_name = "PACK")]
    draft_pack: Option<PathBuf>,
    /// The draft pack's compiled artifacts (default: compiled into the cache).
    #[arg(long, value_name = "DIR")]
    draft_artifacts: Option<PathBuf>,
    /// Query-aware sparse attention (Quest) for decoding past --qsa-budget tokens: on or off.
    #[arg(long, value_enum, default_value_t = Switch::Off)]
    qsa: Switch,
    /// KV positions each token attends to per KV head with --qsa on (a multiple of the block).
    #[arg(long, default_value_t = strata_runtime::model::qsa::DEFAULT_BUDGET)]
    qsa_budget: u32,
    /// KV positions per QSA block; must be the compiled one (strata-compile --qsa-block).
    #[arg(long)]
    qsa_block: Option<u32>,
    /// Device memory for a mixture-of-experts pack's experts: auto (all if the device
    /// budget holds them, else what it leaves), MiB, or a share of the expert bytes
    /// (25%). Experts without a slot stay in host memory and stream in over PCIe.
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<CacheSize>())]
    expert_cache: CacheSize,
    /// Which cached expert gives way: lru, or lfu (use counts halving every 16 tokens).
    #[arg(long, default_value = "lfu", value_parser = |s: &str| s.parse::<Policy>())]
    expert_policy: Policy,
    /// Device memory the model may take in all, MiB (default: 90% of the device's); with
    /// --expert-cache auto, the experts get what the rest leaves.
    #[arg(long, value_name = "MIB")]
    vram_budget: Option<u64>,
    /// Memory for the KV cache pool, MiB (every layer's pages together): the sequences
    /// take pages of it as they grow, and requests wait while it is full. Default: a whole
    /// --ctx for each slot.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=(1 << 40)))]
    kv_budget: Option<u64>,
    /// Refuse greedy tokens from NaN or infinite logits, naming the first layer that
    /// produced one (decoding runs uncaptured). On by itself with `--checked` artifacts.
    #[arg(long)]
    checked: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

#[derive(Args)]
struct PromptArgs {
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the pack's chat template.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    system: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Sends `tracing` events to stderr as text or JSON lines, filtered by RUST_LOG (default
/// `info`; invalid directives are skipped).
fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::filter::LevelFilter;
    let filter = EnvFilter::builder().with_default_directive(LevelFilter::INFO.into()).from_env_lossy();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The API key: `--api-key`, else the first line of `--api-key-file`, else
/// `STRATA_API_KEY`; none of them: no key. A file or variable that yields an empty key is
/// an error rather than an open server.
fn api_key(flag: Option<String>, file: Option<&std::path::Path>) -> Result<Option<String>> {
    if let Some(key) = flag {
        if key.trim().is_empty() {
            bail!("--api-key is empty");
        }
        return Ok(Some(key));
    }
    if let Some(path) = file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading the API key file {}", path.display()))?;
        let key = text.lines().next().unwrap_or_default().trim();
        if key.is_empty() {
            bail!("the API key file {} is empty (the key is its first line)", path.display());
        }
        return Ok(Some(key.to_owned()));
    }
    match std::env::var("STRATA_API_KEY") {
        Ok(key) if key.trim().is_empty() => bail!("STRATA_API_KEY is set but empty"),
        Ok(key) => Ok(Some(key.trim().to_owned())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => bail!("STRATA_API_KEY is not valid UTF-8"),
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    /// A GPU (CUDA, then HIP), else the host's generated kernels, else the reference.
    Auto,
    /// The CPU reference: plain Rust, the oracle every kernel is tested against; slow.
    #[value(alias = "reference")]
    Cpu,
    /// Kernels generated and compiled for this CPU (AVX2, AVX-512, NEON), on all cores.
    Host,
    /// An NVIDIA GPU.
    Cuda,
    /// An AMD GPU.
    Hip,
}

/// Marks an error already written to the log.
#[derive(Debug)]
struct Logged;

impl std::fmt::Display for Logged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("logged")
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if e.downcast_ref::<Logged>().is_none() {
                eprintln!("strata-run: {e:#}");
            }
            // A hang leaves the device busy: exit at once with a distinct status.
            if matches!(e.downcast_ref::<RunError>(), Some(RunError::Hang { .. })) {
                std::process::exit(3);
            }
            ExitCode::FAILURE
        }
    }
}

fn open_options(args: &OpenArgs, selftest: SelfTest, slots: usize) -> OpenOptions {
    OpenOptions {
        backend: match args.backend {
            BackendArg::Auto => BackendChoice::Auto,
            BackendArg::Cpu => BackendChoice::Cpu,
            BackendArg::Host => BackendChoice::Host,
            BackendArg::Cuda => BackendChoice::Cuda,
            BackendArg::Hip => BackendChoice::Hip,
        },
        device: args.device,
        artifacts: args.artifacts.clone(),
        ctx: args.ctx,
        prefill: args.prefill,
        selftest,
        deadline: Duration::from_secs_f64(args.deadline.max(0.001)),
        startup_timeout: Duration::from_secs_f64(args.startup_timeout.max(0.001)),
        slots,
        kv: args.kv_budget.map_or(KvBudget::PerSlot, |mib| KvBudget::Bytes(mib << 20)),
        int8: args.int8,
        spec: SpeculativeConfig { window: args.spec, ngram: args.spec_ngram as usize, draft_max: args.spec_draft_max },
        draft_pack: args.draft_pack.clone(),
        draft_artifacts: args.draft_artifacts.clone(),
        qsa: QsaConfig { enabled: args.qsa == Switch::On, budget: args.qsa_budget, block: args.qsa_block },
        experts: ExpertOptions {
            cache: args.expert_cache,
            policy: args.expert_policy,
            vram_budget_mib: args.vram_budget,
        },
        checked: args.checked,
        threads: args.threads,
    }
}

fn open(args: &OpenArgs, selftest: SelfTest, verbose_selftest: bool, slots: usize) -> Result<Session> {
    let opts = open_options(args, selftest, slots);
    let bar = ProgressBar::hidden();
    let mut tested = 0usize;
    // A stalled start ends the process, as a hang does: the stalled call cannot be undone.
    let dog = Watchdog::start(opts.startup_timeout, |stall| {
        eprintln!("strata-run: {stall}");
        std::process::exit(3);
    });
    let pack = pull::resolve(&args.model)?;
    let mut stage = "pack";
    let session = session::open(&pack, &opts, &mut |event| {
        if let Event::Stage(s) = event {
            stage = s;
        }
        dog.progress(stage);
        report(event, &bar, &mut tested, verbose_selftest)
    });
    dog.finish();
    bar.finish_and_clear();
    if tested > 0 && !verbose_selftest {
        eprintln!("strata-run: self-test: {tested} kernels passed");
    }
    Ok(session?)
}

/// What `generate --json-schema` or `--grammar` asks the output to follow.
enum Grammar {
    Schema(serde_json::Value),
    Lark(String),
}

/// Each kernel's hot loop as the artifacts' manifest records it (compiled where cuobjdump
/// could read the SASS), for `bench --kernels`' instructions a weight.
fn hot_loops(artifacts: Option<&Artifacts>) -> BTreeMap<String, HotLoop> {
    artifacts
        .into_iter()
        .flat_map(|a| &a.manifest.kernels)
        .filter_map(|k| match &k.resources {
            Resources::Ptxas { hot_loop: Some(hot), .. } => Some((k.kernel.name.clone(), *hot)),
            _ => None,
        })
        .collect()
}

/// Reads the grammar file, if one was named, before the model loads: a file that is
/// missing or not JSON fails at once.
fn read_grammar(schema: Option<&Path>, lark: Option<&Path>) -> Result<Option<Grammar>> {
    let read = |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    Ok(match (schema, lark) {
        (Some(p), _) => Some(Grammar::Schema(
            serde_json::from_str(&read(p)?).with_context(|| format!("{} is not JSON", p.display()))?,
        )),
        (None, Some(p)) => Some(Grammar::Lark(read(p)?)),
        (None, None) => None,
    })
}

fn prompt_tokens(s: &Session, p: &PromptArgs) -> Result<Vec<u32>> {
    let text = if p.chat {
        let mut messages = Vec::new();
        if let Some(system) = &p.system {
            messages.push(Message::new("system", system.clone()));
        }
        messages.push(Message::new("user", p.prompt.clone()));
        let t = &s.tokenizer;
        let template = t.chat_template().unwrap_or(chat::CHATML);
        let text_of = |id: Option<u32>| id.map(|i| t.token_text(i).to_string()).unwrap_or_default();
        chat::render(template, &messages, true, &text_of(t.bos()), &text_of(t.eos()))?
    } else {
        p.prompt.clone()
    };
    let tokens = s.tokenizer.encode(&text, true);
    if tokens.is_empty() {
        bail!("the prompt has no tokens");
    }
    Ok(tokens)
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate { open: o, prompt, max_tokens, sample, stop, ignore_eos, json_schema, grammar } => {
            let grammar = read_grammar(json_schema.as_deref(), grammar.as_deref())?;
            let mut s = open(&o, SelfTest::Auto, false, 1)?;
            let tokens = prompt_tokens(&s, &prompt)?;
            let mut constraint = match grammar {
                None => None,
                Some(g) => {
                    let grammars = Grammars::new(&s.tokenizer)?;
                    Some(match g {
                        Grammar::Schema(schema) => grammars.json_schema(&schema).context("--json-schema")?,
                        Grammar::Lark(lark) => grammars.lark(&lark).context("--grammar")?,
                    })
                }
            };
            let mut sampler = sample.sampler();
            let mut decoder = StreamDecoder::new();
            let mut stops = StopMatcher::new(stop);
            let mut stdout = std::io::stdout().lock();
            let mut write_err = None;
            let mut on_token = |tokenizer: &Tokenizer, id| {
                let (text, stopped) = stops.push(&decoder.push(tokenizer, id));
                if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
                    write_err = Some(e);
                    return false;
                }
                !stopped
            };
            let stats = match constraint.as_mut() {
                Some(c) => generate::generate_constrained(&mut s, &tokens, max_tokens, &mut sampler, c, &mut on_token)?,
                None => generate::generate(&mut s, &tokens, max_tokens, ignore_eos, &mut sampler, &mut on_token)?,
            };
            let tail = stops.push(&decoder.finish()).0 + &stops.finish();
            stdout.write_all(tail.as_bytes()).and_then(|()| stdout.write_all(b"\n"))?;
            if let Some(e) = write_err {
                return Err(e).context("writing to stdout");
            }
            eprintln!(
                "strata-run: prefill {} tokens at {:.1} t/s; decode {} tokens at {:.1} t/s ({})",
                stats.prompt_tokens,
                stats.prefill_rate(),
                stats.decoded,
                stats.decode_rate(),
                s.device.name
            );
            if let Some((mean, n)) = constraint.as_ref().map(Constraint::mask_cost) {
                eprintln!(
                    "strata-run: grammar: {n} masks, {:.1} us each on average (computed while the model runs)",
                    mean.as_secs_f64() * 1e6
                );
            }
            if let (Some(st), Some(p)) = (s.model.take_expert_stats(), s.model.expert_placement()) {
                eprintln!("strata-run: {}", expert_stats_line(p, &st));
            }
            if s.spec.enabled() {
                let sp = stats.spec;
                eprintln!(
                    "strata-run: speculative (window {}, {} drafter): {} verify passes, {} of {} drafts accepted ({:.1}%), {:.2} accepted a pass",
                    s.spec.window,
                    if s.draft.is_some() { "draft-model" } else { "n-gram" },
                    sp.verified,
                    sp.accepted,
                    sp.drafted,
                    100.0 * sp.acceptance(),
                    sp.mean_accepted()
                );
            }
            Ok(())
        }
        Command::Chat { open: o, system, max_tokens, sample } => {
            let mut s = open(&o, SelfTest::Auto, false, 1)?;
            repl::run(&mut s, &mut sample.sampler(), &repl::ChatOptions { system, max_tokens })
        }
        Command::Pull { model } => {
            println!("{}", pull::resolve(&model)?.display());
            Ok(())
        }
        Command::Score { open: o, prompt, top_k, json: _ } => {
            let mut s = open(&o, SelfTest::Auto, false, 1)?;
            let tokens = prompt_tokens(&s, &prompt)?;
            let scored = generate::score(&mut s, &tokens, top_k)?;
            let positions: Vec<serde_json::Value> =
                scored.into_iter().map(|(token, top)| serde_json::json!({ "token": token, "top_k": top })).collect();
            println!("{}", serde_json::json!({ "positions": positions }));
            Ok(())
        }
        Command::Perplexity { open: o, file, window } => {
            let mut s = open(&o, SelfTest::Auto, false, 1)?;
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let tokens = s.tokenizer.encode(&text, false);
            let (ppl, scored) = generate::perplexity(&mut s, &tokens, window)?;
            println!("perplexity {ppl:.4} over {scored} tokens (windows of {window})");
            Ok(())
        }
        Command::Bench {
            open: o,
            prompt_tokens,
            gen_tokens,
            reps,
            kernels,
            windows,
            gemm_tokens,
            llama_bench,
            depth,
            attention,
            contexts,
            qsa_budgets,
            batch,
            profile,
        } => {
            let slots = batch.iter().copied().max().unwrap_or(1).max(1);
            let mut s = open(&o, SelfTest::Auto, false, slots)?;
            if !batch.is_empty() {
                for &n in &batch {
                    let rate = generate::bench_batch(&mut s, n, prompt_tokens, gen_tokens, reps)?;
                    println!(
                        "pp{prompt_tokens} tg{gen_tokens} x {n:>2} sequences: {rate:.1} t/s aggregate, {:.1} t/s each  ({}, window {})",
                        rate / n as f64,
                        s.device.name,
                        s.model.window()
                    );
                    if profile {
                        print_batch_profile(n, &generate::profile_batch(&mut s, n, prompt_tokens)?);
                    }
                }
                return Ok(());
            }
            if attention {
                println!("{:>9} {:>14} {:>14}   alone: kernel us", "context", "attention", "per layer");
                for t in s.model.bench_attention(&contexts, &qsa_budgets, 20)? {
                    let kind = t.budget.map_or("dense".to_string(), |b| format!("qsa {b}"));
                    let parts: Vec<String> = t.parts.iter().map(|(k, v)| format!("{k} {:.2}", v * 1e6)).collect();
                    println!("{:>9} {kind:>14} {:>11.2} us   {}", t.context, t.seconds * 1e6, parts.join(", "));
                }
                return Ok(());
            }
            let (pp, tg, experts) = generate::bench_at(&mut s, prompt_tokens, gen_tokens, reps, depth)?;
            let qsa = if o.qsa == Switch::On { format!(", qsa {}", o.qsa_budget) } else { String::new() };
            if depth > 0 {
                println!(
                    "tg{gen_tokens} @ d{depth} {tg:.1} t/s  ({}, window {}{qsa})",
                    s.device.name,
                    s.model.window()
                );
            } else {
                // The prompt's time includes the argmax of its last token: time to first token.
                let ttft = prompt_tokens as f64 / pp * 1e3;
                println!(
                    "pp{prompt_tokens} {pp:.1} t/s (ttft {ttft:.1} ms)  tg{gen_tokens} {tg:.1} t/s  ({}, window {}, chunk {}{qsa})",
                    s.device.name,
                    s.model.window(),
                    s.model.chunk()
                );
            }
            if let (Some(st), Some(p)) = (experts, s.model.expert_placement()) {
                println!("{}", expert_stats_line(p, &st));
            }
            if kernels {
                // After the passes above, so that kernels planned on demand (CPU) are known.
                let report = s.model.bench_kernels_with(100, windows, gemm_tokens)?;
                let hot = hot_loops(s.artifacts.as_ref());
                print_kernel_report(&report, &hot);
                print_window_report(&report, &hot);
            }
            if let Some(binary) = llama_bench {
                // On the host, llama.cpp gets as many threads as the host backend had.
                let threads = (s.device.backend == "host")
                    .then(|| o.threads.unwrap_or_else(strata_runtime::backend::host::physical_cores));
                drop(s); // llama.cpp gets the whole device
                let model = pull::resolve(&o.model)?;
                let (lpp, ltg) = generate::llama_bench(&binary, &model, prompt_tokens, gen_tokens, reps, threads)?;
                println!(
                    "llama.cpp pp{prompt_tokens} {lpp:.1} t/s  tg{gen_tokens} {ltg:.1} t/s  ratio strata/llama.cpp: pp {:.2}x  tg {:.2}x",
                    pp / lpp,
                    tg / ltg
                );
            }
            Ok(())
        }
        Command::Serve {
            open: o,
            host,
            port,
            api_key: key_flag,
            api_key_file,
            served_model_name,
            log_format,
            parallel,
            batch_tokens,
            body_limit,
            queue,
            max_connections,
            header_timeout,
            shutdown_timeout,
            parse_special,
        } => {
            if parallel == 0 {
                bail!("--parallel must be at least 1");
            }
            let api_key = api_key(key_flag, api_key_file.as_deref())?;
            let served_model_names: Vec<String> =
                served_model_name.iter().map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()).collect();
            if served_model_names.is_empty() && !served_model_name.is_empty() {
                bail!("--served-model-name needs a name");
            }
            init_logging(log_format);
            let seconds = |flag: &str, s: f64| {
                Duration::try_from_secs_f64(s)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .with_context(|| format!("{flag} must be a positive number of seconds, not {s}"))
            };
            let limits = strata_server::http::Limits {
                header_timeout: seconds("--header-timeout", header_timeout)?,
                max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
                shutdown_timeout: seconds("--shutdown-timeout", shutdown_timeout)?,
            };
            let config = strata_server::Config {
                pack: pull::resolve(&o.model)?,
                open: open_options(&o, SelfTest::Auto, parallel),
                host,
                port,
                api_key,
                served_model_names,
                body_limit,
                max_queue: queue,
                batch_tokens: usize::try_from(batch_tokens).unwrap_or(usize::MAX),
                parse_special,
                limits,
            };
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let served = runtime.block_on(strata_server::serve(config));
            // Tasks cut by --shutdown-timeout are not waited for.
            runtime.shutdown_background();
            if let Err(e) = served {
                // Through the log, so that a JSON log stays JSON to its last line.
                tracing::error!("{e}");
                return Err(anyhow::Error::new(e).context(Logged));
            }
            Ok(())
        }
        Command::Selftest { open: o } => {
            println!("{:<44} {:>4} {:>10} {:>9} {:>12}", "kernel", "", "max error", "tolerance", "time");
            let s = open(&o, SelfTest::Always, true, 1)?;
            if s.device.backend == "cpu" {
                bail!("the self-test compares a GPU or host backend with the CPU reference; none was found");
            }
            println!("self-test passed on {} ({})", s.device.name, s.device.arch);
            Ok(())
        }
    }
}
