//! `specd bench`: decode speed, BLAS scaling, speculation.
use anyhow::{Context, Result};
use clap::Subcommand;
use specd::cli::generate::{load_engine, sampling_params, SpecArgs};
use specd::cli::Load;
use specd::cli::ModelArg;
use specd::options::split_list;
use std::path::PathBuf;

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
pub enum BenchCmd {
    /// Prefill and decode tokens/s of plain greedy decoding.
    Decode {
        #[command(flatten)]
        model: ModelArg,
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
    },
    /// Speculative vs plain decoding, interleaved, per drafter x schedule x acceptance.
    Spec {
        #[command(flatten)]
        model: ModelArg,
        /// Comma-separated drafters.
        #[arg(long, default_value = "ngram,self:30")]
        drafters: String,
        /// Comma-separated schedules; `NAME:{json}` hands that config to the
        /// schedule's constructor (`constant:{"k": 16}`).
        #[arg(long, default_value = "constant,heuristic,throughput")]
        schedules: String,
        /// Comma-separated acceptance policies (default: greedy, or rejection above
        /// temperature 0); `NAME:{json}` as for schedules.
        #[arg(long)]
        acceptances: Option<String>,
        /// Suites, comma-separated: grounded, open, code, repetitive; or all; or a
        /// JSONL file of {"prompt": ..., "suite": ...}.
        #[arg(long, default_value = "all")]
        prompts: String,
        #[arg(long, default_value_t = 96)]
        max_tokens: usize,
        #[arg(long, default_value_t = 1)]
        repeats: usize,
        #[arg(long)]
        draft_max: Option<usize>,
        #[command(flatten)]
        sampling: specd::request::RequestOptions,
        #[arg(long)]
        policy_dir: Option<PathBuf>,
        /// Append every speculative run's rounds to this JSONL trace.
        #[arg(long)]
        record: Option<PathBuf>,
        /// Write every cell as JSON here (and CSV next to it).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Draw the speedup of every cell (SVG).
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Speculative rounds, comma-separated: light (argmax-only verify
        /// rows for greedy requests), full (every row to the host); both:
        /// each config runs both ways, interleaved. Default: light unless
        /// `--light-rounds off` (SPECD_LIGHT_ROUNDS=0).
        #[arg(long)]
        rounds: Option<String>,
    },
    /// Our plain greedy speed next to mlx-lm and llama.cpp (same tokens, same
    /// threads, one run), and our verify cost curve. Runs the `specd-anchors`
    /// binary beside this one with these arguments (`--help` lists them).
    #[command(disable_help_flag = true)]
    Anchors {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Concurrent requests through the continuous-batching scheduler
    /// (in-process): aggregate tok/s, p50/p99 time to first token and
    /// inter-token latency per concurrency, N = 1 and `bench decode` in the
    /// same run.
    Serve {
        #[command(flatten)]
        model: ModelArg,
        /// Comma-separated concurrencies.
        #[arg(long, default_value = "1,2,4,8,16")]
        concurrency: String,
        /// Comma-separated drafters (`none` is plain batched decoding).
        #[arg(long, default_value = "none,ngram")]
        drafters: String,
        /// Comma-separated temperatures (0: greedy; above: seeded sampling).
        #[arg(long, default_value = "0,0.7")]
        temperatures: String,
        /// The speculative requests' schedule.
        #[arg(long, default_value = "throughput")]
        schedule: String,
        /// The speculative requests' acceptance policy (default: greedy, or
        /// rejection above temperature 0).
        #[arg(long)]
        acceptance: Option<String>,
        /// Extra policy components (*.wasm) to load.
        #[arg(long)]
        policy_dir: Option<PathBuf>,
        #[arg(long, default_value_t = 48)]
        max_tokens: usize,
        #[arg(long, default_value_t = 1)]
        repeats: usize,
        /// Long prompts: each request a distinct prompt of at least this
        /// many tokens (0: the short chat-sized prompts), so attention over
        /// the caches weighs in every step.
        #[arg(long, default_value_t = 0)]
        prompt_tokens: usize,
        /// What the requests say: `story` (raw texts that ask for a long
        /// story: long answers, what the mlx-lm anchor sends), or one of
        /// `bench spec`'s suites as chat turns (`grounded`, `open`, `code`,
        /// `repetitive`: answers end where the model ends them, and drafts
        /// find something to copy in all but `open`).
        #[arg(long, default_value = "story")]
        prompts: String,
        /// Requests each client sends, the next as soon as its last one is
        /// done (a closed loop: finished requests make room for new ones
        /// mid-batch, as on a server); 1: each concurrency one batch of N
        /// requests submitted at once.
        #[arg(long, default_value_t = 1)]
        requests_per_client: usize,
        /// Write the rows as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Only the step cost curve: one batched step of N one-row requests
        /// against N lone forwards, interleaved (no generation).
        #[arg(long)]
        steps_only: bool,
        /// Then mlx-lm's own server (`mlx_lm.server`, on the `specd
        /// convert` directory) at the same concurrencies and token budget,
        /// greedy, with specd / mlx-lm per N: runs `specd-anchors --serve`
        /// beside this binary.
        #[arg(long)]
        anchor: bool,
    },
    /// Perplexity over a text with llama.cpp's `llama-perplexity` protocol
    /// (chunks of --ctx tokens, the second half of each scored), and with
    /// --base the KL divergence, top-1 agreement and perplexity ratio
    /// against a run saved with --save-logits (docs/benchmarks.md).
    Ppl {
        #[command(flatten)]
        model: ModelArg,
        /// Tokens per chunk; positions ctx/2 .. ctx-2 score the next token.
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        /// At most this many chunks (default: every whole chunk of the text).
        #[arg(long)]
        chunks: Option<usize>,
        /// Save every scored token's top log-probabilities here (for a
        /// later run's --base): 8 + 8 k bytes a token.
        #[arg(long)]
        save_logits: Option<PathBuf>,
        /// A --save-logits file of another mode, same text, --ctx and
        /// --chunks: report the divergence from it.
        #[arg(long)]
        base: Option<PathBuf>,
        /// Top log-probabilities --save-logits keeps per token (k).
        #[arg(long, default_value_t = 64)]
        kl_top_k: usize,
        /// Also write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// The text (UTF-8), e.g. tests/data/hamlet.txt.
        file: PathBuf,
    },
    /// MLX matmul of 1 row vs 8 rows against a 2048x2048 float32 matrix.
    Blas {
        #[arg(long, default_value_t = 50)]
        iters: usize,
    },
}

/// `bench serve --anchor`: `specd-anchors --serve` with our rows, which
/// prints mlx-lm's server rows next to them.
fn serve_anchor(
    model: &str,
    concurrency: &str,
    max_tokens: usize,
    rows: &[crate::serve_bench::ServeRow],
) -> Result<()> {
    let ours = std::env::temp_dir().join(format!("specd-serve-rows-{}.json", std::process::id()));
    std::fs::write(&ours, serde_json::to_string(rows)?)
        .with_context(|| format!("writing {}", ours.display()))?;
    let exe = std::env::current_exe().context("finding the specd binary")?;
    let anchors = exe.with_file_name("specd-anchors");
    let status = std::process::Command::new(&anchors)
        .args(["--serve", "--model", model, "--concurrency", concurrency])
        .arg("--max-tokens")
        .arg(max_tokens.to_string())
        .arg("--ours-rows")
        .arg(&ours)
        .status()
        .with_context(|| format!("running {}", anchors.display()));
    let _ = std::fs::remove_file(&ours);
    if !status?.success() {
        anyhow::bail!("the mlx-lm server anchor failed (see above)");
    }
    Ok(())
}

pub fn run(cmd: BenchCmd, load: Load) -> Result<()> {
    match cmd {
        BenchCmd::Blas { iters } => blas(iters),
        BenchCmd::Ppl {
            model,
            ctx,
            chunks,
            save_logits,
            base,
            kl_top_k,
            json,
            file,
        } => {
            let e = load_engine(&model.model, &SpecArgs::default(), load)?;
            let p = crate::ppl::Protocol {
                ctx,
                chunks,
                top_k: kl_top_k,
            };
            let r = crate::ppl::run(
                &e,
                &file,
                &p,
                save_logits.as_ref(),
                base.as_ref(),
                &mut |m| eprintln!("bench ppl: {m}"),
            )?;
            print!("{}", crate::ppl::text(&r));
            if let Some(j) = json {
                std::fs::write(&j, serde_json::to_string_pretty(&r)?)
                    .with_context(|| format!("writing {}", j.display()))?;
            }
            Ok(())
        }
        BenchCmd::Anchors { mut args } => {
            // The global --weights reaches it as its own flag.
            if !args.iter().any(|a| a.starts_with("--weights")) {
                args.extend(["--weights".to_string(), load.weights.name().to_string()]);
            }
            let exe = std::env::current_exe().context("finding the specd binary")?;
            let anchors = exe.with_file_name("specd-anchors");
            let status = std::process::Command::new(&anchors)
                .args(&args)
                .status()
                .with_context(|| {
                    format!(
                        "running {} (built with the workspace: cargo build --release --workspace)",
                        anchors.display()
                    )
                })?;
            if !status.success() {
                std::process::exit(status.code().unwrap_or(1));
            }
            Ok(())
        }
        BenchCmd::Serve {
            model,
            concurrency,
            drafters,
            temperatures,
            schedule,
            acceptance,
            policy_dir,
            max_tokens,
            repeats,
            prompt_tokens,
            prompts,
            requests_per_client,
            json,
            steps_only,
            anchor,
        } => {
            use crate::serve_bench::Prompts;
            let mut said = Prompts::parse(&prompts)?;
            anyhow::ensure!(
                !(anchor && said != Prompts::Story),
                "--anchor sends mlx-lm's server the story prompts: drop --prompts"
            );
            if prompt_tokens > 0 {
                anyhow::ensure!(
                    said == Prompts::Story,
                    "--prompt-tokens builds its own long prompts: drop --prompts"
                );
                said = Prompts::Long(prompt_tokens);
            }
            // The anchor sends mlx-lm's server one batch of short prompts.
            anyhow::ensure!(
                !(anchor && prompt_tokens > 0),
                "--anchor runs the short prompts only: drop --prompt-tokens"
            );
            anyhow::ensure!(
                !(anchor && requests_per_client > 1),
                "--anchor sends one batch per concurrency: drop --requests-per-client"
            );
            anyhow::ensure!(
                requests_per_client >= 1,
                "--requests-per-client must be at least 1"
            );
            let spec = SpecArgs {
                policy_dir,
                ..Default::default()
            };
            let e = load_engine(&model.model, &spec, load)?;
            let parse = |s: &str, what: &str| -> Result<Vec<f64>> {
                split_list(s)
                    .iter()
                    .map(|x| {
                        x.parse::<f64>()
                            .with_context(|| format!("bad {what} {x:?}"))
                    })
                    .collect()
            };
            let b = crate::serve_bench::ServeBench {
                concurrency: parse(&concurrency, "concurrency")?
                    .into_iter()
                    .map(|n| (n as usize).max(1))
                    .collect(),
                drafters: split_list(&drafters),
                schedule,
                acceptance,
                temperatures: parse(&temperatures, "temperature")?
                    .into_iter()
                    .map(|t| t as f32)
                    .collect(),
                repeats,
                load: crate::serve_bench::Load {
                    per_client: requests_per_client,
                    max_tokens,
                    prompts: said,
                },
            };
            // The curve at the run's context (as far as the step prompt goes).
            let context = prompt_tokens.max(128);
            let costs =
                crate::serve_bench::step_costs(&e, &b.concurrency, context, 10 * repeats.max(1))?;
            print!("{}", crate::serve_bench::step_table(&costs));
            if steps_only {
                return Ok(());
            }
            let rows = crate::serve_bench::run(&e, &b, &mut |m| eprintln!("{m}"))?;
            print!("{}", crate::serve_bench::table(&rows));
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&rows)?)
                    .with_context(|| format!("writing {}", p.display()))?;
            }
            if anchor {
                // The anchor gets the CPUs to itself: our engine idles.
                drop(e);
                serve_anchor(&model.model, &concurrency, max_tokens, &rows)?;
            }
            Ok(())
        }
        BenchCmd::Decode { model, max_tokens } => {
            let e = load_engine(&model.model, &SpecArgs::default(), load)?;
            let r = crate::bench::decode(&e, max_tokens)?;
            println!(
                "prefill: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s",
                r.prompt_tokens, r.prefill_tps, r.generated_tokens, r.decode_tps
            );
            Ok(())
        }
        BenchCmd::Spec {
            model,
            drafters,
            schedules,
            acceptances,
            prompts,
            max_tokens,
            repeats,
            draft_max,
            sampling,
            policy_dir,
            json,
            record,
            svg,
            rounds,
        } => {
            let spec_args = SpecArgs {
                policy_dir,
                ..Default::default()
            };
            let e = load_engine(&model.model, &spec_args, load)?;
            let params = sampling_params(&sampling)?;
            let list = split_list;
            let acceptances = acceptances.unwrap_or_else(|| {
                if params.greedy() {
                    "greedy".into()
                } else {
                    "rejection".into()
                }
            });
            let b = crate::bench::SpecBench {
                drafters: list(&drafters),
                schedules: list(&schedules),
                acceptances: list(&acceptances),
                max_tokens,
                repeats: repeats.max(1),
                draft_max,
                params,
                suites: suites(&prompts)?,
                record,
                rounds: rounds
                    .as_deref()
                    .map(|r| {
                        list(r)
                            .iter()
                            .map(|k| match k.as_str() {
                                "light" => Ok(true),
                                "full" => Ok(false),
                                _ => anyhow::bail!("--rounds: {k:?} is neither light nor full"),
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                    .transpose()?
                    .unwrap_or_default(),
            };
            let cells = crate::bench::spec(&e, &b, &mut |m| eprintln!("{m}"))?;
            print!("{}", crate::bench::table(&cells));
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&cells)?)
                    .with_context(|| format!("writing {}", p.display()))?;
                let mut csv = String::from("suite,drafter,schedule,acceptance,tokens_per_second,plain_tokens_per_second,speedup,speedup_min,speedup_median,speedup_max,acceptance_rate,mean_accepted,mean_draft,policy_share,identical_to_plain,runs\n");
                for c in &cells {
                    csv += &format!(
                        "{},{},{},{},{:.3},{:.3},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.6},{},{}\n",
                        c.suite, c.drafter, c.schedule, c.acceptance, c.tokens_per_second, c.plain_tokens_per_second,
                        c.speedup, c.speedup_min, c.speedup_median, c.speedup_max, c.acceptance_rate, c.mean_accepted,
                        c.mean_draft, c.policy_share, c.identical_to_plain, c.runs
                    );
                }
                std::fs::write(p.with_extension("csv"), csv)?;
            }
            if let Some(p) = svg {
                let bars: Vec<(String, f64)> = cells
                    .iter()
                    .map(|c| {
                        let name =
                            format!("{} {}/{}/{}", c.suite, c.drafter, c.schedule, c.acceptance);
                        (name, c.speedup)
                    })
                    .collect();
                let chart = crate::replay::charts::speedup_svg(
                    "speedup over plain decoding per cell",
                    &bars,
                )?;
                std::fs::write(&p, chart).with_context(|| format!("writing {}", p.display()))?;
                eprintln!("wrote {}", p.display());
            }
            Ok(())
        }
    }
}

fn blas(iters: usize) -> Result<()> {
    use specd_mlx::{ops, Array};
    let n = 2048;
    let w: Vec<f32> = (0..n * n)
        .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
        .collect();
    let w = Array::from_f32(&w, &[n as i32, n as i32])?;
    w.eval()?;
    let time_rows = |rows: usize| -> Result<f64> {
        let x: Vec<f32> = (0..rows * n).map(|i| (i % 13) as f32 / 13.0).collect();
        let x = Array::from_f32(&x, &[rows as i32, n as i32])?;
        for _ in 0..3 {
            ops::matmul(&x, &w)?.eval()?;
        }
        let t = std::time::Instant::now();
        for _ in 0..iters {
            ops::matmul(&x, &w)?.eval()?;
        }
        Ok(t.elapsed().as_secs_f64() / iters as f64)
    };
    let t1 = time_rows(1)?;
    let t8 = time_rows(8)?;
    println!("blas: {}", specd_mlx::blas_config());
    println!("matmul [1x{n}]x[{n}x{n}]: {:.3} ms", t1 * 1e3);
    println!("matmul [8x{n}]x[{n}x{n}]: {:.3} ms", t8 * 1e3);
    println!("8 rows / 1 row: {:.2}x", t8 / t1);
    Ok(())
}

fn suites(spec: &str) -> Result<Vec<(String, Vec<String>)>> {
    let own = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let builtin = &crate::bench::SUITES;
    let named: Vec<&str> = spec.split(',').collect();
    if spec == "all" || named.iter().all(|n| builtin.iter().any(|(b, _)| b == n)) {
        return Ok(builtin
            .iter()
            .filter(|(b, _)| spec == "all" || named.contains(b))
            .map(|(b, p)| (b.to_string(), own(p)))
            .collect());
    }
    let path = spec;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading prompt file {path}"))?;
    let mut by: Vec<(String, Vec<String>)> = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{path}:{}: not JSON", i + 1))?;
        let p = v["prompt"]
            .as_str()
            .with_context(|| format!("{path}:{}: no \"prompt\" string", i + 1))?;
        let suite = v["suite"].as_str().unwrap_or("user").to_string();
        match by.iter_mut().find(|(s, _)| *s == suite) {
            Some((_, ps)) => ps.push(p.to_string()),
            None => by.push((suite, vec![p.to_string()])),
        }
    }
    Ok(by)
}
