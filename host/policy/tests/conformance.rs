//! The conformance harness on real components: the built-in `rejection`
//! passes as lossless, `greedy` as exact greedy decoding (and not more),
//! `typical` is reported lossy with its drift, and deliberately biased
//! "lossless" policies (hand-written components) fail.  Each run draws its
//! rounds from a fresh seed, printed on failure.

mod common;
use common::*;
use specd_policy::conformance::random_seed;
use specd_policy::{ConformanceConfig, ConformanceReport, LosslessClaim};

fn run(name: &str, claim: Option<LosslessClaim>) -> ConformanceReport {
    let seed = random_seed();
    let r = host()
        .conformance(name, claim, &ConformanceConfig::new(seed))
        .unwrap_or_else(|e| panic!("{name} (seed {seed}): {e}"));
    assert_eq!(r.seed, seed);
    println!("{name}: {}", r.summary);
    r
}

#[test]
fn rejection_passes_as_lossless() {
    let r = run("rejection", None);
    assert_eq!(r.claim, LosslessClaim::Lossless);
    assert!(r.greedy_exact && r.sampling_lossless && r.passed, "{r:#?}");
    assert!(r.chi_square_tests >= 12, "{r:#?}");
    assert!(r.max_tv_distance < 0.15, "{r:#?}");
    assert!(r.summary.starts_with("lossless: passed"), "{}", r.summary);
    host().require_lossless("rejection", false).unwrap();
}

#[test]
fn greedy_is_exact_at_temperature_0_only() {
    let r = run("greedy", None);
    assert_eq!(r.claim, LosslessClaim::Greedy);
    assert!(r.greedy_exact && r.passed, "{r:#?}");
    // sampling from the target it is not
    assert!(!r.sampling_lossless, "{r:#?}");
    host().require_lossless("greedy", true).unwrap();
    let why = host().require_lossless("greedy", false).unwrap_err();
    assert!(why.contains("temperature 0"), "{why}");
    // the verdict shows in the listing
    let listed = host().list();
    let v = listed
        .iter()
        .find(|p| p.name == "greedy")
        .and_then(|p| p.conformance.clone())
        .unwrap();
    assert!(v.passed && v.claim == LosslessClaim::Greedy && v.claim_source == "built-in");
}

#[test]
fn typical_is_flagged_lossy_with_its_drift() {
    let r = run("typical", None);
    assert_eq!(r.claim, LosslessClaim::Lossy);
    assert!(!r.sampling_lossless, "{r:#?}");
    assert!(r.max_tv_distance > 0.1, "{r:#?}");
    assert!(r.summary.starts_with("lossy: drift"), "{}", r.summary);
    let why = host().require_lossless("typical", false).unwrap_err();
    assert!(why.contains("does not claim"), "{why}");
    // tested as lossless, it fails
    let r = run("typical", Some(LosslessClaim::Lossless));
    assert!(!r.passed && r.summary.starts_with("FAILED"), "{r:#?}");
}

// (Both reset the bump allocator of the hand-written module on each call:
// the positions of thousands of rounds would not fit its one page.)

/// Accepts every draft: output follows the draft, not the target.
fn accept_all() -> Vec<u8> {
    AcceptanceWat {
        create: ACCEPT_CREATE_OK,
        decide: "(global.set $bump (i32.const 4096)) (i32.store (i32.const 128) (local.get $len)) (i32.store8 (i32.const 132) (i32.const 0)) (i32.const 128)",
    }
    .build()
}

/// Speculative sampling with a thumb on the scale: draft i is rejected iff
/// 0.5 * uniform * q >= p (the correct rule has no 0.5), so it accepts too
/// often.  At temperature 0 (p is 0 or 1) it is still exact.
fn over_accepting() -> Vec<u8> {
    AcceptanceWat {
        create: ACCEPT_CREATE_OK,
        decide: r#"(local $i i32) (local $a i32)
            (global.set $bump (i32.const 4096))
            (block $done
              (loop $next
                (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
                (local.set $a (i32.add (local.get $ptr) (i32.mul (local.get $i) (i32.const 24))))
                (br_if $done (f32.ge
                    (f32.mul (f32.mul (f32.const 0.5) (f32.load offset=20 (local.get $a)))
                             (f32.load offset=8 (local.get $a)))
                    (f32.load offset=4 (local.get $a))))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $next)))
            (i32.store (i32.const 128) (local.get $i))
            (i32.store8 (i32.const 132) (i32.const 0))
            (i32.const 128)"#,
    }
    .build()
}

#[test]
fn biased_lossless_policies_fail() {
    host().add("biased-accept-all", &accept_all()).unwrap();
    host()
        .add("biased-over-accepting", &over_accepting())
        .unwrap();

    // a user component cannot declare a claim under contract 0.1: it is
    // tested as lossless
    let r = run("biased-accept-all", None);
    assert_eq!(r.claim, LosslessClaim::Lossless);
    assert!(!r.greedy_exact && !r.passed, "{r:#?}");
    assert!(r.greedy_first_mismatch.is_some(), "{r:#?}");
    assert!(r.summary.starts_with("FAILED"), "{}", r.summary);

    let r = run("biased-over-accepting", Some(LosslessClaim::Lossless));
    assert!(r.greedy_exact, "exact at temperature 0: {r:#?}");
    assert!(!r.sampling_lossless && !r.passed, "{r:#?}");
    assert!(r.min_p_value < 1e-6, "{r:#?}");
    assert!(
        r.summary
            .contains("does not follow the target distribution"),
        "{}",
        r.summary
    );

    // refused under --require-lossless, with the harness's reason
    for name in ["biased-accept-all", "biased-over-accepting"] {
        let why = host().require_lossless(name, false).unwrap_err();
        assert!(why.contains("failed the conformance harness"), "{why}");
    }
    // a verdict belongs to the exact hash: another name for the same bytes
    // shares it, other bytes do not
    host().add("same-bytes", &over_accepting()).unwrap();
    let listed = host().list();
    let verdict = |n: &str| {
        listed
            .iter()
            .find(|p| p.name == n)
            .and_then(|p| p.conformance.clone())
    };
    assert_eq!(verdict("same-bytes"), verdict("biased-over-accepting"));
    assert!(verdict("same-bytes").is_some_and(|v| !v.passed));
}

#[test]
fn every_run_draws_other_rounds() {
    let (a, b) = (random_seed(), random_seed());
    assert_ne!(a, b);
    let cfg = |seed| ConformanceConfig {
        cases: 2,
        rounds_per_case: 300,
        greedy_rounds: 50,
        ..ConformanceConfig::new(seed)
    };
    let one = host().conformance("rejection", None, &cfg(a)).unwrap();
    let two = host().conformance("rejection", None, &cfg(b)).unwrap();
    let again = host().conformance("rejection", None, &cfg(a)).unwrap();
    // the same seed replays the same rounds; another seed other ones
    assert_eq!(one.min_p_value, again.min_p_value);
    assert_ne!(one.min_p_value_at, two.min_p_value_at);
}
