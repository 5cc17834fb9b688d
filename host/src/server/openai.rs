//! OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions,
//! /v1/models. Speculation fields go at the top level of the body.
use super::access::Caller;
use super::api::{self, ApiError, CommonOptions, Flavor};
use super::fields;
use super::stream::{self, Assembler, Piece};
use super::tools::{self, Tools};
use super::worker::{LogprobEntry, TokenAlt};
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
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use specd_text::{ChatMessage, ToolFormat};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Deserialize, Debug)]
pub struct ChatBody {
    model: Option<String>,
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
    #[serde(flatten)]
    ids: TokenIdFields,
}

/// vLLM's token-id fields of both routes.
#[derive(Deserialize, Debug, Default)]
pub struct TokenIdFields {
    #[serde(default)]
    return_token_ids: Option<bool>,
    #[serde(default)]
    return_tokens_as_token_ids: Option<bool>,
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
    #[serde(flatten)]
    ids: TokenIdFields,
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

#[derive(Clone)]
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
    /// The choice's `index` (a completions request's prompt, in order).
    index: usize,
    /// vLLM's `return_token_ids`: the prompt's and the output's token ids.
    token_ids: bool,
    /// vLLM's `return_tokens_as_token_ids`: logprobs name tokens
    /// `token_id:N`.
    ids_as_tokens: bool,
}

impl Ctx {
    /// How a token is named in logprobs.
    fn token_name(&self, a: &TokenAlt) -> String {
        if self.ids_as_tokens {
            format!("token_id:{}", a.id)
        } else {
            a.text.clone()
        }
    }

    /// Logprobs in the legacy completions shape; `offset` is the text
    /// offset of the first token (advanced past the entries). The first
    /// entry of an echoed prompt has no logprob (NaN, written as null) and
    /// no alternatives (null, as vLLM's).
    fn completion_logprobs(&self, entries: &[LogprobEntry], offset: &mut usize) -> Value {
        let mut tokens = Vec::new();
        let mut lps = Vec::new();
        let mut tops = Vec::new();
        let mut offsets = Vec::new();
        for e in entries {
            tokens.push(json!(self.token_name(&e.chosen)));
            lps.push(json!(e.chosen.logprob));
            if e.chosen.logprob.is_nan() {
                tops.push(Value::Null);
            } else {
                let mut top = serde_json::Map::new();
                for a in &e.top {
                    top.insert(self.token_name(a), json!(a.logprob));
                }
                tops.push(Value::Object(top));
            }
            offsets.push(json!(*offset));
            *offset += e.chosen.text.chars().count();
        }
        json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
    }

    fn chat_logprob(&self, e: &LogprobEntry) -> Value {
        let mut v = api::logprob_json(e);
        if self.ids_as_tokens {
            v["token"] = json!(self.token_name(&e.chosen));
            for (t, a) in v["top_logprobs"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .zip(&e.top)
            {
                t["token"] = json!(self.token_name(a));
            }
        }
        v
    }

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
                "content": entries.iter().map(|e| self.chat_logprob(e)).collect::<Vec<_>>(),
                "refusal": null,
            }),
            Kind::Completion => self.completion_logprobs(entries, offset),
        }
    }

    /// vLLM's `return_token_ids` on a response or chunk `v`: the prompt's
    /// ids (on a completions choice, at the top of a chat response), and
    /// the output's (on the choice).
    fn add_ids(&self, v: &mut Value, prompt: Option<&[u32]>, output: Option<&[u32]>) {
        if !self.token_ids {
            return;
        }
        if let Some(p) = prompt {
            match self.kind {
                Kind::Completion => v["choices"][0]["prompt_token_ids"] = json!(p),
                Kind::Chat => v["prompt_token_ids"] = json!(p),
            }
        }
        if let Some(o) = output {
            v["choices"][0]["token_ids"] = json!(o);
        }
    }

    fn chunk(
        &self,
        text: Option<&str>,
        finish: Option<&str>,
        first: bool,
        logprobs: Value,
    ) -> Value {
        let index = self.index;
        let choice = match self.kind {
            Kind::Chat => {
                let delta = match (text, first) {
                    (Some(t), true) => json!({"role": "assistant", "content": t}),
                    (Some(t), false) => json!({"content": t}),
                    (None, _) => json!({}),
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Completion => json!({
                "index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish
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
        let index = self.index;
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
                json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
            }
            (Kind::Chat, None) => json!({
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish_reason(stats),
            }),
            (Kind::Completion, _) => json!({
                "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(stats),
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

/// One prompt's part of a response: its context and what `echo` puts
/// before its text.
struct Part {
    ctx: Ctx,
    prefix: String,
}

/// The prompts' responses merged into one: the choices in order, the usage
/// summed, the `speculation` objects and vLLM `metrics` as lists (one per
/// choice; a single choice keeps its objects).
fn merge(mut wholes: Vec<Value>) -> Value {
    if wholes.len() == 1 {
        return wholes.pop().unwrap_or(Value::Null);
    }
    let mut out = wholes[0].clone();
    let mut choices = Vec::new();
    let (mut spec, mut metrics) = (Vec::new(), Vec::new());
    let mut totals = [0u64; 3];
    for w in &mut wholes {
        choices.push(w["choices"][0].take());
        spec.push(w["speculation"].take());
        metrics.push(w["metrics"].take());
        for (t, k) in totals
            .iter_mut()
            .zip(["prompt_tokens", "completion_tokens", "total_tokens"])
        {
            *t += w["usage"][k].as_u64().unwrap_or(0);
        }
    }
    out["choices"] = json!(choices);
    out["usage"] = json!({
        "prompt_tokens": totals[0], "completion_tokens": totals[1], "total_tokens": totals[2],
    });
    out["speculation"] = json!(spec);
    out["metrics"] = json!(metrics);
    out
}

/// What one prompt's stream hands the response's stream.
enum Out {
    Events(Vec<Event>),
    /// Its last chunk (the finish reason), held until the usage is known.
    Finish(Value, Box<Stats>),
    Failed(String),
}

/// One prompt's chunks.
fn part_stream(
    part: Part,
    started: api::Started,
) -> impl futures_util::Stream<Item = Result<Out, std::convert::Infallible>> {
    let Part { ctx, prefix } = part;
    let prompt = started.prompt;
    let mut first = true;
    // Text offsets count from the start of the text (with `echo`, the
    // prompt's logprobs come first).
    let mut offset = 0;
    let asm = Assembler::new(prefix, ctx.tools);
    stream::pieces(started.rx, asm, move |piece| match piece {
        Piece::Text { text, logprobs } => {
            let lp = ctx.logprobs(&logprobs, &mut offset);
            let mut c = ctx.chunk(Some(&text), None, first, lp);
            if first {
                ctx.add_ids(&mut c, Some(&prompt), None);
            }
            first = false;
            (vec![Out::Events(vec![sse_json(&c)])], false)
        }
        Piece::Done {
            text,
            calls,
            logprobs,
            stats,
            log,
        } => {
            let mut out = Vec::new();
            if first || !logprobs.is_empty() || !text.is_empty() {
                // Nothing was generated: still open the message. Or tokens
                // whose text never came (held back by a stop string), or
                // held-back text that was not a call after all.
                let lp = ctx.logprobs(&logprobs, &mut offset);
                let mut c = ctx.chunk(Some(&text), None, first, lp);
                if first {
                    ctx.add_ids(&mut c, Some(&prompt), None);
                }
                out.push(sse_json(&c));
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
            // The output's ids, all at once in the last chunk.
            ctx.add_ids(
                &mut last,
                None,
                Some(log.get(prompt.len()..).unwrap_or(&[])),
            );
            (vec![Out::Events(out), Out::Finish(last, stats)], true)
        }
        Piece::Failed(e) => (vec![Out::Failed(e)], true),
        Piece::Rounds(_) => (vec![], false),
    })
}

async fn run(
    state: State,
    parts: Vec<Part>,
    reqs: Vec<ValidatedRequest>,
    stream: bool,
) -> Result<Response, ApiError> {
    let started = api::start_many(&state, reqs).await?;
    if !stream {
        let all = futures_util::future::try_join_all(started.into_iter().map(|s| async move {
            let prompt = s.prompt;
            api::collect(s.rx).await.map(|c| (prompt, c))
        }))
        .await?;
        let wholes = parts
            .iter()
            .zip(all)
            .map(|(part, (prompt, c))| {
                let text = part.prefix.clone() + &c.text;
                let lp = part.ctx.logprobs(&c.logprobs, &mut 0);
                let mut w = part.ctx.whole(&text, &c.stats, lp);
                let output = c.log.get(prompt.len()..).unwrap_or(&[]);
                part.ctx.add_ids(&mut w, Some(&prompt), Some(output));
                w
            })
            .collect();
        return Ok(Json(merge(wholes)).into_response());
    }
    let n = parts.len();
    let head = parts[0].ctx.clone();
    let streams: Vec<_> = parts
        .into_iter()
        .zip(started)
        .map(|(p, s)| Box::pin(part_stream(p, s)))
        .collect();
    let merged = futures_util::stream::select_all(streams);
    // The finish chunks and their stats, until every prompt has ended.
    let ended: Vec<(Value, Box<Stats>)> = Vec::new();
    let s = futures_util::stream::unfold(
        (merged, ended, false),
        move |(mut merged, mut ended, over)| {
            let head = head.clone();
            async move {
                if over {
                    return None;
                }
                let Ok(out) = merged.next().await?;
                let (events, over) = match out {
                    Out::Events(e) => (e, false),
                    Out::Failed(e) => (
                        vec![
                            sse_json(&json!({"error": {"message": e, "type": "server_error"}})),
                            Event::default().data("[DONE]"),
                        ],
                        true,
                    ),
                    Out::Finish(last, stats) => {
                        ended.push((last, stats));
                        if ended.len() < n {
                            (vec![sse_json(&ended[ended.len() - 1].0)], false)
                        } else {
                            (finish(&head, &ended), true)
                        }
                    }
                };
                Some((
                    futures_util::stream::iter(
                        events.into_iter().map(Ok::<_, std::convert::Infallible>),
                    ),
                    (merged, ended, over),
                ))
            }
        },
    )
    .flatten();
    Ok(Sse::new(s)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// The last events of a stream whose prompts have all ended (`ended`: their
/// finish chunks, in the order they ended; each but the last already sent).
/// One prompt: its usage, `speculation` and vLLM `metrics` ride on its
/// finish chunk, or, with `include_usage`, on a chunk of their own with no
/// choices (OpenAI's shape). Several: that chunk always comes, with the
/// usage summed and the objects as lists in the prompts' order.
fn finish(head: &Ctx, ended: &[(Value, Box<Stats>)]) -> Vec<Event> {
    let mut out = Vec::new();
    let (last, stats) = &ended[ended.len() - 1];
    if ended.len() == 1 {
        let mut last = last.clone();
        if head.include_usage {
            out.push(sse_json(&last));
            last = head.chunk(None, None, false, Value::Null);
            last["choices"] = json!([]);
        }
        last["usage"] = usage(stats);
        last["speculation"] = serde_json::to_value(&**stats).unwrap_or(Value::Null);
        last["metrics"] = api::vllm_metrics(stats);
        out.push(sse_json(&last));
    } else {
        out.push(sse_json(last));
        let mut by_index: Vec<(u64, &Stats)> = ended
            .iter()
            .map(|(c, s)| (c["choices"][0]["index"].as_u64().unwrap_or(0), &**s))
            .collect();
        by_index.sort_by_key(|(i, _)| *i);
        let mut u = head.chunk(None, None, false, Value::Null);
        u["choices"] = json!([]);
        let p: usize = by_index.iter().map(|(_, s)| s.prompt_tokens).sum();
        let c: usize = by_index.iter().map(|(_, s)| s.generated_tokens).sum();
        u["usage"] = json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c});
        u["speculation"] = json!(by_index
            .iter()
            .map(|(_, s)| serde_json::to_value(s).unwrap_or(Value::Null))
            .collect::<Vec<_>>());
        u["metrics"] = json!(by_index
            .iter()
            .map(|(_, s)| api::vllm_metrics(s))
            .collect::<Vec<_>>());
        out.push(sse_json(&u));
    }
    out.push(Event::default().data("[DONE]"));
    out
}

/// A body's `messages` (each message's keys checked) as the chat
/// template takes them; required and not empty.
pub(super) fn read_messages(body: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let messages = match body.get("messages") {
        None | Some(Value::Null) => return Err(ApiError::bad("messages is required")),
        Some(Value::Array(ms)) if ms.is_empty() => {
            return Err(ApiError::bad("messages must not be empty"))
        }
        Some(Value::Array(ms)) => ms,
        Some(_) => return Err(ApiError::bad("messages must be a list of messages")),
    };
    let mut msgs: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}].");
        fields::check(m, &fields::OPENAI_MESSAGE, &at).map_err(ApiError::field)?;
        let m: OaMessage = api::from_value(m.clone(), &at)?;
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
    Ok(msgs)
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
    let b: ChatBody = api::from_value(v.clone(), "")?;
    let model = state.served_model(&b.model)?;
    check_n(b.n)?;
    let msgs = read_messages(&v)?;
    let common: CommonOptions = api::from_value(v, "")?;
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
        index: 0,
        token_ids: b.ids.return_token_ids.unwrap_or(false),
        ids_as_tokens: b.ids.return_tokens_as_token_ids.unwrap_or(false),
    };
    let part = Part {
        ctx,
        prefix: String::new(),
    };
    run(state, vec![part], vec![req], b.stream).await
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
    let prompts = super::prompts::read(b.prompt.as_ref(), state.model.vocab_size)?;
    let tokenizer = state.worker.validator().tokenizer().clone();
    let base = Ctx {
        kind: Kind::Completion,
        id: new_id("cmpl"),
        created: api::unix_now(),
        model,
        logprobs: b.logprobs.is_some(),
        tools: None,
        include_usage: b.stream_options.is_some_and(|o| o.include_usage),
        index: 0,
        token_ids: b.ids.return_token_ids.unwrap_or(false),
        ids_as_tokens: b.ids.return_tokens_as_token_ids.unwrap_or(false),
    };
    let (mut parts, mut reqs) = (Vec::new(), Vec::new());
    for (index, p) in prompts.iter().enumerate() {
        // Each prompt is a request of its own, with the same fields: the
        // same seed when one is given (vLLM's), a fresh one each when not.
        reqs.push(ValidatedRequest {
            prompt: p.prompt(),
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
        });
        parts.push(Part {
            ctx: Ctx {
                index,
                ..base.clone()
            },
            prefix: if b.echo {
                p.text(&tokenizer)
            } else {
                String::new()
            },
        });
    }
    run(state, parts, reqs, b.stream).await
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
