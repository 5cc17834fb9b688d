//! The `specd-tools` command line: `bench`, `profile` and `replay`, with
//! the flags `specd` gives them (`specd` hands its arguments here as they
//! are, so `specd bench spec ...` and `specd-tools bench spec ...` are one
//! command).
mod bench;
mod replay;

use anyhow::Result;
use clap::{Parser, Subcommand};
use specd::cli::{Globals, ModelArg};

#[derive(Parser)]
#[command(
    name = "specd",
    bin_name = "specd",
    version,
    about = "specd's benchmarks, profiler and trace replay (run by `specd bench | profile | replay`)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    globals: Globals,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Where the time of one plain decode step (or one verify) goes.
    Profile {
        #[command(flatten)]
        model: ModelArg,
        /// Tokens in the cache before the profiled steps.
        #[arg(long, default_value_t = 256)]
        context: usize,
        #[arg(long, default_value_t = 10)]
        steps: usize,
        /// New tokens per forward: 1 is a plain decode step, more a
        /// speculative verify of that many rows (every row's logits).
        #[arg(long, default_value_t = 1)]
        rows: usize,
    },
    /// Replay a trace (`--record`) under other policies, without a model.
    Replay(replay::ReplayArgs),
    /// MTP draft heads.
    #[command(subcommand)]
    Drafter(DrafterCmd),
}

#[derive(Subcommand)]
enum DrafterCmd {
    /// Train an MTP draft head for a model on its own answers
    /// (self-distillation), writing OUT/head.safetensors + OUT/config.json.
    Train {
        #[command(flatten)]
        model: ModelArg,
        #[command(flatten)]
        args: crate::drafter::TrainArgs,
    },
}

pub fn main() -> Result<()> {
    specd::cli::init_logging();
    let cli: Cli = specd::cli::parse_args()?;
    cli.globals.one_process()?;
    let load = cli.globals.load()?;
    match cli.command {
        Command::Bench(b) => bench::run(b, load),
        Command::Profile {
            model,
            context,
            steps,
            rows,
        } => {
            let path = specd::store::Store::default().resolve(&model.model, false)?;
            let flags = load.switches.flags();
            let (m, _) = specd::model::load_model_part(&path, load.weights, None, flags)?;
            let p = crate::profile::profile(&m, context.max(1), steps.max(1), rows.max(1))?;
            print!("{}", crate::profile::report(&p));
            Ok(())
        }
        Command::Replay(a) => replay::run(a),
        Command::Drafter(DrafterCmd::Train { model, args }) => {
            let path = specd::store::Store::default().resolve(&model.model, false)?;
            let policies = specd::cli::policy_host(None)?;
            let e = specd::engine::Engine::load(
                &model.model,
                &path,
                policies,
                load.weights,
                load.switches,
            )?;
            crate::drafter::train(&e, &args)
        }
    }
}
