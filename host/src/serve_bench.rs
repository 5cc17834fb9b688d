//! `specd bench serve`: N concurrent requests through the continuous-batching
//! scheduler in-process (no HTTP in the way), per concurrency: aggregate
//! tokens/s, time to first token and inter-token latency (p50/p99). The
//! N = 1 row comes from the same run, and `bench decode`'s single stream is
//! measured in it too, interleaved, so ratios compare like with like.
use crate::batch::{Admitted, BatchLimits, Scheduler};
use crate::bench::{GROUNDED, OPEN};
use crate::engine::{Engine, Prompt};
use crate::options::{DrafterSpec, SpecOptions};
use crate::sampling::SamplingParams;
use anyhow::{Context, Result};
use serde::Serialize;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

#[derive(Debug, Clone, Serialize)]
pub struct ServeRow {
    /// `greedy` or `sampled`.
    pub mode: String,
    pub drafter: String,
    pub concurrency: usize,
    pub tokens: usize,
    pub seconds: f64,
    /// Aggregate, from submission to the last token.
    pub tokens_per_second: f64,
    /// Aggregate while decoding: streamed pieces after each request's
    /// first, from the first first piece to the last piece.
    pub decode_tokens_per_second: f64,
    pub ttft_p50: f64,
    pub ttft_p99: f64,
    pub itl_p50: f64,
    pub itl_p99: f64,
    /// Most requests one step held.
    pub max_batch: u64,
    #[serde(skip)]
    repeats: usize,
}

pub struct ServeBench {
    pub concurrency: Vec<usize>,
    pub drafters: Vec<String>,
    /// Temperatures to run: 0 is `greedy`, above it `sampled` (seeded).
    pub temperatures: Vec<f32>,
    pub max_tokens: usize,
    pub repeats: usize,
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

#[derive(Default)]
struct Timing {
    first: Option<f64>,
    last: Option<Instant>,
    gaps: Vec<f64>,
    pieces: usize,
}

/// Request `i`'s raw text to continue: long answers, rarely an early end of
/// generation. The mlx-lm server anchor (`specd-anchors --serve`) sends the
/// same texts.
pub fn request_text(i: usize) -> String {
    let prompts: Vec<&str> = GROUNDED.iter().chain(OPEN.iter()).copied().collect();
    format!(
        "{}\n\nContinue this story for a long time:\nOnce upon a time",
        prompts[i % prompts.len()]
    )
}

/// One batch of `n` requests, all submitted at once.
fn one(
    e: &Engine,
    n: usize,
    opts: &SpecOptions,
    temperature: f32,
    max_tokens: usize,
) -> Result<ServeRow> {
    let mut sched = Scheduler::new(
        e,
        BatchLimits {
            max_sequences: n,
            ..Default::default()
        },
    );
    let results = Rc::new(RefCell::new(Vec::new()));
    let t0 = Instant::now();
    let timings: Vec<Rc<RefCell<Timing>>> = (0..n).map(|_| Rc::default()).collect();
    for (i, timing) in timings.iter().enumerate() {
        let text = request_text(i);
        let prompt = e.encode(&Prompt::Raw(text))?;
        let params = SamplingParams {
            temperature,
            seed: 1 + i as u64,
            ..Default::default()
        };
        let spec = e.speculation(opts, &params)?;
        let settings = e.settings(params, Some(max_tokens), vec![]);
        let t = timing.clone();
        let sink = Box::new(move |s: &str| {
            if !s.is_empty() {
                let mut t = t.borrow_mut();
                let now = Instant::now();
                match t.last {
                    None => t.first = Some((now - t0).as_secs_f64()),
                    Some(l) => t.gaps.push((now - l).as_secs_f64()),
                }
                t.last = Some(now);
                t.pieces += 1;
            }
            true
        });
        let r = results.clone();
        sched.admit(Admitted {
            tenant: None,
            prompt,
            settings,
            spec,
            sink,
            done: Box::new(move |f| r.borrow_mut().push(f)),
        });
    }
    let mut max_batch = 0;
    while !sched.is_idle() {
        let s = sched.step(&mut || true);
        max_batch = max_batch.max(s.sequences as u64);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let mut tokens = 0;
    for f in results.borrow_mut().drain(..) {
        let f = f.context("a benchmark request failed")?;
        tokens += f.stats.generated_tokens;
    }
    // Decode throughput: text pieces after each request's first, over the
    // time from the first request's first piece to the last one's last.
    let from = timings
        .iter()
        .filter_map(|t| t.borrow().first)
        .fold(f64::INFINITY, f64::min);
    let to = timings
        .iter()
        .filter_map(|t| t.borrow().last.map(|l| (l - t0).as_secs_f64()))
        .fold(0.0, f64::max);
    let pieces: usize = timings
        .iter()
        .map(|t| t.borrow().pieces.saturating_sub(1))
        .sum();
    let decode_tps = if to > from {
        pieces as f64 / (to - from)
    } else {
        0.0
    };
    let mut ttft: Vec<f64> = timings.iter().filter_map(|t| t.borrow().first).collect();
    let mut itl: Vec<f64> = timings
        .iter()
        .flat_map(|t| t.borrow().gaps.clone())
        .collect();
    Ok(ServeRow {
        mode: if temperature > 0.0 {
            "sampled"
        } else {
            "greedy"
        }
        .into(),
        drafter: opts
            .drafter
            .as_ref()
            .map_or("none".into(), |d| d.to_string()),
        concurrency: n,
        tokens,
        seconds,
        tokens_per_second: tokens as f64 / seconds,
        decode_tokens_per_second: decode_tps,
        ttft_p50: percentile(&mut ttft, 0.5),
        ttft_p99: percentile(&mut ttft, 0.99),
        itl_p50: percentile(&mut itl, 0.5),
        itl_p99: percentile(&mut itl, 0.99),
        max_batch,
        repeats: 1,
    })
}

/// Every (temperature, drafter, concurrency), `repeats` times over, the
/// concurrencies interleaved within each repeat; plus `bench decode`'s
/// single stream (`decode` rows) once per repeat. Rows of one cell are
/// summed (tokens, seconds) and their latencies are the last repeat's.
pub fn run(e: &Engine, b: &ServeBench, progress: &mut dyn FnMut(&str)) -> Result<Vec<ServeRow>> {
    // Warm up: first-touch allocations.
    let none = SpecOptions {
        drafter: Some(DrafterSpec::None),
        ..Default::default()
    };
    one(e, 2, &none, 0.0, 8)?;
    let mut rows: Vec<ServeRow> = Vec::new();
    for rep in 0..b.repeats.max(1) {
        let d = crate::bench::decode(e, b.max_tokens)?;
        merge(
            &mut rows,
            ServeRow {
                mode: "decode".into(),
                drafter: "none".into(),
                concurrency: 1,
                tokens: d.generated_tokens,
                seconds: d.generated_tokens as f64 / d.decode_tps.max(1e-9),
                tokens_per_second: d.decode_tps,
                decode_tokens_per_second: d.decode_tps,
                ttft_p50: 0.0,
                ttft_p99: 0.0,
                itl_p50: 0.0,
                itl_p99: 0.0,
                max_batch: 1,
                repeats: 1,
            },
        );
        for &temp in &b.temperatures {
            for drafter in &b.drafters {
                let opts = SpecOptions {
                    drafter: Some(drafter.parse()?),
                    schedule: Some(if temp > 0.0 { "constant" } else { "throughput" }.into()),
                    ..Default::default()
                };
                for &n in &b.concurrency {
                    progress(&format!(
                        "repeat {rep}: temperature {temp} drafter {drafter} N={n}"
                    ));
                    merge(&mut rows, one(e, n, &opts, temp, b.max_tokens)?);
                }
            }
        }
    }
    Ok(rows)
}

fn merge(rows: &mut Vec<ServeRow>, r: ServeRow) {
    match rows
        .iter_mut()
        .find(|x| x.mode == r.mode && x.drafter == r.drafter && x.concurrency == r.concurrency)
    {
        Some(x) => {
            x.tokens += r.tokens;
            x.seconds += r.seconds;
            x.tokens_per_second = x.tokens as f64 / x.seconds;
            // Decode rates of repeats: their mean.
            x.decode_tokens_per_second = (x.decode_tokens_per_second * x.repeats as f64
                + r.decode_tokens_per_second)
                / (x.repeats + 1) as f64;
            x.repeats += 1;
            x.max_batch = x.max_batch.max(r.max_batch);
            (x.ttft_p50, x.ttft_p99, x.itl_p50, x.itl_p99) =
                (r.ttft_p50, r.ttft_p99, r.itl_p50, r.itl_p99);
        }
        None => rows.push(r),
    }
}

/// The rows as a table, with each row's decode throughput and p99
/// inter-token latency relative to the N = 1 row of its mode and drafter.
pub fn table(rows: &[ServeRow]) -> String {
    let mut s = format!(
        "{:<8} {:<8} {:>3} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>5}\n",
        "mode",
        "drafter",
        "N",
        "tokens",
        "tok/s",
        "dec tok/s",
        "x N=1",
        "ttft p50",
        "ttft p99",
        "itl p50",
        "itl p99",
        "itl99 x",
        "batch"
    );
    for r in rows {
        let base = rows
            .iter()
            .find(|x| x.mode == r.mode && x.drafter == r.drafter && x.concurrency == 1);
        let (x, itl) = base.map_or((1.0, 1.0), |b| {
            (
                r.decode_tokens_per_second / b.decode_tokens_per_second.max(1e-9),
                if b.itl_p99 > 0.0 {
                    r.itl_p99 / b.itl_p99
                } else {
                    0.0
                },
            )
        });
        s += &format!(
            "{:<8} {:<8} {:>3} {:>7} {:>9.1} {:>9.1} {:>7.2} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>8.2} {:>5}\n",
            r.mode, r.drafter, r.concurrency, r.tokens, r.tokens_per_second, r.decode_tokens_per_second, x, r.ttft_p50, r.ttft_p99,
            r.itl_p50, r.itl_p99, itl, r.max_batch
        );
    }
    s
}

/// The cost of one batched step by its size: `n` requests with one row
/// each (plain decode steps, caches of `context` tokens), against `n` steps
/// of one request alone, interleaved `iters` times. Where the batched step
/// costs much less than `n` lone ones, batching pays.
#[derive(Debug, Clone, Serialize)]
pub struct StepCost {
    pub sequences: usize,
    /// Milliseconds of one batched step of `sequences` rows.
    pub batched_ms: f64,
    /// Milliseconds of `sequences` one-row forwards, one request at a time.
    pub alone_ms: f64,
}

pub fn step_costs(e: &Engine, ns: &[usize], context: usize, iters: usize) -> Result<Vec<StepCost>> {
    use crate::speculation::target::{forward_batch, StepRows};
    use crate::speculation::{LlamaTarget, Target};
    let text = format!("{}\n\n{}", GROUNDED.join("\n"), OPEN.join("\n"));
    let ids = e.encode(&Prompt::Raw(text))?;
    let ctx = context.clamp(1, ids.len() - 1);
    let mut out = Vec::new();
    for &n in ns {
        let mut targets: Vec<LlamaTarget> = (0..n)
            .map(|_| {
                let mut t = LlamaTarget::new(e.model.clone());
                t.prefill(&ids[..ctx]).map(|_| t)
            })
            .collect::<Result<_>>()?;
        let (mut batched, mut alone) = (0.0, 0.0);
        for i in 0..iters + 1 {
            let tok = [ids[ctx]];
            let t = Instant::now();
            {
                let mut parts: Vec<StepRows<'_>> = targets
                    .iter_mut()
                    .map(|target| StepRows {
                        target,
                        tokens: &tok,
                        logits: Some(crate::model::Logits::Last),
                    })
                    .collect();
                forward_batch(&e.model, &mut parts)?;
            }
            let b = t.elapsed().as_secs_f64();
            for t in targets.iter_mut() {
                t.rewind(ctx)?;
            }
            let t = Instant::now();
            for target in targets.iter_mut() {
                target.forward(&tok, false)?;
                target.rewind(ctx)?;
            }
            let a = t.elapsed().as_secs_f64();
            // The first round warms up.
            if i > 0 {
                batched += b;
                alone += a;
            }
        }
        out.push(StepCost {
            sequences: n,
            batched_ms: 1e3 * batched / iters as f64,
            alone_ms: 1e3 * alone / iters as f64,
        });
    }
    Ok(out)
}

pub fn step_table(costs: &[StepCost]) -> String {
    let mut s = format!(
        "{:>4} {:>11} {:>11} {:>8}\n",
        "N", "batched ms", "alone ms", "gain"
    );
    for c in costs {
        s += &format!(
            "{:>4} {:>11.2} {:>11.2} {:>8.2}\n",
            c.sequences,
            c.batched_ms,
            c.alone_ms,
            c.alone_ms / c.batched_ms.max(1e-9)
        );
    }
    s
}
