//! Continuous batching on the real default model: a step over several
//! sequences gives each one bitwise the rows of its forward alone, and a
//! request preempted for the KV budget resumes with its solo tokens.
use specd::engine::Prompt;
use specd::model::Logits;
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use specd::sampling::{distribution, token_logprob, LogprobMode, LogprobRequest, TokenLogprob};
use specd::scheduler::{Admitted, BatchLimits, KvRates, Scheduler};
use specd::sequence::{Finished, LogprobHook, PromptLogprobHook, PREFILL_CHUNK};
use specd::speculation::target::{forward_batch, forward_batch_verify, StepRows};
use specd::speculation::{LlamaTarget, Target};
use specd::speculation::{RowArgmax, VerifyMode, VerifyRows};
use specd_tests::{assert_step_as_solo, bits, chi_square, chi_square_critical_001, engine};
use specd_text::ChatMessage;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::user(text)])
}

/// The token after position `at`, or the first one past the end.
fn next_token(ids: &[u32], at: usize) -> u32 {
    *ids.get(at).unwrap_or(&ids[0])
}

#[test]
fn a_batched_step_gives_every_sequence_its_solo_rows_bitwise() {
    batched_step_is_solo(&engine());
}

/// The same over 16-bit KV caches (`--kv-f16 on`).
#[test]
fn a_batched_step_over_f16_caches_gives_every_sequence_its_solo_rows_bitwise() {
    let e = specd_tests::f16_kv_engine();
    assert!(e.model.flags.kv_half);
    batched_step_is_solo(&e);
}

fn batched_step_is_solo(e: &specd::engine::Engine) {
    assert!(e.model.batch_invariant());
    let prompts = [
        "Name three colors of the rainbow.",
        "Write a haiku about the sea, then explain it in one sentence.",
        "2 + 2 =",
        "List the planets of the solar system in order from the sun.",
    ];
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| e.encode(&chat(p)).unwrap())
        .collect();
    // (cached before the step, rows in the step, logits): a decode step,
    // a verify of 5 rows, a fresh prefill chunk, a 3-row verify.
    let plan = [
        (ids[0].len() - 1, 1, Some(Logits::Last)),
        (ids[1].len() - 5, 5, Some(Logits::All)),
        (0, 9, None),
        (ids[3].len() - 3, 3, Some(Logits::All)),
    ];
    let fresh = |i: usize| {
        let mut t = LlamaTarget::new(e.model.clone());
        t.prefill(&ids[i][..plan[i].0], None).unwrap();
        t
    };
    // Alone.
    let mut solo = Vec::new();
    let mut solo_next = Vec::new();
    for (i, &(c, n, which)) in plan.iter().enumerate() {
        let mut t = fresh(i);
        let toks = &ids[i][c..c + n];
        match which {
            Some(w) => solo.push(t.forward(toks, w == Logits::All).unwrap()),
            None => {
                t.prefill(toks, None).unwrap();
                solo.push(Vec::new());
            }
        }
        // The step after it reads what the step left in the caches.
        solo_next.push(t.forward(&[next_token(&ids[i], c + n)], false).unwrap());
    }
    // Together.
    let mut targets: Vec<LlamaTarget> = (0..plan.len()).map(fresh).collect();
    let mut parts: Vec<StepRows<'_>> = targets
        .iter_mut()
        .zip(&plan)
        .zip(&ids)
        .map(|((t, &(c, n, which)), ids)| StepRows {
            target: t,
            tokens: &ids[c..c + n],
            logits: which,
            taps: None,
        })
        .collect();
    let batched = forward_batch(&e.model, &mut parts).unwrap();
    drop(parts);
    for (i, t) in targets.iter_mut().enumerate() {
        let (c, n, _) = plan[i];
        let next = next_token(&ids[i], c + n);
        assert_step_as_solo(i, t, c + n, &batched[i], &solo[i], next, &solo_next[i]);
    }
}

#[test]
fn a_light_batched_step_reads_back_the_argmax_of_its_full_rows() {
    let e = engine();
    let prompts = [
        "Name three colors of the rainbow.",
        "Write a haiku about the sea, then explain it in one sentence.",
        "2 + 2 =",
    ];
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| e.encode(&chat(p)).unwrap())
        .collect();
    // A plain decode step and a 4-row verify read light, a 3-row verify
    // reads its full rows, and a prefill chunk rides along.
    let plan = [
        (ids[0].len() - 1, 1, Some(Logits::Last), VerifyMode::Argmax),
        (ids[1].len() - 4, 4, Some(Logits::All), VerifyMode::Argmax),
        (ids[2].len() - 3, 3, Some(Logits::All), VerifyMode::Rows),
        (0, 6, None, VerifyMode::Rows),
    ];
    let prompt_of = |i: usize| &ids[i.min(2)];
    let step = |modes: &[VerifyMode]| {
        let mut targets: Vec<LlamaTarget> = plan
            .iter()
            .enumerate()
            .map(|(i, &(c, ..))| {
                let mut t = LlamaTarget::new(e.model.clone());
                t.prefill(&prompt_of(i)[..c], None).unwrap();
                t
            })
            .collect();
        let mut parts: Vec<StepRows<'_>> = targets
            .iter_mut()
            .zip(&plan)
            .enumerate()
            .map(|(i, (t, &(c, n, which, _)))| StepRows {
                target: t,
                tokens: &prompt_of(i)[c..c + n],
                logits: which,
                taps: None,
            })
            .collect();
        (forward_batch_verify(&e.model, &mut parts, modes).unwrap())
            .into_iter()
            .map(|v| v.rows)
            .collect::<Vec<_>>()
    };
    let light = step(&plan.map(|p| p.3));
    let full = step(&[VerifyMode::Rows; 4]);
    for (i, (l, f)) in light.iter().zip(&full).enumerate() {
        let VerifyRows::Logits(rows) = f else {
            panic!("sequence {i}: full rows were asked")
        };
        match (plan[i].3, l) {
            (VerifyMode::Argmax, VerifyRows::Argmax(got)) => {
                assert_eq!(got.len(), rows.len(), "sequence {i}'s row count");
                for (g, r) in got.iter().zip(rows) {
                    let want = RowArgmax::of(r);
                    assert_eq!(g.argmax, want.argmax, "sequence {i}");
                    assert_eq!(g.margin.to_bits(), want.margin.to_bits(), "sequence {i}");
                }
            }
            (VerifyMode::Rows, VerifyRows::Logits(got)) => {
                assert!(bits(got) == bits(rows), "sequence {i}: rows differ");
            }
            (m, _) => panic!("sequence {i}: asked {m:?}, got the other kind"),
        }
    }
}

fn solo_run(
    e: &specd::engine::Engine,
    prompt: &[u32],
    params: &SamplingParams,
    opts: &SpecOptions,
    n: usize,
) -> Finished {
    let spec = e.speculation(opts, params).unwrap();
    let settings = e.settings(params.clone(), Some(n), vec![]);
    e.generate(None, prompt, &settings, spec, &mut |_| true)
        .unwrap()
}

fn solo_tokens(
    e: &specd::engine::Engine,
    prompt: &[u32],
    params: &SamplingParams,
    opts: &SpecOptions,
    n: usize,
) -> Vec<u32> {
    solo_run(e, prompt, params, opts, n).log
}

/// A case of a batch test: its prompt text, sampling and speculation.
type Case<'a> = (&'a str, SamplingParams, SpecOptions);

/// The cases' prompts as chat turns.
fn encode_cases(e: &specd::engine::Engine, cases: &[Case<'_>]) -> Vec<Vec<u32>> {
    cases
        .iter()
        .map(|(p, ..)| e.encode(&chat(p)).unwrap())
        .collect()
}

/// Admits every case (`n` tokens each) into `sched`; each request's
/// outcome lands in its slot of the returned list when it finishes.
fn admit_cases<'e>(
    sched: &mut Scheduler<'e>,
    e: &'e specd::engine::Engine,
    cases: &[Case<'_>],
    prompts: &[Vec<u32>],
    n: usize,
) -> Rc<RefCell<Vec<Option<anyhow::Result<Finished>>>>> {
    let finished = Rc::new(RefCell::new(
        (0..cases.len()).map(|_| None).collect::<Vec<_>>(),
    ));
    for (i, ((_, params, opts), p)) in cases.iter().zip(prompts).enumerate() {
        let f = finished.clone();
        sched.admit(Admitted {
            tenant: None,
            prompt: p.clone(),
            settings: e.settings(params.clone(), Some(n), vec![]),
            spec: e.speculation(opts, params).unwrap(),
            sink: Box::new(|_: &str| true),
            done: Box::new(move |r| f.borrow_mut()[i] = Some(r)),
        });
    }
    finished
}

#[test]
fn a_preempted_request_resumes_and_returns_its_solo_tokens() {
    let e = engine();
    let cases: Vec<Case<'_>> = vec![
        (
            "Name three colors of the rainbow.",
            SamplingParams::default(),
            SpecOptions {
                drafter: Some(DrafterSpec::None),
                ..Default::default()
            },
        ),
        (
            "Write a haiku about the sea.",
            SamplingParams {
                temperature: 0.8,
                seed: 9,
                ..Default::default()
            },
            SpecOptions {
                drafter: Some("ngram".parse().unwrap()),
                schedule: Some("constant".into()),
                ..Default::default()
            },
        ),
        (
            "List the planets of the solar system.",
            SamplingParams::default(),
            SpecOptions {
                drafter: Some("self:6".parse().unwrap()),
                schedule: Some("heuristic-transient".into()),
                ..Default::default()
            },
        ),
    ];
    let n = 24;
    let prompts = encode_cases(&e, &cases);
    let solo: Vec<Vec<u32>> = cases
        .iter()
        .zip(&prompts)
        .map(|((_, params, opts), p)| solo_tokens(&e, p, params, opts, n))
        .collect();
    // A budget the prompts fit in with little room to grow: the requests
    // must take turns.
    let per_token = KvRates::of(&e).per_token(&DrafterSpec::None);
    let prompt_tokens: usize = prompts.iter().map(|p| p.len() + 1).sum();
    let limits = BatchLimits {
        max_sequences: 3,
        step_tokens: 512,
        kv_budget: Some((prompt_tokens + 24) * per_token),
    };
    let mut sched = Scheduler::new(&e, limits);
    let finished = admit_cases(&mut sched, &e, &cases, &prompts, n);
    let mut preempted = 0;
    let mut widest = 0;
    while !sched.is_idle() {
        let s = sched.step(&mut || true);
        preempted += s.preempted;
        widest = widest.max(s.sequences);
    }
    assert!(preempted > 0, "the budget should have forced a preemption");
    assert!(widest >= 2, "the requests should have shared steps");
    let mut counted = 0;
    for (i, r) in finished.borrow_mut().drain(..).enumerate() {
        let fin = r.expect("finished").expect("no failure");
        assert_eq!(fin.log, solo[i], "request {i} differs from its solo run");
        counted += fin.stats.preemptions;
    }
    assert_eq!(
        counted as usize, preempted,
        "the stats count every preemption"
    );
}

#[test]
fn decisions_on_several_threads_keep_every_requests_solo_tokens() {
    let e = engine();
    let spec = |drafter: &str, schedule: &str, acceptance: &str| SpecOptions {
        drafter: Some(drafter.parse().unwrap()),
        schedule: Some(schedule.into()),
        acceptance: Some(acceptance.into()),
        ..Default::default()
    };
    let sampled = |temperature: f32, seed: u64| SamplingParams {
        temperature,
        seed,
        ..Default::default()
    };
    let copy = "Repeat exactly, twice: the quick brown fox jumps over the lazy dog.";
    let cases: Vec<Case<'_>> = vec![
        (
            copy,
            SamplingParams::default(),
            spec("ngram", "constant", "greedy"),
        ),
        (
            copy,
            sampled(0.8, 3),
            spec("ngram", "constant", "rejection"),
        ),
        (
            "Count from one to twenty in words.",
            sampled(0.7, 11),
            spec("ngram", "heuristic-transient", "typical"),
        ),
        // The suffix drafter's drafts depend on what the other requests
        // wrote (its corpus spans requests): greedy keeps the tokens.
        (
            "Spell the word banana letter by letter, twice.",
            SamplingParams::default(),
            spec("suffix", "constant", "greedy"),
        ),
    ];
    let n = 32;
    let prompts = encode_cases(&e, &cases);
    // What each request returns alone (its log may go on past its end
    // where a round accepted drafts beyond it: see `Finished::context`).
    let solo: Vec<Vec<u32>> = cases
        .iter()
        .zip(&prompts)
        .map(|((_, params, opts), p)| solo_run(&e, p, params, opts, n).context().to_vec())
        .collect();
    // Every step with two rounds to decide spreads them over 2 threads.
    let mut sched = Scheduler::new(&e, BatchLimits::default()).with_parallel_decisions(0.0, 2);
    let finished = admit_cases(&mut sched, &e, &cases, &prompts, n);
    let mut spread = 0;
    while !sched.is_idle() {
        let s = sched.step(&mut || true);
        if s.decision_threads > 1 {
            spread += 1;
        }
    }
    assert!(spread > 0, "no step decided its rounds on several threads");
    for (i, r) in finished.borrow_mut().drain(..).enumerate() {
        let fin = r.expect("finished").expect("no failure");
        let stats = &fin.stats;
        assert!(stats.drafted > 0, "request {i} drafted nothing");
        assert!(
            stats.policy_failure.is_none(),
            "request {i}: {:?}",
            stats.policy_failure
        );
        assert_eq!(
            fin.context(),
            solo[i],
            "request {i} differs from its solo run"
        );
    }
}

/// Runs `seeds` seeded sampled requests of `n` tokens, all at once through
/// the scheduler (`batch` at a time) or one by one; returns each one's
/// generated tokens, and how many steps it shared and drafts it verified.
fn sampled_runs(
    e: &specd::engine::Engine,
    prompt: &[u32],
    temperature: f32,
    seeds: std::ops::Range<u64>,
    n: usize,
    batch: Option<usize>,
) -> Vec<(Vec<u32>, u64, u64)> {
    let opts = SpecOptions {
        drafter: Some("self:8".parse().unwrap()),
        schedule: Some("throughput".into()),
        ..Default::default()
    };
    let params = |seed| SamplingParams {
        temperature,
        seed,
        ..Default::default()
    };
    let generated = |f: specd::sequence::Finished| {
        (
            f.log[prompt.len()..].to_vec(),
            f.stats.batch_steps,
            f.stats.drafted,
        )
    };
    let Some(width) = batch else {
        return seeds
            .map(|s| {
                let p = params(s);
                let spec = e.speculation(&opts, &p).unwrap();
                let settings = e.settings(p, Some(n), vec![]);
                generated(
                    e.generate(Some(""), prompt, &settings, spec, &mut |_| true)
                        .unwrap(),
                )
            })
            .collect();
    };
    let out = Rc::new(RefCell::new(Vec::new()));
    let mut sched = Scheduler::new(
        e,
        BatchLimits {
            max_sequences: width,
            ..Default::default()
        },
    );
    for s in seeds {
        let p = params(s);
        let o = out.clone();
        sched.admit(Admitted {
            tenant: Some(String::new()),
            prompt: prompt.to_vec(),
            settings: e.settings(p.clone(), Some(n), vec![]),
            spec: e.speculation(&opts, &p).unwrap(),
            sink: Box::new(|_: &str| true),
            done: Box::new(move |r| o.borrow_mut().push((s, generated(r.unwrap())))),
        });
        // Admission is bounded by the width: run steps until there is room.
        while !sched.has_room() {
            sched.step(&mut || false);
        }
    }
    while !sched.is_idle() {
        sched.step(&mut || false);
    }
    let mut v = out.take();
    v.sort_by_key(|(s, _)| *s);
    v.into_iter().map(|(_, r)| r).collect()
}

/// `throughput` picks k from timings, so under load a seeded sampled
/// request may run other rounds than alone and draw other tokens; what must
/// hold is the distribution (rejection sampling is lossless whatever k).
/// The tokens after the first (the ones speculation drafts) of many seeds
/// run 8 at a time are compared with those of the same seeds run alone,
/// position by position, by a chi-square test of homogeneity at
/// significance 0.001 each (0.005 for the five together).
#[test]
fn throughput_under_load_keeps_the_solo_token_distribution() {
    let e = engine();
    let prompt = e
        .encode(&Prompt::Raw("My favourite animal is the".into()))
        .unwrap();
    let (seeds, n) = (0..200u64, 6usize);
    let solo = sampled_runs(&e, &prompt, 1.0, seeds.clone(), n, None);
    let batched = sampled_runs(&e, &prompt, 1.0, seeds, n, Some(8));
    assert!(
        batched.iter().all(|(_, shared, _)| *shared > 0),
        "every batched request shared steps"
    );
    let drafted = |runs: &[(Vec<u32>, u64, u64)]| runs.iter().map(|r| r.2).sum::<u64>();
    let differ = solo
        .iter()
        .zip(&batched)
        .filter(|(a, b)| a.0 != b.0)
        .count();
    eprintln!(
        "drafts: solo {} batched {}; {differ} of {} seeds drew other tokens batched",
        drafted(&solo),
        drafted(&batched),
        solo.len()
    );
    // How many seeds ran other rounds depends on the timings (with what
    // `throughput` carries across requests it rarely drafts `self:8` here);
    // the distribution must match whatever it is.
    let at = |runs: &[(Vec<u32>, u64, u64)], i: usize| -> Vec<u32> {
        runs.iter().filter_map(|r| r.0.get(i).copied()).collect()
    };
    for i in 1..n {
        let (stat, df) = chi_square(&at(&solo, i), &at(&batched, i), 10);
        let crit = chi_square_critical_001(df);
        eprintln!("position {i}: chi-square {stat:.1} (df {df}, critical {crit:.1})");
        assert!(df >= 2, "position {i}: too few categories to test");
        assert!(
            stat < crit,
            "position {i}: the batched tokens' distribution differs from the solo one (chi-square {stat:.1} >= {crit:.1}, df {df})"
        );
    }
}

/// The test statistic and its threshold: equal samples pass, samples from
/// clearly different distributions fail, and the critical values are the
/// tabulated ones within 3%.
#[test]
fn the_chi_square_test_tells_different_distributions_apart() {
    for (df, exact) in [
        (2, 13.816),
        (5, 20.515),
        (8, 26.124),
        (10, 29.588),
        (20, 45.315),
    ] {
        let c = chi_square_critical_001(df);
        assert!((c / exact - 1.0).abs() < 0.03, "df {df}: {c} vs {exact}");
    }
    // 200 draws each over 4 tokens: the same counts, then 50% against 25%.
    let sample = |w: [u32; 4]| -> Vec<u32> {
        (0..4u32)
            .flat_map(|t| std::iter::repeat_n(t, w[t as usize] as usize))
            .collect()
    };
    let a = sample([50, 50, 50, 50]);
    let (same, df) = chi_square(&a, &a, 10);
    assert_eq!((same, df), (0.0, 3));
    let (apart, df) = chi_square(&a, &sample([100, 40, 30, 30]), 10);
    assert!(apart > chi_square_critical_001(df), "{apart}");
}

/// A model drafter's cache follows the committed log, so a request with
/// `self:N` reserves its N layers' KV per token besides the target's; an
/// n-gram drafter holds none.
#[test]
fn a_model_drafters_cache_counts_in_the_kv_budget() {
    let e = engine();
    let prompt = e
        .encode(&chat("Name three colors of the rainbow."))
        .unwrap();
    let reserved = |drafter: &str| {
        let mut sched = Scheduler::new(&e, BatchLimits::default());
        let params = SamplingParams::default();
        let opts = SpecOptions {
            drafter: Some(drafter.parse().unwrap()),
            ..Default::default()
        };
        sched.admit(Admitted {
            tenant: None,
            prompt: prompt.clone(),
            settings: e.settings(params.clone(), Some(4), vec![]),
            spec: e.speculation(&opts, &params).unwrap(),
            sink: Box::new(|_: &str| true),
            done: Box::new(|r| {
                r.unwrap();
            }),
        });
        assert_eq!(sched.running(), 1);
        let bytes = sched.kv_bytes();
        while !sched.is_idle() {
            sched.step(&mut || true);
        }
        bytes
    };
    let layers = e.model.config.num_hidden_layers;
    // Both speculate, so both hold the same tokens; only self:8 has a cache.
    let (ngram, self8) = (reserved("ngram"), reserved("self:8"));
    let per_token = KvRates::of(&e).per_token(&DrafterSpec::None);
    assert!(
        ngram % per_token == 0 && ngram / per_token >= prompt.len() - 1,
        "an n-gram drafter holds no KV: {ngram} bytes"
    );
    assert_eq!(
        self8 * layers,
        ngram * (layers + 8),
        "self:8 holds 8 of the target's {layers} layers per token"
    );
}

/// The prompt's logprobs as one full forward over the prompt on a fresh
/// target computes them, in chunks of [`PREFILL_CHUNK`] rows (what the
/// server did at admission before they came from the batched prefill).
fn full_forward_prompt_logprobs(
    e: &specd::engine::Engine,
    prompt: &[u32],
    params: &SamplingParams,
    req: &LogprobRequest,
) -> Vec<TokenLogprob> {
    let mut t = LlamaTarget::new(e.model.clone());
    let mut out = vec![TokenLogprob {
        token: prompt[0],
        logprob: f32::NAN,
        top: Vec::new(),
    }];
    let mut done = 0;
    while done + 1 < prompt.len() {
        let n = PREFILL_CHUNK.min(prompt.len() - 1 - done);
        let rows = t.forward(&prompt[done..done + n], true).unwrap();
        for (i, row) in rows.iter().enumerate() {
            let p = done + i;
            let d = distribution(row, params, &prompt[..=p]);
            out.push(token_logprob(row, &d, prompt[p + 1], req));
        }
        done += n;
    }
    out
}

/// A token and a logprob's bits.
type Bits = (u32, u32);

/// Entries as bits, so NaN compares equal to NaN and -0.0 differs from 0.0.
fn entry_bits(v: &[TokenLogprob]) -> Vec<(Bits, Vec<Bits>)> {
    v.iter()
        .map(|t| {
            let top = t.top.iter().map(|&(id, lp)| (id, lp.to_bits())).collect();
            ((t.token, t.logprob.to_bits()), top)
        })
        .collect()
}

/// What an echo request saw, in order: its prompt's entries (once), then
/// each generated token's.
#[derive(Debug, PartialEq)]
enum Seen {
    Prompt(Vec<TokenLogprob>),
    Token(u32),
}

/// An echo request (prompt logprobs, `completions`' `echo`) whose entries
/// go to `seen`.
fn echo_request<'e>(
    e: &'e specd::engine::Engine,
    prompt: &[u32],
    params: &SamplingParams,
    req: LogprobRequest,
    max_tokens: usize,
    seen: Arc<Mutex<Vec<Seen>>>,
    done: specd::scheduler::Done<'e>,
) -> Admitted<'e> {
    let mut settings = e.settings(params.clone(), Some(max_tokens), vec![]);
    let s = seen.clone();
    settings.logprobs = Some((
        req,
        LogprobHook(Arc::new(move |t| {
            s.lock().unwrap().push(Seen::Token(t.token))
        })),
    ));
    settings.prompt_logprobs = Some(PromptLogprobHook(Arc::new(move |v| {
        seen.lock().unwrap().push(Seen::Prompt(v))
    })));
    Admitted {
        tenant: Some(String::new()),
        prompt: prompt.to_vec(),
        settings,
        spec: None,
        sink: Box::new(|_: &str| true),
        done,
    }
}

/// The prompt's logprobs come from the request's own prefill chunks as they
/// run in the batched steps: bitwise the entries of a full forward over the
/// prompt alone (penalised and raw distributions, top alternatives, the
/// first entry's NaN), whether the request runs alone or its prefill shares
/// steps with another request's decoding (which keeps its solo tokens), and
/// with its prompt in the prefix cache (an echo request does not use it).
#[test]
fn an_echo_requests_prompt_logprobs_come_from_its_batched_prefill() {
    let e = engine();
    let echo_prompt = e
        .encode(&chat(
            "Summarise in two sentences: the tide rises and falls twice a day because \
             the moon pulls the oceans toward it, and the sun adds a smaller pull of its own.",
        ))
        .unwrap();
    let other_prompt = e.encode(&chat("Count from one to ten.")).unwrap();
    let cases = [
        (
            SamplingParams::default(),
            LogprobRequest {
                top: 2,
                mode: LogprobMode::Raw,
            },
        ),
        (
            SamplingParams {
                temperature: 0.8,
                repeat_penalty: 1.3,
                seed: 5,
                ..Default::default()
            },
            LogprobRequest {
                top: 3,
                mode: LogprobMode::Processed,
            },
        ),
    ];
    let (gen, other_n) = (2, 16);
    let other_solo = solo_tokens(
        &e,
        &other_prompt,
        &SamplingParams::default(),
        &SpecOptions {
            drafter: Some(DrafterSpec::None),
            ..Default::default()
        },
        other_n,
    );
    // Small prefill slices: the echo prompt takes several steps.
    let limits = BatchLimits {
        max_sequences: 4,
        step_tokens: 16,
        kv_budget: None,
    };
    for (params, req) in &cases {
        let want = full_forward_prompt_logprobs(&e, &echo_prompt, params, req);
        assert_eq!(want.len(), echo_prompt.len());
        let run = |with_other: bool| {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let fin = Rc::new(RefCell::new(Vec::new()));
            let mut sched = Scheduler::new(&e, limits);
            let mut shared_prefill_steps = 0;
            if with_other {
                let f = fin.clone();
                let p = SamplingParams::default();
                sched.admit(Admitted {
                    tenant: None,
                    prompt: other_prompt.clone(),
                    settings: e.settings(p, Some(other_n), vec![]),
                    spec: None,
                    sink: Box::new(|_: &str| true),
                    done: Box::new(move |r| f.borrow_mut().push(("other", r.unwrap()))),
                });
                // It is decoding when the echo request arrives.
                sched.step(&mut || false);
                sched.step(&mut || false);
            }
            let f = fin.clone();
            sched.admit(echo_request(
                &e,
                &echo_prompt,
                params,
                *req,
                gen,
                seen.clone(),
                Box::new(move |r| f.borrow_mut().push(("echo", r.unwrap()))),
            ));
            while !sched.is_idle() {
                let s = sched.step(&mut || false);
                if s.prefill_rows > 0 && s.sequences > 1 {
                    shared_prefill_steps += 1;
                }
            }
            let fin = fin.take();
            let seen = std::mem::take(&mut *seen.lock().unwrap());
            (seen, fin, shared_prefill_steps)
        };
        // Alone first: it leaves its prompt in the shared prefix cache.
        for with_other in [false, true] {
            let (seen, fin, shared) = run(with_other);
            eprintln!(
                "{:?} {}: {} prompt tokens, {shared} steps shared the echo prefill with the other's decoding",
                req.mode,
                if with_other { "alongside" } else { "alone" },
                echo_prompt.len()
            );
            let what = if with_other {
                "alongside another"
            } else {
                "alone"
            };
            let Some(Seen::Prompt(got)) = seen.first() else {
                panic!("{what}: the prompt's entries come first, got {seen:?}")
            };
            assert!(
                entry_bits(got) == entry_bits(&want),
                "{what} ({:?}): the prompt's entries differ from the full forward's",
                req.mode
            );
            assert_eq!(
                seen[1..]
                    .iter()
                    .filter(|s| matches!(s, Seen::Token(_)))
                    .count(),
                gen,
                "{what}: then one entry per generated token, got {seen:?}"
            );
            let echo = &fin.iter().find(|(w, _)| *w == "echo").expect("echo done").1;
            assert_eq!(
                echo.stats.cached_tokens, 0,
                "{what}: an echo request skips the prefix cache"
            );
            if with_other {
                let other = &fin
                    .iter()
                    .find(|(w, _)| *w == "other")
                    .expect("other done")
                    .1;
                assert_eq!(
                    other.log, other_solo,
                    "the other request keeps its solo tokens"
                );
                let chunks = (echo_prompt.len() - 1).div_ceil(limits.step_tokens);
                assert!(
                    shared >= chunks.min(other_n - 2),
                    "the echo prefill's {chunks} chunks ran in the other's decode steps ({shared} shared)"
                );
                assert!(echo.stats.batch_steps > 0 && other.stats.batch_steps > 0);
            }
        }
    }
}

/// Requests of the default speculation (n-gram + `throughput`) that arrive
/// one step apart while the others decode, over the prefix cache: each
/// returns its solo tokens.
#[test]
fn staggered_default_requests_over_the_prefix_cache_keep_their_solo_tokens() {
    let e = engine();
    let params = SamplingParams::default();
    let opts = SpecOptions::default();
    let prompt = e.encode(&chat("What is the capital of France?")).unwrap();
    let settings = e.settings(params.clone(), Some(16), vec![]);
    let solo = e
        .generate(
            Some("t"),
            &prompt,
            &settings,
            e.speculation(&opts, &params).unwrap(),
            &mut |_| true,
        )
        .unwrap()
        .log;
    let finished = Rc::new(RefCell::new(vec![None; 8]));
    let mut sched = Scheduler::new(&e, BatchLimits::default());
    let mut admitted = 0;
    let mut steps = 0;
    while admitted < 8 || !sched.is_idle() {
        for _ in 0..(steps % 3) {
            if admitted < 8 {
                let f = finished.clone();
                let i = admitted;
                sched.admit(Admitted {
                    tenant: Some("t".into()),
                    prompt: prompt.clone(),
                    settings: settings.clone(),
                    spec: e.speculation(&opts, &params).unwrap(),
                    sink: Box::new(|_: &str| true),
                    done: Box::new(move |r| {
                        f.borrow_mut()[i] = Some(r.map(|f| f.log).map_err(|e| format!("{e:#}")))
                    }),
                });
                admitted += 1;
            }
        }
        sched.step(&mut || true);
        steps += 1;
    }
    for (i, r) in finished.borrow().iter().enumerate() {
        let log = r.clone().expect("finished").expect("no failure");
        assert_eq!(log, solo, "request {i} differs from its solo run");
    }
}

/// Two requests submitted together, a short prompt and a long one: the
/// first slice reads the short prompt and the start of the long one, and
/// once the short request is decoding (its first token included) the rest
/// of the long prompt goes in held slices beside it, a token of the stream
/// each step, instead of whole `--step-tokens` slices. Both keep their solo
/// tokens.
#[test]
fn a_prompt_that_arrived_with_a_stream_is_held_back_once_the_stream_decodes() {
    let e = engine();
    let params = SamplingParams::default();
    let opts = SpecOptions {
        drafter: Some(DrafterSpec::None),
        ..Default::default()
    };
    let short = e
        .encode(&chat("Name three colors of the rainbow."))
        .unwrap();
    let paragraph = "The committee met on Tuesday to review the budget, the \
        schedule and the list of open questions, and agreed to meet again. ";
    let long = e.encode(&Prompt::Raw(paragraph.repeat(40))).unwrap();
    let step_tokens = 512;
    assert!(
        short.len() + long.len() > step_tokens + 200,
        "the long prompt must outlast the first slice by far"
    );
    let n = 48;
    let solo: Vec<Vec<u32>> = [&short, &long]
        .iter()
        .map(|p| solo_tokens(&e, p, &params, &opts, n))
        .collect();
    let limits = BatchLimits {
        max_sequences: 2,
        step_tokens,
        kv_budget: None,
    };
    let mut sched = Scheduler::new(&e, limits);
    let finished = Rc::new(RefCell::new(vec![None, None]));
    let streamed = Rc::new(RefCell::new(0usize));
    for (i, p) in [&short, &long].into_iter().enumerate() {
        let f = finished.clone();
        let s = streamed.clone();
        sched.admit(Admitted {
            tenant: None,
            prompt: p.clone(),
            settings: e.settings(params.clone(), Some(n), vec![]),
            spec: e.speculation(&opts, &params).unwrap(),
            sink: Box::new(move |piece: &str| {
                if i == 0 && !piece.is_empty() {
                    *s.borrow_mut() += 1;
                }
                true
            }),
            done: Box::new(move |r| f.borrow_mut()[i] = Some(r.map(|f| f.log))),
        });
    }
    let first = sched.step(&mut || true);
    assert_eq!(first.prefill_rows, step_tokens, "the first slice is whole");
    // Prefill reads every prompt token but the last (the first round's).
    let mut left = short.len() + long.len() - 2 - step_tokens;
    // Steps of the rest of the long prompt while the stream goes on.
    let (mut held, mut pieces) = (0, 0);
    while left > 0 {
        let before = *streamed.borrow();
        let streaming = finished.borrow()[0].is_none();
        let s = sched.step(&mut || true);
        assert!(s.prefill_rows > 0, "the prompt goes on");
        left -= s.prefill_rows;
        if streaming {
            assert_eq!(s.sequences, 2, "the stream steps beside the prompt");
            // Held to a few decode steps' worth: tens of rows, not 512.
            // The hold is timed (`PrefillCost`), and tests beside this one
            // share the cores: a fresh machine's run saw 136 rows where a
            // quiet one sees 50-64. A whole slice here is 512 (or all
            // that is left, over 300 rows in the first held steps).
            assert!(
                s.prefill_rows <= step_tokens / 2,
                "a slice of {} rows with {} left beside a stream is not held back",
                s.prefill_rows,
                left + s.prefill_rows
            );
            held += 1;
            pieces += *streamed.borrow() - before;
        }
    }
    assert!(held >= 3, "the rest of the prompt took {held} held slices");
    // A token a step (a piece may wait for the next token's bytes).
    assert!(
        pieces + 2 >= held,
        "the stream got {pieces} pieces over {held} steps"
    );
    while !sched.is_idle() {
        sched.step(&mut || true);
    }
    for (i, r) in finished.borrow_mut().drain(..).enumerate() {
        let log = r.expect("finished").expect("no failure");
        assert_eq!(log, solo[i], "request {i} differs from its solo run");
    }
}
