//! Shared HTTP pieces: reading bodies, request options, the small
//! endpoints, and turning the worker's messages into responses. Errors are
//! [`super::error`]'s.
pub use super::error::{from_value, parse_body, ApiError, Flavor};
use super::fields;
use super::worker::{LogprobEntry, Msg, SubmitError, TokenAlt};
use super::State;
use crate::request::{self, ValidatedRequest};
use crate::sampling::{JsonFormat, LogprobRequest, SamplingParams};
use crate::sequence::Stats;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::{Stream, StreamExt};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

/// A handler's body as JSON, every top-level key checked against `table`
/// ([`fields::check`]): the one way a body comes in.
pub fn read_body(
    body: Result<Bytes, BytesRejection>,
    table: &fields::Table,
) -> Result<Value, ApiError> {
    let v: Value = parse_body(body)?;
    fields::check(&v, table, "").map_err(ApiError::field)?;
    Ok(v)
}

/// The fields both APIs share, as sent: read and checked by
/// [`crate::request`].
pub use crate::request::RequestOptions as CommonOptions;

/// A request's speculation in vLLM's shape (its per-request
/// `metrics.speculative_decoding`, vLLM PR #48915), so that clients and
/// dashboards built for vLLM read it: a spec step is a round that verified
/// drafts; `num_spec_tokens` is the most a round could draft
/// (`draft_max`), and the histogram counts steps by drafts accepted.
pub fn vllm_metrics(s: &crate::sequence::Stats) -> Value {
    let steps = s.spec_rounds;
    let mut histogram = s.accepted_histogram.clone();
    histogram.resize(histogram.len().max(s.draft_max + 1), 0);
    let ratio = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    serde_json::json!({"speculative_decoding": {
        "mean_acceptance_length": if steps > 0 { 1.0 + ratio(s.accepted, steps) } else { 0.0 },
        "draft_acceptance_rate": ratio(s.accepted, s.drafted),
        "acceptance_histogram": histogram,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": s.accepted,
        "num_draft_tokens": s.drafted,
        "num_spec_tokens": s.draft_max,
    }})
}

/// What a request that leaves sampling fields out gets.
#[derive(Debug, Clone)]
pub struct SamplingDefaults {
    pub params: SamplingParams,
    /// Draw a fresh seed for a request without one (else `params.seed`).
    pub fresh_seed: bool,
}

impl SamplingDefaults {
    /// The API's documented defaults with a fresh seed per request, or, with
    /// `greedy` (`--greedy-default`), greedy decoding with seed 0 for every
    /// API.
    pub fn of(api: Flavor, greedy: bool) -> Self {
        if greedy {
            return SamplingDefaults {
                params: SamplingParams::default(),
                fresh_seed: false,
            };
        }
        SamplingDefaults {
            params: match api {
                Flavor::Ollama => SamplingParams::ollama_defaults(),
                Flavor::OpenAi => SamplingParams::openai_defaults(),
            },
            fresh_seed: true,
        }
    }
}

impl CommonOptions {
    pub fn params(&self, defaults: &SamplingDefaults) -> Result<SamplingParams, ApiError> {
        Ok(self.sampling(&defaults.params, defaults.fresh_seed)?)
    }

    pub fn spec(
        &self,
        defaults: &crate::options::SpecOptions,
    ) -> Result<crate::options::SpecOptions, ApiError> {
        Ok(self.speculation(defaults)?)
    }
}

/// What a request's `logprobs` (asked or not) and `top_logprobs` (named
/// `top_field`) ask for; the server's `--logprobs-mode` says of which
/// distribution.
pub fn logprob_request(
    state: &State,
    want: bool,
    top: Option<i64>,
    top_field: &str,
) -> Result<Option<LogprobRequest>, ApiError> {
    Ok(request::logprobs(
        want,
        top,
        top_field,
        state.logprobs_mode,
    )?)
}

/// OpenAI's `response_format`: `text`, `json_object`, or `json_schema` (its
/// `schema`; `strict` or not, the schema is enforced).
pub fn response_format(v: Option<&Value>) -> Result<Option<JsonFormat>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(JsonFormat::Object)),
        Some("json_schema") => match v.get("json_schema").and_then(|j| j.get("schema")) {
            Some(s @ Value::Object(_)) => Ok(Some(JsonFormat::Schema(s.clone()))),
            _ => Err(ApiError::bad(
                "response_format.json_schema.schema must be a JSON schema object",
            )),
        },
        t => Err(ApiError::bad(format!(
            "response_format.type must be text, json_object or json_schema, got {}",
            t.unwrap_or("nothing")
        ))),
    }
}

/// Ollama's `format`: `"json"` or a JSON schema.
pub fn ollama_format(v: Option<&Value>) -> Result<Option<JsonFormat>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(JsonFormat::Object)),
        Some(s @ Value::Object(_)) => Ok(Some(JsonFormat::Schema(s.clone()))),
        Some(v) => Err(ApiError::bad(format!(
            "format must be \"json\" or a JSON schema object, got {v}"
        ))),
    }
}

fn alt_json(a: &TokenAlt) -> Value {
    json!({"token": a.text, "logprob": a.logprob, "bytes": a.bytes})
}

/// One token's logprobs in the shape OpenAI chat (`logprobs.content[]`) and
/// Ollama (`logprobs[]`) share.
pub fn logprob_json(e: &LogprobEntry) -> Value {
    let mut v = alt_json(&e.chosen);
    v["top_logprobs"] = e.top.iter().map(alt_json).collect();
    v
}

/// The tenant of a request: its key id, or `""` (shared) without a key.
pub fn tenant(caller: &Option<axum::Extension<super::access::Caller>>) -> String {
    caller
        .as_ref()
        .and_then(|c| c.0.key_id())
        .unwrap_or_default()
        .to_string()
}

/// A request's max tokens under the server's `max_tokens` limit: more is a
/// 400 naming `field` and the limit; none asked gets the limit.
pub fn cap_max_tokens(
    state: &State,
    asked: Option<usize>,
    field: &str,
) -> Result<Option<usize>, ApiError> {
    Ok(request::max_tokens(state.limits.max_tokens, asked, field)?)
}

/// A request the worker started.
pub struct Started {
    /// The worker's messages; dropping it cancels the request.
    pub rx: UnboundedReceiver<Msg>,
    /// The prompt's token ids (chat messages through the template).
    pub prompt: Vec<u32>,
    /// From submission to the worker picking it up.
    pub queued: Duration,
}

/// Queues a request and waits until the worker starts it (or refuses it).
pub async fn start(
    state: &State,
    req: ValidatedRequest,
) -> Result<(UnboundedReceiver<Msg>, usize, Duration), ApiError> {
    let s = start_many(state, vec![req]).await?.pop().ok_or_else(|| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no request was started")
    })?;
    Ok((s.rx, s.prompt.len(), s.queued))
}

/// Queues the requests of one HTTP request (a completions request's
/// prompts) and waits until the worker starts each: every one is checked
/// before any is queued, then all go into the queue back to back, so the
/// scheduler admits them at the same step boundary and they decode in the
/// same batched steps. A refusal names its prompt (`prompt[i]`) when there
/// are several; the ones already queued are then cancelled (their receivers
/// dropped).
pub async fn start_many(
    state: &State,
    reqs: Vec<ValidatedRequest>,
) -> Result<Vec<Started>, ApiError> {
    let many = reqs.len() > 1;
    let which = move |i: usize, m: String| if many { format!("prompt[{i}]: {m}") } else { m };
    for req in &reqs {
        for p in [&req.spec.schedule, &req.spec.acceptance]
            .into_iter()
            .flatten()
        {
            super::shared::pin(state, p).await?;
        }
        if state.limits.require_lossless {
            require_lossless(state, req).await?;
        }
    }
    // Encoded and checked off the async threads, before the queue: the
    // model thread only admits.
    let validator = state.worker.validator();
    let checked = tokio::task::spawn_blocking(move || {
        reqs.into_iter()
            .enumerate()
            .map(|(i, r)| validator.check(r).map_err(|m| which(i, m)))
            .collect::<Result<Vec<_>, String>>()
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("checking the request: {e}"),
        )
    })?
    .map_err(|message| {
        state.worker.refused();
        ApiError::new(StatusCode::BAD_REQUEST, message)
    })?;
    let prompts: Vec<Vec<u32>> = checked.iter().map(|c| c.prompt.clone()).collect();
    let rxs = state.worker.submit_group(checked).map_err(|e| match e {
        SubmitError::Busy => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is busy (the request queue is full); retry later",
        ),
        SubmitError::Draining => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down (draining); retry on another replica",
        ),
        SubmitError::Stopped => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the generation worker has stopped",
        ),
    })?;
    let queued: Vec<_> = rxs.into_iter().zip(prompts).collect();
    let mut started = Vec::with_capacity(queued.len());
    for (i, (mut rx, prompt)) in queued.into_iter().enumerate() {
        let queued = match rx.recv().await {
            Some(Msg::Started { queued, .. }) => queued,
            Some(Msg::Error { status, message }) => {
                return Err(ApiError::new(status, which(i, message)))
            }
            Some(Msg::Failed(m)) => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    which(i, m),
                ))
            }
            Some(other) => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("unexpected worker message {other:?}"),
                ))
            }
            None => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the generation worker dropped the request",
                ))
            }
        };
        started.push(Started { rx, prompt, queued });
    }
    Ok(started)
}

/// `--require-lossless`: the request's acceptance policy (named, or the
/// engine's default: `greedy` for greedy requests, else `rejection`) must
/// have passed the conformance harness on its exact hash; the harness runs
/// now, once per hash, when it never did (38,000 `decide` calls: a fraction
/// of a second for a built-in, seconds for a Python or JavaScript policy), on
/// a blocking thread: policy calls are synchronous.
async fn require_lossless(state: &State, req: &ValidatedRequest) -> Result<(), ApiError> {
    let greedy = req.params.greedy();
    let name = req
        .spec
        .acceptance
        .clone()
        .unwrap_or_else(|| if greedy { "greedy" } else { "rejection" }.to_string());
    let policies = state.policies.clone();
    let verdict = tokio::task::spawn_blocking(move || policies.require_lossless(&name, greedy))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the conformance check failed: {e}"),
            )
        })?;
    verdict.map_err(|why| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("`acceptance`: {why} (the server runs with --require-lossless)"),
        )
    })
}

/// The whole output of a started request.
pub struct Collected {
    pub text: String,
    /// One per emitted token, when asked for.
    pub logprobs: Vec<LogprobEntry>,
    pub stats: Box<Stats>,
    /// The prompt and the tokens returned ([`crate::sequence::Finished::context`]).
    pub log: Vec<u32>,
}

pub async fn collect(mut rx: UnboundedReceiver<Msg>) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    loop {
        match rx.recv().await {
            Some(Msg::Chunk(c)) => text.push_str(&c),
            Some(Msg::Logprobs(e)) => logprobs.push(e),
            Some(Msg::PromptLogprobs(v)) => logprobs.extend(v),
            Some(Msg::Done { stats, log }) => {
                return Ok(Collected {
                    text,
                    logprobs,
                    stats,
                    log,
                })
            }
            Some(Msg::Failed(m)) | Some(Msg::Error { message: m, .. }) => {
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m))
            }
            Some(Msg::Started { .. }) | Some(Msg::Rounds(_)) => {}
            None => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "generation ended without a result",
                ))
            }
        }
    }
}

/// Turns the worker's messages into a response stream: `f` maps each message
/// to the items to send and whether that was the last.
pub fn stream_of<T, F>(
    rx: UnboundedReceiver<Msg>,
    f: F,
) -> impl Stream<Item = Result<T, Infallible>>
where
    T: Send + 'static,
    F: FnMut(Msg) -> (Vec<T>, bool) + Send + 'static,
{
    futures_util::stream::unfold((rx, f, false), |(mut rx, mut f, ended)| async move {
        if ended {
            return None;
        }
        let m = rx.recv().await?;
        let (items, end) = f(m);
        Some((
            futures_util::stream::iter(items.into_iter().map(Ok)),
            (rx, f, end),
        ))
    })
    .flatten()
}

/// RFC 3339 UTC with nanoseconds, as Ollama's `created_at`.
pub fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// 200 when ready, 503 while draining ([`super::lifecycle`]).
pub async fn health(axum::extract::State(state): axum::extract::State<State>) -> Response {
    super::lifecycle::health_response(
        &state.life,
        json!({
            "model": state.model.name,
            "queued": state.metrics.queued.load(std::sync::atomic::Ordering::Relaxed),
            "running": state.metrics.running.load(std::sync::atomic::Ordering::Relaxed),
        }),
    )
}

pub async fn metrics(axum::extract::State(state): axum::extract::State<State>) -> Response {
    let text = match state
        .metrics
        .prometheus(&state.policies.metrics(), &state.model.name)
    {
        Ok(t) => t,
        Err(e) => {
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding the metrics: {e}"),
            )
            .into_response()
        }
    };
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {}", uri.path()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::SpecOptions;

    fn greedy() -> SamplingDefaults {
        SamplingDefaults::of(Flavor::OpenAi, true)
    }

    #[test]
    fn absent_fields_get_the_api_defaults() {
        let o: CommonOptions = from_value(json!({}), "").unwrap();
        let ol = o
            .params(&SamplingDefaults::of(Flavor::Ollama, false))
            .unwrap();
        assert_eq!(
            (ol.temperature, ol.top_k, ol.top_p, ol.repeat_penalty),
            (0.8, 40, 0.9, 1.1)
        );
        let oa = o
            .params(&SamplingDefaults::of(Flavor::OpenAi, false))
            .unwrap();
        assert_eq!((oa.temperature, oa.top_k, oa.top_p), (1.0, 0, 1.0));
        // A fresh seed each request, unless one is given.
        let again = o
            .params(&SamplingDefaults::of(Flavor::OpenAi, false))
            .unwrap();
        assert_ne!(oa.seed, again.seed);
        let o: CommonOptions = from_value(json!({"seed": 5, "presence_penalty": 0.5}), "").unwrap();
        let p = o
            .params(&SamplingDefaults::of(Flavor::OpenAi, false))
            .unwrap();
        assert_eq!((p.seed, p.presence_penalty), (5, 0.5));
        // --greedy-default: greedy, seed 0.
        let o: CommonOptions = from_value(json!({}), "").unwrap();
        let g = o
            .params(&SamplingDefaults::of(Flavor::Ollama, true))
            .unwrap();
        assert!(g.plain_greedy() && g.seed == 0);
        let o: CommonOptions = from_value(json!({"frequency_penalty": 3}), "").unwrap();
        let e = o.params(&greedy()).unwrap_err();
        assert!(e.message.contains("frequency_penalty"), "{}", e.message);
    }

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let t = UNIX_EPOCH + Duration::new(1_709_251_199, 5); // leap year, end of Feb
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59.000000005Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000000000Z");
    }

    #[test]
    fn option_errors_name_the_field() {
        let v = json!({"temperature": "hot"});
        let e = from_value::<CommonOptions>(v, "options.").unwrap_err();
        assert!(e.message.contains("`options.temperature`"), "{}", e.message);
        let o: CommonOptions = from_value(json!({"top_p": 1.5}), "").unwrap();
        assert!(o.params(&greedy()).unwrap_err().message.contains("top_p"));
        let o: CommonOptions = from_value(json!({"top_k": -2}), "").unwrap();
        assert!(o.params(&greedy()).unwrap_err().message.contains("top_k"));
        let o: CommonOptions =
            from_value(json!({"stop": "x", "schedule_config": "{\"k\": 2}"}), "").unwrap();
        assert_eq!(o.stop(), vec!["x".to_string()]);
        let spec = o.spec(&SpecOptions::default()).unwrap();
        assert_eq!(spec.schedule_config, Some(json!({"k": 2})));
        let o: CommonOptions = from_value(json!({"schedule_config": "{nope"}), "").unwrap();
        assert!(o
            .spec(&SpecOptions::default())
            .unwrap_err()
            .message
            .contains("schedule_config"));
    }

    #[test]
    fn request_values_fill_from_server_defaults() {
        let defaults = SpecOptions {
            schedule: Some("heuristic".into()),
            draft_max: Some(8),
            ..Default::default()
        };
        let o: CommonOptions = from_value(json!({"draft_max": 4}), "").unwrap();
        let s = o.spec(&defaults).unwrap();
        assert_eq!(s.schedule.as_deref(), Some("heuristic"));
        assert_eq!(s.draft_max, Some(4));
        let o: CommonOptions = from_value(json!({"draft_max": -1}), "").unwrap();
        assert!(o.spec(&defaults).is_err());
    }
}
