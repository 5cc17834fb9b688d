//! Server counters and the Prometheus text of `/metrics`.
use super::State;
use crate::pipeline::{DoneReason, Stats};
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

#[derive(Default)]
pub struct ServerMetrics {
    /// HTTP requests by (route, status).
    http: Mutex<BTreeMap<(String, u16), u64>>,
    /// Requests waiting in the queue (gauge).
    pub queued: AtomicU64,
    /// Requests generating now (gauge).
    pub running: AtomicU64,
    /// Policy uploads being read or compiled now (gauge).
    pub uploads_in_flight: AtomicU64,
    /// Uploads refused because `max_concurrent_uploads` were in flight.
    pub uploads_refused_busy: AtomicU64,
    pub rejected_busy: AtomicU64,
    /// Refused by the worker before generation (bad prompt, unknown policy...).
    pub refused: AtomicU64,
    /// Left while queued or during generation.
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub panics: AtomicU64,
    /// Finished generations by done reason.
    pub done_stop: AtomicU64,
    pub done_length: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prompt_nanos: AtomicU64,
    pub decode_nanos: AtomicU64,
    pub rounds: AtomicU64,
    pub drafted: AtomicU64,
    pub accepted: AtomicU64,
    pub draft_nanos: AtomicU64,
    pub verify_nanos: AtomicU64,
    pub policy_nanos: AtomicU64,
    /// Requests whose speculation a policy failure ended, by kind.
    policy_failures: Mutex<BTreeMap<String, u64>>,
}

fn nanos(s: f64) -> u64 {
    (s.max(0.0) * 1e9) as u64
}

impl ServerMetrics {
    /// Counts one finished generation.
    pub fn record(&self, s: &Stats) {
        match s.done_reason {
            DoneReason::Stop => &self.done_stop,
            DoneReason::Length => &self.done_length,
            DoneReason::Cancelled => &self.cancelled,
        }
        .fetch_add(1, Relaxed);
        self.prompt_tokens
            .fetch_add(s.prompt_tokens as u64, Relaxed);
        self.cached_tokens
            .fetch_add(s.cached_tokens as u64, Relaxed);
        self.generated_tokens
            .fetch_add(s.generated_tokens as u64, Relaxed);
        self.prompt_nanos
            .fetch_add(nanos(s.prompt_seconds), Relaxed);
        self.decode_nanos
            .fetch_add(nanos(s.decode_seconds), Relaxed);
        self.rounds.fetch_add(s.rounds, Relaxed);
        self.drafted.fetch_add(s.drafted, Relaxed);
        self.accepted.fetch_add(s.accepted, Relaxed);
        self.draft_nanos.fetch_add(nanos(s.draft_seconds), Relaxed);
        self.verify_nanos
            .fetch_add(nanos(s.verify_seconds), Relaxed);
        self.policy_nanos
            .fetch_add(nanos(s.policy_seconds), Relaxed);
        if let Some(f) = &s.policy_failure {
            *self
                .policy_failures
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(f.kind.clone())
                .or_default() += 1;
        }
    }

    fn http_request(&self, route: String, status: u16) {
        *self
            .http
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((route, status))
            .or_default() += 1;
    }

    /// The Prometheus text exposition (server counters + the policy host's).
    pub fn prometheus(&self, policy: &specd_policy::MetricsSnapshot, model: &str) -> String {
        let mut s = String::new();
        let counter = |s: &mut String, name: &str, help: &str, v: String| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let secs = |a: &AtomicU64| format!("{}", a.load(Relaxed) as f64 / 1e9);
        let n = |a: &AtomicU64| a.load(Relaxed).to_string();
        let _ = writeln!(
            s,
            "# HELP specd_model_info The served model.\n# TYPE specd_model_info gauge\nspecd_model_info{{model=\"{model}\"}} 1"
        );
        let _ = writeln!(
            s,
            "# HELP specd_http_requests_total HTTP requests by route and status.\n# TYPE specd_http_requests_total counter"
        );
        for ((route, status), v) in self
            .http
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            let _ = writeln!(
                s,
                "specd_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {v}"
            );
        }
        let _ = writeln!(
            s,
            "# HELP specd_queue_depth Requests waiting for the worker.\n# TYPE specd_queue_depth gauge\nspecd_queue_depth {}",
            n(&self.queued)
        );
        let _ = writeln!(
            s,
            "# HELP specd_running Requests generating now.\n# TYPE specd_running gauge\nspecd_running {}",
            n(&self.running)
        );
        let _ = writeln!(
            s,
            "# HELP specd_policy_uploads_in_flight Policy uploads being read or compiled.\n# TYPE specd_policy_uploads_in_flight gauge\nspecd_policy_uploads_in_flight {}",
            n(&self.uploads_in_flight)
        );
        counter(
            &mut s,
            "specd_policy_uploads_busy_total",
            "Policy uploads refused (429) because the most allowed at once were in flight.",
            n(&self.uploads_refused_busy),
        );
        let _ = writeln!(
            s,
            "# HELP specd_generations_total Generation requests by outcome.\n# TYPE specd_generations_total counter"
        );
        for (outcome, a) in [
            ("stop", &self.done_stop),
            ("length", &self.done_length),
            ("cancelled", &self.cancelled),
            ("refused", &self.refused),
            ("busy", &self.rejected_busy),
            ("failed", &self.failed),
            ("panic", &self.panics),
        ] {
            let _ = writeln!(
                s,
                "specd_generations_total{{outcome=\"{outcome}\"}} {}",
                n(a)
            );
        }
        counter(
            &mut s,
            "specd_prompt_tokens_total",
            "Prompt tokens processed.",
            n(&self.prompt_tokens),
        );
        counter(
            &mut s,
            "specd_prompt_cached_tokens_total",
            "Prompt tokens served from the prefix cache.",
            n(&self.cached_tokens),
        );
        counter(
            &mut s,
            "specd_generated_tokens_total",
            "Tokens generated.",
            n(&self.generated_tokens),
        );
        counter(
            &mut s,
            "specd_prompt_seconds_total",
            "Time spent in prefill.",
            secs(&self.prompt_nanos),
        );
        counter(
            &mut s,
            "specd_decode_seconds_total",
            "Time spent decoding.",
            secs(&self.decode_nanos),
        );
        counter(
            &mut s,
            "specd_speculation_rounds_total",
            "Decode rounds.",
            n(&self.rounds),
        );
        counter(
            &mut s,
            "specd_speculation_drafted_tokens_total",
            "Tokens drafted.",
            n(&self.drafted),
        );
        counter(
            &mut s,
            "specd_speculation_accepted_tokens_total",
            "Drafted tokens accepted.",
            n(&self.accepted),
        );
        counter(
            &mut s,
            "specd_speculation_draft_seconds_total",
            "Time in drafters.",
            secs(&self.draft_nanos),
        );
        counter(
            &mut s,
            "specd_speculation_verify_seconds_total",
            "Time in verify forwards.",
            secs(&self.verify_nanos),
        );
        counter(
            &mut s,
            "specd_speculation_policy_seconds_total",
            "Time in policy calls (per-request view).",
            secs(&self.policy_nanos),
        );
        let _ = writeln!(
            s,
            "# HELP specd_request_policy_failures_total Requests whose speculation a policy failure ended, by kind.\n# TYPE specd_request_policy_failures_total counter"
        );
        for kind in specd_policy::PolicyErrorKind::ALL {
            let v = self
                .policy_failures
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(kind.as_str())
                .copied()
                .unwrap_or(0);
            let _ = writeln!(
                s,
                "specd_request_policy_failures_total{{kind=\"{kind}\"}} {v}"
            );
        }
        s.push_str(&policy.prometheus());
        s
    }
}

/// Middleware: counts every request by matched route and status.
pub async fn track(
    axum::extract::State(state): axum::extract::State<State>,
    req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "other".to_string());
    let resp = next.run(req).await;
    state.metrics.http_request(route, resp.status().as_u16());
    resp
}
