//! `specd serve`: Ollama- and OpenAI-compatible HTTP APIs over one
//! [`Engine`](crate::engine::Engine), with the speculation policy chosen per
//! request.
//!
//! Threads: the tokio runtime serves HTTP; one dedicated worker thread owns
//! the engine (all MLX work) and runs the continuous-batching scheduler
//! ([`crate::scheduler`]) over requests from a bounded queue ([`worker`]):
//! every running request's rows go through one forward a step. A request's text streams from the worker's sink
//! through a channel into the HTTP response; a closed channel (the client went
//! away) makes the sink return false, which ends generation at once.
mod access;
mod api;
mod batch_metrics;
mod config;
mod error;
mod fields;
mod lifecycle;
mod metrics;
mod ollama;
mod openai;
mod policies;
mod prompts;
mod responses;
mod shared;
mod stream;
mod tokenize;
mod tools;
mod ui;
mod validation;
mod worker;

pub use config::{ServeArgs, ServerConfig};

use crate::options::SpecOptions;
use anyhow::{Context, Result};
use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post};
use axum::Router;
use metrics::ServerMetrics;
use specd_policy::PolicyHost;
use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use worker::{ModelInfo, WorkerHandle};

/// What every handler shares.
pub struct AppState {
    pub model: ModelInfo,
    pub worker: WorkerHandle,
    pub policies: Arc<PolicyHost>,
    /// Where uploaded policies are persisted.
    pub policy_dir: PathBuf,
    pub defaults: SpecOptions,
    pub metrics: Arc<ServerMetrics>,
    pub started: std::time::SystemTime,
    /// Keys and who may change the registry.
    pub access: access::Access,
    pub limits: config::Limits,
    /// `--greedy-default`: requests without sampling fields decode greedily.
    pub greedy_default: bool,
    /// `--logprobs-mode`: which distribution `logprobs` describe.
    pub logprobs_mode: crate::sampling::LogprobMode,
    /// Who uploaded each user policy, and when (by name).
    pub uploads: Mutex<BTreeMap<String, policies::UploadRecord>>,
    /// Uploads read and compiled at once.
    pub upload_slots: Arc<tokio::sync::Semaphore>,
    /// Loading, ready or draining (`/health`).
    pub life: Arc<lifecycle::Lifecycle>,
    /// The registry replicas share (`--policy-store`), if any.
    pub store: Option<Arc<specd_policy::PolicyStore>>,
    /// Stored `/v1/responses` answers (`--responses-history`).
    pub responses: responses::History,
}

pub type State = Arc<AppState>;

impl AppState {
    /// Whether `name` names the served model (its name as `--model` gave
    /// it, or `default`), Ollama's implicit `:latest` tag said or not on
    /// either side.
    pub fn is_served(&self, name: &str) -> bool {
        let bare = |n: &'_ str| n.strip_suffix(":latest").unwrap_or(n).to_string();
        let n = bare(name);
        n == bare(&self.model.name) || n == "default"
    }

    /// The model a request names, if this server serves it (both APIs
    /// require one).
    pub fn served_model(&self, model: &Option<String>) -> Result<String, api::ApiError> {
        match model.as_deref() {
            None | Some("") => Err(api::ApiError::bad("model is required")),
            Some(m) if self.is_served(m) => Ok(m.to_string()),
            Some(m) => Err(api::ApiError::model_not_found(m)),
        }
    }

    /// What a request of `api` that leaves sampling fields out gets.
    pub fn sampling_defaults(&self, api: api::Flavor) -> api::SamplingDefaults {
        api::SamplingDefaults::of(api, self.greedy_default)
    }
}

/// The HTTP routes.
pub fn router(state: State) -> Router {
    let body_limit = state.limits.max_body_bytes;
    Router::new()
        .route("/", get(|| async { "specd is running" }))
        .route("/health", get(api::health))
        .route("/ui", get(ui::page))
        .route("/metrics", get(api::metrics))
        .route("/api/version", get(api::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/generate", post(ollama::generate))
        .route("/api/chat", post(ollama::chat))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{model}", get(openai::model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::get))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        // The upload reads its body itself, under its own limit.
        .route("/api/policies", get(policies::list).post(policies::upload))
        .route("/api/policies/{name}", delete(policies::remove))
        .fallback(api::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .with_state(state)
}

/// Runs the server until SIGINT/SIGTERM, then drains.
pub fn run(
    args: ServeArgs,
    load: crate::load::Load,
    ranks: Option<Arc<crate::ranks::Joined>>,
) -> Result<()> {
    let mut cfg = ServerConfig::from_args(&args)?;
    (cfg.weights, cfg.switches) = (load.weights, load.switches);
    cfg.ranks = ranks.clone();
    let policies =
        Arc::new(PolicyHost::new(cfg.policy_limits.clone()).context("starting the policy host")?);
    std::fs::create_dir_all(&cfg.policy_dir)
        .with_context(|| format!("creating the policy dir {}", cfg.policy_dir.display()))?;
    let loaded = policies
        .add_dir(&cfg.policy_dir)
        .with_context(|| format!("loading policies from {}", cfg.policy_dir.display()))?;
    if !loaded.is_empty() {
        eprintln!(
            "loaded {} polic{} from {}: {}",
            loaded.len(),
            if loaded.len() == 1 { "y" } else { "ies" },
            cfg.policy_dir.display(),
            loaded
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let uploads = policies::load_records(&cfg.policy_dir, &policies.list());
    let store = match &cfg.policy_store {
        Some(dir) => {
            let store = Arc::new(specd_policy::PolicyStore::open(dir)?);
            shared::spawn(store.clone(), policies.clone());
            eprintln!("policy store (shared): {}", dir.display());
            Some(store)
        }
        None => None,
    };
    let metrics = Arc::new(ServerMetrics::default());
    let life = Arc::new(lifecycle::Lifecycle::default());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("specd-http")
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        use axum::serve::ListenerExt;
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            // Streamed chunks are small: don't let Nagle hold them back.
            let _ = tcp.set_nodelay(true);
        });
        // HTTP answers from the start (`/health` 503 while the model
        // loads); the full routes take over once it is ready.
        let ready = Arc::new(std::sync::OnceLock::new());
        let app = lifecycle::outer(ready.clone(), life.clone(), cfg.model.clone());
        let drain = Duration::from_secs(cfg.drain_seconds);
        let server = tokio::spawn(
            axum::serve(listener, app)
                .with_graceful_shutdown(lifecycle::drained(life.clone(), metrics.clone(), drain))
                .into_future(),
        );
        eprintln!("specd {} loading {} on http://{local}", env!("CARGO_PKG_VERSION"), cfg.model);
        let (worker, model) = {
            let (cfg, policies, metrics, life) =
                (cfg.clone(), policies.clone(), metrics.clone(), life.clone());
            tokio::task::spawn_blocking(move || worker::start(&cfg, policies, metrics, life))
                .await
                .context("the loading thread")??
        };
        let access = access::Access::new(&cfg.access, local.ip().is_loopback(), &local.to_string());
        let state = Arc::new(AppState {
            model,
            worker,
            policies,
            policy_dir: cfg.policy_dir.clone(),
            defaults: cfg.defaults.clone(),
            metrics,
            started: std::time::SystemTime::now(),
            access,
            upload_slots: Arc::new(tokio::sync::Semaphore::new(cfg.limits.max_concurrent_uploads)),
            limits: cfg.limits.clone(),
            greedy_default: cfg.greedy_default,
            logprobs_mode: cfg.logprobs_mode,
            uploads: Mutex::new(uploads),
            life: life.clone(),
            store,
            responses: responses::History::new(cfg.responses_history),
        });
        eprintln!(
            "specd {} serving {} on http://{local} (queue {}, policies in {})",
            env!("CARGO_PKG_VERSION"),
            state.model.name,
            cfg.queue,
            cfg.policy_dir.display()
        );
        for line in state.access.describe() {
            eprintln!("  {line}");
        }
        if !local.ip().is_loopback() {
            eprintln!(
                "  note: {local} is reachable from other machines; keys travel in plain HTTP unless a TLS-terminating proxy is in front (see docs/serving.md, \"On a network\")"
            );
        }
        if let access::RegistryMode::ReadOnly(why) = &state.access.registry {
            tracing::warn!("the policy registry is read-only: {why}");
        }
        let _ = ready.set(router(state));
        // A signal that came while loading leaves it draining.
        if life.phase() == lifecycle::Phase::Loading {
            life.set(lifecycle::Phase::Ready);
        }
        let served = server.await;
        // Drained: pipeline ranks after 0 exit with this one.
        if let Some(j) = &ranks {
            j.finish();
        }
        served.context("the HTTP server task")?.context("serving HTTP")
    })
}
