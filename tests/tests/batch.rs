//! Continuous batching on the real default model: a step over several
//! sequences gives each one bitwise the rows of its forward alone, and a
//! request preempted for the KV budget resumes with its solo tokens.
use specd::batch::{kv_bytes_per_token, Admitted, BatchLimits, Scheduler};
use specd::engine::Prompt;
use specd::model::Logits;
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use specd::speculation::target::{forward_batch, StepRows};
use specd::speculation::{LlamaTarget, Target};
use specd_tests::engine;
use specd_text::ChatMessage;
use std::cell::RefCell;
use std::rc::Rc;

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::user(text)])
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// The token after position `at`, or the first one past the end.
fn next_token(ids: &[u32], at: usize) -> u32 {
    *ids.get(at).unwrap_or(&ids[0])
}

#[test]
fn a_batched_step_gives_every_sequence_its_solo_rows_bitwise() {
    let e = engine();
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
        t.prefill(&ids[i][..plan[i].0]).unwrap();
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
                t.prefill(toks).unwrap();
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
        })
        .collect();
    let batched = forward_batch(&e.model, &mut parts).unwrap();
    drop(parts);
    for (i, t) in targets.iter_mut().enumerate() {
        let (c, n, _) = plan[i];
        assert_eq!(
            t.offset(),
            c + n,
            "sequence {i}'s caches advanced by its rows"
        );
        assert_eq!(batched[i].len(), solo[i].len(), "sequence {i}'s row count");
        assert!(
            bits(&batched[i]) == bits(&solo[i]),
            "sequence {i}: batched rows differ from its solo rows"
        );
        let next = t.forward(&[next_token(&ids[i], c + n)], false).unwrap();
        assert!(
            bits(&next) == bits(&solo_next[i]),
            "sequence {i}: the caches a batched step left differ from its solo ones"
        );
    }
}

fn solo_tokens(
    e: &specd::engine::Engine,
    prompt: &[u32],
    params: &SamplingParams,
    opts: &SpecOptions,
    n: usize,
) -> Vec<u32> {
    let spec = e.speculation(opts, params).unwrap();
    let settings = e.settings(params.clone(), Some(n), vec![]);
    e.generate(None, prompt, &settings, spec, &mut |_| true)
        .unwrap()
        .log
}

#[test]
fn a_preempted_request_resumes_and_returns_its_solo_tokens() {
    let e = engine();
    let cases: Vec<(&str, SamplingParams, SpecOptions)> = vec![
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
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .map(|(p, ..)| e.encode(&chat(p)).unwrap())
        .collect();
    let solo: Vec<Vec<u32>> = cases
        .iter()
        .zip(&prompts)
        .map(|((_, params, opts), p)| solo_tokens(&e, p, params, opts, n))
        .collect();
    // A budget the prompts fit in with little room to grow: the requests
    // must take turns.
    let per_token = kv_bytes_per_token(&e.model.config);
    let prompt_tokens: usize = prompts.iter().map(|p| p.len() + 1).sum();
    let limits = BatchLimits {
        max_sequences: 3,
        step_tokens: 512,
        kv_budget: Some((prompt_tokens + 24) * per_token),
    };
    let finished = Rc::new(RefCell::new(
        (0..cases.len()).map(|_| None).collect::<Vec<_>>(),
    ));
    let mut sched = Scheduler::new(&e, limits);
    for (i, ((_, params, opts), p)) in cases.iter().zip(&prompts).enumerate() {
        let f = finished.clone();
        sched.admit(Admitted {
            tenant: None,
            prompt: p.clone(),
            settings: e.settings(params.clone(), Some(n), vec![]),
            spec: e.speculation(opts, params).unwrap(),
            sink: Box::new(|_: &str| true),
            done: Box::new(move |r| f.borrow_mut()[i] = Some(r.map(|f| (f.log, f.stats)))),
        });
    }
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
        let (log, stats) = r.expect("finished").expect("no failure");
        assert_eq!(log, solo[i], "request {i} differs from its solo run");
        counted += stats.preemptions;
    }
    assert_eq!(
        counted as usize, preempted,
        "the stats count every preemption"
    );
}
