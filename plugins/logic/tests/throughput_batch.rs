//! `throughput` in a batched step (contract 0.2's batch context): scripted
//! inputs, the decision checked against the step-cost arithmetic.
use specd_policy_logic::{batch_share, ScheduleInput, ScheduleLogic, Throughput};

/// int8-like lone-forward costs: 5.5 ms for one row, 1.2 ms per extra row.
fn lone(j: u32) -> f64 {
    0.0055 + 0.0012 * j as f64
}

/// Round 10 of a request that measured every length up to `max`, with
/// acceptance `a` at every draft position, in a step of `n` requests with
/// `planned` rows asked before it (0, 0: not batched).
fn input(max: u32, a: f64, n: u32, planned: u32) -> ScheduleInput {
    ScheduleInput {
        round: 10,
        generated: 10,
        budget_left: 100,
        max_draft: max,
        position_acceptance: vec![a; max as usize],
        verify_seconds_by_len: (0..=max).map(lone).collect(),
        batch_sequences: n,
        batch_rows_planned: planned,
        ..Default::default()
    }
}

fn decide(i: &ScheduleInput) -> u32 {
    let mut s = Throughput::create("{}", None).unwrap();
    s.next_draft_length(i)
}

#[test]
fn alone_a_well_accepted_draft_pays() {
    // Alone a draft row costs 1.2 ms against 5.5 for the step: at 0.6
    // acceptance drafting pays, and the batch context of a lone request
    // (n = 1) or of none (n = 0) changes nothing.
    for n in [0, 1] {
        let k = decide(&input(8, 0.6, n, 0));
        assert!(k > 0, "n = {n}: k = {k}");
    }
    assert_eq!(decide(&input(8, 0.6, 0, 0)), decide(&input(8, 0.6, 1, 0)));
}

#[test]
fn a_large_batch_does_not_pay_for_the_same_drafts() {
    // In a step of 8 the request's share of the step is (5.5 + 7 * 1.2) / 8
    // = 1.74 ms, and one draft row still adds 1.2 ms: at 0.6 acceptance
    // that loses, so it asks for a plain step.
    assert_eq!(decide(&input(8, 0.6, 8, 7)), 0);
    // 16 requests: still 0 at 0.6; only near-certain drafts pay.
    assert_eq!(decide(&input(8, 0.6, 16, 15)), 0);
    assert!(decide(&input(8, 0.98, 8, 7)) > 0);
}

#[test]
fn the_threshold_moves_with_the_batch() {
    // The smallest acceptance at which one draft pays: a > m / share, the
    // share T0 / n with T0 = 5.5 + 1.2 (n - 1) ms.
    for n in [2u32, 4, 8] {
        let share = (0.0055 + 0.0012 * (n - 1) as f64) / n as f64;
        let threshold = 0.0012 / share;
        let above = (threshold + 0.03).min(0.999);
        let below = threshold - 0.03;
        let i = |a| input(1, a, n, n - 1);
        assert_eq!(decide(&i(above)), 1, "n = {n}, a = {above}");
        assert_eq!(decide(&i(below)), 0, "n = {n}, a = {below}");
    }
}

#[test]
fn prefill_rows_in_the_step_make_drafts_cheaper() {
    // A step already carrying a 256-row prefill chunk is long whatever
    // this request does: one more row barely slows the batch.
    let a = 0.5;
    assert_eq!(decide(&input(8, a, 8, 7)), 0);
    assert!(decide(&input(8, a, 8, 7 + 256)) > 0);
}

#[test]
fn the_share_adds_the_marginal_rows_to_the_split_step() {
    let i = input(4, 0.5, 4, 10);
    let verify: Vec<f64> = (0..=4).map(lone).collect();
    let share = batch_share(&verify, &i);
    // R = 11 rows: T0 = lone(10); a quarter of it, plus 1.2 ms per draft.
    for (k, s) in share.iter().enumerate() {
        let want = lone(10) / 4.0 + 0.0012 * k as f64;
        assert!((s - want).abs() < 1e-12, "k = {k}: {s} vs {want}");
    }
    // Fewer planned rows than requests: every request forwards a row.
    let few = batch_share(&verify, &input(4, 0.5, 4, 0));
    assert!((few[0] - lone(3) / 4.0).abs() < 1e-12);
    // Not batched: the lone curve itself.
    assert_eq!(batch_share(&verify, &input(4, 0.5, 0, 0)), verify);
}

#[test]
fn a_batched_request_probes_n_times_less_often() {
    // Acceptance too low to pay even alone: plain rounds, then a probe
    // after PROBE_AFTER of them alone, after 8 x PROBE_AFTER in a step of 8.
    let first_probe = |n: u32, planned: u32| {
        let mut s = Throughput::create("{}", None).unwrap();
        (1..=200)
            .find(|_| s.next_draft_length(&input(8, 0.05, n, planned)) > 0)
            .unwrap()
    };
    use specd_policy_logic::PROBE_AFTER;
    assert_eq!(first_probe(0, 0), PROBE_AFTER);
    assert_eq!(first_probe(8, 7), 8 * PROBE_AFTER);
}

#[test]
fn in_a_batch_the_request_trusts_its_own_rounds_over_the_carried_ones() {
    use specd_policy_logic::{RoundRecord, ThroughputCarry};
    // Earlier requests (another prompt) kept 74% of their first drafts.
    let carried = ThroughputCarry {
        reached: vec![100.0],
        kept: vec![74.0],
        plain_seconds: lone(0),
        row_seconds: 0.0012,
        draft_seconds: 0.0,
        batch_row_seconds: 0.0012,
    }
    .encode();
    // This request drafted once and lost it: its own estimate is 1/3.
    let after_a_miss = |n: u32, planned: u32| {
        let mut s = Throughput::create("{}", Some(&carried)).unwrap();
        let mut i = input(1, 1.0 / 3.0, n, planned);
        i.round = 1;
        i.recent = vec![RoundRecord {
            drafted: 1,
            accepted: 0,
            ..Default::default()
        }];
        s.next_draft_length(&i)
    };
    // Alone, 8 carried rounds outweigh one miss ((1/3 + 8 x 0.74) / 9 = 0.70
    // against a threshold of 0.22): it drafts again.
    assert_eq!(after_a_miss(0, 0), 1);
    // In a step of 8 the carried rounds weigh 1: (1/3 + 0.74) / 2 = 0.54,
    // below the 0.69 a draft row needs there.
    assert_eq!(after_a_miss(8, 7), 0);
}

/// A request's second round: one length measured (`drafted` drafts), no
/// carried state, in a step of `n` requests.
fn second_round(drafted: u32, n: u32) -> ScheduleInput {
    let mut verify = vec![0.0; 17];
    verify[drafted as usize] = lone(drafted);
    ScheduleInput {
        round: 1,
        generated: 1,
        budget_left: 100,
        max_draft: 16,
        position_acceptance: vec![0.6; 16],
        verify_seconds_by_len: verify,
        batch_sequences: n,
        batch_rows_planned: n.saturating_sub(1),
        ..Default::default()
    }
}

#[test]
fn one_measured_length_does_not_take_drafts_as_free() {
    // Taken flat, one measured length would make 16 drafts cost what none
    // do: alone a 17-row verify (7 plain steps on a 2-core CPU), in a step
    // of 8 all 8 requests drafting 16 at once (a 136-row step). Taken as
    // proportional to the rows, the next round is plain: it measures the
    // intercept, and the round after decides from a line.
    assert_eq!(decide(&second_round(4, 1)), 0);
    assert_eq!(decide(&second_round(4, 0)), 0);
    // Alone with only a plain round measured: the first guess, `initial`,
    // which measures a second length.
    assert_eq!(decide(&second_round(0, 1)), 4);
    for drafted in [0, 4] {
        let k = decide(&second_round(drafted, 8));
        assert_eq!(k, 0, "drafted {drafted}: k = {k}");
    }
}

#[test]
fn a_first_round_in_a_batch_shares_the_initial_guess() {
    let first = |n: u32| ScheduleInput {
        round: 0,
        budget_left: 100,
        max_draft: 16,
        verify_seconds_by_len: vec![0.0; 17],
        batch_sequences: n,
        ..Default::default()
    };
    assert_eq!(decide(&first(0)), 4);
    assert_eq!(decide(&first(1)), 4);
    assert_eq!(decide(&first(2)), 2);
    assert_eq!(decide(&first(8)), 0);
}

#[test]
fn a_fresh_request_in_a_batch_hedges_the_carried_acceptance_with_the_prior() {
    use specd_policy_logic::ThroughputCarry;
    // Lone requests on other prompts kept 83% of their first drafts: scaled
    // to 8 rounds and smoothed, (6.64 + 1) / (8 + 2) = 0.764. This request
    // has no round of its own yet (round 0, nothing measured: the carried
    // timing decides).
    let carried = ThroughputCarry {
        reached: vec![100.0],
        kept: vec![83.0],
        plain_seconds: lone(0),
        row_seconds: 0.0012,
        draft_seconds: 0.0,
        batch_row_seconds: 0.0012,
    }
    .encode();
    let fresh = |n: u32, planned: u32| {
        let mut s = Throughput::create(r#"{"prior": 0.5}"#, Some(&carried)).unwrap();
        let mut i = input(1, f64::NAN, n, planned);
        i.round = 0;
        i.verify_seconds_by_len = vec![0.0; 2];
        s.next_draft_length(&i)
    };
    // Alone the carried 0.764 stands against a threshold of 0.22.
    assert_eq!(fresh(0, 0), 1);
    assert_eq!(fresh(1, 0), 1);
    // In a step of 4 the share is (5.5 + 3 x 1.2) / 4 = 2.28 ms, so a draft
    // row needs 0.53: hedged, (2 x 0.764 + 0.5) / 3 = 0.68, it drafts.
    assert_eq!(fresh(4, 3), 1);
    // In a step of 8 a draft row needs 0.69. The carried 0.764 alone would
    // draft; hedged, (0.764 + 0.5) / 2 = 0.63, the step keeps its rows.
    assert_eq!(fresh(8, 7), 0);
}

#[test]
fn a_slope_learnt_alone_does_not_price_draft_rows_in_a_batch() {
    use specd_policy_logic::ThroughputCarry;
    // Earlier requests ran alone, where a draft row cost 0.3 ms against a
    // 5.5 ms step, and kept 90% of their first drafts.
    let alone = ThroughputCarry {
        reached: vec![100.0],
        kept: vec![90.0],
        plain_seconds: lone(0),
        row_seconds: 0.0003,
        draft_seconds: 0.0,
        batch_row_seconds: 0.0,
    };
    // This request is in a step of 8 and has measured only plain rounds.
    let decide_with = |carried: &ThroughputCarry, n: u32| {
        let mut s = Throughput::create("{}", Some(&carried.encode())).unwrap();
        let mut i = second_round(0, n);
        i.max_draft = 4;
        i.position_acceptance = vec![f64::NAN; 4];
        s.next_draft_length(&i)
    };
    // Alone the cheap lone slope stands: it drafts.
    assert!(decide_with(&alone, 1) > 0);
    // In the batch nothing says what a row costs there: plain rounds (the
    // lone slope would price a row at 0.3 ms, and the hedged 0.74
    // acceptance would then draft).
    assert_eq!(decide_with(&alone, 8), 0);
    // A batched slope carried from earlier batches decides: cheap rows
    // there draft, dear ones do not.
    let batched = |row: f64| ThroughputCarry {
        batch_row_seconds: row,
        ..alone.clone()
    };
    assert!(decide_with(&batched(0.0003), 8) > 0);
    assert_eq!(decide_with(&batched(0.002), 8), 0);
}
