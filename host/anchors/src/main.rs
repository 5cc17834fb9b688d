//! `specd-anchors`: what `specd bench anchors` runs. Our plain greedy speed
//! next to mlx-lm and llama.cpp (same tokens, same threads, one run), and
//! our verify cost curve.
//!
//! The anchors run in Python: SPECD_PYTHON, else this checkout's .venv, else
//! python3. A missing anchor package is pip-installed there on first use
//! (llama-cpp-python compiles llama.cpp: minutes). This binary, not the
//! server's, holds those drivers.
mod anchors;
mod options;
mod ppl;
mod python;
mod serve;

use anyhow::{Context, Result};
use clap::Parser;
use specd::model::WeightMode;

#[derive(Parser)]
#[command(
    name = "specd bench anchors",
    bin_name = "specd bench anchors",
    version
)]
struct Args {
    /// A store name (smollm2:135m), a GGUF file, or a Hugging Face directory.
    #[arg(long, short, default_value = specd::store::DEFAULT_MODEL)]
    model: String,
    /// How our weights are held: quantized (default) or f32.
    #[arg(long, value_parser = WeightMode::parse)]
    weights: Option<WeightMode>,
    /// Comma-separated engines: ours, mlx-lm, llama.cpp.
    #[arg(long, default_value = "ours,mlx-lm,llama.cpp")]
    only: String,
    /// Tokens to decode (greedy; fewer if the model ends first).
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Length of the prefill prompt in tokens.
    #[arg(long, default_value_t = 512)]
    prefill_tokens: usize,
    /// Threads for every engine (default: SPECD_THREADS, else all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Timed prefill runs per engine, after a warm-up (the median counts).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Tokens in the cache before the verify forwards.
    #[arg(long, default_value_t = 128)]
    verify_context: usize,
    /// Timed forwards per point of the verify curve (the median counts).
    #[arg(long, default_value_t = 7)]
    verify_reps: usize,
    /// Report a missing anchor package as an error instead of installing it.
    #[arg(long)]
    no_install: bool,
    /// mlx-lm's BLAS: `openblas` (the system's, preloaded, as specd links
    /// it) or `wheel` (the mlx-cpu wheel's reference BLAS).
    #[arg(long, default_value = "openblas")]
    mlx_lm_blas: String,
    /// Print the report as JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Instead of the above: mlx-lm's own server (`mlx_lm.server`) at
    /// `--concurrency` concurrent streamed requests of `--max-tokens`
    /// tokens each (what `specd bench serve --anchor` runs).
    #[arg(long)]
    serve: bool,
    /// With --serve: comma-separated concurrencies.
    #[arg(long, default_value = "1,2,4,8")]
    concurrency: String,
    /// Instead of the speed table: our perplexity over this text next to
    /// llama.cpp's on the same GGUF (llama-perplexity's protocol; `specd
    /// bench ppl` for one mode with divergences). `--only` picks ours
    /// and/or llama.cpp.
    #[arg(long, value_name = "FILE")]
    ppl: Option<std::path::PathBuf>,
    /// With --ppl: tokens per chunk.
    #[arg(long, default_value_t = 512)]
    ppl_ctx: usize,
    /// With --ppl: at most this many chunks (default: the whole text).
    #[arg(long)]
    ppl_chunks: Option<usize>,
    /// With --serve: `bench serve --json` rows of specd from the same run,
    /// printed next to mlx-lm's with the ratio per concurrency.
    #[arg(long)]
    ours_rows: Option<std::path::PathBuf>,
}

fn main() {
    specd::cli::init_logging();
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// `--serve`: mlx-lm's server on the `specd convert` directory of a GGUF
/// (or on a Hugging Face directory as it is).
fn run_serve(
    a: &Args,
    path: &std::path::Path,
    threads: usize,
    blas: Option<std::path::PathBuf>,
) -> Result<()> {
    let concurrency = a
        .concurrency
        .split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .with_context(|| format!("--concurrency: bad value {x:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let progress = &mut |m: &str| eprintln!("bench serve anchor: {m}");
    let model_dir = if path.is_dir() {
        path.to_path_buf()
    } else {
        anchors::converted_dir(path, progress)?
    };
    let o = serve::ServeOptions {
        python: anchors::default_python(),
        model_dir,
        concurrency,
        max_tokens: a.max_tokens,
        threads,
        blas,
    };
    let rows = serve::run(&o, progress)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        let ours = match &a.ours_rows {
            Some(p) => serve::read_ours(p)?,
            None => Vec::new(),
        };
        print!("{}", serve::table(&rows, &ours));
    }
    Ok(())
}

fn run(a: Args) -> Result<()> {
    let threads = a.threads.unwrap_or_else(anchors::default_threads).max(1);
    // Before the model loads: the kernels make their pool on first use.
    if !specd_mlx::kernels::set_threads(threads as i32)
        && specd_mlx::kernels::threads() != threads as i32
    {
        anyhow::bail!(
            "the kernels already run with {} threads",
            specd_mlx::kernels::threads()
        );
    }
    specd_mlx::set_blas_threads(threads as i32);
    let mlx_lm_blas = match a.mlx_lm_blas.as_str() {
        "wheel" => None,
        "openblas" => Some(anchors::system_openblas().context(
            "--mlx-lm-blas openblas: no libopenblas.so.0 found (apt-get install libopenblas0-pthread), or use --mlx-lm-blas wheel",
        )?),
        other => anyhow::bail!("--mlx-lm-blas {other:?}: use openblas or wheel"),
    };
    let opts = anchors::Options {
        engines: a
            .only
            .split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect(),
        max_tokens: a.max_tokens,
        prefill_tokens: a.prefill_tokens,
        threads,
        reps: a.reps,
        verify_context: a.verify_context,
        verify_reps: a.verify_reps,
        install: !a.no_install,
        mlx_lm_blas,
        python: anchors::default_python(),
    };
    let path = specd::store::Store::default().resolve(&a.model, false)?;
    if a.serve {
        return run_serve(&a, &path, threads, opts.mlx_lm_blas.clone());
    }
    let policies = specd::cli::policy_host(None)?;
    let weights = a.weights.unwrap_or_default();
    let switches = specd::load::Switches::default();
    let e = specd::engine::Engine::load(&a.model, &path, policies, weights, switches)?;
    if let Some(file) = &a.ppl {
        let p = ppl::PplOptions {
            file: file.clone(),
            ctx: a.ppl_ctx,
            chunks: a.ppl_chunks,
        };
        let rows = ppl::run(&e, &opts, &p, &mut |m| eprintln!("bench anchors: {m}"))?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            print!("{}", ppl::table(&p, &rows));
        }
        if let Some(r) = rows.iter().find(|r| r.error.is_some()) {
            anyhow::bail!("{} could not run (see the report)", r.engine);
        }
        return Ok(());
    }
    let report = anchors::run(e, &opts, &mut |m| eprintln!("bench anchors: {m}"))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", anchors::table(&report));
    }
    let failed = report.failed();
    if !failed.is_empty() {
        anyhow::bail!(
            "{} could not run (see the report)",
            failed
                .iter()
                .map(|e| e.engine.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}
