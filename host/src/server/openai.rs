//! OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions,
//! /v1/models. Speculation fields go at the top level of the body.
use super::access::Caller;
use super::api::{self, ApiError, CommonOptions, Flavor};
use super::fields;
use super::stream::{self, Assembler, Piece};
use super::tools::{self, Tools};
use super::worker::LogprobEntry;
use super::State;
use crate::engine::Prompt;
use crate::request::{self, ValidatedRequest};
use crate::sequence::{DoneReason, Stats};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::Path;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use specd_text::{ChatMessage, ToolFormat};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Deserialize, Debug)]
pub struct ChatBody {
    model: Option<String>,
    messages: Option<Vec<OaMessage>>,
    #[serde(default)]
    stream: bool,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    n: Option<i64>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    response_format: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    stream_options: Option<StreamOptions>,
}

/// `stream_options` (its keys checked by [`fields::STREAM_OPTIONS`]).
#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    /// A last chunk with `choices: []` and the usage, before `[DONE]`.
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize, Debug)]
pub struct OaMessage {
    role: String,
    #[serde(default)]
    content: Value,
    tool_calls: Option<Value>,
    tool_call_id: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct CompletionBody {
    model: Option<String>,
    prompt: Option<Value>,
    #[serde(default)]
    stream: bool,
    max_tokens: Option<i64>,
    n: Option<i64>,
    #[serde(default)]
    echo: bool,
    /// How many alternatives per token (0..=20); present: logprobs wanted.
    logprobs: Option<i64>,
    stream_options: Option<StreamOptions>,
}

fn oa(e: ApiError) -> ApiError {
    e.flavor(Flavor::OpenAi)
}

fn max_tokens(v: Option<i64>) -> Result<Option<usize>, ApiError> {
    Ok(request::non_negative("max_tokens", v)?)
}

fn check_n(n: Option<i64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::bad(format!(
            "n = {n} is not supported: specd returns one choice (n = 1)"
        ))),
    }
}

/// A message's text: a string, or the text parts of a content array.
fn content_text(v: &Value, i: usize) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push_str(t),
                    (t, _) => {
                        return Err(ApiError::bad(format!(
                            "messages[{i}].content: part type {} is not supported (text only)",
                            t.unwrap_or("(none)")
                        )))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad(format!(
            "messages[{i}].content must be a string or an array of text parts"
        ))),
    }
}

/// `stream_options`' keys, named as `stream_options.KEY` when refused.
fn stream_options_checked(body: &Value) -> Result<(), ApiError> {
    match body.get("stream_options") {
        None | Some(Value::Null) => Ok(()),
        Some(o @ Value::Object(_)) => {
            fields::check(o, &fields::STREAM_OPTIONS, "stream_options.").map_err(ApiError::field)
        }
        Some(_) => Err(ApiError::bad("stream_options must be an object")),
    }
}

fn finish_reason(s: &Stats) -> &'static str {
    match s.done_reason {
        DoneReason::Length => "length",
        _ => "stop",
    }
}

fn usage(s: &Stats) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
    })
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn new_id(prefix: &str) -> String {
    let n = NEXT_ID.fetch_add(1, Relaxed);
    format!("{prefix}-{:x}{n:04x}", api::unix_now())
}

#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Completion,
}

struct Ctx {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    /// Whether the request asked for logprobs.
    logprobs: bool,
    /// The served model's call format, when the answer's calls are parsed.
    tools: Option<ToolFormat>,
    /// `stream_options.include_usage`: the usage goes in a chunk of its own.
    include_usage: bool,
}

/// Logprobs in the legacy completions shape; `offset` is the text offset of
/// the first token (advanced past the entries).
fn completion_logprobs(entries: &[LogprobEntry], offset: &mut usize) -> Value {
    let mut tokens = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for e in entries {
        tokens.push(json!(e.chosen.text));
        lps.push(json!(e.chosen.logprob));
        let mut top = serde_json::Map::new();
        for a in &e.top {
            top.insert(a.text.clone(), json!(a.logprob));
        }
        tops.push(Value::Object(top));
        offsets.push(json!(*offset));
        *offset += e.chosen.text.chars().count();
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

impl Ctx {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// The `logprobs` of a choice holding `entries`.
    fn logprobs(&self, entries: &[LogprobEntry], offset: &mut usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.kind {
            Kind::Chat => json!({
                "content": entries.iter().map(api::logprob_json).collect::<Vec<_>>(),
                "refusal": null,
            }),
            Kind::Completion => completion_logprobs(entries, offset),
        }
    }

    fn chunk(
        &self,
        text: Option<&str>,
        finish: Option<&str>,
        first: bool,
        logprobs: Value,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let delta = match (text, first) {
                    (Some(t), true) => json!({"role": "assistant", "content": t}),
                    (Some(t), false) => json!({"content": t}),
                    (None, _) => json!({}),
                };
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Completion => json!({
                "index": 0, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "specd",
            "choices": [choice],
        })
    }

    fn whole(&self, text: &str, stats: &Stats, logprobs: Value) -> Value {
        let choice = match (self.kind, self.tools) {
            (Kind::Chat, Some(format)) => {
                let p = specd_text::tool_calls::parse(format, text);
                let mut message = json!({"role": "assistant", "content": p.content});
                let mut finish = finish_reason(stats);
                if !p.calls.is_empty() {
                    message["tool_calls"] = tools::openai_calls(&p.calls, false);
                    finish = "tool_calls";
                    if p.content.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish})
            }
            (Kind::Chat, None) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish_reason(stats),
            }),
            (Kind::Completion, _) => json!({
                "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(stats),
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "specd",
            "choices": [choice],
            "usage": usage(stats),
            "speculation": stats,
            "metrics": api::vllm_metrics(stats),
        })
    }
}

fn sse_json(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

async fn run(
    state: State,
    ctx: Ctx,
    req: ValidatedRequest,
    stream: bool,
    prefix: String,
) -> Result<Response, ApiError> {
    // Text offsets count from the start of the text (with `echo`, the
    // prompt's logprobs come first).
    let mut offset = 0;
    let (rx, _, _) = api::start(&state, req).await?;
    if !stream {
        let c = api::collect(rx).await?;
        let text = prefix + &c.text;
        let lp = ctx.logprobs(&c.logprobs, &mut offset);
        return Ok(Json(ctx.whole(&text, &c.stats, lp)).into_response());
    }
    let mut first = true;
    let asm = Assembler::new(prefix, ctx.tools);
    let s = stream::pieces(rx, asm, move |piece| match piece {
        Piece::Text { text, logprobs } => {
            let lp = ctx.logprobs(&logprobs, &mut offset);
            let e = sse_json(&ctx.chunk(Some(&text), None, first, lp));
            first = false;
            (vec![e], false)
        }
        Piece::Done {
            text,
            calls,
            logprobs,
            stats,
            ..
        } => {
            let mut out = Vec::new();
            if first || !logprobs.is_empty() || !text.is_empty() {
                // Nothing was generated: still open the message. Or tokens
                // whose text never came (held back by a stop string), or
                // held-back text that was not a call after all.
                let lp = ctx.logprobs(&logprobs, &mut offset);
                out.push(sse_json(&ctx.chunk(Some(&text), None, first, lp)));
                first = false;
            }
            let mut finish = finish_reason(&stats);
            if !calls.is_empty() {
                let mut c = ctx.chunk(None, None, first, Value::Null);
                c["choices"][0]["delta"]["tool_calls"] = tools::openai_calls(&calls, true);
                out.push(sse_json(&c));
                finish = "tool_calls";
            }
            let mut last = ctx.chunk(None, Some(finish), false, Value::Null);
            if ctx.include_usage {
                // OpenAI's shape: the usage in a chunk of its own, with no
                // choices; specd's and vLLM's figures ride along.
                out.push(sse_json(&last));
                last = ctx.chunk(None, None, false, Value::Null);
                last["choices"] = json!([]);
            }
            last["usage"] = usage(&stats);
            last["speculation"] = serde_json::to_value(&*stats).unwrap_or(Value::Null);
            last["metrics"] = api::vllm_metrics(&stats);
            out.push(sse_json(&last));
            out.push(Event::default().data("[DONE]"));
            (out, true)
        }
        Piece::Failed(e) => (
            vec![
                sse_json(&json!({"error": {"message": e, "type": "server_error"}})),
                Event::default().data("[DONE]"),
            ],
            true,
        ),
        Piece::Rounds(_) => (vec![], false),
    });
    Ok(Sse::new(s)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// Errors of the OpenAI routes take OpenAI's shape (`error.type`,
/// `error.param`), once per route.
pub async fn chat_completions(
    axum::extract::State(state): axum::extract::State<State>,
    caller: Option<axum::Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    chat(state, caller, body).await.map_err(oa)
}

async fn chat(
    state: State,
    caller: Option<axum::Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let v = api::read_body(body, &fields::OPENAI_CHAT)?;
    stream_options_checked(&v)?;
    if let Some(Value::Array(ms)) = v.get("messages") {
        for (i, m) in ms.iter().enumerate() {
            fields::check(m, &fields::OPENAI_MESSAGE, &format!("messages[{i}]."))
                .map_err(ApiError::field)?;
        }
    }
    let b: ChatBody = api::from_value(v.clone(), "")?;
    let common: CommonOptions = api::from_value(v, "")?;
    let model = state.served_model(&b.model)?;
    check_n(b.n)?;
    let messages = b
        .messages
        .ok_or_else(|| ApiError::bad("messages is required"))?;
    if messages.is_empty() {
        return Err(ApiError::bad("messages must not be empty"));
    }
    let mut msgs: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            r => {
                return Err(ApiError::bad(format!(
                "messages[{i}].role {r:?} is not one of system, developer, user, assistant, tool"
            )))
            }
        };
        let mut msg = ChatMessage::new(role, content_text(&m.content, i)?);
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_null()) {
            let field = format!("messages[{i}].tool_calls");
            msg.tool_calls = Some(tools::message_calls(calls, &field)?);
        }
        if let Some(id) = &m.tool_call_id {
            // Templates that name the function of a result find it here.
            msg.name = tools::name_of_call(&msgs, id);
            msg.tool_call_id = Some(id.clone());
        }
        msgs.push(msg);
    }
    let tools = tools::read(
        b.tools.as_ref(),
        b.tool_choice.as_ref(),
        state.model.tool_format,
    )?;
    let format = tools::constraint(
        tools.as_ref(),
        api::response_format(b.response_format.as_ref())?,
        "response_format",
    )?;
    let prompt = match &tools {
        Some(t) => Prompt::ChatWithTools(msgs, t.list.clone()),
        None => Prompt::Chat(msgs),
    };
    let req = ValidatedRequest {
        prompt,
        params: common.params(&state.sampling_defaults(Flavor::OpenAi))?,
        max_tokens: api::cap_max_tokens(
            &state,
            max_tokens(b.max_completion_tokens.or(b.max_tokens))?,
            if b.max_completion_tokens.is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            },
        )?,
        stop: common.stop(),
        spec: common.spec(&state.defaults)?,
        trace_rounds: false,
        tenant: api::tenant(&caller),
        logprobs: api::logprob_request(
            &state,
            b.logprobs.unwrap_or(false),
            b.top_logprobs,
            "top_logprobs",
        )?,
        format,
        prompt_logprobs: false,
        ends: common.ends(state.model.vocab_size)?,
    };
    let ctx = Ctx {
        kind: Kind::Chat,
        id: new_id("chatcmpl"),
        created: api::unix_now(),
        model,
        logprobs: req.logprobs.is_some(),
        tools: tools.filter(Tools::parses).map(|t| t.format),
        include_usage: b.stream_options.is_some_and(|o| o.include_usage),
    };
    run(state, ctx, req, b.stream, String::new()).await
}

pub async fn completions(
    axum::extract::State(state): axum::extract::State<State>,
    caller: Option<axum::Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    completion(state, caller, body).await.map_err(oa)
}

async fn completion(
    state: State,
    caller: Option<axum::Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let v = api::read_body(body, &fields::OPENAI_COMPLETIONS)?;
    stream_options_checked(&v)?;
    let b: CompletionBody = api::from_value(v.clone(), "")?;
    let common: CommonOptions = api::from_value(v, "")?;
    let model = state.served_model(&b.model)?;
    check_n(b.n)?;
    let prompt = match b.prompt {
        Some(Value::String(s)) => s,
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_string()
        }
        Some(Value::Array(_)) => {
            return Err(ApiError::bad(
                "prompt must be a string (one prompt per request)",
            ))
        }
        None | Some(Value::Null) => return Err(ApiError::bad("prompt is required")),
        Some(_) => return Err(ApiError::bad("prompt must be a string")),
    };
    let prefix = if b.echo {
        prompt.clone()
    } else {
        String::new()
    };
    let req = ValidatedRequest {
        prompt: Prompt::Raw(prompt),
        params: common.params(&state.sampling_defaults(Flavor::OpenAi))?,
        // The OpenAI default for completions is 16 tokens (or the
        // server's limit, if lower).
        max_tokens: match max_tokens(b.max_tokens)? {
            None => Some(state.limits.max_tokens.map_or(16, |m| m.min(16))),
            asked => api::cap_max_tokens(&state, asked, "max_tokens")?,
        },
        stop: common.stop(),
        spec: common.spec(&state.defaults)?,
        trace_rounds: false,
        tenant: api::tenant(&caller),
        logprobs: api::logprob_request(&state, b.logprobs.is_some(), b.logprobs, "logprobs")?,
        format: None,
        prompt_logprobs: b.echo,
        ends: common.ends(state.model.vocab_size)?,
    };
    let ctx = Ctx {
        kind: Kind::Completion,
        id: new_id("cmpl"),
        created: api::unix_now(),
        model,
        logprobs: req.logprobs.is_some(),
        tools: None,
        include_usage: b.stream_options.is_some_and(|o| o.include_usage),
    };
    run(state, ctx, req, b.stream, prefix).await
}

fn model_object(state: &State) -> Value {
    let created = state
        .started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({"id": state.model.name, "object": "model", "created": created, "owned_by": "specd"})
}

pub async fn models(axum::extract::State(state): axum::extract::State<State>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&state)]}))
}

pub async fn model(
    axum::extract::State(state): axum::extract::State<State>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.is_served(&name) {
        return Err(oa(ApiError::model_not_found(&name)));
    }
    Ok(Json(model_object(&state)))
}
