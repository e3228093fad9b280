//! `strata-compile`: compiles the kernels one pack needs for one target; also
//! describes packs, lists targets and writes synthetic packs.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use strata_compiler::artifacts::{self, Request, Stage};
use strata_compiler::build::{Resources, Toolchain};
use strata_compiler::host::{self, HostTarget};
use strata_compiler::inspect::{self, bytes};
use strata_compiler::model::RopeScaling;
use strata_compiler::pack::Pack;
use strata_compiler::plan::{Fault, Int8Dot, Options, rules};
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::{self, Preset, Tokenizer, Types};
use strata_compiler::target::{self, Target};

#[derive(Parser)]
#[command(
    version,
    about = "Compiles the kernels a GGUF pack needs for one GPU target",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(flatten)]
    compile: CompileArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

/// `strata-compile --pack P --target T --out D`.
#[derive(clap::Args)]
struct CompileArgs {
    /// The model: a .gguf file (any shard of a split pack), a Hugging Face
    /// OWNER/REPO[:QUANT] or file URL (downloaded into the cache when not there yet).
    #[arg(short = 'm', long = "model", visible_alias = "pack", value_name = "MODEL", required = true)]
    pack: Option<String>,
    /// Target: a known name (see `strata-compile targets`) or the path of a target TOML.
    #[arg(long, required = true)]
    target: Option<String>,
    /// Artifact directory.
    #[arg(long, required = true)]
    out: Option<PathBuf>,
    /// Largest speculative verify window: windows 2..=T are compiled (0 or 1: none).
    #[arg(long, default_value_t = 4)]
    spec: u32,
    /// Bounds-check every global access; violations are recorded, not faults.
    #[arg(long)]
    checked: bool,
    /// Accept spills and scratch in GEMV kernels.
    #[arg(long)]
    allow_spills: bool,
    /// Cross-vendor execution: render the (wave32) target's kernels with the CUDA
    /// prelude and build them for this NVIDIA target.
    #[arg(long, value_name = "NVIDIA_TARGET")]
    run_on: Option<String>,
    /// Int8-dot GEMVs (input quantized to int8, integer dot products): `auto` every matrix
    /// on NVIDIA and as `large` on AMD, `large` where the matrix is large enough to be
    /// bound by its weight reads (at least 1 MiB), `always` wherever the target and quant
    /// type allow, `never` (GEMMs too: the others give the int8 GEMM wherever the target
    /// and type allow it and the GEMV of the same matrix is int8).
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<Int8Dot>())]
    int8: Int8Dot,
    /// Rows each wave of an int8 GEMV decodes together, instead of the rule's (tuning
    /// sweeps; capped in wide verify windows).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8))]
    q8_rows: Option<u32>,
    /// KV positions per QSA block: the granularity of the key summaries and of sparse
    /// attention's selection (default: the target's, 16).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    qsa_block: Option<u32>,
    /// Rows and tokens of every GEMM's block tile, as ROWSxTOKENS, instead of the rule's
    /// (tuning sweeps).
    #[arg(long, value_name = "ROWSxTOKENS", value_parser = parse_tile)]
    gemm_tile: Option<[u32; 2]>,
    /// Input features of every GEMM's step (a multiple of 32) instead of the rule's (64 on
    /// NVIDIA where it fits, else 32) (tuning sweeps).
    #[arg(long, value_name = "FEATURES", value_parser = clap::value_parser!(u32).range(32..=256))]
    gemm_k: Option<u32>,
    /// Tokens of an int8 GEMM's wave tile (a multiple of 8) instead of the rule's 32
    /// (tuning sweeps).
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(8..=64))]
    gemm_wave_tokens: Option<u32>,
    /// Blocks of an int8 GEMM an SM must hold at once (its launch bounds, which cap the
    /// registers) instead of the rule's (tuning sweeps).
    #[arg(long, value_name = "BLOCKS", value_parser = clap::value_parser!(u32).range(1..=4))]
    gemm_blocks: Option<u32>,
    /// One block a tile for the GEMMs instead of stream-K (NVIDIA: as many blocks as the
    /// SMs hold, the tiles' steps split among them), for comparisons.
    #[arg(long)]
    no_stream_k: bool,
    /// The narrowest window whose GEMVs take the int8 matrix unit (NVIDIA mma.sync; Q4_0,
    /// Q4_1, Q8_0 and Q4_K) instead of the int8-dot GEMV, or `never`: 1 puts the single token there
    /// too (slower, but a window's columns then equal single-token products bit for bit).
    #[arg(long, value_name = "COLUMNS|never", value_parser = parse_mma_from)]
    gemv_mma: Option<MmaFrom>,
    /// Stages, least slab bytes and waves per compute unit of the matrix-unit GEMVs, as
    /// STAGES,BYTES,WAVES, instead of the rule's (tuning sweeps).
    #[arg(long, value_name = "STAGES,BYTES,WAVES", value_parser = parse_mma_shape)]
    gemv_mma_shape: Option<[u32; 3]>,
    /// 16-row groups a wave of the matrix-unit GEMVs multiplies together, instead of the
    /// rule's (tuning sweeps).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8))]
    gemv_mma_groups: Option<u32>,
    /// Whether the matrix-unit GEMVs copy each slab's inputs into shared memory with its
    /// weights, instead of the rule's choice (tuning sweeps).
    #[arg(long, value_name = "BOOL")]
    gemv_mma_staged: Option<bool>,
    /// Whether the matrix-unit GEMVs of a type with a zero point (Q4_0) take it out
    /// through each column's starting sum (the rule: yes, for windows), instead of
    /// making the weights' bytes signed (tuning sweeps).
    #[arg(long, value_name = "BOOL")]
    gemv_mma_zero_start: Option<bool>,
    /// Whether a verify window's matrix-unit GEMV takes another number of row groups
    /// where its blocks would not all fit the GPU at once at eight columns (the rule:
    /// yes), instead of keeping the first choice (tuning sweeps).
    #[arg(long, value_name = "BOOL")]
    gemv_mma_one_round: Option<bool>,
    /// Whether Q6_K (whose 16-element halves have scales of their own: an output head's
    /// usual type) takes the matrix-unit GEMV for windows and batches, instead of the
    /// int8-dot one (the rule: no, until measured on a device).
    #[arg(long, value_name = "BOOL")]
    gemv_mma_half_scales: Option<bool>,
    /// Leave out the prompt-chunk kernels (a GEMM per product matrix and the prefill
    /// attention; a mixture of experts' 16-token window): prompts are then read in
    /// verify-window passes.
    #[arg(long)]
    no_prefill: bool,
    /// Plan, render and check only, with no toolchain: write the module source and the
    /// kernel records (`plan.toml`) to --out instead of artifacts (reading kernels;
    /// `scripts/compare-generated.sh`).
    #[arg(long)]
    emit_only: bool,
    /// Test only: plant a fault (`wrong:KERNEL` or `hang:KERNEL`) to prove the
    /// runtime's self-test and watchdog catch it.
    #[arg(long, hide = true, value_parser = Fault::parse)]
    fault: Option<Fault>,
}

#[derive(Subcommand)]
enum Command {
    /// Lists the known targets and their main facts.
    Targets,
    /// Shows a pack: architecture, model description, metadata, tensors, bytes by type.
    Inspect {
        /// The pack (a .gguf file, or any shard of a split pack).
        pack: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// With --dequant: the tensor to write.
        #[arg(long, requires = "dequant")]
        tensor: Option<String>,
        /// Write --tensor dequantized to this file as little-endian f32, rows in file order.
        #[arg(long, requires = "tensor")]
        dequant: Option<PathBuf>,
    },
    /// Writes a synthetic pack: a real model shape filled with random valid blocks.
    Synth {
        /// Model shape (see --help for the list).
        #[arg(long, value_parser = preset_names())]
        preset: String,
        /// Types of the linear and expert weights; a comma-separated list is assigned in
        /// turn, tensor by tensor, so one pack can hold several types.
        #[arg(long = "type", value_delimiter = ',', value_parser = parse_type, default_value = "Q4_0")]
        types: Vec<GgmlType>,
        /// Token embedding type.
        #[arg(long, value_parser = parse_type, default_value = "Q8_0")]
        embd_type: GgmlType,
        /// Output projection type (for shapes with a separate output).
        #[arg(long, value_parser = parse_type, default_value = "Q6_K")]
        output_type: GgmlType,
        /// Copy the tokenizer of this pack (default: a byte-level vocabulary).
        #[arg(long)]
        tokenizer_from: Option<PathBuf>,
        /// Seed of the random blocks.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Override the number of layers.
        #[arg(long)]
        layers: Option<u32>,
        /// Override the vocabulary size (at least the tokenizer's token count).
        #[arg(long)]
        vocab: Option<u32>,
        /// Write this many split shards (NAME-00001-of-0000N.gguf) instead of one file.
        #[arg(long, default_value_t = 1)]
        split: usize,
        /// Long-context rope scaling: `linear:FACTOR` or `yarn:FACTOR:ORIGINAL_CONTEXT`.
        #[arg(long, value_parser = parse_rope_scaling)]
        rope_scaling: Option<RopeScaling>,
        /// Add Llama-3-style rope frequency factors (`rope_freqs.weight`; llama shapes).
        #[arg(long)]
        rope_freqs: bool,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
    },
}

fn preset_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(Preset::ALL.map(|(_, n)| n))
}

/// `linear:FACTOR` or `yarn:FACTOR:ORIGINAL_CONTEXT`.
fn parse_rope_scaling(s: &str) -> Result<RopeScaling, String> {
    let bad = || format!("{s:?}: expected linear:FACTOR or yarn:FACTOR:ORIGINAL_CONTEXT");
    let parts: Vec<&str> = s.split(':').collect();
    let factor = |t: &str| t.parse::<f32>().ok().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(bad);
    match parts.as_slice() {
        ["linear", f] => Ok(RopeScaling::Linear { factor: factor(f)? }),
        ["yarn", f, ctx] => {
            Ok(RopeScaling::Yarn { factor: factor(f)?, original_context: ctx.parse().map_err(|_| bad())? })
        }
        _ => Err(bad()),
    }
}

fn parse_type(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s).filter(|t| t.is_supported()).ok_or_else(|| {
        format!("unknown or unsupported type {s:?} (supported: {})", strata_compiler::quant::supported_list())
    })
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata-compile: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let Some(command) = cli.command else { return compile(cli.compile) };
    match command {
        Command::Targets => {
            println!(
                "{:<8} {:<7} {:>4} {:>8} {:>8} {:>5} {:>7}  product",
                "target", "vendor", "wave", "threads", "shared", "CUs", "GB/s"
            );
            for t in target::known() {
                let d = &t.device;
                println!(
                    "{:<8} {:<7} {:>4} {:>8} {:>8} {:>5} {:>7}  {}",
                    t.name,
                    format!("{:?}", t.vendor).to_lowercase(),
                    d.wave_size,
                    d.max_threads_per_block,
                    d.shared_bytes_per_block,
                    d.compute_units,
                    d.memory_bandwidth_gbs,
                    t.product
                );
            }
            println!("\n{:<14} {:<8} {:>7}  features", "host", "arch", "vector");
            for name in host::known_names() {
                let t = HostTarget::load(name)?;
                println!("{:<14} {:<8} {:>6}B  {}", t.name, t.arch, t.isa.vector_bytes, t.isa.features.join(" "));
            }
            Ok(())
        }
        Command::Inspect { pack: path, json, tensor, dequant } => {
            let pack = match Pack::open(&path) {
                Ok(pack) => pack,
                Err(e) => {
                    // Show what could be read before the damage, then fail with it.
                    if let Ok((version, metadata)) = strata_compiler::pack::read_metadata(&path) {
                        print!("{}", inspect::metadata_text(version, &metadata));
                    }
                    return Err(e.into());
                }
            };
            if let (Some(name), Some(path)) = (tensor, dequant) {
                let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
                let mut out = BufWriter::new(file);
                let n = inspect::dequantize_tensor(&pack, &name, &mut out)?;
                out.flush()?;
                eprintln!("wrote {n} values of {name} to {}", path.display());
                return Ok(());
            }
            let report = inspect::inspect(&pack);
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.to_text());
            }
            Ok(())
        }
        Command::Synth {
            preset,
            types,
            embd_type,
            output_type,
            tokenizer_from,
            seed,
            layers,
            vocab,
            split,
            rope_scaling,
            rope_freqs,
            out,
        } => {
            let Some(preset) = Preset::from_name(&preset) else { bail!("unknown preset {preset}") };
            let mut shape = preset.shape();
            shape.rope_scaling = rope_scaling.unwrap_or(shape.rope_scaling);
            shape.rope_freq_factors = rope_freqs;
            if let Some(layers) = layers {
                shape.layers = layers;
            }
            if vocab.is_some() {
                shape.vocab = vocab;
            }
            let tokenizer = match &tokenizer_from {
                Some(path) => {
                    let pack = Pack::open(path)?;
                    Tokenizer::from_pack(&pack)
                        .with_context(|| format!("{}: has no tokenizer.ggml.tokens to copy", path.display()))?
                }
                None => Tokenizer::byte_level(),
            };
            let types = Types { weights: types, embedding: embd_type, output: output_type };
            let written = synth::write(&shape, &types, &tokenizer, seed, &out, split)?;
            for f in &written.files {
                println!("{}", f.display());
            }
            eprintln!(
                "wrote {} ({} tensors, {} of tensor data)",
                preset.name(),
                written.tensors,
                bytes(written.data_bytes)
            );
            Ok(())
        }
    }
}

fn compile(args: CompileArgs) -> Result<()> {
    let (Some(pack), Some(target), Some(out)) = (args.pack.clone(), args.target.clone(), args.out.clone()) else {
        bail!("--model, --target and --out are required")
    };
    let pack = strata_cli::pull::resolve(&pack)?;
    let started = std::time::Instant::now();
    if HostTarget::is_host(&target) {
        return compile_host(&pack, &HostTarget::load(&target)?, &args, &out, started);
    }
    let target = Target::load(&target)?;
    let run_on = args.run_on.as_deref().map(Target::load).transpose()?;
    let pack = Pack::open(&pack)?;
    let options = Options {
        verify_window: args.spec,
        checked: args.checked,
        fault: args.fault,
        int8: args.int8,
        q8_rows: args.q8_rows,
        qsa_block: args.qsa_block,
        gemm_tile: args.gemm_tile,
        gemm_k: args.gemm_k,
        int8_gemm: true,
        gemm_wave_tokens: args.gemm_wave_tokens,
        gemm_blocks: args.gemm_blocks,
        stream_k: !args.no_stream_k,
        gemv_mma_from: args.gemv_mma.map_or(Some(rules::GEMV_MMA_FROM), |MmaFrom(from)| from),
        gemv_mma_shape: args.gemv_mma_shape,
        gemv_mma_groups: args.gemv_mma_groups,
        gemv_mma_staged: args.gemv_mma_staged,
        gemv_mma_zero_start: args.gemv_mma_zero_start,
        gemv_mma_half_scales: args.gemv_mma_half_scales,
        gemv_mma_one_round: args.gemv_mma_one_round,
        prefill: !args.no_prefill,
    };
    let request = Request {
        pack: &pack,
        target: &target,
        options,
        allow_spills: args.allow_spills,
        run_on: run_on.as_ref(),
        out: &out,
    };
    if args.emit_only {
        let rendered = artifacts::render(&request, &mut |_| {})?;
        artifacts::write_rendered(&rendered, &out)?;
        eprintln!("rendered {} kernels for {} in {}", rendered.plan.kernels.len(), target.name, out.display());
        return Ok(());
    }
    let tools = Toolchain::discover()?;
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let mut up_to_date = false;
    let result = artifacts::compile(&request, &tools, &mut |stage| {
        let message = match stage {
            Stage::Plan => "planning kernels".to_owned(),
            Stage::Emit(n) => format!("rendering {n} kernels"),
            Stage::Check(n) => format!("checking {n} kernels against {}", target.name),
            Stage::Build(n, tool) => format!("compiling {n} kernels with {tool}"),
            Stage::UpToDate => {
                up_to_date = true;
                "up to date".to_owned()
            }
            Stage::Write => "writing artifacts".to_owned(),
        };
        bar.set_message(message);
    });
    bar.finish_and_clear();
    let manifest = result?;
    let spills = manifest.kernels.iter().filter(|k| k.resources.spills().is_some_and(|s| s > 0)).count();
    let checked_at_load = manifest.kernels.iter().filter(|k| k.resources == Resources::CheckedAtLoad).count();
    eprintln!(
        "{} {} kernels for {} ({} built for {}) in {}: {:.1} s{}{}{}",
        if up_to_date { "up to date:" } else { "compiled" },
        manifest.kernels.len(),
        target.name,
        manifest.target.dialect_name(),
        manifest.target.built_for,
        out.display(),
        started.elapsed().as_secs_f64(),
        if spills > 0 { format!(", {spills} with spills") } else { String::new() },
        if checked_at_load > 0 {
            format!(", resources of {checked_at_load} checked at load (no ptxas here)")
        } else {
            String::new()
        },
        if args.checked { ", bounds-checked" } else { "" },
    );
    Ok(())
}

/// `strata-compile --target <host target>`: the host's kernels, built into a shared
/// library.
fn compile_host(
    pack: &std::path::Path,
    target: &HostTarget,
    args: &CompileArgs,
    out: &std::path::Path,
    started: std::time::Instant,
) -> Result<()> {
    let pack = Pack::open(pack)?;
    let options = Options {
        verify_window: args.spec,
        int8: args.int8,
        prefill: !args.no_prefill,
        qsa_block: args.qsa_block,
        ..Options::default()
    };
    if args.emit_only {
        let (_, module) = host::render(&pack, target, &options)?;
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("module.cc"), &module.source)?;
        eprintln!("rendered {} host kernels for {} in {}", module.kernels.len(), target.name, out.display());
        return Ok(());
    }
    let tools = Toolchain::discover()?;
    let manifest = host::compile(&pack, target, &options, &tools, out, &mut |_| {})?;
    let native = manifest.kernels.iter().filter(|k| !k.source.is_empty()).count();
    eprintln!(
        "compiled {native} host kernels for {} ({} more run the reference) into {}: {:.1} s",
        target.name,
        manifest.kernels.len() - native,
        out.join(host::LIBRARY).display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--gemv-mma`'s value: the narrowest window on the matrix unit, or none (`never`).
#[derive(Clone, Copy, Debug)]
struct MmaFrom(Option<u32>);

fn parse_mma_from(s: &str) -> Result<MmaFrom, String> {
    match s {
        "never" => Ok(MmaFrom(None)),
        _ => match s.parse() {
            Ok(n) if (1..=16).contains(&n) => Ok(MmaFrom(Some(n))),
            _ => Err(format!("{s:?} is neither a window of 1 to 16 columns nor `never`")),
        },
    }
}

/// A matrix-unit GEMV's shape `STAGES,BYTES,WAVES`.
fn parse_mma_shape(s: &str) -> Result<[u32; 3], String> {
    let bad = || format!("{s:?} is not STAGES,BYTES,WAVES with 2 to 8 stages and the others positive (e.g. 3,512,8)");
    let v: Vec<u32> = s.split(',').map(|x| x.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    match v[..] {
        [stages, bytes, waves] if (2..=8).contains(&stages) && bytes > 0 && waves > 0 => Ok([stages, bytes, waves]),
        _ => Err(bad()),
    }
}

/// A GEMM block tile `ROWSxTOKENS`, rows a multiple of 16 and tokens of 8.
fn parse_tile(s: &str) -> Result<[u32; 2], String> {
    let bad = || format!("{s:?} is not ROWSxTOKENS, rows a multiple of 16 and tokens of 8 (e.g. 128x64)");
    let (r, t) = s.split_once('x').ok_or_else(bad)?;
    let (r, t): (u32, u32) = (r.parse().map_err(|_| bad())?, t.parse().map_err(|_| bad())?);
    if r == 0 || t == 0 || r % 16 != 0 || t % 8 != 0 {
        return Err(bad());
    }
    Ok([r, t])
}
