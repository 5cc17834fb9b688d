//! OpenAI's Responses API: `POST /v1/responses` (and `GET
//! /v1/responses/{id}` for a stored one). The input (a string, or items:
//! messages, `function_call`, `function_call_output`) becomes chat messages
//! for the model's template, function tools go through the template's tool
//! format and the forced-call grammar as on chat completions, and
//! `text.format` through the structured-output path. Streaming sends the
//! Responses events, each with its `sequence_number`.
//!
//! With `store` (the default, as OpenAI's) a response and the conversation
//! it ended are kept in memory under the caller's API key, so that a later
//! request's `previous_response_id` continues it; at most
//! `--responses-history` per key, the oldest evicted first. An unknown or
//! evicted id, or another key's, is a 404.
use super::access::Caller;
use super::api::{self, ApiError, CommonOptions, Flavor};
use super::fields;
use super::stream::{self, Assembler, Piece};
use super::tools::{self, Tools};
use super::State;
use crate::engine::Prompt;
use crate::request::{self, ValidatedRequest};
use crate::sampling::JsonFormat;
use crate::sequence::{DoneReason, Stats};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use specd_text::{ChatMessage, ToolCall, ToolFormat};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

/// A stored response and the conversation up to its end (its input and its
/// output, without its `instructions`: OpenAI does not carry them over).
struct Stored {
    id: String,
    conversation: Vec<ChatMessage>,
    response: Value,
}

/// The stored responses, per tenant (API key id; `""` without keys).
pub struct History {
    cap: usize,
    by_tenant: Mutex<HashMap<String, VecDeque<Stored>>>,
}

impl History {
    /// At most `cap` responses per tenant.
    pub fn new(cap: usize) -> History {
        History {
            cap,
            by_tenant: Mutex::new(HashMap::new()),
        }
    }

    fn with<T>(&self, tenant: &str, id: &str, f: impl FnOnce(&Stored) -> T) -> Option<T> {
        let map = self.by_tenant.lock().unwrap_or_else(|e| e.into_inner());
        map.get(tenant)?.iter().find(|s| s.id == id).map(f)
    }

    fn put(&self, tenant: &str, s: Stored) {
        if self.cap == 0 {
            return;
        }
        let mut map = self.by_tenant.lock().unwrap_or_else(|e| e.into_inner());
        let q = map.entry(tenant.to_string()).or_default();
        while q.len() >= self.cap {
            q.pop_front();
        }
        q.push_back(s);
    }

    fn not_found(&self, id: &str, field: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "response '{id}' not found: unknown, evicted (this server keeps the last {} per API key, --responses-history) or stored under another key",
                self.cap
            ),
        );
        e.param = Some(field.to_string());
        e.code = Some("response_not_found");
        e
    }
}

#[derive(Deserialize, Debug)]
pub(super) struct Body {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<String>,
    #[serde(default)]
    stream: bool,
    max_output_tokens: Option<i64>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    text: Option<Value>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    metadata: Option<Value>,
    parallel_tool_calls: Option<bool>,
    user: Option<String>,
}

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    let mut e = ApiError::bad(format!("`{field}`: {message}"));
    e.param = Some(field.to_string());
    e
}

fn fresh_id(prefix: &str) -> String {
    let (a, b) = (crate::sampling::fresh_seed(), crate::sampling::fresh_seed());
    format!("{prefix}_{a:016x}{:08x}", b as u32)
}

/// A message item's text: a string, or its `input_text` / `output_text`
/// parts.
fn item_text(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
                        out.push_str(t)
                    }
                    (t, _) => {
                        return Err(bad(
                            &format!("{at}[{j}].type"),
                            format!(
                                "{} is not supported: the served model reads text only (input_text, output_text)",
                                t.unwrap_or("(none)")
                            ),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(bad(at, "must be a string or a list of text parts")),
    }
}

/// Refuses an item's keys other than `allowed`, naming the first.
fn item_keys(item: &Value, allowed: &[&str], at: &str) -> Result<(), ApiError> {
    if let Some(o) = item.as_object() {
        if let Some(k) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(bad(
                &format!("{at}.{k}"),
                "unknown field of this input item",
            ));
        }
    }
    Ok(())
}

/// `input` appended to `msgs` as chat messages: a string is one user turn;
/// items are messages, the assistant's `function_call`s (joined to the
/// assistant turn before them) and their `function_call_output`s (tool
/// turns).
fn read_input(input: &Value, msgs: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let items = match input {
        Value::String(s) => {
            msgs.push(ChatMessage::user(s.clone()));
            return Ok(());
        }
        Value::Array(items) => items,
        Value::Null => return Err(bad("input", "is required")),
        _ => return Err(bad("input", "must be a string or a list of input items")),
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let str_of = |k: &str| item.get(k).and_then(Value::as_str);
        match str_of("type") {
            None | Some("message") => {
                item_keys(item, &["type", "role", "content", "id", "status"], &at)?;
                let role = match str_of("role") {
                    Some("developer" | "system") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    r => {
                        return Err(bad(
                            &format!("{at}.role"),
                            format!(
                                "{} is not one of user, assistant, system, developer",
                                r.unwrap_or("(none)")
                            ),
                        ))
                    }
                };
                let text = item_text(
                    item.get("content").unwrap_or(&Value::Null),
                    &format!("{at}.content"),
                )?;
                msgs.push(ChatMessage::new(role, text));
            }
            Some("function_call") => {
                item_keys(
                    item,
                    &["type", "call_id", "name", "arguments", "id", "status"],
                    &at,
                )?;
                let call_id = str_of("call_id")
                    .ok_or_else(|| bad(&format!("{at}.call_id"), "must be a string"))?;
                let call = json!([{"id": call_id, "type": "function", "function": {
                    "name": item.get("name"), "arguments": item.get("arguments"),
                }}]);
                let calls = tools::message_calls(&call, &at)?;
                match msgs.last_mut() {
                    // Calls after the assistant's text, or after other calls
                    // of the same turn, belong to that turn.
                    Some(m) if m.role == "assistant" => {
                        m.tool_calls.get_or_insert_with(Vec::new).extend(calls)
                    }
                    _ => {
                        let mut m = ChatMessage::new("assistant", String::new());
                        m.tool_calls = Some(calls);
                        msgs.push(m);
                    }
                }
            }
            Some("function_call_output") => {
                item_keys(item, &["type", "call_id", "output", "id", "status"], &at)?;
                let call_id = str_of("call_id")
                    .ok_or_else(|| bad(&format!("{at}.call_id"), "must be a string"))?;
                let output = item_text(
                    item.get("output").unwrap_or(&Value::Null),
                    &format!("{at}.output"),
                )?;
                let mut m = ChatMessage::new("tool", output);
                m.name = tools::name_of_call(msgs, call_id);
                m.tool_call_id = Some(call_id.to_string());
                msgs.push(m);
            }
            Some("item_reference") => {
                return Err(bad(
                    &format!("{at}.type"),
                    "item_reference is not supported: send the item, or previous_response_id",
                ))
            }
            Some(t) => {
                return Err(bad(
                    &format!("{at}.type"),
                    format!("{t} items are not supported (specd runs function tools only)"),
                ))
            }
        }
    }
    Ok(())
}

/// Responses' function tools (`{"type": "function", "name", "parameters",
/// ...}`) in chat's shape, and `tool_choice` likewise; a built-in tool
/// (web search, file search, ...) is refused by name.
fn chat_tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
) -> Result<(Option<Value>, Option<Value>), ApiError> {
    let tools = match tools {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(Value::Array(
            list.iter()
                .enumerate()
                .map(|(i, t)| match t.get("type").and_then(Value::as_str) {
                    Some("function") => {
                        let mut f = serde_json::Map::new();
                        for k in ["name", "description", "parameters", "strict"] {
                            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                                f.insert(k.to_string(), v.clone());
                            }
                        }
                        Ok(json!({"type": "function", "function": f}))
                    }
                    t => Err(bad(
                        &format!("tools[{i}].type"),
                        format!(
                            "{} tools are not supported: specd runs function tools only",
                            t.unwrap_or("(none)")
                        ),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
        )),
        Some(_) => return Err(bad("tools", "must be a list of function tools")),
    };
    let choice = match choice {
        None | Some(Value::Null) => None,
        Some(s @ Value::String(_)) => Some(s.clone()),
        Some(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            Some(json!({"type": "function", "function": {"name": o.get("name")}}))
        }
        Some(o) => {
            return Err(bad(
                "tool_choice",
                format!(
                    "{} is not supported: auto, none, required or a function",
                    o.get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("this choice")
                ),
            ))
        }
    };
    Ok((tools, choice))
}

/// `text.format`: `text`, `json_object` or `json_schema` (its `schema`).
fn text_format(text: Option<&Value>) -> Result<Option<JsonFormat>, ApiError> {
    let Some(t) = text.filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    let Some(o) = t.as_object() else {
        return Err(bad("text", "must be an object"));
    };
    for (k, v) in o {
        match k.as_str() {
            "format" => {}
            "verbosity" if v.is_null() || v.as_str() == Some("medium") => {}
            "verbosity" => {
                return Err(bad(
                    "text.verbosity",
                    "the served model has no verbosity control (medium only)",
                ))
            }
            _ => return Err(bad(&format!("text.{k}"), "unknown field")),
        }
    }
    let Some(f) = o.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(JsonFormat::Object)),
        Some("json_schema") => match f.get("schema") {
            Some(s @ Value::Object(_)) => Ok(Some(JsonFormat::Schema(s.clone()))),
            _ => Err(bad("text.format.schema", "must be a JSON schema object")),
        },
        t => Err(bad(
            "text.format.type",
            format!(
                "must be text, json_object or json_schema, got {}",
                t.unwrap_or("nothing")
            ),
        )),
    }
}

/// What a response echoes of its request.
#[derive(Clone)]
struct Head {
    id: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    previous_response_id: Option<String>,
    store: bool,
    temperature: f32,
    top_p: f32,
    text: Value,
    tools: Value,
    tool_choice: Value,
    metadata: Value,
    parallel_tool_calls: bool,
    user: Option<String>,
}

impl Head {
    /// The response object with `output`, `status` and, once done, usage.
    fn response(&self, status: &str, output: Vec<Value>, stats: Option<&Stats>) -> Value {
        let mut r = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": null, "summary": null},
            "store": self.store,
            "temperature": self.temperature,
            "text": self.text,
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": null,
            "user": self.user,
            "metadata": self.metadata,
        });
        if let Some(s) = stats {
            r["usage"] = json!({
                "input_tokens": s.prompt_tokens,
                "input_tokens_details": {"cached_tokens": s.cached_tokens},
                "output_tokens": s.generated_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": s.prompt_tokens + s.generated_tokens,
            });
            r["speculation"] = serde_json::to_value(s).unwrap_or(Value::Null);
            r["metrics"] = api::vllm_metrics(s);
            if s.done_reason == DoneReason::Length {
                r["status"] = json!("incomplete");
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
        }
        r
    }
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content: Vec<Value> = if status == "in_progress" {
        vec![]
    } else {
        vec![output_text(text)]
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn call_item(id: &str, call_id: &str, c: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": c.name,
           "arguments": arguments, "status": status})
}

/// The ids of an answer's output items, made once so that a stream's
/// events and its final response name the same items.
struct Ids {
    message: String,
    /// `(item id, call id)` per call.
    calls: Vec<(String, String)>,
}

impl Ids {
    fn new() -> Ids {
        Ids {
            message: fresh_id("msg"),
            calls: Vec::new(),
        }
    }

    fn call(&mut self, i: usize) -> (String, String) {
        while self.calls.len() <= i {
            self.calls.push((fresh_id("fc"), fresh_id("call")));
        }
        self.calls[i].clone()
    }
}

/// The output items of an answer: its text as a message (when there is
/// text, or nothing else), then its calls.
fn output(ids: &mut Ids, text: &str, calls: &[ToolCall]) -> Vec<Value> {
    let mut out = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        out.push(message_item(&ids.message, text, "completed"));
    }
    for (i, c) in calls.iter().enumerate() {
        let (id, call_id) = ids.call(i);
        out.push(call_item(
            &id,
            &call_id,
            c,
            &c.arguments.to_string(),
            "completed",
        ));
    }
    out
}

/// The assistant turn an answer adds to the conversation (stored for
/// `previous_response_id`), its calls in the template's shape.
fn assistant_turn(ids: &mut Ids, text: &str, calls: &[ToolCall]) -> ChatMessage {
    let mut m = ChatMessage::new("assistant", text.to_string());
    if !calls.is_empty() {
        m.tool_calls = Some(
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    json!({"id": ids.call(i).1, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect(),
        );
    }
    m
}

/// What is needed to finish a response: the head, the conversation so
/// far, where to store it.
struct Finisher {
    state: State,
    head: Head,
    tenant: String,
    conversation: Vec<ChatMessage>,
}

impl Finisher {
    /// The final response; stored when asked.
    fn finish(self, ids: &mut Ids, text: &str, calls: &[ToolCall], stats: &Stats) -> Value {
        let r = self
            .head
            .response("completed", output(ids, text, calls), Some(stats));
        if self.head.store {
            let mut conversation = self.conversation;
            conversation.push(assistant_turn(ids, text, calls));
            self.state.responses.put(
                &self.tenant,
                Stored {
                    id: self.head.id.clone(),
                    conversation,
                    response: r.clone(),
                },
            );
        }
        r
    }
}

pub async fn create(
    axum::extract::State(state): axum::extract::State<State>,
    caller: Option<axum::Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    respond(state, caller, body)
        .await
        .map_err(|e| e.flavor(Flavor::OpenAi))
}

async fn respond(
    state: State,
    caller: Option<axum::Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let v = api::read_body(body, &fields::OPENAI_RESPONSES)?;
    let b: Body = api::from_value(v.clone(), "")?;
    let common: CommonOptions = api::from_value(v, "")?;
    let model = state.served_model(&b.model)?;
    let tenant = api::tenant(&caller);
    let mut conversation = match &b.previous_response_id {
        Some(id) => state
            .responses
            .with(&tenant, id, |s| s.conversation.clone())
            .ok_or_else(|| state.responses.not_found(id, "previous_response_id"))?,
        None => Vec::new(),
    };
    read_input(b.input.as_ref().unwrap_or(&Value::Null), &mut conversation)?;
    let mut msgs = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = b.instructions.as_ref().filter(|i| !i.is_empty()) {
        msgs.push(ChatMessage::system(i.clone()));
    }
    msgs.extend(conversation.iter().cloned());
    let (chat_tools, chat_choice) = chat_tools(b.tools.as_ref(), b.tool_choice.as_ref())?;
    let tools = tools::read(
        chat_tools.as_ref(),
        chat_choice.as_ref(),
        state.model.tool_format,
    )?;
    let format = tools::constraint(tools.as_ref(), text_format(b.text.as_ref())?, "text.format")?;
    let prompt = match &tools {
        Some(t) => Prompt::ChatWithTools(msgs, t.list.clone()),
        None => Prompt::Chat(msgs),
    };
    let params = common.params(&state.sampling_defaults(Flavor::OpenAi))?;
    let req = ValidatedRequest {
        prompt,
        params: params.clone(),
        max_tokens: api::cap_max_tokens(
            &state,
            request::non_negative("max_output_tokens", b.max_output_tokens)?,
            "max_output_tokens",
        )?,
        stop: common.stop(),
        spec: common.spec(&state.defaults)?,
        trace_rounds: false,
        tenant: tenant.clone(),
        logprobs: None,
        format,
        prompt_logprobs: false,
        ends: common.ends(state.model.vocab_size)?,
    };
    let head = Head {
        id: fresh_id("resp"),
        created_at: api::unix_now(),
        model,
        instructions: b.instructions.clone(),
        max_output_tokens: b.max_output_tokens,
        previous_response_id: b.previous_response_id.clone(),
        store: b.store.unwrap_or(true),
        temperature: params.temperature,
        top_p: params.top_p,
        text: b
            .text
            .clone()
            .filter(|t| !t.is_null())
            .unwrap_or_else(|| json!({"format": {"type": "text"}})),
        tools: b.tools.clone().unwrap_or_else(|| json!([])),
        tool_choice: b.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        metadata: b.metadata.clone().unwrap_or_else(|| json!({})),
        parallel_tool_calls: b.parallel_tool_calls.unwrap_or(true),
        user: b.user.clone(),
    };
    let call_format = tools.filter(Tools::parses).map(|t| t.format);
    let (rx, _, _) = api::start(&state, req).await?;
    let fin = Finisher {
        state,
        head,
        tenant,
        conversation,
    };
    if !b.stream {
        let c = api::collect(rx).await?;
        let (text, calls) = match call_format {
            Some(f) => {
                let p = specd_text::tool_calls::parse(f, &c.text);
                (p.content, p.calls)
            }
            None => (c.text, Vec::new()),
        };
        return Ok(Json(fin.finish(&mut Ids::new(), &text, &calls, &c.stats)).into_response());
    }
    Ok(stream_response(rx, fin, call_format))
}

/// The Responses events of one answer.
struct Events {
    seq: u64,
    ids: Ids,
    /// The text sent so far; the message item is open once it is not empty.
    text: String,
    open: bool,
}

impl Events {
    fn event(&mut self, kind: &str, mut data: Value) -> Event {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        Event::default().event(kind).data(data.to_string())
    }

    /// The message item's opening events (once: the first text, or an
    /// empty answer closing).
    fn open_message(&mut self, id: &str, out: &mut Vec<Event>) {
        self.open = true;
        let item = message_item(id, "", "in_progress");
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        ));
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "part": output_text("")}),
        ));
    }

    fn text(&mut self, delta: &str, out: &mut Vec<Event>) {
        if delta.is_empty() {
            return;
        }
        let id = self.ids.message.clone();
        if !self.open {
            self.open_message(&id, out);
        }
        self.text.push_str(delta);
        out.push(self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": delta, "logprobs": []}),
        ));
    }

    /// The message's closing events (opened if the answer is empty and has
    /// no calls: a response always has an output item), then each call's.
    fn close(&mut self, calls: &[ToolCall], out: &mut Vec<Event>) {
        let id = self.ids.message.clone();
        if !self.open && calls.is_empty() {
            self.open_message(&id, out);
        }
        let mut index = 0;
        if self.open {
            let text = self.text.clone();
            out.push(self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
            ));
            out.push(self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "part": output_text(&text)}),
            ));
            let item = message_item(&id, &text, "completed");
            out.push(self.event(
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            ));
            index = 1;
        }
        for (i, c) in calls.iter().enumerate() {
            let (item_id, call_id) = self.ids.call(i);
            let args = c.arguments.to_string();
            let at = index + i;
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": at, "item": call_item(&item_id, &call_id, c, "", "in_progress")}),
            ));
            out.push(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": at, "delta": args}),
            ));
            out.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": at, "name": c.name, "arguments": args}),
            ));
            out.push(self.event(
                "response.output_item.done",
                json!({"output_index": at, "item": call_item(&item_id, &call_id, c, &args, "completed")}),
            ));
        }
    }
}

fn stream_response(
    rx: tokio::sync::mpsc::UnboundedReceiver<super::worker::Msg>,
    fin: Finisher,
    call_format: Option<ToolFormat>,
) -> Response {
    let mut ev = Events {
        seq: 0,
        ids: Ids::new(),
        text: String::new(),
        open: false,
    };
    let start = fin.head.response("in_progress", vec![], None);
    let opening = vec![
        ev.event("response.created", json!({ "response": start })),
        ev.event("response.in_progress", json!({ "response": start })),
    ];
    let mut fin = Some(fin);
    let asm = Assembler::new(String::new(), call_format);
    let body = stream::pieces(rx, asm, move |piece| match piece {
        Piece::Text { text, .. } => {
            let mut out = Vec::new();
            ev.text(&text, &mut out);
            (out, false)
        }
        Piece::Done {
            text, calls, stats, ..
        } => {
            let mut out = Vec::new();
            ev.text(&text, &mut out);
            ev.close(&calls, &mut out);
            let whole = ev.text.clone();
            let r = match fin.take() {
                Some(f) => f.finish(&mut ev.ids, &whole, &calls, &stats),
                None => Value::Null,
            };
            // `response.completed` ends every stream (as vLLM's), its
            // `status` `incomplete` when the output was cut at
            // max_output_tokens.
            out.push(ev.event("response.completed", json!({ "response": r })));
            (out, true)
        }
        Piece::Failed(e) => (
            vec![ev.event(
                "error",
                json!({"code": "server_error", "message": e, "param": null}),
            )],
            true,
        ),
        Piece::Rounds(_) => (vec![], false),
    });
    let s = futures_util::StreamExt::chain(
        futures_util::stream::iter(opening.into_iter().map(Ok)),
        body,
    );
    Sse::new(s)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// `GET /v1/responses/{id}`: a stored response of the caller's key.
pub async fn get(
    axum::extract::State(state): axum::extract::State<State>,
    caller: Option<axum::Extension<Caller>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = api::tenant(&caller);
    state
        .responses
        .with(&tenant, &id, |s| s.response.clone())
        .map(Json)
        .ok_or_else(|| {
            state
                .responses
                .not_found(&id, "response_id")
                .flavor(Flavor::OpenAi)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_the_templates_turns() {
        let mut msgs = Vec::new();
        let input = json!([
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ]);
        read_input(&input, &mut msgs).unwrap();
        let roles: Vec<_> = msgs.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user"]);
        let call = &msgs[1].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(msgs[2].name.as_deref(), Some("get_weather"));
        assert_eq!(msgs[3].content, "thanks");
    }

    #[test]
    fn what_is_not_implemented_is_named() {
        let mut msgs = Vec::new();
        let e =
            read_input(&json!([{"type": "web_search_call", "id": "x"}]), &mut msgs).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].type"));
        let e = read_input(
            &json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            &mut msgs,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].content[0].type"));
        let e = chat_tools(Some(&json!([{"type": "web_search"}])), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        assert!(e.message.contains("web_search"), "{}", e.message);
        let (t, c) = chat_tools(
            Some(&json!([{"type": "function", "name": "f", "parameters": {}}])),
            Some(&json!({"type": "function", "name": "f"})),
        )
        .unwrap();
        assert_eq!(t.unwrap()[0]["function"]["name"], "f");
        assert_eq!(c.unwrap()["function"]["name"], "f");
        let f = text_format(Some(&json!({"format": {"type": "json_schema", "name": "x",
            "schema": {"type": "object"}}})))
        .unwrap();
        assert!(matches!(f, Some(JsonFormat::Schema(_))));
        assert!(text_format(Some(&json!({"format": {"type": "yaml"}}))).is_err());
    }

    #[test]
    fn the_history_is_bounded_and_per_tenant() {
        let h = History::new(2);
        let s = |id: &str| Stored {
            id: id.into(),
            conversation: vec![],
            response: json!({}),
        };
        for id in ["a", "b", "c"] {
            h.put("k1", s(id));
        }
        assert!(h.with("k1", "a", |_| ()).is_none(), "the oldest is evicted");
        assert!(h.with("k1", "c", |_| ()).is_some());
        assert!(h.with("k2", "c", |_| ()).is_none(), "another key's");
    }
}
