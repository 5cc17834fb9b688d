//! Each standard policy, run as its WebAssembly component, on scripted
//! rounds, against its reference semantics (and the native baseline).

mod common;
use common::*;
use specd_policy::{
    native, Correction, Decision, PolicyErrorKind, Position, RoundRecord, ScheduleInput,
};

/// Runs a schedule over rounds whose outcomes are `outcomes[i] = accepted`
/// (drafted = what the schedule asked); returns the k sequence.
fn run_schedule(
    name: &str,
    config: &str,
    model: &str,
    max: u32,
    outcomes: &[Option<u32>],
    finish: bool,
) -> Vec<u32> {
    let mut s = host().schedule(name, config, model).unwrap();
    let mut recent: Vec<(u32, u32)> = Vec::new();
    let mut ks = Vec::new();
    for (round, outcome) in outcomes.iter().enumerate() {
        let k = s
            .next_draft_length(&input(round as u32, max, &recent))
            .unwrap();
        ks.push(k);
        // None = full accept of whatever was drafted.
        let accepted = outcome.unwrap_or(k).min(k);
        recent.push((k, accepted));
    }
    if finish {
        s.finish();
    }
    ks
}

#[test]
fn heuristic_follows_the_hf_sequence() {
    // initial 4; full accept +2; otherwise -1 (never below 1); within [1, max].
    let full = None;
    let outcomes = [
        full,
        full,
        Some(3),
        Some(0),
        full,
        Some(1),
        full,
        full,
        full,
        full,
        full,
        Some(0),
    ];
    let ks = run_schedule("heuristic-transient", "{}", "m", 16, &outcomes, true);
    assert_eq!(ks, vec![4, 6, 8, 7, 6, 8, 7, 9, 11, 13, 15, 16]);
    // clipped to max, and the floor of 1
    let ks = run_schedule(
        "heuristic-transient",
        r#"{"initial": 2}"#,
        "m",
        5,
        &[
            full,
            full,
            full,
            Some(0),
            Some(0),
            Some(0),
            Some(0),
            Some(0),
            full,
        ],
        true,
    );
    assert_eq!(ks, vec![2, 4, 5, 5, 4, 3, 2, 1, 1]);
    // a round that drafted nothing changes nothing
    let mut s = host().schedule("heuristic-transient", "{}", "m").unwrap();
    assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 4);
    assert_eq!(s.next_draft_length(&input(1, 16, &[(0, 0)])).unwrap(), 4);
    assert_eq!(
        s.next_draft_length(&input(2, 16, &[(0, 0), (4, 4)]))
            .unwrap(),
        6
    );
    // max-draft 0: answer 0
    assert_eq!(
        s.next_draft_length(&input(3, 0, &[(4, 4), (6, 2)]))
            .unwrap(),
        0
    );
}

#[test]
fn heuristic_carries_k_across_requests_and_transient_does_not() {
    let model = "carry-model";
    let full = None;
    let ks = run_schedule("heuristic", "{}", model, 16, &[full, full, full], true);
    assert_eq!(ks, vec![4, 6, 8]);
    // the last round's full accept was applied at the third call: k is 8 now
    assert_eq!(
        host().carried_state("heuristic", model, "{}"),
        Some(8u32.to_le_bytes().to_vec())
    );
    // next request starts where the last ended
    let ks = run_schedule("heuristic", "{ }", model, 16, &[Some(0), full], true);
    assert_eq!(ks, vec![8, 7]);
    // other model or other config: fresh
    assert_eq!(
        run_schedule("heuristic", "{}", "other-model", 16, &[full], false),
        vec![4]
    );
    assert_eq!(
        run_schedule("heuristic", r#"{"initial":3}"#, model, 16, &[full], false),
        vec![3]
    );
    // a request dropped without finish carries nothing new
    let _ = run_schedule(
        "heuristic",
        "{}",
        model,
        16,
        &[full, full, full, full],
        false,
    );
    assert_eq!(
        run_schedule("heuristic", "{}", model, 16, &[full], true),
        vec![7]
    );
    // transient never carries
    let _ = run_schedule(
        "heuristic-transient",
        "{}",
        model,
        16,
        &[full, full, full],
        true,
    );
    assert_eq!(
        run_schedule("heuristic-transient", "{}", model, 16, &[full], true),
        vec![4]
    );
    assert_eq!(
        host().carried_state("heuristic-transient", model, "{}"),
        None
    );
}

#[test]
fn constant_is_constant_and_clipped() {
    let ks = run_schedule(
        "constant",
        r#"{"k": 3}"#,
        "m",
        16,
        &[None, Some(0), Some(1), None],
        true,
    );
    assert_eq!(ks, vec![3, 3, 3, 3]);
    assert_eq!(
        run_schedule("constant", "{}", "m", 2, &[None, None], true),
        vec![2, 2]
    );
    assert_eq!(
        run_schedule("constant", "", "m", 16, &[None], true),
        vec![4]
    );
    let err = host()
        .schedule("constant", r#"{"kk": 3}"#, "m")
        .err()
        .unwrap();
    assert_eq!(err.kind, PolicyErrorKind::Config);
    assert!(err.message.contains("kk"), "{err}");
    let err = host().schedule("constant", "{not json", "m").err().unwrap();
    assert_eq!(err.kind, PolicyErrorKind::Config);
}

fn throughput_input(
    max: u32,
    acceptance: f64,
    verify: impl Fn(u32) -> f64,
    draft: f64,
) -> ScheduleInput {
    ScheduleInput {
        round: 5,
        generated: 20,
        budget_left: 1000,
        max_draft: max,
        recent: vec![RoundRecord {
            drafted: 4,
            accepted: 2,
            draft_seconds: 0.0,
            verify_seconds: 0.01,
        }],
        position_acceptance: vec![acceptance; max as usize],
        draft_seconds_per_token: draft,
        verify_seconds_by_len: (0..=max).map(verify).collect(),
        batch_sequences: 0,
        batch_rows_planned: 0,
    }
}

/// Independent reference: argmax over k of E[tokens]/cost.
fn best_k(i: &ScheduleInput) -> u32 {
    let kmax = i.max_draft.min(i.budget_left.saturating_sub(1));
    let mut best = (0, 0.0f64);
    for k in 0..=kmax {
        let tokens: f64 = (0..=k)
            .map(|j| {
                (0..j)
                    .map(|t| i.position_acceptance[t as usize])
                    .product::<f64>()
            })
            .sum();
        let cost = k as f64 * i.draft_seconds_per_token + i.verify_seconds_by_len[k as usize];
        if tokens / cost > best.1 * (1.0 + 1e-9) {
            best = (k, tokens / cost);
        }
    }
    best.0
}

#[test]
fn throughput_picks_the_k_that_pays() {
    let mut s = host().schedule("throughput", "{}", "m").unwrap();
    // expensive verify (linear in tokens, as with reference BLAS) and low acceptance: no speculation
    let i = throughput_input(16, 0.2, |j| 0.01 * (j + 1) as f64, 0.0);
    assert_eq!(s.next_draft_length(&i).unwrap(), 0);
    // cheap verify, high acceptance: draft the max
    let i = throughput_input(16, 0.95, |j| 0.01 + 0.0001 * j as f64, 0.0);
    assert_eq!(s.next_draft_length(&i).unwrap(), 16);
    // a costly drafter pulls k down
    let i = throughput_input(16, 0.95, |j| 0.01 + 0.0001 * j as f64, 0.004);
    let k = s.next_draft_length(&i).unwrap();
    assert!(k > 0 && k < 16, "k = {k}");
    assert_eq!(k, best_k(&i));
    // in between: the exact argmax
    for (a, slope, draft) in [
        (0.7, 0.002, 0.0),
        (0.5, 0.001, 0.0005),
        (0.85, 0.003, 0.0),
        (0.3, 0.0005, 0.0),
    ] {
        let i = throughput_input(12, a, |j| 0.01 + slope * j as f64, draft);
        assert_eq!(
            s.next_draft_length(&i).unwrap(),
            best_k(&i),
            "a={a} slope={slope} draft={draft}"
        );
    }
    // the budget bounds k: 3 tokens left -> at most 2 drafts
    let mut i = throughput_input(16, 0.95, |j| 0.01 + 0.0001 * j as f64, 0.0);
    i.budget_left = 3;
    assert_eq!(s.next_draft_length(&i).unwrap(), 2);
    // nothing measured yet: initial (4), or the config's
    let i = ScheduleInput {
        max_draft: 16,
        budget_left: 100,
        ..Default::default()
    };
    assert_eq!(s.next_draft_length(&i).unwrap(), 4);
    let mut s2 = host()
        .schedule("throughput", r#"{"initial": 7}"#, "m")
        .unwrap();
    assert_eq!(s2.next_draft_length(&i).unwrap(), 7);
    // partial timings (only k=0 and k=1 measured, linear): extrapolated, still no speculation at low acceptance
    let i = throughput_input(
        8,
        0.2,
        |j| if j <= 1 { 0.01 * (j + 1) as f64 } else { 0.0 },
        0.0,
    );
    assert_eq!(s.next_draft_length(&i).unwrap(), 0);
    // no acceptance estimate: the prior (0.6) — with flat verify cost, speculate
    let i2 = throughput_input(8, 0.6, |_| 0.01, 0.0);
    let mut i3 = i2.clone();
    i3.position_acceptance.clear();
    assert_eq!(
        s.next_draft_length(&i3).unwrap(),
        s.next_draft_length(&i2).unwrap()
    );
}

fn decide(name: &str, config: &str, positions: &[specd_policy::Position]) -> Decision {
    let wasm = host()
        .acceptance(name, config, 1000)
        .unwrap()
        .decide(positions)
        .unwrap();
    let native = native::acceptance(name, config, 1000)
        .unwrap()
        .decide(positions)
        .unwrap();
    assert_eq!(wasm, native, "{name} wasm vs native on {positions:?}");
    wasm
}

#[test]
fn greedy_accepts_exact_argmax_matches() {
    let ps = [
        pos(5, 0.3, 1.0, 5, 2.0, 0.9),
        pos(6, 0.1, 1.0, 6, 2.0, 0.9),
        pos(7, 0.9, 1.0, 8, 0.1, 0.0),
        pos(9, 0.9, 1.0, 9, 0.1, 0.0),
    ];
    assert_eq!(
        decide("greedy", "{}", &ps),
        Decision {
            accepted: 2,
            correction: Correction::Token(8)
        }
    );
    assert_eq!(
        decide("greedy", r#"{"correction":"sample"}"#, &ps),
        Decision {
            accepted: 2,
            correction: Correction::TargetSample
        }
    );
    assert_eq!(decide("greedy", "{}", &ps[..2]).accepted, 2);
    assert_eq!(
        decide("greedy", "{}", &[pos(1, 1.0, 1.0, 2, 0.0, 0.0)]),
        Decision {
            accepted: 0,
            correction: Correction::Token(2)
        }
    );
    // probabilities and uniforms do not matter
    assert_eq!(
        decide("greedy", "{}", &[pos(3, 0.0, 1.0, 3, 9.0, 0.999)]).accepted,
        1
    );
    let err = host()
        .acceptance("greedy", r#"{"correction":"maybe"}"#, 10)
        .err()
        .unwrap();
    assert_eq!(err.kind, PolicyErrorKind::Config);
}

/// Decides one position at a time with the default config: `(position, accepted)`.
fn assert_one_position(policy: &str, cases: &[(Position, u32)]) {
    for (case, want) in cases {
        assert_eq!(
            decide(policy, "{}", &[*case]).accepted,
            *want,
            "{policy}: {case:?}"
        );
    }
}

#[test]
fn rejection_accepts_with_min_1_p_over_q() {
    // One position: (token, p, q, target argmax, entropy, uniform) -> accepted.
    assert_one_position(
        "rejection",
        &[
            // p/q = 0.625: u = 0.6 accepts (0.65 rejects, below)
            (pos(1, 0.5, 0.8, 0, 1.0, 0.6), 1),
            // p >= q always accepts; p = 0 never; q = 0 < p always
            (pos(1, 0.9, 0.3, 0, 1.0, 0.999), 1),
            (pos(1, 0.0, 0.3, 0, 1.0, 0.0), 0),
            (pos(1, 0.2, 0.0, 0, 1.0, 0.999), 1),
            // point-mass draft (n-gram): accept with probability p
            (pos(1, 0.3, 1.0, 0, 1.0, 0.29), 1),
            (pos(1, 0.3, 1.0, 0, 1.0, 0.31), 0),
        ],
    );
    assert_eq!(
        decide("rejection", "{}", &[pos(1, 0.5, 0.8, 0, 1.0, 0.65)]),
        Decision {
            accepted: 0,
            correction: Correction::Residual
        }
    );
    // stops at the first rejection even when later ones would pass
    let ps = [
        pos(1, 0.5, 0.5, 0, 1.0, 0.9),
        pos(2, 0.1, 0.5, 0, 1.0, 0.19),
        pos(3, 0.1, 0.5, 0, 1.0, 0.5),
        pos(4, 1.0, 0.1, 0, 1.0, 0.0),
    ];
    assert_eq!(
        decide("rejection", "{}", &ps),
        Decision {
            accepted: 2,
            correction: Correction::Residual
        }
    );
    // Monte Carlo: acceptance rate of a position = min(1, p/q)
    let mut rng = Lcg(7);
    let (n, mut acc) = (4000, 0);
    for _ in 0..n {
        let u = rng.below(1 << 24) as f32 / (1u32 << 24) as f32;
        acc += decide("rejection", "{}", &[pos(1, 0.2, 0.5, 0, 1.0, u)]).accepted;
    }
    let rate = acc as f64 / n as f64;
    assert!((rate - 0.4).abs() < 0.03, "rate {rate}");
}

#[test]
fn typical_uses_the_medusa_threshold() {
    // threshold = min(epsilon, delta * exp(-entropy)), defaults 0.09 / 0.3
    assert_one_position(
        "typical",
        &[
            // entropy 0: threshold 0.09
            (pos(1, 0.1, 1.0, 2, 0.0, 0.0), 1),
            // entropy 3: threshold 0.3 * e^-3 = 0.01494
            (pos(1, 0.016, 1.0, 2, 3.0, 0.0), 1),
            (pos(1, 0.014, 1.0, 2, 3.0, 0.0), 0),
            // it is lossy: a non-argmax token is accepted when plausible enough
            (pos(1, 0.3, 0.9, 2, 1.0, 0.99), 1),
        ],
    );
    assert_eq!(
        decide("typical", "{}", &[pos(1, 0.08, 1.0, 2, 0.0, 0.0)]),
        Decision {
            accepted: 0,
            correction: Correction::TargetSample
        }
    );
    // config: epsilon 0.5, delta 0.5 -> entropy 0 threshold 0.5
    let ps = [
        pos(1, 0.6, 1.0, 1, 0.0, 0.0),
        pos(2, 0.45, 1.0, 2, 0.0, 0.0),
    ];
    assert_eq!(
        decide("typical", r#"{"epsilon":0.5,"delta":0.5}"#, &ps).accepted,
        1
    );
    assert_eq!(decide("typical", "{}", &ps).accepted, 2);
}

#[test]
fn wasm_schedules_match_native_on_scripted_rounds() {
    for name in native::SCHEDULES {
        let mut w = host().schedule(name, "{}", "native-cmp").unwrap();
        let mut n = native::schedule(name, "{}", None).unwrap();
        let mut rng = Lcg(42);
        let mut recent: Vec<RoundRecord> = Vec::new();
        for round in 0..300u32 {
            let max = 1 + rng.below(16);
            let i = ScheduleInput {
                round,
                generated: round * 3,
                budget_left: 1 + rng.below(40),
                max_draft: max,
                recent: recent.iter().rev().take(32).rev().cloned().collect(),
                position_acceptance: (0..max).map(|_| rng.below(1000) as f64 / 1000.0).collect(),
                draft_seconds_per_token: rng.below(3) as f64 * 1e-4,
                verify_seconds_by_len: (0..=max)
                    .map(|j| {
                        if rng.below(4) == 0 {
                            0.0
                        } else {
                            0.01 + 0.001 * j as f64
                        }
                    })
                    .collect(),
                batch_sequences: 0,
                batch_rows_planned: 0,
            };
            let (kw, kn) = (
                w.next_draft_length(&i).unwrap(),
                n.next_draft_length(&i).unwrap(),
            );
            assert_eq!(kw, kn, "{name} round {round}");
            recent.push(RoundRecord {
                drafted: kw,
                accepted: rng.below(kw + 1),
                draft_seconds: 0.0,
                verify_seconds: 0.0,
            });
        }
    }
}
