//! `throughput` against a drafter that drafts fewer tokens than it is
//! asked for (a suffix match that stops where its counts do, an n-gram
//! without a match): only drafted rows are verified, so asking more costs
//! only where the drafter goes on.
use specd_policy_logic::{RoundRecord, ScheduleInput, ScheduleLogic, Throughput, ThroughputCarry};

/// Round `round` of a request that measured every length up to 16 (5.5 ms
/// for one row, 1.2 ms per extra row), with acceptance `a` at every draft
/// position; `last` is the previous round.
fn input(round: u32, a: f64, last: RoundRecord) -> ScheduleInput {
    ScheduleInput {
        round,
        generated: round,
        budget_left: 1000,
        max_draft: 16,
        position_acceptance: vec![a; 16],
        verify_seconds_by_len: (0..=16).map(|j| 0.0055 + 0.0012 * j as f64).collect(),
        recent: vec![last],
        ..Default::default()
    }
}

/// The answers of 40 rounds against a drafter that drafts everything
/// asked in the rounds `drafts` says, nothing in the others (no match),
/// each draft kept at acceptance `a`.
fn answers(drafts: impl Fn(u32) -> bool, a: f64) -> (Vec<u32>, Throughput) {
    let mut s = Throughput::create("{}", None).unwrap();
    let mut last = RoundRecord::default();
    let ks = (0..40)
        .map(|round| {
            let k = s.next_draft_length(&input(round, a, last));
            let drafted = if drafts(round) { k } else { 0 };
            last = RoundRecord {
                drafted,
                accepted: drafted,
                ..Default::default()
            };
            k
        })
        .collect();
    (ks, s)
}

#[test]
fn a_drafter_that_often_has_nothing_is_asked_for_more() {
    // Every draft asked for is made: k is where one more row stops
    // paying (at 0.8 and 1.2 ms a row against 5.5 ms, 4).
    let (full, _) = answers(|_| true, 0.8);
    assert!(full[20..].iter().all(|&k| k == 4), "{full:?}");
    // A drafter with a match in one round of three: its rows are paid for
    // a third of the time, while the plain step is paid every round, so a
    // further draft pays at a lower acceptance (at 0.8: 5).
    let (third, _) = answers(|r| r % 3 == 0, 0.8);
    assert!(third[20..].iter().all(|&k| k == 5), "{third:?}");
}

#[test]
fn the_fill_counts_are_carried_to_the_next_request() {
    let (_, s) = answers(|r| r % 3 == 0, 0.8);
    let bytes = s.carry().unwrap();
    let c = ThroughputCarry::decode(&bytes).unwrap();
    // About a third of the drafts asked for were made, at every position.
    for i in 0..4 {
        let f = c.filled[i] / c.asked[i];
        assert!(c.asked[i] > 10.0 && (0.25..0.45).contains(&f), "{c:?}");
    }
    assert_eq!(ThroughputCarry::decode(&c.encode()), Some(c.clone()));
    // A version 2 carry (no fill counts) still decodes, with none.
    let mut v2 = bytes[..bytes.len() - 1 - 8 * c.asked.len()].to_vec();
    v2[0] = 2;
    let old = ThroughputCarry::decode(&v2).unwrap();
    assert!(old.asked.is_empty() && old.reached == c.reached);
    // A fresh request starts from them: it asks for more at once than one
    // whose carry has no fill counts.
    let fresh = |carried: &[u8]| {
        let mut s = Throughput::create("{}", Some(carried)).unwrap();
        let mut i = input(1, 0.8, RoundRecord::default());
        i.recent.clear();
        s.next_draft_length(&i)
    };
    let (with, without) = (fresh(&bytes), fresh(&v2));
    assert!(with > without, "{with} against {without}");
}
