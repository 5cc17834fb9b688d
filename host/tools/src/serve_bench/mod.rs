//! `specd bench serve`: N concurrent requests through the continuous-batching
//! scheduler in-process (no HTTP in the way), per concurrency: aggregate
//! tokens/s, time to first token and inter-token latency (p50/p99); one
//! batch of N, or N clients in a closed loop (`--requests-per-client`). The
//! N = 1 row comes from the same run, and `bench decode`'s single stream is
//! measured in it too, interleaved, so ratios compare like with like.
use crate::bench::{GROUNDED, OPEN};
use crate::latency::{percentile, Gaps, Latency};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use specd::engine::{Engine, Prompt};
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use specd::scheduler::{Admitted, BatchLimits, Scheduler, StepFit};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

/// A row as `--json` writes it; `specd-anchors --serve` reads it back
/// (fields it lacks default).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ServeRow {
    /// `greedy` or `sampled`.
    pub mode: String,
    pub drafter: String,
    #[serde(flatten)]
    pub latency: Latency,
    /// Mean prompt tokens of the row's requests.
    pub prompt_tokens: u64,
    /// Requests the row's clients sent and got answered (N, or N x
    /// requests per client).
    pub requests: u64,
    /// Most requests one step held.
    pub max_batch: u64,
    /// Scheduler steps (a overlapped run of one request alone counts once)
    /// and their seconds.
    pub steps: u64,
    pub step_seconds: f64,
    /// Rows the steps forwarded (prefill chunks included).
    pub step_rows: u64,
    /// Over all requests: rounds, drafted and accepted tokens.
    pub rounds: u64,
    pub drafted: u64,
    pub accepted: u64,
    /// Seconds the requests' policies ran in the steps, summed.
    #[serde(skip)]
    pub policy_seconds: f64,
    #[serde(skip)]
    repeats: usize,
    /// The samples of the percentiles, over the repeats so far.
    #[serde(skip)]
    gaps: Gaps,
    /// The decoding steps' seconds (steps with no prefill rows).
    #[serde(skip)]
    decode_steps: Vec<f64>,
}

impl ServeRow {
    /// A percentile of the decoding steps' seconds: where the inter-token
    /// tail equals their p99, the steps themselves are slow; above it,
    /// something between steps or in what is streamed is.
    pub fn step_percentile(&self, p: f64) -> f64 {
        percentile(&mut self.decode_steps.clone(), p)
    }
}

pub struct ServeBench {
    pub concurrency: Vec<usize>,
    pub drafters: Vec<String>,
    /// The speculative requests' schedule and acceptance policy (`None`:
    /// the default for the temperature).
    pub schedule: String,
    pub acceptance: Option<String>,
    /// Temperatures to run: 0 is `greedy`, above it `sampled` (seeded).
    pub temperatures: Vec<f32>,
    pub repeats: usize,
    /// What each client sends.
    pub load: Load,
}

/// Request `i`'s raw text to continue: long answers, rarely an early end of
/// generation. The mlx-lm server anchor (`specd-anchors --serve`) sends the
/// same texts.
pub fn request_text(i: usize) -> String {
    let prompts: Vec<&str> = GROUNDED.iter().chain(OPEN.iter()).copied().collect();
    format!("{}{CONTINUE}", prompts[i % prompts.len()])
}

/// What every bench request ends with.
const CONTINUE: &str = "\n\nContinue this story for a long time:\nOnce upon a time";

/// What a bench's requests say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Prompts {
    /// Raw texts that ask for a long story (`request_text`): long answers
    /// that rarely end early, and what the mlx-lm anchor sends.
    Story,
    /// One of `bench spec`'s suites, request `i` its `i`-th prompt (cycled)
    /// as a user turn in the chat template: answers that end where the
    /// model ends them, and that a drafter can copy from (`grounded`,
    /// `code`, `repetitive`) or not (`open`).
    Chat(&'static [&'static str]),
    /// A distinct raw prompt of at least this many tokens per request
    /// (`request_prompt`), where attention over the caches weighs in every
    /// step.
    Long(usize),
}

impl Prompts {
    /// `story` or a `bench spec` suite's name.
    pub fn parse(name: &str) -> Result<Prompts> {
        if name == "story" {
            return Ok(Prompts::Story);
        }
        crate::bench::suite(name)
            .map(Prompts::Chat)
            .with_context(|| {
                format!("unknown prompts {name:?}: story, grounded, open, code or repetitive")
            })
    }
}

/// The prompt of request `i`, as `prompts` says. `Long(n)`: the bench's
/// paragraphs from the i-th on, cycled (so requests differ from their
/// first tokens and share no cached prefix), whole paragraphs added until
/// the prompt holds at least `n` tokens, then the same instruction to
/// continue.
pub fn request_prompt(e: &Engine, i: usize, prompts: Prompts) -> Result<Vec<u32>> {
    let prompt_tokens = match prompts {
        Prompts::Story => return e.encode(&Prompt::Raw(request_text(i))),
        Prompts::Chat(suite) => {
            return e.encode(&crate::bench::user_turn(e, suite[i % suite.len()]));
        }
        Prompts::Long(n) => n,
    };
    let paragraphs: Vec<&str> = GROUNDED.iter().chain(OPEN.iter()).copied().collect();
    let mut text = format!("Request {i}.");
    for k in i.. {
        let ids = e.encode(&Prompt::Raw(format!("{text}{CONTINUE}")))?;
        if ids.len() >= prompt_tokens {
            return Ok(ids);
        }
        text += "\n\n";
        text += paragraphs[k % paragraphs.len()];
    }
    unreachable!("the paragraphs cycle until the prompt is long enough")
}

/// What each client sends.
pub struct Load {
    /// Requests one after another, the next as soon as its last one is done
    /// (a closed loop); 1: one batch of N submitted at once.
    pub per_client: usize,
    /// New tokens a request asks for.
    pub max_tokens: usize,
    pub prompts: Prompts,
}

/// `n` clients, each sending `load.per_client` requests one after another
/// (the next admitted at the step boundary after its last one finished, its
/// budget between half and all of `max_tokens`); with one each, a batch of
/// `n` submitted at once, every request with `max_tokens`. With a chat
/// suite, clients send as many more requests (full budget each) as it takes
/// to send every prompt of the suite, so every concurrency's row answers
/// the same prompts. Client c's j-th
/// request is request c + n j (its prompt and seed). The scheduler starts
/// from `fit` and leaves what it learnt there, as a server's one scheduler
/// keeps its step-cost fit from request to request. `tenant` scopes what
/// the requests' policies and drafter carry across requests (a suffix
/// drafter's corpus: one row's requests draft from each other's answers,
/// never from another row's).
fn one(
    e: &Engine,
    fit: &mut StepFit,
    n: usize,
    load: &Load,
    opts: &SpecOptions,
    temperature: f32,
    tenant: &str,
) -> Result<ServeRow> {
    let Load {
        per_client,
        max_tokens,
        prompts: said,
    } = *load;
    let mut sched = Scheduler::new(
        e,
        BatchLimits {
            max_sequences: n,
            ..Default::default()
        },
    )
    .with_fit(std::mem::take(fit));
    let varied = per_client > 1;
    let per_client = match said {
        Prompts::Chat(suite) => per_client.max(suite.len().div_ceil(n)),
        _ => per_client,
    };
    let total = n * per_client.max(1);
    // Request i's result, as its `done` delivers it.
    let results: Rc<RefCell<Vec<(usize, _)>>> = Rc::new(RefCell::new(Vec::new()));
    // Per request, its non-empty pieces' seconds since t0, and when it was
    // submitted.
    let timings: Vec<Rc<RefCell<Vec<f64>>>> = (0..total).map(|_| Rc::default()).collect();
    let mut submitted = vec![0.0; total];
    let prompts: Vec<Vec<u32>> = (0..total)
        .map(|i| request_prompt(e, i, said))
        .collect::<Result<_>>()?;
    let prompt_total: usize = prompts.iter().map(Vec::len).sum();
    let mut prompts: Vec<Option<Vec<u32>>> = prompts.into_iter().map(Some).collect();
    // A closed loop's requests ask for max_tokens / 2 ..= max_tokens, so
    // clients drift apart and requests join mid-batch, as on a server (equal
    // budgets would finish together and run in waves).
    let budget = |i: usize| {
        if varied {
            let half = max_tokens / 2;
            half + i * 7919 % (max_tokens - half + 1)
        } else {
            max_tokens
        }
    };
    let t0 = Instant::now();
    let mut admit = |sched: &mut Scheduler, i: usize| -> Result<()> {
        let params = SamplingParams {
            temperature,
            seed: 1 + i as u64,
            ..Default::default()
        };
        let spec = e.speculation_in(tenant, opts, &params)?;
        let settings = e.settings(params, Some(budget(i)), vec![]);
        let t = timings[i].clone();
        let sink = Box::new(move |s: &str| {
            if !s.is_empty() {
                t.borrow_mut().push(t0.elapsed().as_secs_f64());
            }
            true
        });
        let r = results.clone();
        submitted[i] = t0.elapsed().as_secs_f64();
        sched.admit(Admitted {
            tenant: None,
            prompt: prompts[i].take().expect("each request is admitted once"),
            settings,
            spec,
            sink,
            done: Box::new(move |f| r.borrow_mut().push((i, f))),
        });
        Ok(())
    };
    for i in 0..n.min(total) {
        admit(&mut sched, i)?;
    }
    let mut finished = 0;
    let (mut max_batch, mut steps, mut step_seconds, mut step_rows) = (0, 0, 0.0, 0);
    let mut decode_steps = Vec::new();
    let mut policy_seconds = 0.0;
    while !sched.is_idle() {
        let s = sched.step(&mut || true);
        // The clients whose requests finished send their next.
        let done: Vec<usize> = results.borrow()[finished..]
            .iter()
            .map(|(i, _)| *i)
            .collect();
        finished += done.len();
        for i in done {
            if i + n < total {
                admit(&mut sched, i + n)?;
            }
        }
        max_batch = max_batch.max(s.sequences as u64);
        if s.sequences > 0 {
            steps += 1;
            step_seconds += s.seconds;
            step_rows += s.rows as u64;
            policy_seconds += s.policy_seconds;
            if !s.overlapped && s.prefill_rows == 0 {
                decode_steps.push(s.seconds);
            }
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    *fit = sched.take_fit();
    let (mut tokens, mut rounds, mut drafted, mut accepted) = (0, 0, 0, 0);
    let requests = results.borrow().len() as u64;
    for (_, f) in results.borrow_mut().drain(..) {
        let f = f.context("a benchmark request failed")?;
        tokens += f.stats.generated_tokens;
        rounds += f.stats.rounds;
        drafted += f.stats.drafted;
        accepted += f.stats.accepted;
    }
    let streams: Vec<Vec<f64>> = timings.iter().map(|t| t.take()).collect();
    let gaps = Gaps::of(&streams, &submitted);
    let mut latency = Latency::rates(n, tokens, seconds, &streams);
    latency.set_percentiles(&gaps);
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
        latency,
        gaps,
        requests,
        prompt_tokens: (prompt_total / total.max(1)) as u64,
        max_batch,
        steps,
        step_seconds,
        step_rows,
        rounds,
        drafted,
        accepted,
        decode_steps,
        policy_seconds,
        repeats: 1,
    })
}

/// Every (temperature, drafter, concurrency), `repeats` times over, the
/// concurrencies interleaved within each repeat; plus `bench decode`'s
/// single stream (`decode` rows) once per repeat. Rows of one cell are
/// summed (tokens, seconds) and their percentiles are over every repeat's
/// samples pooled.
pub fn run(e: &Engine, b: &ServeBench, progress: &mut dyn FnMut(&str)) -> Result<Vec<ServeRow>> {
    // Warm up: first-touch allocations.
    let none = SpecOptions {
        drafter: Some(DrafterSpec::None),
        ..Default::default()
    };
    let mut fit = StepFit::default();
    let warm = Load {
        per_client: 1,
        max_tokens: 8,
        prompts: Prompts::Story,
    };
    one(e, &mut fit, 2, &warm, &none, 0.0, "")?;
    let mut rows: Vec<ServeRow> = Vec::new();
    for rep in 0..b.repeats.max(1) {
        let d = crate::bench::decode(e, b.load.max_tokens)?;
        merge(
            &mut rows,
            ServeRow {
                mode: "decode".into(),
                drafter: "none".into(),
                latency: Latency {
                    concurrency: 1,
                    tokens: d.generated_tokens,
                    seconds: d.generated_tokens as f64 / d.decode_tps.max(1e-9),
                    tokens_per_second: d.decode_tps,
                    decode_tokens_per_second: d.decode_tps,
                    ..Default::default()
                },
                prompt_tokens: d.prompt_tokens as u64,
                requests: 1,
                max_batch: 1,
                repeats: 1,
                ..Default::default()
            },
        );
        for &temp in &b.temperatures {
            for drafter in &b.drafters {
                // By default `throughput` for greedy and sampled requests
                // alike: what a client that only names a drafter gets.
                let opts = SpecOptions {
                    drafter: Some(drafter.parse()?),
                    schedule: Some(b.schedule.clone()),
                    acceptance: b.acceptance.clone(),
                    ..Default::default()
                };
                for &n in &b.concurrency {
                    progress(&format!(
                        "repeat {rep}: temperature {temp} drafter {drafter} N={n}"
                    ));
                    // A suffix drafter learns from the answers of its own
                    // row only; other drafters share the default tenant.
                    let tenant = match opts.drafter {
                        Some(DrafterSpec::Suffix) => format!("bench-serve/{rep}/{temp}/{n}"),
                        _ => String::new(),
                    };
                    let mut row = one(e, &mut fit, n, &b.load, &opts, temp, &tenant)?;
                    if drafter != "none" && (b.schedule != "throughput" || b.acceptance.is_some()) {
                        row.drafter = format!(
                            "{drafter}/{}/{}",
                            b.schedule,
                            b.acceptance.as_deref().unwrap_or("default")
                        );
                    }
                    merge(&mut rows, row);
                }
            }
        }
    }
    Ok(rows)
}

fn merge(rows: &mut Vec<ServeRow>, r: ServeRow) {
    match rows.iter_mut().find(|x| {
        x.mode == r.mode && x.drafter == r.drafter && x.latency.concurrency == r.latency.concurrency
    }) {
        Some(x) => {
            let (l, rl) = (&mut x.latency, &r.latency);
            l.tokens += rl.tokens;
            l.seconds += rl.seconds;
            x.requests += r.requests;
            x.steps += r.steps;
            x.step_seconds += r.step_seconds;
            x.step_rows += r.step_rows;
            x.policy_seconds += r.policy_seconds;
            x.rounds += r.rounds;
            x.drafted += r.drafted;
            x.accepted += r.accepted;
            l.tokens_per_second = l.tokens as f64 / l.seconds;
            // Decode rates of repeats: their mean.
            l.decode_tokens_per_second = (l.decode_tokens_per_second * x.repeats as f64
                + rl.decode_tokens_per_second)
                / (x.repeats + 1) as f64;
            x.repeats += 1;
            x.max_batch = x.max_batch.max(r.max_batch);
            x.gaps.extend(&r.gaps);
            l.set_percentiles(&x.gaps);
            x.decode_steps.extend_from_slice(&r.decode_steps);
        }
        None => rows.push(r),
    }
}

/// The rows as a table (after N, the requests answered), with each row's
/// decode throughput and p99 inter-token latency relative to the N = 1 row
/// of its mode and drafter;
/// then per step its mean milliseconds and rows, per round the mean
/// drafts (`k`) and the share of them accepted (`acc`), and the p50/p99
/// milliseconds of the decoding steps (no prefill rows; none for a
/// request decoding overlapped alone), the policies' milliseconds per step
/// (schedule and acceptance calls of all its requests), and last the
/// row's aggregate tok/s relative to plain decoding's (drafter `none`) at
/// the same mode and N, where the run has that row.
pub fn table(rows: &[ServeRow]) -> String {
    let mut s = format!(
        "{:<8} {:<8} {:>3} {:>4} {:>6} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>5} {:>6} {:>8} {:>6} {:>5} {:>5} {:>8} {:>8} {:>6} {:>6}\n",
        "mode",
        "drafter",
        "N",
        "reqs",
        "prompt",
        "tokens",
        "tok/s",
        "dec tok/s",
        "x N=1",
        "ttft p50",
        "ttft p99",
        "itl p50",
        "itl p99",
        "itl99 x",
        "batch",
        "steps",
        "ms/step",
        "rows",
        "k",
        "acc",
        "step p50",
        "step p99",
        "pol ms",
        "x none"
    );
    for row in rows {
        let r = &row.latency;
        let base = rows
            .iter()
            .find(|x| x.mode == row.mode && x.drafter == row.drafter && x.latency.concurrency == 1)
            .map(|b| &b.latency);
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
        let per = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let plain = rows
            .iter()
            .find(|x| {
                x.mode == row.mode && x.drafter == "none" && x.latency.concurrency == r.concurrency
            })
            .map_or("-".to_string(), |p| {
                format!(
                    "{:.2}",
                    per(r.tokens_per_second, p.latency.tokens_per_second)
                )
            });
        s += &format!(
            "{:<8} {:<8} {:>3} {:>4} {:>6} {:>7} {:>9.1} {:>9.1} {:>7.2} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>8.2} {:>5} {:>6} {:>8.2} {:>6.1} {:>5.2} {:>5.2} {:>8.2} {:>8.2} {:>6.3} {:>6}\n",
            row.mode, row.drafter, r.concurrency, row.requests, row.prompt_tokens, r.tokens, r.tokens_per_second, r.decode_tokens_per_second, x, r.ttft_p50, r.ttft_p99,
            r.itl_p50, r.itl_p99, itl, row.max_batch, row.steps, per(1e3 * row.step_seconds, row.steps as f64),
            per(row.step_rows as f64, row.steps as f64), per(row.drafted as f64, row.rounds as f64),
            per(row.accepted as f64, row.drafted as f64),
            1e3 * row.step_percentile(0.5),
            1e3 * row.step_percentile(0.99),
            per(1e3 * row.policy_seconds, row.steps as f64),
            plain
        );
    }
    s
}

mod steps;
pub use steps::{step_costs, step_table, StepCost};

#[cfg(test)]
mod tests {
    use super::*;

    fn row(streams: &[Vec<f64>], steps: &[f64]) -> ServeRow {
        ServeRow {
            mode: "greedy".into(),
            drafter: "none".into(),
            latency: Latency::of(streams.len(), 0, 1.0, streams),
            gaps: Gaps::of(streams, &vec![0.0; streams.len()]),
            decode_steps: steps.to_vec(),
            repeats: 1,
            ..Default::default()
        }
    }

    /// A cell's percentiles are over every repeat's samples, not the last
    /// repeat's: a slow gap of the first repeat is the cell's p99.
    #[test]
    fn repeats_pool_their_latency_samples() {
        let mut rows = Vec::new();
        // Repeat 1: 20 gaps, one slow (0.5 s) among fast ones (0.01 s).
        let slow: Vec<f64> = [0.1, 0.6]
            .into_iter()
            .chain((1..20).map(|i| 0.6 + 0.01 * i as f64))
            .collect();
        merge(&mut rows, row(&[slow], &[0.01, 0.5]));
        assert!((rows[0].latency.itl_p99 - 0.5).abs() < 1e-9);
        // Repeat 2: 20 fast gaps, and a faster first token.
        let fast: Vec<f64> = (0..21).map(|i| 0.05 + 0.01 * i as f64).collect();
        merge(&mut rows, row(&[fast], &[0.01, 0.01]));
        assert_eq!(rows.len(), 1);
        let l = &rows[0].latency;
        assert!(
            (l.itl_p99 - 0.5).abs() < 1e-9,
            "the slow gap of repeat 1 counts: {}",
            l.itl_p99
        );
        assert!((l.itl_p50 - 0.01).abs() < 1e-9);
        // Time to first token over both repeats' requests (0.1 and 0.05).
        assert!((l.ttft_p99 - 0.1).abs() < 1e-9);
        assert!((rows[0].step_percentile(0.99) - 0.5).abs() < 1e-9);
        assert_eq!(rows[0].repeats, 2);
    }
}
