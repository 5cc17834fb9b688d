//! Where a server is in its life, as routers and probes read it: it answers
//! HTTP while the model loads (`/health` 503, `/livez` 200, `/v1/models`),
//! serves once ready, and on SIGTERM drains: it admits nothing new (a clean
//! 503 + Retry-After), lets what runs finish within `--drain-seconds`, then
//! ends what is left with a final error event and exits 0.
use super::metrics::ServerMetrics;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU8};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The default `--drain-seconds`.
pub const DEFAULT_DRAIN_SECONDS: u64 = 60;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Loading = 0,
    Ready = 1,
    Draining = 2,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::Ready => "ok",
            Phase::Draining => "draining",
        }
    }
}

/// Shared by the HTTP side and the worker.
#[derive(Default)]
pub struct Lifecycle {
    phase: AtomicU8,
    /// Set at the drain deadline: the worker ends every running request
    /// with an error event.
    abort: AtomicBool,
    /// Set once a pipeline rank was lost: nothing more can run (the
    /// process exits soon).
    rank_lost: AtomicBool,
}

impl Lifecycle {
    pub fn phase(&self) -> Phase {
        match self.phase.load(SeqCst) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            _ => Phase::Draining,
        }
    }

    pub fn set(&self, p: Phase) {
        self.phase.store(p as u8, SeqCst);
    }

    pub fn draining(&self) -> bool {
        self.phase() == Phase::Draining
    }

    pub fn mark_rank_lost(&self) {
        self.rank_lost.store(true, SeqCst);
    }

    pub fn rank_lost(&self) -> bool {
        self.rank_lost.load(SeqCst)
    }

    /// Whether the worker must end what runs now (the drain deadline passed).
    pub fn aborting(&self) -> bool {
        self.abort.load(Relaxed)
    }
}

/// `/health` as llama.cpp's and vLLM's servers answer it: 200 when ready,
/// 503 while loading or draining (a router stops sending new requests).
pub fn health_response(life: &Lifecycle, body: serde_json::Value) -> Response {
    // A pipeline rank lost: nothing more can run (the process exits soon).
    let lost = life.rank_lost();
    let status = match life.phase() {
        Phase::Ready if !lost => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    let mut body = body;
    body["status"] = json!(if lost {
        "rank lost"
    } else {
        life.phase().as_str()
    });
    (status, Json(body)).into_response()
}

/// Liveness: 200 while the process is up, whatever its phase (a liveness
/// probe on `/health` would kill a draining replica).
pub async fn livez() -> Json<serde_json::Value> {
    Json(json!({"status": "alive"}))
}

/// The routes that answer before the model is loaded; everything else goes
/// to the full router in `ready` once it is set, and is a 503 + Retry-After
/// until then.
pub fn outer(ready: Arc<OnceLock<Router>>, life: Arc<Lifecycle>, model: String) -> Router {
    let loading = move |req: Request| {
        let (ready, life, model) = (ready.clone(), life.clone(), model.clone());
        async move {
            if let Some(r) = ready.get() {
                use tower::ServiceExt;
                return match r.clone().oneshot(req).await {
                    Ok(resp) => resp,
                    Err(e) => match e {},
                };
            }
            let path = req.uri().path();
            if path == "/health" {
                return health_response(&life, json!({"model": model}));
            }
            if path == "/v1/models" {
                // What a router asks first: the name is known before the
                // weights are in memory.
                return Json(json!({"object": "list", "data": [
                    {"id": model, "object": "model", "created": 0, "owned_by": "specd"}
                ]}))
                .into_response();
            }
            let mut r = (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"error": "the model is loading; retry shortly"})),
            )
                .into_response();
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("2"),
            );
            r
        }
    };
    Router::new().route("/livez", get(livez)).fallback(loading)
}

/// Resolves when the server should stop serving HTTP: at the first SIGTERM
/// or SIGINT it drains (nothing new admitted) until nothing is queued or
/// running, or `drain` passes; then running requests are ended with an
/// error event, which gets a moment to reach the clients. A second signal
/// ends the process at once.
pub async fn drained(life: Arc<Lifecycle>, metrics: Arc<ServerMetrics>, drain: Duration) {
    signal().await;
    life.set(Phase::Draining);
    let busy = || metrics.queued.load(Relaxed) + metrics.running.load(Relaxed);
    eprintln!(
        "draining: {} request(s) queued or running; up to {}s",
        busy(),
        drain.as_secs()
    );
    tokio::spawn(async {
        signal().await;
        eprintln!("second signal: exiting now");
        std::process::exit(0);
    });
    let deadline = Instant::now() + drain;
    while busy() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if busy() > 0 {
        eprintln!("drain deadline: ending {} request(s) with an error", busy());
        life.abort.store(true, SeqCst);
        let grace = Instant::now() + Duration::from_secs(5);
        while busy() > 0 && Instant::now() < grace {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The error events are queued to the streams: let them go out.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("drained; shutting down");
    // Open connections get a moment to close; then the process ends
    // regardless.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(5));
        std::process::exit(0);
    });
}

async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
