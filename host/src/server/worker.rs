//! The generation worker: one thread owns the engine and runs the
//! continuous-batching scheduler ([`crate::scheduler`]) over requests from a
//! bounded queue.
use super::config::ServerConfig;
use super::lifecycle::Lifecycle;
use super::metrics::ServerMetrics;
use super::validation::{Checked, Validator};
use crate::engine::Engine;
use crate::sampling::SamplingParams;
use crate::scheduler::{Admitted, Scheduler};
use crate::sequence::Finished;
use crate::sequence::Stats;
use anyhow::{anyhow, Context, Result};
use axum::http::StatusCode;
use serde::Serialize;
use specd_policy::PolicyHost;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// A token as the APIs show it in logprobs: its text (lossy where it holds
/// part of a character), its bytes, its logprob.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenAlt {
    pub id: u32,
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// One emitted token's logprob and the top alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobEntry {
    pub chosen: TokenAlt,
    pub top: Vec<TokenAlt>,
}

impl LogprobEntry {
    fn new(t: &crate::sampling::TokenLogprob, tok: &specd_text::Tokenizer) -> Self {
        let alt = |id: u32, logprob: f32| {
            let bytes = tok.token_bytes(id);
            TokenAlt {
                id,
                text: String::from_utf8_lossy(&bytes).into_owned(),
                bytes,
                logprob,
            }
        };
        LogprobEntry {
            chosen: alt(t.token, t.logprob),
            top: t.top.iter().map(|&(id, lp)| alt(id, lp)).collect(),
        }
    }
}

/// What the worker tells the HTTP side, in order: `Started` or `Error`
/// first; then `Chunk`s; then `Done` or `Failed`.
#[derive(Debug)]
pub enum Msg {
    Started {
        prompt_tokens: usize,
        /// From submission to the worker picking it up.
        queued: Duration,
    },
    /// The request was refused before generation started.
    Error {
        status: StatusCode,
        message: String,
    },
    Chunk(String),
    /// The next emitted token's logprobs (before the text it is part of).
    Logprobs(LogprobEntry),
    /// The prompt's logprobs (completions' `echo`), right after `Started`.
    PromptLogprobs(Vec<LogprobEntry>),
    /// A round's trace, as it ends (when `trace_rounds`).
    Rounds(Vec<crate::speculation::RoundTrace>),
    Done {
        stats: Box<Stats>,
        /// Prompt + committed tokens.
        log: Vec<u32>,
    },
    /// Generation failed after it started.
    Failed(String),
}

struct Job {
    /// Checked before the queue ([`super::validation`]).
    req: Checked,
    reply: UnboundedSender<Msg>,
    submitted: Instant,
    /// Jobs of the same HTTP request queued right behind this one (a
    /// completions request's prompts): admitted with it, in one step.
    following: usize,
}

/// How long the worker waits for the rest of a group it has begun to
/// admit (they are queued back to back; longer only if one was refused).
const GROUP_WAIT: Duration = Duration::from_millis(50);

/// The served model as the HTTP side describes it.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub name: String,
    pub path: String,
    pub format: String,
    pub size_bytes: u64,
    pub digest: String,
    /// GGUF `general.architecture` or config.json's `model_type`.
    pub architecture: String,
    /// `Q4_1`, `4-bit`, `F32`, ... ([`crate::model_files`]).
    pub quantization: String,
    pub context_length: usize,
    pub vocab_size: usize,
    pub layers: usize,
    pub hidden_size: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub parameters: u64,
    pub draft_models: Vec<String>,
    pub template: String,
    /// How the model writes tool calls; `None`: its template renders no tools.
    #[serde(skip)]
    pub tool_format: Option<specd_text::ToolFormat>,
}

/// The HTTP side's end of the queue.
pub struct WorkerHandle {
    tx: SyncSender<Job>,
    metrics: Arc<ServerMetrics>,
    life: Arc<Lifecycle>,
    validator: Arc<Validator>,
}

/// Why a request could not be queued.
pub enum SubmitError {
    /// The queue is full (503 + Retry-After).
    Busy,
    /// The server is draining (503 + Retry-After: another replica).
    Draining,
    /// The worker is gone (500).
    Stopped,
}

impl WorkerHandle {
    /// What requests are checked against before they are queued.
    pub fn validator(&self) -> Arc<Validator> {
        self.validator.clone()
    }

    /// Counts a request refused before the queue (`specd_requests_refused`).
    pub fn refused(&self) {
        self.metrics.refused.fetch_add(1, Relaxed);
    }

    /// Queues requests (each receiver yields [`Msg`]s; dropping it
    /// cancels) that must start together (one HTTP request's
    /// prompts): the worker admits them at the same step boundary, room
    /// allowing. A refusal of one leaves the ones queued before it queued
    /// (dropping their receivers cancels them).
    pub fn submit_group(
        &self,
        reqs: Vec<Checked>,
    ) -> Result<Vec<UnboundedReceiver<Msg>>, SubmitError> {
        let n = reqs.len();
        reqs.into_iter()
            .enumerate()
            .map(|(i, r)| self.submit_one(r, n - 1 - i))
            .collect()
    }

    fn submit_one(
        &self,
        req: Checked,
        following: usize,
    ) -> Result<UnboundedReceiver<Msg>, SubmitError> {
        if self.life.draining() {
            return Err(SubmitError::Draining);
        }
        let (reply, rx) = unbounded_channel();
        let job = Job {
            req,
            reply,
            submitted: Instant::now(),
            following,
        };
        self.metrics.queued.fetch_add(1, Relaxed);
        match self.tx.try_send(job) {
            Ok(()) => Ok(rx),
            Err(e) => {
                self.metrics.queued.fetch_sub(1, Relaxed);
                match e {
                    TrySendError::Full(_) => {
                        self.metrics.rejected_busy.fetch_add(1, Relaxed);
                        Err(SubmitError::Busy)
                    }
                    TrySendError::Disconnected(_) => Err(SubmitError::Stopped),
                }
            }
        }
    }
}

fn load(cfg: &ServerConfig, policies: Arc<PolicyHost>) -> Result<(Engine, ModelInfo)> {
    let store = crate::store::Store::default();
    let path = store.resolve(&cfg.model, false)?;
    let (weights, switches, ranks) = (cfg.weights, cfg.switches, cfg.ranks.clone());
    let mut engine = Engine::load_on(&cfg.model, &path, policies, weights, switches, ranks)
        .with_context(|| format!("loading model {}", cfg.model))?;
    for (name, p) in &cfg.draft_models {
        let dp = store.resolve(p, false)?;
        engine.add_draft_model(name, &dp)?;
    }
    for (name, p) in &cfg.draft_heads {
        engine.add_draft_head(name, std::path::Path::new(p))?;
    }
    // The server defaults must name things that exist.
    engine
        .speculation(&cfg.defaults, &SamplingParams::default())
        .context("the default speculation settings")?;
    let c = &engine.model.config;
    let parameters = (c.vocab_size * c.hidden_size
        + c.num_hidden_layers
            * (c.hidden_size
                * c.head_dim
                * (c.num_attention_heads * 2 + c.num_key_value_heads * 2)
                + 3 * c.hidden_size * c.intermediate_size)) as u64;
    let mut draft_models: Vec<String> = engine.drafts.keys().cloned().collect();
    draft_models.sort();
    let described = crate::model_files::describe(&path);
    let info = ModelInfo {
        name: engine.name.clone(),
        path: path.display().to_string(),
        format: match engine.format {
            crate::model::ModelFormat::Gguf => "gguf".into(),
            crate::model::ModelFormat::HfDir => "safetensors".into(),
        },
        size_bytes: described.size,
        digest: store.digest(&cfg.model, &path).unwrap_or_default(),
        architecture: described.architecture,
        quantization: described.quantization,
        context_length: engine.context_length(),
        vocab_size: c.vocab_size,
        layers: c.num_hidden_layers,
        hidden_size: c.hidden_size,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        parameters,
        draft_models,
        template: engine.template.source().to_string(),
        tool_format: engine.template.tool_format(),
    };
    Ok((engine, info))
}

/// Starts the worker thread and loads the model on it (the engine never
/// leaves that thread). Returns once the model is ready.
pub fn start(
    cfg: &ServerConfig,
    policies: Arc<PolicyHost>,
    metrics: Arc<ServerMetrics>,
    life: Arc<Lifecycle>,
) -> Result<(WorkerHandle, ModelInfo)> {
    let (tx, rx) = sync_channel::<Job>(cfg.queue);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(ModelInfo, Validator), String>>();
    let cfg2 = cfg.clone();
    let m = metrics.clone();
    let life2 = life.clone();
    std::thread::Builder::new()
        .name("specd-worker".into())
        .spawn(move || {
            let engine = match load(&cfg2, policies) {
                Ok((e, info)) => {
                    let _ = ready_tx.send(Ok((info, Validator::new(&e, &cfg2))));
                    e
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{e:#}")));
                    return;
                }
            };
            m.kv_budget
                .store(cfg2.batch.kv_budget.unwrap_or(0) as u64, Relaxed);
            m.kv_bytes_per_token
                .store(engine.model.kv_bytes_per_token() as u64, Relaxed);
            if let Some(j) = &engine.ranks {
                let life = life2.clone();
                j.exit_when_broken(move || life.mark_rank_lost());
            }
            schedule(&engine, &rx, &m, &cfg2, &life2);
            if let Some(j) = &engine.ranks {
                j.finish();
            }
        })
        .context("starting the worker thread")?;
    let (info, validator) = ready_rx
        .recv()
        .map_err(|_| anyhow!("the worker thread died while loading the model"))?
        .map_err(|e| anyhow!(e))?;
    let validator = Arc::new(validator);
    Ok((
        WorkerHandle {
            tx,
            metrics,
            life,
            validator,
        },
        info,
    ))
}

/// The scheduler loop: admits queued requests at each step boundary (while
/// there is room), runs a step over every running one, until the queue's
/// senders are gone and nothing runs.
fn schedule(
    engine: &Engine,
    rx: &Receiver<Job>,
    m: &Arc<ServerMetrics>,
    cfg: &ServerConfig,
    life: &Lifecycle,
) {
    let mut sched = Scheduler::new(engine, cfg.batch);
    let mut open = true;
    loop {
        if life.aborting() {
            // The drain deadline: what is queued is refused, what runs
            // ends with an error event (never a cut stream).
            while let Ok(job) = rx.try_recv() {
                m.queued.fetch_sub(1, Relaxed);
                let _ = job.reply.send(Msg::Error {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    message: DRAINED.into(),
                });
            }
            if !sched.is_idle() {
                sched.fail_all(DRAINED);
            }
        }
        // Jobs still to come of the group being admitted.
        let mut following = 0;
        while open && sched.has_room() {
            let job = if following > 0 {
                match rx.recv_timeout(GROUP_WAIT) {
                    Ok(j) => j,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        following = 0;
                        continue;
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            } else if sched.is_idle() {
                match idle_recv(engine, rx) {
                    Ok(j) => j,
                    Err(_) => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            };
            m.queued.fetch_sub(1, Relaxed);
            following = job.following;
            if let Some(a) = prepare(engine, job, m, cfg) {
                sched.admit(a);
            }
        }
        if sched.is_idle() {
            if !open {
                return;
            }
            continue;
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sched.step(&mut || m.queued.load(Relaxed) == 0)
        }));
        if let Ok(step) = &r {
            m.batch.preemptions.inc_by(step.preempted as u64);
            if step.sequences > 0 {
                m.batch.batch_size.observe(step.sequences as f64);
                m.batch.step_seconds.observe(step.seconds);
                if !step.overlapped {
                    m.batch.step_policy_seconds.observe(step.policy_seconds);
                }
            }
        }
        if r.is_err() {
            m.panics.fetch_add(1, Relaxed);
            sched.fail_all("internal error (the worker panicked)");
        }
        m.batch_waiting.store(sched.waiting() as u64, Relaxed);
        m.kv_bytes.store(sched.kv_bytes() as u64, Relaxed);
    }
}

/// The next job, waiting as long as it takes; on rank 0 of a pipeline,
/// the engine's idle tick every second meanwhile, so a lost rank is found
/// while idle too.
fn idle_recv(engine: &Engine, rx: &Receiver<Job>) -> Result<Job, std::sync::mpsc::RecvError> {
    if !engine.pipelined() {
        return rx.recv();
    }
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(j) => return Ok(j),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(std::sync::mpsc::RecvError)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = engine.idle_tick() {
                    tracing::error!("{e:#}");
                }
            }
        }
    }
}

/// What requests still running at the drain deadline are told.
const DRAINED: &str =
    "the server is shutting down and its drain deadline passed before this request finished";

/// Checks a queued request and builds what it runs with; `None` when it was
/// refused (the client got its 400) or its client left.
fn prepare<'e>(
    engine: &'e Engine,
    job: Job,
    m: &Arc<ServerMetrics>,
    cfg: &'e ServerConfig,
) -> Option<Admitted<'e>> {
    let record = cfg.record.as_deref();
    let Job {
        req,
        reply,
        submitted,
        ..
    } = job;
    if reply.is_closed() {
        // The client left while queued.
        m.cancelled.fetch_add(1, Relaxed);
        return None;
    }
    let refuse = |message: String| {
        m.refused.fetch_add(1, Relaxed);
        let _ = reply.send(Msg::Error {
            status: StatusCode::BAD_REQUEST,
            message,
        });
        None
    };
    // Encoded, held to the limits and its grammar built before the queue:
    // what is left is what only the engine resolves (policies, draft
    // models by name).
    let Checked {
        req,
        prompt,
        constraint,
    } = req;
    let crate::engine::Prepared { mut settings, spec } = match engine.prepare(&req) {
        Ok(p) => p,
        Err(e) => return refuse(format!("{e:#}")),
    };
    settings.record |= record.is_some();
    settings.constraint = constraint.map(crate::sampling::SharedConstraint::new);
    if req.trace_rounds {
        // Each round goes out as it ends, so a client can plot it live.
        let tx = reply.clone();
        settings.on_round = Some(crate::sequence::RoundHook(Arc::new(move |r| {
            let _ = tx.send(Msg::Rounds(vec![r.clone()]));
        })));
    }
    if let Some(lr) = req.logprobs {
        let (tx, tok) = (reply.clone(), engine.tokenizer.clone());
        let hook = crate::sequence::LogprobHook(Arc::new(move |t| {
            let _ = tx.send(Msg::Logprobs(LogprobEntry::new(t, &tok)));
        }));
        settings.logprobs = Some((lr, hook));
        if req.prompt_logprobs {
            // Built from the request's prefill chunks as they run in the
            // batched steps; sent once the prefill is over.
            let (tx, tok) = (reply.clone(), engine.tokenizer.clone());
            settings.prompt_logprobs =
                Some(crate::sequence::PromptLogprobHook(Arc::new(move |v| {
                    let v = v.iter().map(|t| LogprobEntry::new(t, &tok)).collect();
                    let _ = tx.send(Msg::PromptLogprobs(v));
                })));
        }
    }
    if reply
        .send(Msg::Started {
            prompt_tokens: prompt.len(),
            queued: submitted.elapsed(),
        })
        .is_err()
    {
        m.cancelled.fetch_add(1, Relaxed);
        return None;
    }
    m.batch
        .queue_wait_seconds
        .observe(submitted.elapsed().as_secs_f64());
    let chunks = reply.clone();
    let timing = m.clone();
    let mut last: Option<Instant> = None;
    let sink = Box::new(move |s: &str| {
        if s.is_empty() {
            // The cancellation probe.
            return !chunks.is_closed();
        }
        let now = Instant::now();
        match last {
            None => timing
                .batch
                .time_to_first_token_seconds
                .observe((now - submitted).as_secs_f64()),
            Some(t) => timing
                .batch
                .inter_token_seconds
                .observe((now - t).as_secs_f64()),
        }
        last = Some(now);
        chunks.send(Msg::Chunk(s.to_string())).is_ok()
    });
    m.running.fetch_add(1, Relaxed);
    let metrics = m.clone();
    // What a trace's header needs, kept only where the server records.
    let traced = record.map(|p| (p, settings.clone(), req.spec.clone()));
    let done = Box::new(move |result: Result<Finished>| {
        metrics.running.fetch_sub(1, Relaxed);
        match result {
            Ok(fin) => {
                metrics.record(&fin.stats);
                if let Some((p, settings, spec)) = &traced {
                    if let Err(e) = crate::trace::write(p, engine, settings, spec, &fin) {
                        tracing::warn!("writing trace {}: {e:#}", p.display());
                    }
                }
                let log = fin.context().to_vec();
                let _ = reply.send(Msg::Done {
                    stats: Box::new(fin.stats),
                    log,
                });
            }
            Err(e) => {
                metrics.failed.fetch_add(1, Relaxed);
                tracing::warn!("generation failed: {e:#}");
                let _ = reply.send(Msg::Failed(format!("{e:#}")));
            }
        }
    });
    Some(Admitted {
        tenant: Some(req.tenant),
        prompt,
        settings,
        spec,
        sink,
        done,
    })
}
