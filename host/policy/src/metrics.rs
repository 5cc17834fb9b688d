//! Counters the server exports (Prometheus-friendly: monotonic totals).

use crate::PolicyErrorKind;
use prometheus::{
    Counter, CounterVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Default)]
pub(crate) struct Metrics {
    schedule_calls: AtomicU64,
    schedule_nanos: AtomicU64,
    acceptance_calls: AtomicU64,
    acceptance_nanos: AtomicU64,
    instantiations: AtomicU64,
    instantiate_nanos: AtomicU64,
    warm_hits: AtomicU64,
    warm_built: AtomicU64,
    warm_build_nanos: AtomicU64,
    warm_discarded: AtomicU64,
    failures: [AtomicU64; 7],
}

/// A reading of the policy counters (all totals since the host started).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsSnapshot {
    pub schedule_calls: u64,
    pub schedule_seconds: f64,
    pub acceptance_calls: u64,
    pub acceptance_seconds: f64,
    /// Per-request instances made (schedules + acceptance policies).
    pub instantiations: u64,
    /// Time requests spent getting their instances (taken ready from the
    /// warm pool, or made on the request path).
    pub instantiate_seconds: f64,
    /// Of `instantiations`, those taken ready (made ahead, `warm.rs`).
    #[serde(default)]
    pub warm_hits: u64,
    /// Instances made ahead, and the CPU time that took (the warm-up
    /// thread's, off the request path: what the pool costs).
    #[serde(default)]
    pub warm_built: u64,
    #[serde(default)]
    pub warm_build_seconds: f64,
    /// Instances made ahead and dropped unused: stale (the schedule's
    /// carried state changed) or forgotten.
    #[serde(default)]
    pub warm_discarded: u64,
    /// Instances ready now.
    #[serde(default)]
    pub warm_ready: u64,
    /// Failures by kind (`trap`, `timeout`, `memory_limit`, `invalid_answer`,
    /// `instantiate`, `not_found`, `config`); every kind is present.
    pub failures: BTreeMap<String, u64>,
}

impl MetricsSnapshot {
    /// Adds these counters (`specd_policy_*`) to a Prometheus registry.
    pub fn register(&self, r: &Registry) -> prometheus::Result<()> {
        let calls = IntCounterVec::new(
            Opts::new("specd_policy_calls_total", "Policy calls by interface."),
            &["interface"],
        )?;
        let seconds = CounterVec::new(
            Opts::new(
                "specd_policy_call_seconds_total",
                "Time in policy calls by interface.",
            ),
            &["interface"],
        )?;
        for (interface, n, secs) in [
            ("schedule", self.schedule_calls, self.schedule_seconds),
            ("acceptance", self.acceptance_calls, self.acceptance_seconds),
        ] {
            calls.with_label_values(&[interface]).inc_by(n);
            seconds.with_label_values(&[interface]).inc_by(secs);
        }
        r.register(Box::new(calls))?;
        r.register(Box::new(seconds))?;
        for (name, help, n) in [
            (
                "specd_policy_instantiations_total",
                "Per-request policy instances made.",
                self.instantiations,
            ),
            (
                "specd_policy_warm_hits_total",
                "Per-request instances taken ready (made ahead).",
                self.warm_hits,
            ),
            (
                "specd_policy_warm_built_total",
                "Instances made ahead of requests.",
                self.warm_built,
            ),
            (
                "specd_policy_warm_discarded_total",
                "Instances made ahead and dropped unused (stale or forgotten).",
                self.warm_discarded,
            ),
        ] {
            let c = IntCounter::new(name, help)?;
            c.inc_by(n);
            r.register(Box::new(c))?;
        }
        for (name, help, secs) in [
            (
                "specd_policy_instantiate_seconds_total",
                "Time making per-request policy instances.",
                self.instantiate_seconds,
            ),
            (
                "specd_policy_warm_build_seconds_total",
                "CPU time making instances ahead of requests (off the request path).",
                self.warm_build_seconds,
            ),
        ] {
            let c = Counter::new(name, help)?;
            c.inc_by(secs);
            r.register(Box::new(c))?;
        }
        let warm_ready = IntGauge::new("specd_policy_warm_ready", "Instances ready now.")?;
        warm_ready.set(self.warm_ready.min(i64::MAX as u64) as i64);
        r.register(Box::new(warm_ready))?;
        let failures = IntCounterVec::new(
            Opts::new("specd_policy_failures_total", "Policy failures by kind."),
            &["kind"],
        )?;
        for (kind, n) in &self.failures {
            failures.with_label_values(&[kind]).inc_by(*n);
        }
        r.register(Box::new(failures))
    }

    /// The Prometheus text of these counters alone.
    pub fn prometheus(&self) -> prometheus::Result<String> {
        let r = Registry::new();
        self.register(&r)?;
        TextEncoder::new().encode_to_string(&r.gather())
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

impl Metrics {
    pub fn schedule_call(&self, d: Duration) {
        self.schedule_calls.fetch_add(1, Relaxed);
        self.schedule_nanos.fetch_add(nanos(d), Relaxed);
    }
    pub fn acceptance_call(&self, d: Duration) {
        self.acceptance_calls.fetch_add(1, Relaxed);
        self.acceptance_nanos.fetch_add(nanos(d), Relaxed);
    }
    pub fn instantiated(&self, d: Duration) {
        self.instantiations.fetch_add(1, Relaxed);
        self.instantiate_nanos.fetch_add(nanos(d), Relaxed);
    }
    pub fn warm_hit(&self) {
        self.warm_hits.fetch_add(1, Relaxed);
    }
    pub fn warm_built(&self, d: Duration) {
        self.warm_built.fetch_add(1, Relaxed);
        self.warm_build_nanos.fetch_add(nanos(d), Relaxed);
    }
    pub fn warm_discarded(&self) {
        self.warm_discarded.fetch_add(1, Relaxed);
    }
    pub fn failure(&self, kind: PolicyErrorKind) {
        self.failures[kind.index()].fetch_add(1, Relaxed);
    }
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            schedule_calls: self.schedule_calls.load(Relaxed),
            schedule_seconds: self.schedule_nanos.load(Relaxed) as f64 * 1e-9,
            acceptance_calls: self.acceptance_calls.load(Relaxed),
            acceptance_seconds: self.acceptance_nanos.load(Relaxed) as f64 * 1e-9,
            instantiations: self.instantiations.load(Relaxed),
            instantiate_seconds: self.instantiate_nanos.load(Relaxed) as f64 * 1e-9,
            warm_hits: self.warm_hits.load(Relaxed),
            warm_built: self.warm_built.load(Relaxed),
            warm_build_seconds: self.warm_build_nanos.load(Relaxed) as f64 * 1e-9,
            warm_discarded: self.warm_discarded.load(Relaxed),
            warm_ready: 0,
            failures: PolicyErrorKind::ALL
                .iter()
                .map(|k| {
                    (
                        k.as_str().to_string(),
                        self.failures[k.index()].load(Relaxed),
                    )
                })
                .collect(),
        }
    }
}
