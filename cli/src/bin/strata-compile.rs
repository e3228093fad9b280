//! `strata-compile`: reads a pack, describes it, and writes synthetic packs.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use strata_compiler::inspect::{self, bytes};
use strata_compiler::pack::Pack;
use strata_compiler::quant::GgmlType;
use strata_compiler::synth::{self, Preset, Tokenizer, Types};

#[derive(Parser)]
#[command(version, about = "Compiles the kernels a GGUF pack needs for one GPU target")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
        /// Output file.
        #[arg(long)]
        out: PathBuf,
    },
}

fn preset_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(Preset::ALL.map(|(_, n)| n))
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
    match cli.command {
        Command::Inspect { pack, json, tensor, dequant } => {
            let pack = Pack::open(&pack)?;
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
        Command::Synth { preset, types, embd_type, output_type, tokenizer_from, seed, layers, vocab, split, out } => {
            let Some(preset) = Preset::from_name(&preset) else { bail!("unknown preset {preset}") };
            let mut shape = preset.shape();
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
