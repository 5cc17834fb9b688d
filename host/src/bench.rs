//! Benchmarks over the real engine: decode speed and speculation vs plain
//! decoding, interleaved in one run (these machines are shared and noisy, so
//! only ratios measured side by side mean much).
use crate::engine::{Engine, Prompt};
use crate::options::{DrafterSpec, SpecOptions};
use crate::pipeline::Finished;
use crate::sampling::SamplingParams;
use anyhow::Result;
use serde::Serialize;
use specd_text::ChatMessage;

/// Input-grounded prompts: repeat, edit or summarize a given text or code.
pub const GROUNDED: [&str; 5] = [
    "Repeat the following text exactly: The quick brown fox jumps over the lazy dog. The early bird catches the worm. A stitch in time saves nine.",
    "Fix the typo and rewrite the sentence: Teh cat sat on the mat and looked out of the windwo at the birds.",
    "Rewrite this Python function with a docstring:\ndef add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b",
    "Summarize: The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It is named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.",
    "Copy this list and add one more fruit at the end: apples, bananas, cherries, dates, elderberries, figs.",
];

/// Open-ended chat.
pub const OPEN: [&str; 5] = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Give me three tips for learning to cook.",
    "Why is the sky blue?",
    "Tell me a fun fact about octopuses.",
];

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::user(text)])
}

fn run_one(
    e: &Engine,
    prompt: &str,
    opts: &SpecOptions,
    params: &SamplingParams,
    max_tokens: usize,
    record: Option<&std::path::Path>,
) -> Result<Finished> {
    // A model without a chat template (a base model such as Gemma 3 270M)
    // gets the prompt as plain text: completion mode.
    let prompt = if e.tokenizer.chat_template().is_some() {
        chat(prompt)
    } else {
        Prompt::Raw(prompt.into())
    };
    let ids = e.encode(&prompt)?;
    let spec = e.speculation(opts, params)?;
    let mut settings = e.settings(params.clone(), Some(max_tokens), vec![]);
    settings.record = record.is_some();
    let fin = e.generate_uncached(&ids, &settings, spec, &mut |_| true)?;
    if let Some(p) = record {
        crate::trace::write(p, e, &settings, &fin)?;
    }
    Ok(fin)
}

#[derive(Debug, Clone, Serialize)]
pub struct DecodeReport {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_tps: f64,
    pub decode_tps: f64,
}

/// Plain greedy prefill and decode speed.
pub fn decode(e: &Engine, max_tokens: usize) -> Result<DecodeReport> {
    let text = format!(
        "{}\n\nContinue this story for a long time:\nOnce upon a time",
        GROUNDED.join("\n")
    );
    let ids = e.encode(&Prompt::Raw(text))?;
    let params = SamplingParams::default();
    let none = SpecOptions {
        drafter: Some(DrafterSpec::None),
        ..Default::default()
    };
    // Warm up (first-touch allocations), then measure.
    let settings = e.settings(params.clone(), Some(8), vec![]);
    e.generate_uncached(&ids, &settings, None, &mut |_| true)?;
    let settings = e.settings(params.clone(), Some(max_tokens), vec![]);
    let fin = e.generate_uncached(&ids, &settings, e.speculation(&none, &params)?, &mut |_| {
        true
    })?;
    Ok(DecodeReport {
        prompt_tokens: fin.stats.prompt_tokens,
        generated_tokens: fin.stats.generated_tokens,
        prefill_tps: fin.stats.prompt_tps(),
        decode_tps: fin.stats.decode_tps(),
    })
}

/// Sums over the runs of one config.
#[derive(Debug, Clone, Default)]
struct Acc {
    tokens: usize,
    seconds: f64,
    /// Per-run speedup over the plain run of the same prompt.
    speedups: Vec<f64>,
    drafted: u64,
    accepted: u64,
    rounds: u64,
    policy_seconds: f64,
    /// Runs whose tokens equal the plain run's.
    same: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub suite: String,
    pub drafter: String,
    pub schedule: String,
    pub acceptance: String,
    pub tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub plain_tokens_per_second: f64,
    /// Aggregate tokens/s over plain's, same prompts, interleaved.
    pub speedup: f64,
    pub speedup_min: f64,
    pub speedup_median: f64,
    pub speedup_max: f64,
    pub acceptance_rate: f64,
    pub mean_accepted: f64,
    pub mean_draft: f64,
    pub policy_share: f64,
    pub identical_to_plain: usize,
    pub runs: usize,
}

pub struct SpecBench {
    pub drafters: Vec<String>,
    pub schedules: Vec<String>,
    pub acceptances: Vec<String>,
    pub max_tokens: usize,
    pub repeats: usize,
    pub draft_max: Option<usize>,
    pub params: SamplingParams,
    pub suites: Vec<(String, Vec<String>)>,
    /// Append every run's rounds to this trace file.
    pub record: Option<std::path::PathBuf>,
}

/// Every drafter x schedule x acceptance against plain decoding, per suite,
/// prompt by prompt and interleaved, repeated.
pub fn spec(e: &Engine, b: &SpecBench, progress: &mut dyn FnMut(&str)) -> Result<Vec<Cell>> {
    let mut configs = Vec::new();
    for d in &b.drafters {
        for s in &b.schedules {
            for a in &b.acceptances {
                configs.push((d.clone(), s.clone(), a.clone()));
            }
        }
    }
    let mut cells = Vec::new();
    let total =
        b.suites.iter().map(|(_, p)| p.len()).sum::<usize>() * b.repeats * (configs.len() + 1);
    let mut done = 0;
    for (suite, prompts) in &b.suites {
        // Per config: (tokens, seconds, per-run speedups, counters...)
        let mut acc: Vec<Acc> = vec![Acc::default(); configs.len()];
        let (mut plain_tokens, mut plain_seconds) = (0usize, 0.0f64);
        for r in 0..b.repeats {
            for p in prompts {
                let none = SpecOptions {
                    drafter: Some(DrafterSpec::None),
                    ..Default::default()
                };
                let plain = run_one(e, p, &none, &b.params, b.max_tokens, None)?;
                done += 1;
                progress(&format!(
                    "[{done}/{total}] {suite} repeat {} plain: {:.1} tok/s",
                    r + 1,
                    plain.stats.decode_tps()
                ));
                plain_tokens += plain.stats.generated_tokens;
                plain_seconds += plain.stats.decode_seconds;
                for (i, (d, s, a)) in configs.iter().enumerate() {
                    let opts = SpecOptions {
                        drafter: Some(d.parse()?),
                        schedule: Some(s.clone()),
                        acceptance: Some(a.clone()),
                        draft_max: b.draft_max,
                        ..Default::default()
                    };
                    let f = run_one(e, p, &opts, &b.params, b.max_tokens, b.record.as_deref())?;
                    done += 1;
                    progress(&format!(
                        "[{done}/{total}] {suite} repeat {} {d}/{s}/{a}: {:.1} tok/s, acceptance {:.2}",
                        r + 1,
                        f.stats.decode_tps(),
                        f.stats.acceptance_rate
                    ));
                    let c = &mut acc[i];
                    c.tokens += f.stats.generated_tokens;
                    c.seconds += f.stats.decode_seconds;
                    if plain.stats.decode_tps() > 0.0 {
                        c.speedups
                            .push(f.stats.decode_tps() / plain.stats.decode_tps());
                    }
                    c.drafted += f.stats.drafted;
                    c.accepted += f.stats.accepted;
                    c.rounds += f.stats.rounds;
                    c.policy_seconds += f.stats.policy_seconds;
                    c.same += (f.emitted == plain.emitted) as usize;
                }
            }
        }
        let plain_tps = if plain_seconds > 0.0 {
            plain_tokens as f64 / plain_seconds
        } else {
            0.0
        };
        cells.push(Cell {
            suite: suite.clone(),
            drafter: "none".into(),
            schedule: "-".into(),
            acceptance: "-".into(),
            tokens: plain_tokens,
            seconds: plain_seconds,
            tokens_per_second: plain_tps,
            plain_tokens_per_second: plain_tps,
            speedup: 1.0,
            speedup_min: 1.0,
            speedup_median: 1.0,
            speedup_max: 1.0,
            acceptance_rate: 0.0,
            mean_accepted: 0.0,
            mean_draft: 0.0,
            policy_share: 0.0,
            identical_to_plain: prompts.len() * b.repeats,
            runs: prompts.len() * b.repeats,
        });
        for (i, (d, s, a)) in configs.iter().enumerate() {
            let Acc {
                tokens,
                seconds,
                speedups: mut sp,
                drafted,
                accepted,
                rounds,
                policy_seconds: policy,
                same,
            } = acc[i].clone();
            sp.sort_by(|x, y| x.total_cmp(y));
            let tps = if seconds > 0.0 {
                tokens as f64 / seconds
            } else {
                0.0
            };
            let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
            cells.push(Cell {
                suite: suite.clone(),
                drafter: d.clone(),
                schedule: s.clone(),
                acceptance: a.clone(),
                tokens,
                seconds,
                tokens_per_second: tps,
                plain_tokens_per_second: plain_tps,
                speedup: ratio(tps, plain_tps),
                speedup_min: sp.first().copied().unwrap_or(0.0),
                speedup_median: sp.get(sp.len() / 2).copied().unwrap_or(0.0),
                speedup_max: sp.last().copied().unwrap_or(0.0),
                acceptance_rate: ratio(accepted as f64, drafted as f64),
                mean_accepted: ratio(accepted as f64, rounds as f64),
                mean_draft: ratio(drafted as f64, rounds as f64),
                policy_share: ratio(policy, seconds),
                identical_to_plain: same,
                runs: prompts.len() * b.repeats,
            });
        }
    }
    Ok(cells)
}

/// A readable table of the cells.
pub fn table(cells: &[Cell]) -> String {
    let mut s = format!(
        "{:<9} {:<10} {:<20} {:<10} {:>8} {:>8} {:>22} {:>7} {:>8} {:>7} {:>7} {:>6}\n",
        "suite",
        "drafter",
        "schedule",
        "accept",
        "tok/s",
        "speedup",
        "min/med/max",
        "accept",
        "acc/rnd",
        "draft",
        "policy",
        "same"
    );
    for c in cells {
        s += &format!(
            "{:<9} {:<10} {:<20} {:<10} {:>8.1} {:>7.2}x {:>6.2}/{:>6.2}/{:>6.2}x {:>7.2} {:>8.2} {:>7.2} {:>6.3}% {:>3}/{:<2}\n",
            c.suite,
            c.drafter,
            c.schedule,
            c.acceptance,
            c.tokens_per_second,
            c.speedup,
            c.speedup_min,
            c.speedup_median,
            c.speedup_max,
            c.acceptance_rate,
            c.mean_accepted,
            c.mean_draft,
            c.policy_share * 100.0,
            c.identical_to_plain,
            c.runs
        );
    }
    s
}
