//! `throughput` learns across requests: what one request measured
//! (acceptance per draft position, verify timing) is carried to the next
//! through the schedule's carried bytes, run as the WebAssembly component
//! and checked against the native logic on the same bytes.

mod common;
use common::*;
use specd_policy::{native, RoundRecord, ScheduleInput};
use specd_policy_logic::ThroughputCarry;

/// Seconds each extra verify row adds in a batch of 8: half a plain step's
/// share (4 ms), so a draft pays only when kept more than half the time.
const BATCH_ROW: f64 = 0.002;
/// ... and alone, where a row adds a tenth of a plain step.
const SOLO_ROW: f64 = 0.0004;

/// A round: a plain step costs 4 ms, every extra row `row` seconds.
fn round_input(
    round: u32,
    recent: &[(u32, u32)],
    acceptance: &[f64],
    measured: &[u32],
    row: f64,
) -> ScheduleInput {
    ScheduleInput {
        round,
        generated: round,
        budget_left: 1000,
        max_draft: 8,
        recent: recent
            .iter()
            .map(|&(drafted, accepted)| RoundRecord {
                drafted,
                accepted,
                draft_seconds: 0.0,
                verify_seconds: 0.004 + row * drafted as f64,
            })
            .collect(),
        position_acceptance: acceptance.to_vec(),
        draft_seconds_per_token: 0.0,
        verify_seconds_by_len: (0..=8u32)
            .map(|k| {
                if measured.contains(&k) {
                    0.004 + row * k as f64
                } else {
                    0.0
                }
            })
            .collect(),
        // The timings above are already what a round costs this request
        // (a share of a step); no batch context, so `throughput` takes them
        // as they are (with one it would read them as lone forwards and
        // split them again).
        batch_sequences: 0,
        batch_rows_planned: 0,
    }
}

/// A fresh request's first round: nothing measured, nothing accepted yet.
fn first_round() -> ScheduleInput {
    round_input(0, &[], &[], &[], BATCH_ROW)
}

/// Runs one request of `rounds` rounds in which every draft position is
/// kept with probability ~`a` (the host's Laplace estimate), the drafter
/// drafting what was asked, and finishes it (its state is carried).
fn request(model: &str, rounds: u32, row: f64, kept: impl Fn(u32, u32) -> u32) -> Vec<u32> {
    let mut s = host().schedule("throughput", "{}", model).unwrap();
    let mut recent: Vec<(u32, u32)> = Vec::new();
    let (mut reached, mut kept_n) = (vec![0u64; 8], vec![0u64; 8]);
    let mut measured = Vec::new();
    let mut ks = Vec::new();
    for round in 0..rounds {
        let acceptance: Vec<f64> = reached
            .iter()
            .zip(&kept_n)
            .take_while(|(r, _)| **r > 0)
            .map(|(r, k)| (*k as f64 + 1.0) / (*r as f64 + 2.0))
            .collect();
        let k = s
            .next_draft_length(&round_input(round, &recent, &acceptance, &measured, row))
            .unwrap();
        let acc = kept(round, k).min(k);
        for i in 0..k as usize {
            reached[i] += 1;
            if i < acc as usize {
                kept_n[i] += 1;
            } else {
                break;
            }
        }
        if !measured.contains(&k) {
            measured.push(k);
        }
        recent.push((k, acc));
        ks.push(k);
    }
    s.finish();
    ks
}

#[test]
fn a_request_starts_from_what_the_requests_before_it_saw() {
    // Fresh: nothing carried, nothing measured: `initial` (4).
    let mut fresh = host().schedule("throughput", "{}", "carry-fresh").unwrap();
    assert_eq!(fresh.next_draft_length(&first_round()).unwrap(), 4);

    // A request whose drafts are almost never kept, in a batch where each
    // extra row costs half a plain step.
    let model = "carry-low";
    let ks = request(model, 40, BATCH_ROW, |round, k| {
        u32::from(round % 10 == 0 && k > 0)
    });
    assert_eq!(ks[0], 4, "the first request knows nothing yet");
    let carried = host()
        .carried_state("throughput", model, "{}")
        .expect("throughput carries its state");
    let c = ThroughputCarry::decode(&carried).expect("the carried bytes decode");
    assert!(c.reached[0] >= 1.0 && c.kept[0] < c.reached[0], "{c:?}");
    assert!(
        (c.row_seconds - 0.002).abs() < 1e-9 && (c.plain_seconds - 0.004).abs() < 1e-9,
        "the timing it measured: {c:?}"
    );

    // The next request declines to draft from its first round on.
    let mut next = host().schedule("throughput", "{}", model).unwrap();
    assert_eq!(
        next.next_draft_length(&first_round()).unwrap(),
        0,
        "carried: low acceptance and costly rows"
    );
    // The native logic on the same bytes decides the same.
    let mut n = native::schedule("throughput", "{}", Some(&carried)).unwrap();
    assert_eq!(n.next_draft_length(&first_round()).unwrap(), 0);

    // A request whose drafts are all kept: the next one drafts from its
    // first round on, the k the last one settled on (not `initial`).
    let model = "carry-high";
    let ks = request(model, 40, BATCH_ROW, |_, k| k);
    let settled = *ks.last().unwrap();
    assert!(settled > 0 && settled != 4, "{ks:?}");
    let mut next = host().schedule("throughput", "{}", model).unwrap();
    let k = next.next_draft_length(&first_round()).unwrap();
    assert_eq!(k, settled, "carried: drafts kept ({ks:?})");
}

#[test]
fn a_requests_own_rounds_outweigh_what_was_carried() {
    let model = "carry-shift";
    request(model, 40, BATCH_ROW, |_, _| 0);
    // The carried estimate says no; this request runs alone (rows are
    // cheap) and its drafts are all kept: after a probe it drafts.
    let ks = request(model, 60, SOLO_ROW, |_, k| k);
    assert_eq!(ks[0], 0, "it starts from the carried estimate");
    let late = &ks[40..];
    assert!(
        late.iter().all(|&k| k > 0),
        "its own rounds take over: {ks:?}"
    );
}

#[test]
fn probes_back_off_when_drafting_does_not_pay() {
    let model = "carry-probe";
    request(model, 40, BATCH_ROW, |_, _| 0);
    let ks = request(model, 64, BATCH_ROW, |_, _| 0);
    let probes: Vec<usize> = (0..ks.len()).filter(|&i| ks[i] > 0).collect();
    // Plain answers before each probe: 8, then 16, then 32.
    assert_eq!(probes, vec![7, 23, 55], "{ks:?}");
}

#[test]
fn malformed_carried_bytes_are_ignored() {
    for bytes in [&[][..], &[1u8][..], &[1, 2, 0, 0][..], &[9, 0, 0, 0, 0][..]] {
        assert_eq!(ThroughputCarry::decode(bytes), None, "{bytes:?}");
        let mut s = native::schedule("throughput", "{}", Some(bytes)).unwrap();
        assert_eq!(s.next_draft_length(&first_round()).unwrap(), 4);
    }
    let c = ThroughputCarry {
        reached: vec![10.0, 4.0],
        kept: vec![4.0, 1.0],
        plain_seconds: 0.01,
        row_seconds: 0.001,
        draft_seconds: 0.0,
        batch_row_seconds: 0.003,
    };
    assert_eq!(ThroughputCarry::decode(&c.encode()), Some(c.clone()));
    // Version 1 (no batched slope) still decodes: the state a server kept
    // before the slope was carried per regime.
    let mut v1 = c.encode();
    v1[0] = 1;
    v1.truncate(v1.len() - 8);
    let old = ThroughputCarry {
        batch_row_seconds: 0.0,
        ..c
    };
    assert_eq!(ThroughputCarry::decode(&v1), Some(old));
}
