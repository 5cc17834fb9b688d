//! Benchmarks over the real engine: decode speed and speculation vs plain
//! decoding, interleaved in one run (these machines are shared and noisy, so
//! only ratios measured side by side mean much).
use anyhow::Result;
use serde::Serialize;
use specd::engine::{Engine, Prompt};
use specd::options::{DrafterSpec, PolicyWithConfig, SpecOptions};
use specd::sampling::SamplingParams;
use specd::sequence::Finished;
use specd::speculation::RoundPhases;
use specd_text::ChatMessage;
use std::collections::HashMap;

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

/// Code editing: rename, add type hints, fix a bug, in 20-60 lines of code.
pub const CODE_EDIT: [&str; 4] = [
    "Rename the variable `lst` to `items` everywhere in this code and show the whole result:\n\ndef total(lst):\n    s = 0\n    for x in lst:\n        s += x\n    return s\n\n\ndef mean(lst):\n    if not lst:\n        return 0.0\n    return total(lst) / len(lst)\n\n\ndef largest(lst):\n    best = lst[0]\n    for x in lst:\n        if x > best:\n            best = x\n    return best\n\n\ndef smallest(lst):\n    best = lst[0]\n    for x in lst:\n        if x < best:\n            best = x\n    return best\n\n\ndef spread(lst):\n    return largest(lst) - smallest(lst)\n",
    "Add Python type hints to every function in this code and show the whole result:\n\ndef greet(name):\n    return \"Hello, \" + name\n\n\ndef repeat(text, times):\n    out = []\n    for _ in range(times):\n        out.append(text)\n    return out\n\n\ndef count_words(text):\n    counts = {}\n    for word in text.split():\n        counts[word] = counts.get(word, 0) + 1\n    return counts\n\n\ndef longest_word(text):\n    words = text.split()\n    if not words:\n        return None\n    return max(words, key=len)\n\n\ndef is_palindrome(word):\n    w = word.lower()\n    return w == w[::-1]\n",
    "Fix the bug in this code (the loop skips the last element) and show the whole corrected code:\n\ndef sum_even(numbers):\n    total = 0\n    for i in range(len(numbers) - 1):\n        if numbers[i] % 2 == 0:\n            total += numbers[i]\n    return total\n\n\ndef sum_odd(numbers):\n    total = 0\n    for n in numbers:\n        if n % 2 == 1:\n            total += n\n    return total\n\n\ndef main():\n    data = [1, 2, 3, 4, 5, 6, 7, 8]\n    print(\"even:\", sum_even(data))\n    print(\"odd:\", sum_odd(data))\n    print(\"all:\", sum(data))\n\n\nif __name__ == \"__main__\":\n    main()\n",
    "Rename the function `calc` to `area` and its parameter `w` to `width` everywhere in this code, and show the whole result:\n\nclass Rect:\n    def __init__(self, w, h):\n        self.w = w\n        self.h = h\n\n    def calc(self):\n        return self.w * self.h\n\n\ndef calc(w, h):\n    return w * h\n\n\ndef total(rects):\n    s = 0\n    for r in rects:\n        s += r.calc()\n    return s\n\n\ndef report(rects):\n    for r in rects:\n        print(r.w, r.h, r.calc())\n    print(\"total\", total(rects))\n\n\nreport([Rect(1, 2), Rect(3, 4), Rect(5, 6)])\n",
];

/// One task type over several requests (records to JSON): what an agent or
/// a batch job sends. Later requests can draft from earlier outputs.
pub const REPETITIVE: [&str; 6] = [
    "Convert this record to JSON with the keys name, age, city, email and role: Alice Martin, 31 years old, lives in Paris, alice.martin@example.com, engineer.",
    "Convert this record to JSON with the keys name, age, city, email and role: Bob Chen, 45 years old, lives in Toronto, bob.chen@example.com, manager.",
    "Convert this record to JSON with the keys name, age, city, email and role: Carla Diaz, 27 years old, lives in Madrid, carla.diaz@example.com, designer.",
    "Convert this record to JSON with the keys name, age, city, email and role: David Okafor, 38 years old, lives in Lagos, david.okafor@example.com, analyst.",
    "Convert this record to JSON with the keys name, age, city, email and role: Emma Novak, 52 years old, lives in Prague, emma.novak@example.com, director.",
    "Convert this record to JSON with the keys name, age, city, email and role: Farid Haddad, 29 years old, lives in Beirut, farid.haddad@example.com, developer.",
];

/// The built-in suites by name, in the order `bench spec --prompts all`
/// runs them.
pub const SUITES: [(&str, &[&str]); 4] = [
    ("grounded", &GROUNDED),
    ("open", &OPEN),
    ("code", &CODE_EDIT),
    ("repetitive", &REPETITIVE),
];

/// A built-in suite's prompts, by its name.
pub fn suite(name: &str) -> Option<&'static [&'static str]> {
    SUITES.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

/// A benchmark prompt as a user turn in the model's chat template, or as
/// raw text for a model without one (a base model has no chat mode).
pub fn user_turn(e: &Engine, text: &str) -> Prompt {
    match e.template.is_present() {
        true => Prompt::Chat(vec![ChatMessage::user(text)]),
        false => Prompt::Raw(text.to_string()),
    }
}

/// Runs one prompt. `tenant` scopes what the suffix drafter learns from
/// earlier runs, so configs never draft from each other's outputs. `light`:
/// light rounds ([`specd::sequence::Settings::light_rounds`]).
#[allow(clippy::too_many_arguments)]
fn run_one(
    e: &Engine,
    tenant: &str,
    prompt: &str,
    opts: &SpecOptions,
    params: &SamplingParams,
    max_tokens: usize,
    record: Option<&std::path::Path>,
    light: bool,
) -> Result<Finished> {
    let ids = e.encode(&user_turn(e, prompt))?;
    let spec = e.speculation_in(tenant, opts, params)?;
    let mut settings = e.settings(params.clone(), Some(max_tokens), vec![]);
    settings.record = record.is_some();
    settings.light_rounds = light;
    let fin = e.generate(None, &ids, &settings, spec, &mut |_| true)?;
    if let Some(p) = record {
        specd::trace::write(p, e, &settings, opts, &fin)?;
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
    e.generate(None, &ids, &settings, None, &mut |_| true)?;
    let settings = e.settings(params.clone(), Some(max_tokens), vec![]);
    let fin = e.generate(
        None,
        &ids,
        &settings,
        e.speculation(&none, &params)?,
        &mut |_| true,
    )?;
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
    /// Per prompt (by its index), tokens and decode seconds over the
    /// repeats.
    per_prompt: Vec<(usize, f64)>,
    drafted: u64,
    accepted: u64,
    rounds: u64,
    policy_seconds: f64,
    /// Runs whose tokens equal the plain run's.
    same: usize,
    /// Runs that first differ from the plain run where its top-2 margin
    /// was a near-tie (the portable path's promise, `--kernels mlx`).
    at_tie: usize,
    phases: RoundPhases,
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
    /// Over the suite's prompts, each prompt's speedup over its repeats
    /// (tokens/s summed as `speedup` is): the lowest, median and highest.
    pub speedup_min: f64,
    pub speedup_median: f64,
    pub speedup_max: f64,
    pub acceptance_rate: f64,
    pub mean_accepted: f64,
    pub mean_draft: f64,
    /// Draft length the schedule asked for, per round (`mean_draft` is what
    /// the drafter proposed of it).
    pub mean_asked: f64,
    /// Per draft position, while any round reached it: the share of rounds
    /// reaching it (every draft before it kept) that kept it, and how many
    /// reached it.
    pub position_acceptance: Vec<(f64, u64)>,
    pub policy_share: f64,
    pub identical_to_plain: usize,
    /// Runs not identical to plain decoding whose first difference sits
    /// where plain decoding's top-2 margin is under 0.01 (a near-tie).
    pub differ_at_near_tie: usize,
    pub runs: usize,
    /// `light` or `full` rounds ([`specd::sequence::Settings::light_rounds`]).
    pub rounds: String,
    /// Milliseconds per round in each part of it (empty for plain).
    pub round_ms: Vec<(String, f64)>,
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
    /// Round kinds, each a config of its own: light (true) and/or full
    /// (false) rounds; empty: the default's.
    pub rounds: Vec<bool>,
}

/// Every drafter x schedule x acceptance against plain decoding, per suite,
/// prompt by prompt and interleaved, repeated.
pub fn spec(e: &Engine, b: &SpecBench, progress: &mut dyn FnMut(&str)) -> Result<Vec<Cell>> {
    let mut configs = Vec::new();
    let rounds = if b.rounds.is_empty() {
        vec![e.switches.light_rounds]
    } else {
        b.rounds.clone()
    };
    for d in &b.drafters {
        for s in &b.schedules {
            for a in &b.acceptances {
                for &r in &rounds {
                    configs.push((d.clone(), s.clone(), a.clone(), r));
                }
            }
        }
    }
    // Each policy as named, with the config it may carry (`NAME:{json}`);
    // checked before any run.
    let policies = |names: &[String]| -> Result<HashMap<String, PolicyWithConfig>> {
        names
            .iter()
            .map(|n| Ok((n.clone(), specd::options::policy_with_config(n)?)))
            .collect()
    };
    let (schedules, acceptances) = (policies(&b.schedules)?, policies(&b.acceptances)?);
    let mut cells = Vec::new();
    let total =
        b.suites.iter().map(|(_, p)| p.len()).sum::<usize>() * b.repeats * (configs.len() + 1);
    let mut done = 0;
    for (suite, prompts) in &b.suites {
        // Per config: (tokens, seconds, per-prompt sums, counters...)
        let fresh = Acc {
            per_prompt: vec![(0, 0.0); prompts.len()],
            ..Default::default()
        };
        let mut acc: Vec<Acc> = vec![fresh; configs.len()];
        let (mut plain_tokens, mut plain_seconds) = (0usize, 0.0f64);
        let mut plain_per_prompt = vec![(0usize, 0.0f64); prompts.len()];
        for r in 0..b.repeats {
            // Each pass over a suite starts with nothing learned, so a repeat
            // never drafts from its own earlier output.
            e.clear_caches();
            for (pi, p) in prompts.iter().enumerate() {
                let none = SpecOptions {
                    drafter: Some(DrafterSpec::None),
                    ..Default::default()
                };
                let plain = run_one(e, "plain", p, &none, &b.params, b.max_tokens, None, true)?;
                done += 1;
                progress(&format!(
                    "[{done}/{total}] {suite} repeat {} plain: {:.1} tok/s",
                    r + 1,
                    plain.stats.decode_tps()
                ));
                plain_tokens += plain.stats.generated_tokens;
                plain_seconds += plain.stats.decode_seconds;
                plain_per_prompt[pi].0 += plain.stats.generated_tokens;
                plain_per_prompt[pi].1 += plain.stats.decode_seconds;
                for (i, (d, s, a, light)) in configs.iter().enumerate() {
                    let ((schedule, schedule_config), (acceptance, acceptance_config)) =
                        (schedules[s].clone(), acceptances[a].clone());
                    let opts = SpecOptions {
                        drafter: Some(d.parse()?),
                        schedule: Some(schedule),
                        acceptance: Some(acceptance),
                        draft_max: b.draft_max,
                        schedule_config,
                        acceptance_config,
                    };
                    let f = run_one(
                        e,
                        &format!("config-{i}"),
                        p,
                        &opts,
                        &b.params,
                        b.max_tokens,
                        b.record.as_deref(),
                        *light,
                    )?;
                    done += 1;
                    progress(&format!(
                        "[{done}/{total}] {suite} repeat {} {d}/{s}/{a} {}: {:.1} tok/s, acceptance {:.2}",
                        r + 1,
                        round_kind(*light),
                        f.stats.decode_tps(),
                        f.stats.acceptance_rate
                    ));
                    let c = &mut acc[i];
                    c.tokens += f.stats.generated_tokens;
                    c.seconds += f.stats.decode_seconds;
                    c.per_prompt[pi].0 += f.stats.generated_tokens;
                    c.per_prompt[pi].1 += f.stats.decode_seconds;
                    c.drafted += f.stats.drafted;
                    c.accepted += f.stats.accepted;
                    c.rounds += f.stats.rounds;
                    c.policy_seconds += f.stats.policy_seconds;
                    c.same += (f.emitted == plain.emitted) as usize;
                    c.at_tie += first_difference_at_tie(&plain, &f) as usize;
                    c.phases.add(&f.stats.phases);
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
            mean_asked: 0.0,
            position_acceptance: Vec::new(),
            policy_share: 0.0,
            identical_to_plain: prompts.len() * b.repeats,
            differ_at_near_tie: 0,
            runs: prompts.len() * b.repeats,
            rounds: "-".into(),
            round_ms: Vec::new(),
        });
        for (i, (d, s, a, light)) in configs.iter().enumerate() {
            let Acc {
                tokens,
                seconds,
                per_prompt,
                drafted,
                accepted,
                rounds,
                policy_seconds: policy,
                same,
                at_tie,
                phases,
            } = acc[i].clone();
            let tps = if seconds > 0.0 {
                tokens as f64 / seconds
            } else {
                0.0
            };
            let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
            let mut sp: Vec<f64> = per_prompt
                .iter()
                .zip(&plain_per_prompt)
                .filter(|(_, &(pt, ps))| pt > 0 && ps > 0.0)
                .map(|(&(t, s), &(pt, ps))| ratio(ratio(t as f64, s), pt as f64 / ps))
                .collect();
            sp.sort_by(|x, y| x.total_cmp(y));
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
                mean_asked: ratio(phases.drafts.asked as f64, rounds as f64),
                position_acceptance: phases.drafts.acceptance(),
                policy_share: ratio(policy, seconds),
                identical_to_plain: same,
                differ_at_near_tie: at_tie,
                runs: prompts.len() * b.repeats,
                rounds: round_kind(*light).into(),
                round_ms: round_ms(&phases, seconds),
            });
        }
    }
    Ok(cells)
}

/// Whether `spec`'s tokens first differ from `plain`'s at a position where
/// plain decoding's top-2 logit margin was under 0.01 (DESIGN's near-tie).
fn first_difference_at_tie(plain: &Finished, spec: &Finished) -> bool {
    let first = plain
        .emitted
        .iter()
        .zip(&spec.emitted)
        .position(|(a, b)| a != b);
    first.is_some_and(|i| plain.margins.get(i).is_some_and(|&m| m < 0.01))
}

fn round_kind(light: bool) -> &'static str {
    if light {
        "light"
    } else {
        "full"
    }
}

/// Milliseconds per round in each part, and `other`: what the decode time
/// (`seconds`) spent outside the parts.
fn round_ms(p: &RoundPhases, seconds: f64) -> Vec<(String, f64)> {
    let per_round = |x: f64| {
        if p.rounds > 0 {
            x * 1e3 / p.rounds as f64
        } else {
            0.0
        }
    };
    let parts = p.parts();
    let measured: f64 = parts.iter().map(|x| x.1).sum();
    parts
        .iter()
        .map(|&(n, x)| (n.to_string(), per_round(x)))
        .chain([("other".to_string(), per_round(seconds - measured))])
        .collect()
}

/// A readable table of the cells, then where each speculative cell's
/// rounds spent their time (ms per round).
pub fn table(cells: &[Cell]) -> String {
    let mut s = format!(
        "{:<9} {:<10} {:<20} {:<10} {:<9} {:>8} {:>8} {:>22} {:>7} {:>8} {:>7} {:>7} {:>4} {:>6}\n",
        "suite",
        "drafter",
        "schedule",
        "accept",
        "rounds",
        "tok/s",
        "speedup",
        "min/med/max",
        "accept",
        "acc/rnd",
        "draft",
        "policy",
        "tie",
        "same"
    );
    for c in cells {
        s += &format!(
            "{:<9} {:<10} {:<20} {:<10} {:<9} {:>8.1} {:>7.2}x {:>6.2}/{:>6.2}/{:>6.2}x {:>7.2} {:>8.2} {:>7.2} {:>6.3}% {:>4} {:>3}/{:<2}\n",
            c.suite,
            c.drafter,
            c.schedule,
            c.acceptance,
            c.rounds,
            c.tokens_per_second,
            c.speedup,
            c.speedup_min,
            c.speedup_median,
            c.speedup_max,
            c.acceptance_rate,
            c.mean_accepted,
            c.mean_draft,
            c.policy_share * 100.0,
            c.differ_at_near_tie,
            c.identical_to_plain,
            c.runs
        );
    }
    let timed: Vec<&Cell> = cells.iter().filter(|c| !c.round_ms.is_empty()).collect();
    if let Some(first) = timed.first() {
        // Indented: only the cells' lines start with their suite.
        s += &format!("\n{:<55}", "ms per round");
        for (n, _) in &first.round_ms {
            s += &format!(" {n:>8}");
        }
        s += "\n";
        for c in &timed {
            let name = format!(
                "{} {}/{}/{} {}",
                c.suite, c.drafter, c.schedule, c.acceptance, c.rounds
            );
            s += &format!("  {name:<53}");
            for (_, ms) in &c.round_ms {
                s += &format!(" {ms:>8.3}");
            }
            s += "\n";
        }
        s += &position_table(&timed);
    }
    s
}

/// Positions shown in the acceptance table.
const SHOWN_POSITIONS: usize = 8;

/// Per cell: k asked and drafted per round, then the acceptance at each
/// draft position among the rounds that reached it (rounds in brackets).
fn position_table(cells: &[&Cell]) -> String {
    let mut s = format!(
        "\n{:<55} {:>6} {:>6}",
        "acceptance per draft position", "asked", "draft"
    );
    for i in 1..=SHOWN_POSITIONS {
        s += &format!(" {:>10}", format!("#{i}"));
    }
    s += "\n";
    for c in cells {
        let name = format!(
            "{} {}/{}/{} {}",
            c.suite, c.drafter, c.schedule, c.acceptance, c.rounds
        );
        s += &format!("  {name:<53} {:>6.2} {:>6.2}", c.mean_asked, c.mean_draft);
        for &(a, n) in c.position_acceptance.iter().take(SHOWN_POSITIONS) {
            s += &format!(" {:>10}", format!("{a:.2} ({n})"));
        }
        s += "\n";
    }
    s
}
