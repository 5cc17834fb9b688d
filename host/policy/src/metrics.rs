//! Counters the server exports (Prometheus-friendly: monotonic totals).

use crate::PolicyErrorKind;
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
    pub instantiate_seconds: f64,
    /// Failures by kind (`trap`, `timeout`, `memory_limit`, `invalid_answer`,
    /// `instantiate`, `not_found`, `config`); every kind is present.
    pub failures: BTreeMap<String, u64>,
}

impl MetricsSnapshot {
    /// Prometheus text exposition lines (`specd_policy_*`).
    pub fn prometheus(&self) -> String {
        let mut s = String::new();
        s.push_str("# TYPE specd_policy_calls_total counter\n");
        s.push_str(&format!(
            "specd_policy_calls_total{{interface=\"schedule\"}} {}\n",
            self.schedule_calls
        ));
        s.push_str(&format!(
            "specd_policy_calls_total{{interface=\"acceptance\"}} {}\n",
            self.acceptance_calls
        ));
        s.push_str("# TYPE specd_policy_call_seconds_total counter\n");
        s.push_str(&format!(
            "specd_policy_call_seconds_total{{interface=\"schedule\"}} {}\n",
            self.schedule_seconds
        ));
        s.push_str(&format!(
            "specd_policy_call_seconds_total{{interface=\"acceptance\"}} {}\n",
            self.acceptance_seconds
        ));
        s.push_str("# TYPE specd_policy_instantiations_total counter\n");
        s.push_str(&format!(
            "specd_policy_instantiations_total {}\n",
            self.instantiations
        ));
        s.push_str("# TYPE specd_policy_instantiate_seconds_total counter\n");
        s.push_str(&format!(
            "specd_policy_instantiate_seconds_total {}\n",
            self.instantiate_seconds
        ));
        s.push_str("# TYPE specd_policy_failures_total counter\n");
        for (k, v) in &self.failures {
            s.push_str(&format!(
                "specd_policy_failures_total{{kind=\"{k}\"}} {v}\n"
            ));
        }
        s
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
