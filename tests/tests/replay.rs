//! `specd replay`: recorded rounds fed to policies without a model.
//!
//! - with the recorded policies, replay reproduces every recorded decision
//!   (a real run of the default model, recorded, written and read back);
//! - a schedule that always drafts 0 has a modelled speedup of exactly 1.0;
//! - an oracle trace (every draft accepted, flat verify cost) gives the
//!   upper bound computed by hand;
//! - charts: the SVGs are produced and hold their series.
use specd::engine::Prompt;
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use specd::speculation::RoundTrace;
use specd::trace::{Header, Recorded};
use specd_policy::{PolicyHost, Position};
use specd_tests::{engine, GROUNDED};
use specd_text::ChatMessage;
use specd_tools::replay::{charts, replay, ReplayPolicies, ReplayReport, TimingModel};
use std::sync::Arc;

fn host() -> Arc<PolicyHost> {
    specd::cli::policy_host(None).expect("policy host")
}

fn run_replay(recs: &[Recorded], p: ReplayPolicies) -> ReplayReport {
    let timing = TimingModel::from_rounds(recs.iter().flat_map(|r| &r.rounds)).unwrap();
    replay(&host(), recs, &p, &timing, true).unwrap()
}

fn policies(schedule: &str, config: &str) -> ReplayPolicies {
    ReplayPolicies {
        schedule: Some(schedule.into()),
        schedule_config: config.into(),
        ..Default::default()
    }
}

/// Records one real run, writes it to a trace file and reads it back.
fn record(prompt: &str, opts: SpecOptions, params: SamplingParams) -> Vec<Recorded> {
    let e = engine();
    let ids = e
        .encode(&Prompt::Chat(vec![ChatMessage::user(prompt)]))
        .unwrap();
    let spec = e.speculation(&opts, &params).unwrap();
    let mut settings = e.settings(params, Some(64), vec![]);
    settings.record = true;
    let fin = e
        .generate(None, &ids, &settings, spec, &mut |_| true)
        .unwrap();
    assert!(!fin.trace.is_empty());
    let dir = std::env::temp_dir().join(format!("specd-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.jsonl", fin.stats.drafter.replace(':', "_")));
    let _ = std::fs::remove_file(&path);
    specd::trace::write(&path, &e, &settings, &opts, &fin).unwrap();
    let recs = specd::trace::read(&path).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].rounds.len(), fin.trace.len());
    // The header keeps the configs the request gave (none here: defaults).
    assert_eq!(recs[0].header.schedule_config, opts.schedule_config);
    assert_eq!(recs[0].header.acceptance_config, opts.acceptance_config);
    recs
}

#[test]
fn replay_with_the_recorded_policies_reproduces_every_decision() {
    // Greedy with the n-gram drafter and the throughput schedule (timing
    // dependent: the EMA timings must be rebuilt exactly) ...
    let greedy = record(
        GROUNDED[0],
        SpecOptions {
            drafter: Some(specd::options::DEFAULT_DRAFTER),
            schedule: Some("throughput".into()),
            acceptance: Some("greedy".into()),
            draft_max: Some(8),
            ..Default::default()
        },
        SamplingParams::default(),
    );
    // ... and sampled rejection with a self-speculative drafter (q < 1,
    // the host's uniforms) and HF's transient heuristic.
    let sampled = record(
        GROUNDED[4],
        SpecOptions {
            drafter: Some(DrafterSpec::SelfLayers(4)),
            schedule: Some("heuristic-transient".into()),
            acceptance: Some("rejection".into()),
            draft_max: Some(6),
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.8,
            seed: 7,
            ..Default::default()
        },
    );
    for recs in [&greedy, &sampled] {
        let spec_rounds = recs[0].rounds.iter().filter(|r| r.drafted > 0).count();
        assert!(spec_rounds > 0, "the recording speculated");
        let r = run_replay(recs, ReplayPolicies::default());
        assert!(r.recorded_policies);
        assert_eq!(r.rounds as usize, recs[0].rounds.len());
        assert!(
            r.matches_recording,
            "{} / {}: {} mismatches, first: {:?}, failures {:?}",
            r.schedule, r.acceptance, r.decision_mismatches, r.first_mismatch, r.policy_failures
        );
        for (x, rec) in r.per_round.iter().zip(&recs[0].rounds) {
            assert_eq!((x.k, x.accepted), (rec.k, rec.accepted));
        }
        assert_eq!(r.truncated_rounds, 0);
        let tokens: usize = recs[0].rounds.iter().map(|x| x.tokens.len()).sum();
        assert_eq!(r.tokens as usize, tokens);
        assert_eq!(
            r.accepted,
            recs[0]
                .rounds
                .iter()
                .map(|x| x.accepted as u64)
                .sum::<u64>()
        );

        // Always drafting 0 is plain decoding: exactly 1.0.
        let zero = run_replay(recs, policies("constant", r#"{"k":0}"#));
        assert_eq!(zero.drafted, 0);
        assert_eq!(zero.modelled_speedup, 1.0);
        assert!(!zero.matches_recording);
    }
}

fn synthetic(rounds: usize, k: u32, draft_per_token: f64, verify: f64) -> Vec<Recorded> {
    let header = Header {
        specd_trace: specd::trace::TRACE_VERSION,
        model: "synthetic".into(),
        drafter: "ngram".into(),
        schedule: "constant".into(),
        acceptance: "greedy".into(),
        schedule_config: None,
        acceptance_config: None,
        params: SamplingParams::default(),
        stats: serde_json::Value::Null,
    };
    let rounds = (0..rounds)
        .map(|i| RoundTrace {
            round: i as u32,
            schedule_input: None,
            k,
            drafted: k,
            positions: (0..k)
                .map(|j| Position {
                    token: 100 + j,
                    p: 1.0,
                    q: 1.0,
                    target_argmax: 100 + j,
                    entropy: 0.0,
                    uniform: 0.5,
                    ..Default::default()
                })
                .collect(),
            draft_steps: Vec::new(),
            decision: None,
            accepted: k,
            tokens: (0..=k).map(|j| 100 + j).collect(),
            draft_seconds: k as f64 * draft_per_token,
            verify_seconds: verify,
            policy_seconds: 0.0,
            source: 0,
        })
        .collect();
    vec![Recorded { header, rounds }]
}

#[test]
fn an_oracle_trace_gives_the_upper_bound_and_k0_gives_one() {
    // Every draft accepted, verify cost flat at 10 ms whatever the length,
    // drafting 1 ms per token.
    let recs = synthetic(200, 8, 0.001, 0.010);
    let timing = TimingModel::from_rounds(recs.iter().flat_map(|r| &r.rounds)).unwrap();
    assert_eq!(timing.plain_step_seconds, 0.010);
    assert!(!timing.plain_step_measured);

    // Constant k=8: 9 tokens per round for 8 * 1 ms + 10 ms, against 1
    // token per 10 ms: 9 * 10 / 18 = 5.0.
    let r8 = run_replay(&recs, policies("constant", r#"{"k":8}"#));
    assert_eq!(r8.accepted_per_round, 8.0);
    assert_eq!(r8.tokens_per_round, 9.0);
    assert_eq!(r8.acceptance_rate, 1.0);
    assert!(
        (r8.modelled_speedup - 5.0).abs() < 1e-9,
        "{}",
        r8.modelled_speedup
    );
    assert_eq!(r8.truncated_rounds, 0);

    // Constant k=4: 5 * 10 / 14.
    let r4 = run_replay(&recs, policies("constant", r#"{"k":4}"#));
    assert!((r4.modelled_speedup - 50.0 / 14.0).abs() < 1e-9);

    // Asking for more than was recorded is truncated to the recorded
    // drafts, and said so.
    let r12 = run_replay(&recs, policies("constant", r#"{"k":12}"#));
    // (all but the last round, where the token budget caps k at 8).
    assert_eq!(r12.truncated_rounds, 199);
    assert!((r12.modelled_speedup - 5.0).abs() < 1e-9);

    // The heuristic grows k on full accepts (4, 6, 8, then capped by the
    // recording): below the bound, approaching it.
    let h = run_replay(&recs, policies("heuristic-transient", ""));
    assert!(
        h.modelled_speedup < 5.0 && h.modelled_speedup > 4.8,
        "{}",
        h.modelled_speedup
    );

    // k = 0: exactly 1.0.
    let z = run_replay(&recs, policies("constant", r#"{"k":0}"#));
    assert_eq!(z.modelled_speedup, 1.0);
    assert_eq!(z.tokens, 200);

    // Thousands of rounds per second.
    let big = synthetic(5000, 8, 0.001, 0.010);
    let t = run_replay(&big, policies("throughput", ""));
    assert_eq!(t.rounds, 5000);
    assert!(
        t.rounds_per_second > 1000.0,
        "{} rounds/s",
        t.rounds_per_second
    );
}

#[test]
fn charts_are_svg_with_their_series() {
    let recs = synthetic(40, 6, 0.001, 0.010);
    let a = run_replay(&recs, policies("constant", r#"{"k":2}"#));
    let b = run_replay(&recs, policies("heuristic-transient", ""));
    let svg = charts::rounds_svg(&[a, b]).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
    assert!(svg.contains("draft length per round"));
    assert!(svg.contains("accepted drafts per round"));
    assert!(
        svg.contains("constant {&quot;k&quot;:2} / greedy")
            || svg.contains("constant {\"k\":2} / greedy")
    );
    assert!(svg.contains("heuristic-transient / greedy"));
    // Two series on each of the two charts.
    assert!(svg.matches("<polyline").count() >= 4, "series drawn");

    let bars = vec![
        ("ngram/throughput/greedy".to_string(), 1.8),
        ("self:4/heuristic/greedy".to_string(), 0.9),
    ];
    let svg = charts::speedup_svg("speedup per cell", &bars).unwrap();
    assert!(svg.starts_with("<svg"));
    assert!(svg.contains("ngram/throughput/greedy"));
    assert!(svg.contains("1.80x") && svg.contains("0.90x"));
    assert!(
        svg.matches("<rect").count() >= 3,
        "background + one bar per cell"
    );
}
