//! Ollama-compatible endpoints: /api/generate, /api/chat, /api/tags,
//! /api/ps, /api/show.
use super::access::Caller;
use super::api::{self, parse_body, ApiError, CommonOptions, Flavor};
use super::fields;
use super::stream::{self, Assembler, Piece};
use super::tools::{self, Tools};
use super::State;
use crate::engine::Prompt;
use crate::request::ValidatedRequest;
use crate::sequence::Stats;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use specd_text::{ChatMessage, ToolFormat};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct OllamaOptions {
    pub num_predict: Option<i64>,
    pub trace_rounds: bool,
    /// OpenAI's `tool_choice`, a specd extension here.
    pub tool_choice: Option<Value>,
    pub common: CommonOptions,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub(super) struct NumPredict {
    num_predict: Option<i64>,
    num_ctx: Option<i64>,
    /// Stream `{"round": ...}` lines (one per speculation round) before the
    /// final line.
    trace_rounds: Option<bool>,
    tool_choice: Option<Value>,
}

impl OllamaOptions {
    /// `context` is the model's: a larger `num_ctx` is refused (a smaller
    /// or equal one changes nothing, as the prompt must fit it anyway).
    fn parse(v: Option<Value>, context: usize) -> Result<OllamaOptions, ApiError> {
        match v {
            None | Some(Value::Null) => Ok(OllamaOptions::default()),
            Some(v @ Value::Object(_)) => {
                fields::check(&v, &fields::OLLAMA_OPTIONS, "options.").map_err(ApiError::field)?;
                let n = api::from_value::<NumPredict>(v.clone(), "options.")?;
                match n.num_ctx {
                    Some(c) if c < 0 || c as u64 > context as u64 => {
                        return Err(ApiError::bad(format!(
                            "options.num_ctx = {c} is outside the served model's context of {context} tokens"
                        )))
                    }
                    _ => {}
                }
                Ok(OllamaOptions {
                    num_predict: n.num_predict,
                    trace_rounds: n.trace_rounds.unwrap_or(false),
                    tool_choice: n.tool_choice,
                    common: api::from_value(v, "options.")?,
                })
            }
            Some(v) => Err(ApiError::bad(format!(
                "options must be a JSON object, got {v}"
            ))),
        }
    }
}

#[derive(Deserialize, Debug)]
pub struct GenerateBody {
    model: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    system: Option<String>,
    #[serde(default)]
    raw: bool,
    stream: Option<bool>,
    #[serde(default)]
    options: Option<Value>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<i64>,
    format: Option<Value>,
}

#[derive(Deserialize, Debug)]
pub struct ChatMsg {
    role: String,
    #[serde(default)]
    content: Option<String>,
    tool_calls: Option<Value>,
    tool_name: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct ChatBody {
    model: Option<String>,
    #[serde(default)]
    messages: Vec<ChatMsg>,
    stream: Option<bool>,
    #[serde(default)]
    options: Option<Value>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<i64>,
    format: Option<Value>,
    tools: Option<Value>,
}

fn request(
    state: &State,
    prompt: Prompt,
    o: &OllamaOptions,
    tenant: String,
    logprobs: (bool, Option<i64>),
    format: Option<crate::sampling::JsonFormat>,
) -> Result<ValidatedRequest, ApiError> {
    let max_tokens = match o.num_predict {
        None => None,
        // -1: infinite, -2: fill the context; both are "until the end".
        Some(n) if n < 0 => None,
        Some(n) => Some(n as usize),
    };
    let max_tokens = api::cap_max_tokens(state, max_tokens, "options.num_predict")?;
    Ok(ValidatedRequest {
        prompt,
        params: o.common.params(&state.sampling_defaults(Flavor::Ollama))?,
        max_tokens,
        stop: o.common.stop(),
        spec: o.common.spec(&state.defaults)?,
        trace_rounds: o.trace_rounds,
        tenant,
        logprobs: api::logprob_request(state, logprobs.0, logprobs.1, "top_logprobs")?,
        format,
        prompt_logprobs: false,
        ends: o.common.ends(state.model.vocab_size)?,
    })
}

/// `tool_choice` sits in `options` on this API: errors name it there.
fn in_options(e: ApiError) -> ApiError {
    match e.param.as_deref() {
        Some("tool_choice") => ApiError::bad(e.message.replacen(
            "`tool_choice`",
            "`options.tool_choice`",
            1,
        )),
        _ => e,
    }
}

fn nanos(d: f64) -> u64 {
    (d.max(0.0) * 1e9) as u64
}

/// The fields of a final response (`done: true`).
fn final_fields(m: &mut Map<String, Value>, stats: &Stats, t0: Instant, queued: Duration) {
    m.insert("done".into(), json!(true));
    m.insert("done_reason".into(), json!(stats.done_reason.as_str()));
    m.insert(
        "total_duration".into(),
        json!(t0.elapsed().as_nanos() as u64),
    );
    m.insert("load_duration".into(), json!(queued.as_nanos() as u64));
    m.insert("prompt_eval_count".into(), json!(stats.prompt_tokens));
    m.insert(
        "prompt_eval_duration".into(),
        json!(nanos(stats.prompt_seconds)),
    );
    m.insert("eval_count".into(), json!(stats.generated_tokens));
    m.insert("eval_duration".into(), json!(nanos(stats.decode_seconds)));
    m.insert(
        "speculation".into(),
        serde_json::to_value(stats).unwrap_or(Value::Null),
    );
}

fn ndjson_line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

fn ndjson_response(body: Body) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )],
        body,
    )
        .into_response()
}

/// What differs between /api/generate and /api/chat (with the served
/// model's call format when the answer's calls are parsed).
#[derive(Clone, Copy)]
enum Kind {
    Generate,
    Chat(Option<ToolFormat>),
}

impl Kind {
    fn piece(self, model: &str, text: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("model".into(), json!(model));
        m.insert("created_at".into(), json!(api::now_rfc3339()));
        match self {
            Kind::Generate => {
                m.insert("response".into(), json!(text));
            }
            Kind::Chat(_) => {
                m.insert(
                    "message".into(),
                    json!({"role": "assistant", "content": text}),
                );
            }
        }
        m.insert("done".into(), json!(false));
        m
    }
}

async fn run(
    state: State,
    kind: Kind,
    model: String,
    req: ValidatedRequest,
    stream: bool,
    t0: Instant,
) -> Result<Response, ApiError> {
    let logprobs = req.logprobs.is_some();
    let (rx, _prompt_tokens, queued) = api::start(&state, req).await?;
    if !stream {
        let c = api::collect(rx).await?;
        let mut m = match kind {
            Kind::Chat(Some(format)) => {
                let p = specd_text::tool_calls::parse(format, &c.text);
                let mut m = kind.piece(&model, &p.content);
                if !p.calls.is_empty() {
                    m["message"]["tool_calls"] = tools::ollama_calls(&p.calls);
                }
                m
            }
            _ => kind.piece(&model, &c.text),
        };
        if logprobs {
            m.insert(
                "logprobs".into(),
                c.logprobs.iter().map(api::logprob_json).collect(),
            );
        }
        final_fields(&mut m, &c.stats, t0, queued);
        if let Kind::Generate = kind {
            m.insert("context".into(), json!(c.log));
        }
        return Ok(Json(Value::Object(m)).into_response());
    }
    let tool_format = match kind {
        Kind::Chat(Some(format)) => Some(format),
        _ => None,
    };
    let logprobs_json =
        |v: &[super::worker::LogprobEntry]| -> Value { v.iter().map(api::logprob_json).collect() };
    let asm = Assembler::new(String::new(), tool_format);
    let s = stream::pieces(rx, asm, move |piece| match piece {
        Piece::Text { text, logprobs: lp } => {
            let mut m = kind.piece(&model, &text);
            if logprobs {
                m.insert("logprobs".into(), logprobs_json(&lp));
            }
            (vec![ndjson_line(&Value::Object(m))], false)
        }
        Piece::Done {
            text,
            calls,
            logprobs: lp,
            stats,
            log,
        } => {
            let mut out = Vec::new();
            // Held-back text that was not a call after all, and the calls.
            if !text.is_empty() || !calls.is_empty() {
                let mut m = kind.piece(&model, &text);
                if !calls.is_empty() {
                    m["message"]["tool_calls"] = tools::ollama_calls(&calls);
                }
                out.push(ndjson_line(&Value::Object(m)));
            }
            let mut m = kind.piece(&model, "");
            if logprobs {
                m.insert("logprobs".into(), logprobs_json(&lp));
            }
            final_fields(&mut m, &stats, t0, queued);
            if let Kind::Generate = kind {
                m.insert("context".into(), json!(log));
            }
            out.push(ndjson_line(&Value::Object(m)));
            (out, true)
        }
        Piece::Failed(e) => (vec![ndjson_line(&json!({ "error": e }))], true),
        Piece::Rounds(rounds) => (
            rounds
                .iter()
                .map(|r| {
                    ndjson_line(&json!({ "round": {
                        "round": r.round,
                        "k": r.k,
                        "drafted": r.drafted,
                        "accepted": r.accepted,
                        "tokens": r.tokens.len(),
                        "draft_seconds": r.draft_seconds,
                        "verify_seconds": r.verify_seconds,
                        "policy_seconds": r.policy_seconds,
                    }}))
                })
                .collect(),
            false,
        ),
    });
    Ok(ndjson_response(Body::from_stream(s)))
}

/// The answer to an empty request: Ollama loads the model and says so.
fn load_response(kind: Kind, model: &str) -> Response {
    let mut m = kind.piece(model, "");
    m.insert("done".into(), json!(true));
    m.insert("done_reason".into(), json!("load"));
    Json(Value::Object(m)).into_response()
}

pub async fn generate(
    axum::extract::State(state): axum::extract::State<State>,
    caller: Option<axum::Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let v = api::read_body(body, &fields::OLLAMA_GENERATE)?;
    let b: GenerateBody = api::from_value(v, "")?;
    let model = state.served_model(&b.model)?;
    let prompt_text = b.prompt.unwrap_or_default();
    if prompt_text.is_empty() {
        return Ok(load_response(Kind::Generate, &model));
    }
    let prompt = if b.raw {
        Prompt::Raw(prompt_text)
    } else {
        Prompt::user_turn(b.system.filter(|s| !s.is_empty()), prompt_text)
    };
    let options = OllamaOptions::parse(b.options, state.model.context_length)?;
    // /api/generate has no tools: none to force.
    tools::read(None, options.tool_choice.as_ref(), state.model.tool_format).map_err(in_options)?;
    let req = request(
        &state,
        prompt,
        &options,
        api::tenant(&caller),
        (b.logprobs, b.top_logprobs),
        api::ollama_format(b.format.as_ref())?,
    )?;
    run(
        state,
        Kind::Generate,
        model,
        req,
        b.stream.unwrap_or(true),
        t0,
    )
    .await
}

pub async fn chat(
    axum::extract::State(state): axum::extract::State<State>,
    caller: Option<axum::Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let v = api::read_body(body, &fields::OLLAMA_CHAT)?;
    if let Some(Value::Array(ms)) = v.get("messages") {
        for (i, m) in ms.iter().enumerate() {
            fields::check(m, &fields::OLLAMA_MESSAGE, &format!("messages[{i}]."))
                .map_err(ApiError::field)?;
        }
    }
    let b: ChatBody = api::from_value(v, "")?;
    let model = state.served_model(&b.model)?;
    if b.messages.is_empty() {
        return Ok(load_response(Kind::Chat(None), &model));
    }
    let mut msgs = Vec::with_capacity(b.messages.len());
    for (i, m) in b.messages.into_iter().enumerate() {
        match m.role.as_str() {
            "system" | "user" | "assistant" | "tool" => {}
            r => {
                return Err(ApiError::bad(format!(
                    "messages[{i}].role {r:?} is not one of system, user, assistant, tool"
                )))
            }
        }
        let mut msg = ChatMessage::new(m.role, m.content.unwrap_or_default());
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_null()) {
            let field = format!("messages[{i}].tool_calls");
            msg.tool_calls = Some(tools::message_calls(calls, &field)?);
        }
        msg.name = m.tool_name.filter(|n| !n.is_empty());
        msgs.push(msg);
    }
    let options = OllamaOptions::parse(b.options, state.model.context_length)?;
    let tools = tools::read(
        b.tools.as_ref(),
        options.tool_choice.as_ref(),
        state.model.tool_format,
    )
    .map_err(in_options)?;
    let format = tools::constraint(
        tools.as_ref(),
        api::ollama_format(b.format.as_ref())?,
        "format",
    )?;
    let prompt = match &tools {
        Some(t) => Prompt::ChatWithTools(msgs, t.list.clone()),
        None => Prompt::Chat(msgs),
    };
    let req = request(
        &state,
        prompt,
        &options,
        api::tenant(&caller),
        (b.logprobs, b.top_logprobs),
        format,
    )?;
    let kind = Kind::Chat(tools.filter(Tools::parses).map(|t| t.format));
    run(state, kind, model, req, b.stream.unwrap_or(true), t0).await
}

fn model_entry(state: &State) -> Value {
    let m = &state.model;
    let modified = api::rfc3339(
        std::fs::metadata(&m.path)
            .and_then(|x| x.modified())
            .unwrap_or(state.started),
    );
    json!({
        "name": m.name,
        "model": m.name,
        "modified_at": modified,
        "size": m.size_bytes,
        "digest": m.digest,
        "details": details(state),
    })
}

fn details(state: &State) -> Value {
    let m = &state.model;
    json!({
        "parent_model": "",
        "format": m.format,
        "family": m.architecture,
        "families": [m.architecture],
        "parameter_size": param_size(m.parameters),
        "quantization_level": m.quantization,
    })
}

fn param_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", (n as f64 / 1e6).round())
    }
}

/// Ollama's `model_info`: GGUF metadata keys, under the architecture's
/// prefix as a GGUF names them.
fn model_info(m: &super::worker::ModelInfo) -> Value {
    let a = &m.architecture;
    json!({
        "general.architecture": a,
        "general.parameter_count": m.parameters,
        format!("{a}.context_length"): m.context_length,
        format!("{a}.embedding_length"): m.hidden_size,
        format!("{a}.block_count"): m.layers,
        format!("{a}.attention.head_count"): m.heads,
        format!("{a}.attention.head_count_kv"): m.kv_heads,
        format!("{a}.vocab_size"): m.vocab_size,
    })
}

pub async fn tags(axum::extract::State(state): axum::extract::State<State>) -> Json<Value> {
    Json(json!({ "models": [model_entry(&state)] }))
}

pub async fn ps(axum::extract::State(state): axum::extract::State<State>) -> Json<Value> {
    let mut e = model_entry(&state);
    let o = e.as_object_mut().expect("object");
    o.remove("modified_at");
    o.insert("expires_at".into(), json!("9999-12-31T23:59:59Z"));
    o.insert("size_vram".into(), json!(0));
    o.insert("context_length".into(), json!(state.model.context_length));
    Json(json!({ "models": [e] }))
}

#[derive(Deserialize)]
pub struct ShowBody {
    model: Option<String>,
    name: Option<String>,
}

pub async fn show(
    axum::extract::State(state): axum::extract::State<State>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let b: ShowBody = parse_body(body)?;
    let model = state.served_model(&b.model.or(b.name))?;
    let m = &state.model;
    let _ = model;
    Ok(Json(json!({
        "license": "",
        "modelfile": format!("FROM {}\n", m.path),
        "parameters": "",
        "template": m.template,
        "details": details(&state),
        "model_info": model_info(m),
        "capabilities": if m.tool_format.is_some() { json!(["completion", "tools"]) } else { json!(["completion"]) },
        "specd": {
            "path": m.path,
            "draft_models": m.draft_models,
            "defaults": state.defaults,
        },
    })))
}
