//! The checks every language's ports of the built-ins go through
//! (plugins/python, plugins/js): they decide exactly like the Rust
//! `heuristic` and `rejection`, refuse the same configs, and the language's
//! hostile policy is contained with the right failure kind each time.
use super::*;
use specd_policy::{Correction, Decision, PolicyError, PolicyErrorKind, PolicyHost};
use std::path::PathBuf;
use std::sync::OnceLock;

/// A language's ports: `heuristic-SUFFIX`, `rejection-SUFFIX` and
/// `hostile-SUFFIX`, built under `plugins/target/DIR` by `scripts/SCRIPT`.
pub struct Port {
    pub lang: &'static str,
    pub suffix: &'static str,
    pub dir: &'static str,
    pub script: &'static str,
    /// The hostile policy's config for "raise an exception".
    pub raise: &'static str,
}

impl Port {
    pub fn name(&self, policy: &str) -> String {
        format!("{policy}-{}", self.suffix)
    }

    pub fn file(&self, policy: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../plugins/target")
            .join(self.dir)
            .join(format!("{}.wasm", self.name(policy)));
        std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}\nthe {} policies are not built: run scripts/{} (`make test` does)",
                path.display(),
                self.lang,
                self.script
            )
        })
    }

    /// Registers the three components in the shared host, once per test
    /// binary (each compiles for seconds; parallel tests must not all do it).
    pub fn host(&self) -> &'static PolicyHost {
        static ADDED: OnceLock<()> = OnceLock::new();
        ADDED.get_or_init(|| {
            for policy in ["heuristic", "rejection", "hostile"] {
                let name = self.name(policy);
                let info = host()
                    .add(&name, &self.file(policy))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(
                    info.imports_wasi,
                    "{name}: {} components import WASI",
                    self.lang
                );
            }
        });
        host()
    }

    /// The port of `heuristic` over random rounds, then `bad` configs
    /// refused by both and `good` ones giving the same first answer.
    pub fn assert_heuristic(&self, seed: u64, bad: &[&str], good: &[&str]) {
        let host = self.host();
        let name = self.name("heuristic");
        let rounds = assert_heuristic_twin(&name, 24, seed, |rng| 8 + rng.below(20));
        assert!(rounds >= 300, "{rounds} rounds");
        for &cfg in bad {
            let port = host.schedule(&name, cfg, "m").err().map(|e| e.kind);
            let rust = host.schedule("heuristic", cfg, "m").err().map(|e| e.kind);
            assert_eq!(
                port,
                Some(PolicyErrorKind::Config),
                "{} accepted {cfg}",
                self.lang
            );
            assert_eq!(rust, Some(PolicyErrorKind::Config), "Rust accepted {cfg}");
        }
        for &cfg in good {
            let mut p = host.schedule(&name, cfg, "good").unwrap();
            let mut r = host.schedule("heuristic", cfg, "good").unwrap();
            let i = input(0, 16, &[]);
            assert_eq!(
                p.next_draft_length(&i).unwrap(),
                r.next_draft_length(&i).unwrap(),
                "{cfg}"
            );
        }
    }

    /// The port of `rejection` over 300 random rounds (both outcomes
    /// exercised), then `bad` configs refused by both.
    pub fn assert_rejection(&self, seed: u64, bad: &[&str]) {
        let host = self.host();
        let name = self.name("rejection");
        let mut rng = Lcg(seed);
        let mut port = host.acceptance(&name, "{}", 50_000).unwrap();
        let mut rust = host.acceptance("rejection", "{}", 50_000).unwrap();
        let (mut full, mut partial) = (0, 0);
        for round in 0..300 {
            let k = 1 + rng.below(8);
            let positions: Vec<Position> = (0..k).map(|_| random_position(&mut rng)).collect();
            let (dp, dr): (Decision, Decision) = (
                port.decide(&positions).unwrap(),
                rust.decide(&positions).unwrap(),
            );
            assert_eq!(dp, dr, "round {round}: {positions:?}");
            assert_eq!(dr.correction, Correction::Residual);
            if dr.accepted == k {
                full += 1;
            } else {
                partial += 1;
            }
        }
        assert!(full > 20 && partial > 20, "{full} full, {partial} partial");
        for &cfg in bad {
            let p = host.acceptance(&name, cfg, 10).err().map(|e| e.kind);
            let r = host.acceptance("rejection", cfg, 10).err().map(|e| e.kind);
            assert_eq!(
                p,
                Some(PolicyErrorKind::Config),
                "{} accepted {cfg}",
                self.lang
            );
            assert_eq!(r, Some(PolicyErrorKind::Config), "Rust accepted {cfg}");
        }
        assert!(host.acceptance(&name, "", 10).is_ok());
    }

    /// After a failure the host still serves the port's policies.
    fn still_serves(&self) {
        let mut s = self
            .host()
            .schedule(&self.name("heuristic"), "{}", "after")
            .unwrap();
        assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 4);
        let mut a = self
            .host()
            .acceptance(&self.name("hostile"), "{}", 100)
            .unwrap();
        assert_eq!(
            a.decide(&[pos(1, 0.5, 1.0, 1, 0.0, 0.0)]).unwrap().accepted,
            1
        );
    }

    /// The hostile schedule misbehaving as `config` asks: its error, which a
    /// spent instance repeats.
    fn hostile_schedule_error(&self, config: &str) -> PolicyError {
        let mut s = self
            .host()
            .schedule(&self.name("hostile"), config, "m")
            .unwrap_or_else(|e| panic!("{config}: {e}"));
        let err = s.next_draft_length(&input(0, 16, &[])).unwrap_err();
        assert_eq!(s.next_draft_length(&input(1, 16, &[])).unwrap_err(), err);
        err
    }

    /// Endless loops (in a call and in `create`), memory growth, an
    /// exception and out-of-range answers: each contained with its kind,
    /// each counted, and the host serves on after each.
    pub fn assert_hostile_contained(&self) {
        let hostile = self.name("hostile");
        let mut s = self.host().schedule(&hostile, "{}", "m").unwrap();
        assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 2);

        let err = self.hostile_schedule_error(r#"{"do": "loop"}"#);
        assert_eq!(err.kind, PolicyErrorKind::Timeout, "{err}");
        assert_eq!(err.policy, hostile);
        self.still_serves();

        let err = self
            .host()
            .schedule(&hostile, r#"{"do": "loop-create"}"#, "m")
            .err()
            .unwrap();
        assert_eq!(err.kind, PolicyErrorKind::Timeout, "{err}");
        self.still_serves();

        let err = self.hostile_schedule_error(r#"{"do": "grow"}"#);
        assert_eq!(err.kind, PolicyErrorKind::MemoryLimit, "{err}");
        assert!(err.message.contains("memory"), "{err}");
        self.still_serves();

        let err = self.hostile_schedule_error(self.raise);
        assert_eq!(err.kind, PolicyErrorKind::Trap, "{err}");
        self.still_serves();

        let err = self.hostile_schedule_error(r#"{"do": "too-long"}"#);
        assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
        assert!(
            err.message.contains("17") && err.message.contains("16"),
            "{err}"
        );

        let two = [pos(1, 0.5, 1.0, 1, 0.0, 0.0), pos(2, 0.5, 1.0, 2, 0.0, 0.0)];
        let mut a = self
            .host()
            .acceptance(&hostile, r#"{"do": "accept-too-many"}"#, 100)
            .unwrap();
        let err = a.decide(&two).unwrap_err();
        assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
        assert!(err.message.contains("accepted 3 of 2"), "{err}");
        let mut a = self
            .host()
            .acceptance(&hostile, r#"{"do": "bad-token"}"#, 100)
            .unwrap();
        let err = a.decide(&two).unwrap_err();
        assert_eq!(err.kind, PolicyErrorKind::InvalidAnswer, "{err}");
        assert!(err.message.contains("100"), "{err}");
        self.still_serves();

        let m = self.host().metrics();
        for kind in ["timeout", "memory_limit", "trap", "invalid_answer"] {
            assert!(m.failures[kind] >= 1, "{kind}: {m:?}");
        }
    }
}
