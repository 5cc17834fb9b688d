//! Instances made ahead of requests (`warm.rs`): a request's instance is
//! fresh even when it was made ahead, an instance made with carried state
//! that has since changed is never used, the pool stays within its bounds,
//! and its slots go to requests when the allocator runs out.  The components
//! are hand-written ones that count their calls, so any state shared between
//! requests shows in their answers.  They instantiate in microseconds, so
//! these hosts make everything ahead (`warm_threshold_us: 0`).

mod common;
use common::*;
use specd_policy::{HostConfig, MetricsSnapshot, PolicyHost};
use std::time::{Duration, Instant};

fn warm_host(warm_instances: usize, warm_per_policy: usize, max_instances: u32) -> PolicyHost {
    PolicyHost::new(HostConfig {
        warm_instances,
        warm_per_policy,
        warm_threshold_us: 0,
        max_instances,
        ..test_config()
    })
    .expect("policy host")
}

/// A schedule that counts its calls: `next-draft-length` answers
/// calls-so-far + the first carried byte (0 without carried state), and
/// `carry` hands back that answer's last value as one byte.  `bias` makes
/// components of different hashes.
fn counter(bias: u32) -> Vec<u8> {
    let create = format!(
        "(if (local.get 2) (then (global.set $seed (i32.load8_u (local.get 3))))) \
         (global.set $bias (i32.const {bias})) {CREATE_OK}"
    );
    ScheduleWat {
        create: &create,
        next: "(global.set $calls (i32.add (global.get $calls) (i32.const 1))) \
               (i32.add (global.get $calls) (global.get $seed))",
        carry: Some(
            "(i32.store8 (i32.const 200) (i32.add (global.get $calls) (global.get $seed))) \
             (i32.store8 (i32.const 96) (i32.const 1)) \
             (i32.store (i32.const 100) (i32.const 200)) \
             (i32.store (i32.const 104) (i32.const 1)) \
             (i32.const 96)",
        ),
        core_extra: "(global $calls (mut i32) (i32.const 0)) \
                     (global $seed (mut i32) (i32.const 0)) \
                     (global $bias (mut i32) (i32.const 0))",
        ..Default::default()
    }
    .build()
}

/// Waits (up to 20 s) until `done` holds of the host's counters.
fn wait_for(host: &PolicyHost, what: &str, done: impl Fn(&MetricsSnapshot) -> bool) {
    let t = Instant::now();
    loop {
        let m = host.metrics();
        if done(&m) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "waited 20 s for {what}: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Answers of `calls` rounds of a request.
fn answers(s: &mut dyn specd_policy::Schedule, calls: u32) -> Vec<u32> {
    (0..calls)
        .map(|r| s.next_draft_length(&input(r, 64, &[])).unwrap())
        .collect()
}

#[test]
fn an_instance_is_never_shared_across_requests() {
    let host = warm_host(8, 2, 256);
    host.add("counter", &counter(0)).unwrap();
    // Two requests make the key worth making ahead.
    for _ in 0..2 {
        let mut s = host.schedule("counter", "{}", "m").unwrap();
        assert_eq!(answers(s.as_mut(), 3), [1, 2, 3]);
    }
    for request in 0..6 {
        wait_for(&host, "two ready instances", |m| m.warm_ready >= 2);
        let hits = host.metrics().warm_hits;
        // Two requests at once, each on an instance made ahead: neither
        // sees the other's calls, nor any earlier request's.
        let mut a = host.schedule("counter", "{}", "m").unwrap();
        let mut b = host.schedule("counter", "{}", "m").unwrap();
        assert_eq!(host.metrics().warm_hits, hits + 2, "request {request}");
        assert_eq!(answers(a.as_mut(), 3), [1, 2, 3], "request {request}");
        assert_eq!(answers(b.as_mut(), 2), [1, 2], "request {request}");
        assert_eq!(answers(a.as_mut(), 1), [4], "request {request}");
    }
    // Every request got its own instance: 2 made on the request path, the
    // 12 others ahead (the pool may have made a few more since).
    let m = host.metrics();
    assert_eq!(m.instantiations, 14);
    assert_eq!(m.warm_hits, 12);
    assert!(m.warm_built >= 12, "{m:?}");
}

#[test]
fn an_instance_made_before_carried_state_changed_is_never_used() {
    let host = warm_host(8, 2, 256);
    host.add("carrier", &counter(1)).unwrap();
    // Request 1 carries 3 (it answered 1, 2, 3).
    let mut s = host.schedule("carrier", "{}", "m").unwrap();
    assert_eq!(answers(s.as_mut(), 3), [1, 2, 3]);
    s.finish();
    // Request 2 starts from 3 and leaves 6; the pool makes instances
    // created with 3 meanwhile (the key was asked for twice).
    let mut s = host.schedule("carrier", "{}", "m").unwrap();
    wait_for(&host, "instances made with the state 3", |m| {
        m.warm_ready >= 2
    });
    assert_eq!(answers(s.as_mut(), 3), [4, 5, 6]);
    s.finish();
    // Those are stale now: dropped unused, and made again with 6.
    wait_for(&host, "the stale instances dropped and remade", |m| {
        m.warm_discarded >= 2 && m.warm_ready >= 2
    });
    let hits = host.metrics().warm_hits;
    let mut s = host.schedule("carrier", "{}", "m").unwrap();
    assert_eq!(host.metrics().warm_hits, hits + 1, "taken ready");
    assert_eq!(answers(s.as_mut(), 2), [7, 8]);
    s.finish();
    // Taken right after the state changed (nothing remade yet, or remade
    // already): made on the request path or ahead, it starts from 8.
    let mut s = host.schedule("carrier", "{}", "m").unwrap();
    assert_eq!(answers(s.as_mut(), 1), [9]);
    // Another model's state is its own key: it starts from nothing.
    let mut s = host.schedule("carrier", "{}", "other-model").unwrap();
    assert_eq!(answers(s.as_mut(), 1), [1]);
}

#[test]
fn the_pool_stays_within_its_bounds() {
    // At most 3 instances held ahead, 2 per key, over 4 keys.
    let host = warm_host(3, 2, 256);
    for i in 0..4 {
        host.add(&format!("c{i}"), &counter(10 + i)).unwrap();
        for _ in 0..2 {
            let mut s = host.schedule(&format!("c{i}"), "{}", "m").unwrap();
            assert_eq!(answers(s.as_mut(), 1), [1]);
        }
    }
    wait_for(&host, "the pool full", |m| m.warm_ready >= 3);
    // It stays full and no fuller.
    let built = host.metrics().warm_built;
    std::thread::sleep(Duration::from_millis(200));
    let m = host.metrics();
    assert_eq!(m.warm_ready, 3, "{m:?}");
    assert_eq!(m.warm_built, built, "nothing more made: {m:?}");
    // One key alone: its depth is the bound.
    let host = warm_host(8, 1, 256);
    host.add("one", &counter(20)).unwrap();
    for _ in 0..2 {
        drop(host.schedule("one", "{}", "m").unwrap());
    }
    wait_for(&host, "one ready instance", |m| m.warm_ready >= 1);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(host.metrics().warm_ready, 1);
    // Off: nothing is made ahead.
    let host = warm_host(0, 2, 256);
    host.add("none", &counter(30)).unwrap();
    for _ in 0..4 {
        drop(host.schedule("none", "{}", "m").unwrap());
    }
    std::thread::sleep(Duration::from_millis(100));
    let m = host.metrics();
    assert_eq!((m.warm_ready, m.warm_built, m.warm_hits), (0, 0, 0));
}

#[test]
fn requests_get_the_slots_of_instances_made_ahead() {
    // 16 allocator slots: at most 2 made ahead (an eighth).
    let host = warm_host(8, 2, 16);
    host.add("held-ahead", &counter(40)).unwrap();
    host.add("busy", &counter(41)).unwrap();
    for _ in 0..2 {
        drop(host.schedule("held-ahead", "{}", "m").unwrap());
    }
    wait_for(&host, "two instances held ahead", |m| m.warm_ready >= 2);
    assert_eq!(host.metrics().warm_ready, 2);
    // 16 live requests of another policy: the 15th finds the allocator
    // full, and the instances held ahead make room.
    let mut live = Vec::new();
    for i in 0..16 {
        let mut s = host
            .schedule("busy", "{}", "m")
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(answers(s.as_mut(), 1), [1]);
        live.push(s);
    }
    assert!(host.schedule("busy", "{}", "m").is_err(), "17 > 16 slots");
    drop(live);
    let mut s = host.schedule("held-ahead", "{}", "m").unwrap();
    assert_eq!(answers(s.as_mut(), 2), [1, 2]);
}

#[test]
fn removing_a_policy_drops_its_instances_made_ahead() {
    let host = warm_host(8, 2, 256);
    host.add("gone", &counter(50)).unwrap();
    for _ in 0..2 {
        drop(host.schedule("gone", "{}", "m").unwrap());
    }
    wait_for(&host, "ready instances", |m| m.warm_ready >= 2);
    host.remove("gone").unwrap();
    assert_eq!(host.metrics().warm_ready, 0);
    // Replaced under the same name by other bytes: the new one answers.
    host.add("gone", &counter(51)).unwrap();
    let mut s = host.schedule("gone", "{}", "m").unwrap();
    assert_eq!(answers(s.as_mut(), 1), [1]);
}
