//! Command-line interface: `specd generate | serve | pull | convert | policy`,
//! and `bench | profile | replay`, which run the `specd-tools` binary
//! beside this one (the measuring tools live in their own crate, so the
//! server carries none of them).
mod debug;
pub mod generate;
mod list;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use specd_policy::{HostConfig, PolicyHost};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "specd",
    version,
    about = "LLM host with programmable speculative decoding (WASM policies on MLX)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    globals: Globals,
}

/// The flags every command takes, before or after its name: how the model
/// runs. `specd-tools` takes the same ones.
#[derive(Args)]
pub struct Globals {
    /// How quantized weights run: `quantized` (kept as they are, specd's
    /// batch-invariant CPU kernels; the default), `int8` (the same, with
    /// activations quantized to 8 bits per 32 values, llama.cpp's method:
    /// faster, perplexity +0.1% on the default model, see
    /// docs/benchmarks.md) or `f32` (dequantized
    /// at load, MLX's matmul). Same as SPECD_WEIGHTS.
    #[arg(long, global = true, value_parser = parse_weights)]
    weights: Option<crate::model::WeightMode>,
    /// Whose kernels run the forward: `specd` (its batch-invariant CPU
    /// kernels; the default on CPU builds) or `mlx` (MLX's own ops only,
    /// the path CUDA and Metal builds run, on whatever device MLX picks;
    /// greedy speculation may then differ from plain decoding at
    /// near-ties). Same as SPECD_KERNELS.
    #[arg(long, global = true, value_parser = parse_kernels)]
    kernels: Option<crate::model::Kernels>,
    /// `off`: attention as the per-sequence ops that one op per layer over
    /// every sequence's cache rows replaced (to measure one against the
    /// other). Same as SPECD_KV_ROWS=0.
    #[arg(long, global = true, hide = true, value_name = "on|off", value_parser = parse_on_off)]
    kv_rows: Option<bool>,
    /// `off`: a layer's o, gate/up and down matmuls as the three ops that
    /// one op replaced (`specd profile` then times them part by part).
    /// Same as SPECD_FUSED_TAIL=0.
    #[arg(long, global = true, hide = true, value_name = "on|off", value_parser = parse_on_off)]
    fused_tail: Option<bool>,
    /// `on`: KV caches of 16-bit floats (f16) instead of float32, on the
    /// CPU kernels' path: half the bytes a token takes and a step reads, so
    /// long contexts decode faster and twice the tokens fit the KV budget;
    /// attention then sees keys and values rounded to f16. Same as
    /// SPECD_KV_F16=1.
    #[arg(long, global = true, value_name = "on|off", value_parser = parse_on_off)]
    kv_f16: Option<bool>,
    /// `off`: every speculative verify copies its rows back whole (the
    /// default for requests; `bench spec --rounds` picks per run). Same as
    /// SPECD_LIGHT_ROUNDS=0.
    #[arg(long, global = true, hide = true, value_name = "on|off", value_parser = parse_on_off)]
    light_rounds: Option<bool>,
    /// Pipeline ranks (started by `mlx.launch --backend ring`): how many
    /// layers each rank holds, in rank order, e.g. `14,16`; the same on
    /// every rank. Default: equal weight bytes per rank (rank 0 also holds
    /// the embedding and head).
    #[arg(long, global = true, value_delimiter = ',', value_name = "N,N,...")]
    layers: Option<Vec<usize>>,
}

impl Globals {
    /// The flags, else SPECD_WEIGHTS / SPECD_KERNELS and the other
    /// variables (for A/B runs, read here once; the model reads none), else
    /// the defaults; the kernels installed before anything loads (they are
    /// the process's, as the device is).
    pub fn load(&self) -> Result<Load> {
        let weights = choice(
            self.weights,
            "SPECD_WEIGHTS",
            crate::model::WeightMode::parse,
        )?
        .unwrap_or_default();
        let kernels = choice(self.kernels, "SPECD_KERNELS", crate::model::Kernels::parse)?
            .unwrap_or_else(crate::model::Kernels::default_for_build);
        kernels.check(weights).map_err(anyhow::Error::msg)?;
        let kv_f16 = switch(self.kv_f16, "SPECD_KV_F16", false);
        if kv_f16 && kernels == crate::model::Kernels::Mlx {
            anyhow::bail!("--kv-f16 on needs --kernels specd (16-bit caches are written by specd's attention kernel)");
        }
        kernels.install();
        Ok(Load {
            weights,
            kernels,
            switches: crate::load::Switches {
                kv_rows: switch(self.kv_rows, "SPECD_KV_ROWS", true),
                fused_tail: switch(self.fused_tail, "SPECD_FUSED_TAIL", true),
                light_rounds: switch(self.light_rounds, "SPECD_LIGHT_ROUNDS", true),
                kv_f16,
            },
        })
    }
}

pub use crate::load::Load;

impl Globals {
    /// For commands that run in one process only (the tools): `--layers`
    /// there is an error, not a flag quietly ignored.
    pub fn one_process(&self) -> Result<()> {
        if self.layers.is_some() {
            anyhow::bail!("--layers splits a model across pipeline ranks: only `specd generate` and `specd serve` run as ranks");
        }
        Ok(())
    }
}

fn parse_on_off(s: &str) -> std::result::Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?} is not on or off")),
    }
}

/// The flag, else the environment variable (for A/B runs: read here, once;
/// the model and the sequence read none: `0` is off, `1` on), else
/// `default`.
fn switch(flag: Option<bool>, var: &str, default: bool) -> bool {
    flag.unwrap_or_else(|| match std::env::var(var).as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => default,
    })
}

/// The flag, else the environment variable when set and not empty.
fn choice<T>(
    flag: Option<T>,
    var: &str,
    parse: fn(&str) -> std::result::Result<T, String>,
) -> Result<Option<T>> {
    match (flag, std::env::var(var)) {
        (Some(v), _) => Ok(Some(v)),
        (None, Ok(s)) if !s.is_empty() => parse(&s).map(Some).map_err(anyhow::Error::msg),
        _ => Ok(None),
    }
}

fn parse_kernels(s: &str) -> std::result::Result<crate::model::Kernels, String> {
    crate::model::Kernels::parse(s)
}

fn parse_weights(s: &str) -> std::result::Result<crate::model::WeightMode, String> {
    crate::model::WeightMode::parse(s)
}

// Parsed once per process: the size of the largest variant costs nothing.
#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Serve Ollama- and OpenAI-compatible HTTP APIs (default 127.0.0.1:11435).
    Serve(crate::server::ServeArgs),
    /// Fetch a known model into the store (SPECD_HOME/models).
    Pull {
        /// A store name (default: smollm2:135m).
        #[arg(default_value = crate::store::DEFAULT_MODEL)]
        name: String,
        /// Print the model file's path on stdout (after fetching it if
        /// needed); progress and messages go to stderr.
        #[arg(long)]
        path: bool,
    },
    /// The models specd finds by name: its store's, Ollama's
    /// (`ollama:NAME[:TAG]`) and the Hugging Face cache's
    /// (`hf:ORG/NAME[:FILE]`), with architecture, quantization, size and
    /// whether specd runs each.
    List {
        /// One JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Convert a GGUF model into a Hugging Face directory (float32 safetensors).
    Convert { gguf: String, dir: PathBuf },
    /// Inspect policy components.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Benchmarks: decode, spec, serve, ppl, anchors, blas (`specd-tools`).
    #[command(disable_help_flag = true)]
    Bench(Tool),
    /// Where the time of one plain decode step (or one verify) goes
    /// (`specd-tools`).
    #[command(disable_help_flag = true)]
    Profile(Tool),
    /// Replay a trace (`--record`) under other policies, without a model
    /// (`specd-tools`).
    #[command(disable_help_flag = true)]
    Replay(Tool),
    /// Train an MTP draft head for a model (`specd-tools`).
    #[command(disable_help_flag = true)]
    Drafter(Tool),
    /// Debugging dumps (logits, greedy token ids) as JSON; used by the tests.
    #[command(subcommand, hide = true)]
    Debug(debug::DebugCmd),
}

#[derive(Subcommand)]
enum PolicyCmd {
    /// Every policy (built-in and from --policy-dir) with its hash and exports.
    List {
        #[arg(long)]
        policy_dir: Option<PathBuf>,
    },
    /// Validate a component against the specd:policy world; with
    /// --conformance, run the conformance harness on an acceptance policy
    /// (a file, or a built-in or --policy-dir policy by name).
    Check {
        /// FILE.wasm (or, with --conformance, a policy name).
        file: PathBuf,
        /// Run the conformance harness: greedy exactness and a chi-square
        /// test of the output against the target distribution over rounds
        /// drawn at random (the seed is printed), or the drift of a lossy
        /// policy.  Exit status 1 when the claim fails.
        #[arg(long)]
        conformance: bool,
        /// The claim to test: lossless, greedy (exact at temperature 0) or
        /// lossy (report only).  Default: a built-in's own; lossless for
        /// other components (contract 0.1 cannot declare one).  Only a run
        /// on the default claim is kept as the policy's verdict.
        #[arg(long, requires = "conformance")]
        claim: Option<String>,
        /// Replays the rounds of an earlier run.
        #[arg(long, requires = "conformance")]
        seed: Option<u64>,
        #[arg(long, requires = "conformance")]
        policy_dir: Option<PathBuf>,
    },
}

/// A command `specd-tools` runs: its arguments go there as they are
/// (`--help` included).
#[derive(Args)]
struct Tool {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

/// Runs `specd-tools` (built beside this binary by `cargo build --release
/// --workspace`) with this process's own arguments, in its place.
fn run_tool() -> Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("finding the specd binary")?;
    let tools = exe.with_file_name("specd-tools");
    if !tools.is_file() {
        anyhow::bail!(
            "{} is missing: the benchmarks, profile and replay live in that binary (cargo build --release --workspace builds it)",
            tools.display()
        );
    }
    let err = std::process::Command::new(&tools)
        .args(std::env::args_os().skip(1))
        .exec();
    Err(err).with_context(|| format!("running {}", tools.display()))
}

/// The model flag shared by commands that load one.
#[derive(Args, Clone, Debug)]
pub struct ModelArg {
    /// A store name (smollm2:135m), `ollama:NAME[:TAG]` (Ollama's store),
    /// `hf:ORG/NAME[@REVISION][:FILE]` (the Hugging Face cache), a GGUF
    /// file, or a Hugging Face directory (`specd list` shows what is there).
    #[arg(long, short, default_value = crate::store::DEFAULT_MODEL)]
    pub model: String,
}

pub fn policy_host(dir: Option<&Path>) -> Result<Arc<PolicyHost>> {
    let host = PolicyHost::new(HostConfig::default()).context("starting the policy host")?;
    if let Some(d) = dir {
        host.add_dir(d)
            .with_context(|| format!("loading policies from {}", d.display()))?;
    }
    Ok(Arc::new(host))
}

pub fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("SPECD_LOG").unwrap_or_else(|_| "warn".into());
    // Colour only on a terminal: a log file or pipe gets plain text.
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Parses the command line; a usage error becomes one `error: ...` line
/// (like every other error), `--help` and `--version` print and exit 0.
pub fn parse_args<C: Parser>() -> Result<C> {
    match C::try_parse() {
        Ok(c) => Ok(c),
        Err(e) if e.use_stderr() => {
            let text = e.render().to_string();
            let parts: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| {
                    !l.is_empty()
                        && !l.starts_with("Usage:")
                        && !l.starts_with("For more information")
                })
                .map(|l| l.strip_prefix("error: ").unwrap_or(l))
                .collect();
            let mut msg = String::new();
            for p in parts {
                if !msg.is_empty() {
                    msg.push_str(if msg.ends_with(':') { " " } else { "; " });
                }
                msg.push_str(p);
            }
            Err(anyhow::anyhow!("{msg} (see --help)"))
        }
        Err(e) => e.exit(),
    }
}

/// Ends the process with `result`: 0, or 1 after one `error: ...` line
/// holding the whole context chain (`specd` and `specd-tools` alike).
pub fn exit(result: Result<()>) -> ! {
    let code = match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            1
        }
    };
    std::process::exit(code)
}

pub fn main() -> Result<()> {
    init_logging();
    let cli: Cli = parse_args()?;
    if let Command::Bench(_) | Command::Profile(_) | Command::Replay(_) | Command::Drafter(_) =
        cli.command
    {
        return run_tool();
    }
    let load = cli.globals.load()?;
    // The group this process joined, passed to what loads the model.
    let mut ranks = None;
    if crate::ranks::launched() {
        let model = match &cli.command {
            Command::Generate(a) => a.model.model.clone(),
            Command::Serve(a) => crate::server::ServerConfig::from_args(a)?.model,
            _ => anyhow::bail!(
                "MLX_RANK is set: pipeline ranks run `specd generate` and `specd serve` (unset it for other commands)"
            ),
        };
        let path = crate::store::Store::default().resolve(&model, false)?;
        let j = crate::ranks::join(&path, cli.globals.layers.as_deref(), &load)?;
        if j.group.rank > 0 {
            return j.run_stage(&path, &load);
        }
        ranks = Some(j);
    } else if cli.globals.layers.is_some() {
        anyhow::bail!("--layers splits a model across pipeline ranks: start them with `mlx.launch --backend ring` (MLX_RANK and MLX_HOSTFILE)");
    }
    match cli.command {
        Command::Generate(a) => generate::run(a, load, ranks),
        Command::Serve(a) => crate::server::run(a, load, ranks),
        Command::Pull { name, path } => {
            let store = crate::store::Store::default();
            let k = crate::store::Store::known_or_err(&name)?;
            let p = store.path_of(k);
            let p = if p.exists() {
                if !path {
                    eprintln!("{} is already in the store ({})", k.name, p.display());
                }
                p
            } else {
                store.pull(k, path)?
            };
            if path {
                println!("{}", p.display());
            }
            Ok(())
        }
        Command::List { json } => list::run(json),
        Command::Convert { gguf, dir } => {
            let path = crate::store::Store::default().resolve(&gguf, false)?;
            crate::model::convert::convert_gguf(&path, &dir)?;
            eprintln!("wrote {}", dir.display());
            Ok(())
        }
        Command::Policy(PolicyCmd::List { policy_dir }) => {
            let host = policy_host(policy_dir.as_deref())?;
            println!(
                "{:<22} {:<10} {:<20} {:<9} {:<8} {:<20} SHA256",
                "NAME", "SOURCE", "EXPORTS", "CONTRACT", "WASI", "CONFORMANCE"
            );
            for p in host.list() {
                // the harness's verdict on this exact hash, when it was run
                let conformance = match &p.conformance {
                    Some(v) if v.passed => format!("{} passed", v.claim),
                    Some(v) => format!("{} FAILED", v.claim),
                    None if p.exports.acceptance => "not run".into(),
                    None => "-".into(),
                };
                println!(
                    "{:<22} {:<10} {:<20} {:<9} {:<8} {:<20} {}",
                    p.name,
                    if p.builtin { "built-in" } else { "user" },
                    p.exports.to_string(),
                    p.exports.contract.version(),
                    if p.imports_wasi { "yes" } else { "no" },
                    conformance,
                    p.sha256
                );
            }
            Ok(())
        }
        Command::Policy(PolicyCmd::Check {
            file,
            conformance: true,
            claim,
            seed,
            policy_dir,
        }) => {
            let claim = claim
                .map(|c| {
                    specd_policy::LosslessClaim::parse(&c).ok_or_else(|| {
                        anyhow::anyhow!("--claim {c:?}: expected lossless, greedy or lossy")
                    })
                })
                .transpose()?;
            let host = policy_host(policy_dir.as_deref())?;
            // A file is registered under its stem; anything else is a name.
            let name = if file.is_file() {
                let bytes =
                    std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
                let stem = file
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("policy")
                    .to_string();
                host.add(&stem, &bytes)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
                stem
            } else {
                file.display().to_string()
            };
            let seed = seed.unwrap_or_else(specd_policy::conformance::random_seed);
            let cfg = specd_policy::ConformanceConfig::new(seed);
            println!(
                "conformance of {name}: seed {seed} (repeat with --seed {seed}), {} greedy rounds, {} cases x {} sampled rounds, vocabulary {}, significance {}",
                cfg.greedy_rounds, cfg.cases, cfg.rounds_per_case, cfg.vocab, cfg.alpha
            );
            let r = host
                .conformance(&name, claim, &cfg)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{name}: {}", r.summary);
            if !r.passed {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Policy(PolicyCmd::Check { file, .. }) => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let host = policy_host(None)?;
            let info = host
                .check(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            println!(
                "{}: ok, exports {} ({}), sha256 {}{}",
                file.display(),
                info.exports,
                info.exports.contract,
                info.sha256,
                if info.imports_wasi {
                    " (imports WASI: runs under the deny-all WASI)"
                } else {
                    ""
                }
            );
            Ok(())
        }
        Command::Bench(_) | Command::Profile(_) | Command::Replay(_) | Command::Drafter(_) => {
            run_tool()
        }
        Command::Debug(d) => debug::run(d, load),
    }
}
