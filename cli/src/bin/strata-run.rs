//! `strata-run`: loads artifacts beside a pack and serves tokens.
//!
//! The runtime lands with issue #4; until then `generate` validates the pack and says
//! plainly what is not built yet.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use strata_compiler::model::ModelDesc;
use strata_compiler::pack::Pack;

#[derive(Parser)]
#[command(version, about = "Runs a GGUF pack with kernels compiled for this device")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generates text from a prompt.
    Generate {
        /// The pack.
        #[arg(long)]
        pack: PathBuf,
        /// The prompt.
        #[arg(long)]
        prompt: String,
        /// Wrap the prompt in the pack's chat template.
        #[arg(long)]
        chat: bool,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata-run: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate { pack, prompt, chat } => {
            let pack = Pack::open(&pack)?;
            let model = ModelDesc::from_pack(&pack)?;
            eprintln!(
                "strata-run: {} is a valid {} pack ({} layers, {} wide, vocab {})",
                pack.path().display(),
                model.family.arch(),
                model.layers,
                model.embd,
                model.vocab
            );
            eprintln!(
                "strata-run: not yet: the runtime (issue #4) is not built, so no tokens for {:?}{}",
                prompt,
                if chat { " (chat)" } else { "" }
            );
            Ok(())
        }
    }
}
