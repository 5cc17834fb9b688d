//! Server counters and the Prometheus text of `/metrics`.
use super::State;
use crate::sequence::{DoneReason, Stats};
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{
    Counter, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

#[derive(Default)]
pub struct ServerMetrics {
    /// HTTP requests by (route, status).
    http: Mutex<BTreeMap<(String, u16), u64>>,
    /// Requests waiting in the queue (gauge).
    pub queued: AtomicU64,
    /// Requests admitted and not finished (gauge): generating, or waiting
    /// inside the batch for KV room.
    pub running: AtomicU64,
    /// Of `running`, those waiting inside the batch (KV room, preempted),
    /// as of the last step.
    pub batch_waiting: AtomicU64,
    /// KV bytes the running requests hold or reserved, as of the last step.
    pub kv_bytes: AtomicU64,
    /// The KV budget (`--kv-budget`) and bytes per token of the served
    /// model, for the utilization gauge and the cache's blocks.
    pub kv_budget: AtomicU64,
    pub kv_bytes_per_token: AtomicU64,
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
    /// Continuous batching's histograms.
    pub batch: super::batch_metrics::BatchMetrics,
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

    /// The Prometheus text of `/metrics`: the server's counters and the
    /// policy host's, read now.
    pub fn prometheus(
        &self,
        policy: &specd_policy::MetricsSnapshot,
        model: &str,
    ) -> prometheus::Result<String> {
        let r = Registry::new();
        let info = IntGaugeVec::new(
            Opts::new("specd_model_info", "The served model."),
            &["model"],
        )?;
        info.with_label_values(&[model]).set(1);
        r.register(Box::new(info))?;
        let http = IntCounterVec::new(
            Opts::new(
                "specd_http_requests_total",
                "HTTP requests by route and status.",
            ),
            &["route", "status"],
        )?;
        for ((route, status), v) in self
            .http
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            http.with_label_values(&[route.as_str(), &status.to_string()])
                .inc_by(*v);
        }
        r.register(Box::new(http))?;
        for (name, help, a) in [
            (
                "specd_queue_depth",
                "Requests waiting for the worker.",
                &self.queued,
            ),
            ("specd_running", "Requests generating now.", &self.running),
            (
                "specd_policy_uploads_in_flight",
                "Policy uploads being read or compiled.",
                &self.uploads_in_flight,
            ),
        ] {
            let g = IntGauge::new(name, help)?;
            g.set(a.load(Relaxed) as i64);
            r.register(Box::new(g))?;
        }
        self.register_load(&r)?;
        let busy = IntCounter::new(
            "specd_policy_uploads_busy_total",
            "Policy uploads refused (429) because the most allowed at once were in flight.",
        )?;
        busy.inc_by(self.uploads_refused_busy.load(Relaxed));
        r.register(Box::new(busy))?;
        let outcomes = IntCounterVec::new(
            Opts::new("specd_generations_total", "Generation requests by outcome."),
            &["outcome"],
        )?;
        for (outcome, a) in [
            ("stop", &self.done_stop),
            ("length", &self.done_length),
            ("cancelled", &self.cancelled),
            ("refused", &self.refused),
            ("busy", &self.rejected_busy),
            ("failed", &self.failed),
            ("panic", &self.panics),
        ] {
            outcomes
                .with_label_values(&[outcome])
                .inc_by(a.load(Relaxed));
        }
        r.register(Box::new(outcomes))?;
        for (name, help, a) in [
            (
                "specd_prompt_tokens_total",
                "Prompt tokens processed.",
                &self.prompt_tokens,
            ),
            (
                "specd_prompt_cached_tokens_total",
                "Prompt tokens served from the prefix cache.",
                &self.cached_tokens,
            ),
            (
                "specd_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
            (
                "specd_speculation_rounds_total",
                "Decode rounds.",
                &self.rounds,
            ),
            (
                "specd_speculation_drafted_tokens_total",
                "Tokens drafted.",
                &self.drafted,
            ),
            (
                "specd_speculation_accepted_tokens_total",
                "Drafted tokens accepted.",
                &self.accepted,
            ),
        ] {
            let c = IntCounter::new(name, help)?;
            c.inc_by(a.load(Relaxed));
            r.register(Box::new(c))?;
        }
        for (name, help, a) in [
            (
                "specd_prompt_seconds_total",
                "Time spent in prefill.",
                &self.prompt_nanos,
            ),
            (
                "specd_decode_seconds_total",
                "Time spent decoding.",
                &self.decode_nanos,
            ),
            (
                "specd_speculation_draft_seconds_total",
                "Time in drafters.",
                &self.draft_nanos,
            ),
            (
                "specd_speculation_verify_seconds_total",
                "Time in verify forwards.",
                &self.verify_nanos,
            ),
            (
                "specd_speculation_policy_seconds_total",
                "Time in policy calls (per-request view).",
                &self.policy_nanos,
            ),
        ] {
            let c = Counter::new(name, help)?;
            c.inc_by(a.load(Relaxed) as f64 / 1e9);
            r.register(Box::new(c))?;
        }
        let failures = IntCounterVec::new(
            Opts::new(
                "specd_request_policy_failures_total",
                "Requests whose speculation a policy failure ended, by kind.",
            ),
            &["kind"],
        )?;
        let counted = self
            .policy_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for kind in specd_policy::PolicyErrorKind::ALL {
            failures
                .with_label_values(&[kind.as_str()])
                .inc_by(counted.get(kind.as_str()).copied().unwrap_or(0));
        }
        r.register(Box::new(failures))?;
        self.batch.register(&r)?;
        policy.register(&r)?;
        TextEncoder::new().encode_to_string(&r.gather())
    }
}

/// Tokens of KV accounting a cache block stands for: specd has no paged
/// blocks, but routers that score replicas by KV blocks read a block size.
pub const KV_BLOCK_TOKENS: u64 = 16;

impl ServerMetrics {
    /// The load gauges, in the Gateway API Inference Extension's
    /// model-server protocol semantics under specd names (docs/serving.md: "Behind
    /// a router").
    fn register_load(&self, r: &Registry) -> prometheus::Result<()> {
        let waiting = self.queued.load(Relaxed) + self.batch_waiting.load(Relaxed);
        let running = self
            .running
            .load(Relaxed)
            .saturating_sub(self.batch_waiting.load(Relaxed));
        for (name, help, v) in [
            (
                "specd_requests_waiting",
                "Requests waiting to run: queued, or admitted and waiting for KV room.",
                waiting,
            ),
            (
                "specd_requests_running",
                "Requests generating now (in the running batch).",
                running,
            ),
        ] {
            let g = IntGauge::new(name, help)?;
            g.set(v as i64);
            r.register(Box::new(g))?;
        }
        let budget = self.kv_budget.load(Relaxed);
        let used = prometheus::Gauge::new(
            "specd_kv_cache_utilization",
            "KV cache the running requests hold or reserved, as a fraction of the KV budget (0-1).",
        )?;
        if budget > 0 {
            used.set((self.kv_bytes.load(Relaxed) as f64 / budget as f64).min(1.0));
        }
        r.register(Box::new(used))?;
        let per_block = self.kv_bytes_per_token.load(Relaxed) * KV_BLOCK_TOKENS;
        let info = IntGaugeVec::new(
            Opts::new(
                "specd_kv_cache_info",
                "The KV cache's size in blocks of block_size tokens (accounting blocks: specd does not page).",
            ),
            &["block_size", "num_gpu_blocks"],
        )?;
        let blocks = budget.checked_div(per_block).unwrap_or(0);
        info.with_label_values(&[&KV_BLOCK_TOKENS.to_string(), &blocks.to_string()])
            .set(1);
        r.register(Box::new(info))?;
        // Which kernels this process runs, and how many of specd's own ops
        // it has built: 0 throughout on the portable path (`--kernels mlx`).
        let kernels = IntGaugeVec::new(
            Opts::new(
                "specd_kernels_info",
                "Whose kernels run the forward: specd (its CPU kernels) or mlx (MLX's own ops, the GPU builds' path).",
            ),
            &["kernels"],
        )?;
        let name = if specd_mlx::kernels::mlx_ops() {
            "mlx"
        } else {
            "specd"
        };
        kernels.with_label_values(&[name]).set(1);
        r.register(Box::new(kernels))?;
        let own = prometheus::IntGauge::new(
            "specd_own_kernel_ops",
            "Ops of specd's own CPU kernels built since the start (0 on the portable path).",
        )?;
        own.set(specd_mlx::kernels::own_op_count() as i64);
        r.register(Box::new(own))?;
        Ok(())
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
