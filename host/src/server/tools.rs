//! Tools on both APIs: reading `tools` and `tool_choice`, the assistant
//! turns and tool results of a conversation, the grammar that forces a call
//! (`tool_choice` `required` or a named function: the output is constrained
//! to the template's call format with the function's parameter schema, as
//! vLLM does, so the call always parses), and the calls of an answer in each
//! API's shape. The call formats themselves are `specd_text::tool_calls`.
use super::api::ApiError;
use crate::sampling::JsonFormat;
use serde_json::{json, Value};
use specd_text::{ToolCall, ToolFormat};

/// What a request's `tool_choice` asks.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// Never call: the answer is text (tools are still rendered).
    None,
    /// The model decides; calls in its answer are parsed.
    Auto,
    /// At least one call, to any of the tools.
    Required,
    /// A call to this function.
    Named(String),
}

/// A request's tools, checked against the served model's template.
#[derive(Debug, Clone)]
pub struct Tools {
    /// As sent (OpenAI's function objects): the template's `tools`.
    pub list: Vec<Value>,
    pub choice: ToolChoice,
    /// How the served model writes calls.
    pub format: ToolFormat,
}

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    let mut e = ApiError::bad(format!("`{field}`: {}", message.into()));
    e.param = Some(field.to_string());
    e
}

/// The `function` object of a tool or a tool call (`at` names it).
fn function_of<'a>(v: &'a Value, at: &str) -> Result<&'a Value, ApiError> {
    v.get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| bad(&format!("{at}.function"), "must be an object"))
}

/// The name of `tools[i]`, checking its shape:
/// `{"type": "function", "function": {"name", "description"?, "parameters"?}}`.
fn tool_name(t: &Value, i: usize) -> Result<String, ApiError> {
    let field = format!("tools[{i}]");
    match t.get("type").and_then(Value::as_str) {
        Some("function") | None => {}
        Some(other) => {
            return Err(bad(
                &format!("{field}.type"),
                format!("only \"function\" tools are supported, got {other:?}"),
            ))
        }
    }
    let f = function_of(t, &field)?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            bad(
                &format!("{field}.function.name"),
                "must be a non-empty string",
            )
        })?;
    match f.get("parameters") {
        None | Some(Value::Null) | Some(Value::Object(_)) => Ok(name.to_string()),
        Some(_) => Err(bad(
            &format!("{field}.function.parameters"),
            "must be a JSON schema object",
        )),
    }
}

/// OpenAI's `tool_choice`: `"none"`, `"auto"`, `"required"` or
/// `{"type": "function", "function": {"name": ...}}`.
fn choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(bad(
                "tool_choice",
                format!(
                    "must be \"none\", \"auto\", \"required\" or a named function, got {other:?}"
                ),
            )),
        },
        Some(o @ Value::Object(_)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| {
                    matches!(
                        o.get("type").and_then(Value::as_str),
                        Some("function") | None
                    )
                });
            match name {
                Some(n) => Ok(ToolChoice::Named(n.to_string())),
                None => Err(bad(
                    "tool_choice",
                    "a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                )),
            }
        }
        Some(other) => Err(bad(
            "tool_choice",
            format!("must be a string or an object, got {other}"),
        )),
    }
}

/// Reads `tools` and `tool_choice` (`None` for Ollama, which has none: the
/// model decides). `template` is how the served model writes calls, `None`
/// when its template does not render tools: then tools are a 400.
pub fn read(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    template: Option<ToolFormat>,
) -> Result<Option<Tools>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(bad("tools", "must be an array of function tools")),
    };
    let choice = choice(tool_choice)?;
    if list.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(None),
            _ => Err(bad("tool_choice", "forcing a tool call needs `tools`")),
        };
    }
    let names = list
        .iter()
        .enumerate()
        .map(|(i, t)| tool_name(t, i))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(format) = template else {
        return Err(bad("tools", specd_text::NoToolSupport.to_string()));
    };
    if let ToolChoice::Named(n) = &choice {
        if !names.contains(n) {
            return Err(bad(
                "tool_choice",
                format!(
                    "names {n:?}, which is not among `tools` ({})",
                    names.join(", ")
                ),
            ));
        }
    }
    if matches!(choice, ToolChoice::Required | ToolChoice::Named(_))
        && format == ToolFormat::Mistral
    {
        return Err(bad(
            "tool_choice",
            "specd cannot force a call in the served model's format ([TOOL_CALLS] is a special token)",
        ));
    }
    Ok(Some(Tools {
        list,
        choice,
        format,
    }))
}

impl Tools {
    /// Whether the answer's calls are parsed out (not under `"none"`).
    pub fn parses(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The schema of one call to `tool` in `format`.
    fn call_schema(tool: &Value, format: ToolFormat) -> Value {
        let f = &tool["function"];
        let mut params = match f.get("parameters") {
            Some(p @ Value::Object(_)) => p.clone(),
            _ => json!({"type": "object"}),
        };
        // The declared parameters only, as OpenAI's strict mode (and
        // llama.cpp's grammars) read a schema that does not say: free extra
        // keys would let a model write past the call forever.
        if let Some(o) = params.as_object_mut() {
            o.entry("additionalProperties").or_insert(json!(false));
        }
        let args = if format == ToolFormat::Json {
            "parameters"
        } else {
            "arguments"
        };
        let mut props = serde_json::Map::new();
        props.insert("name".into(), json!({"const": f["name"]}));
        props.insert(args.into(), params);
        json!({
            "type": "object",
            "properties": props,
            "required": ["name", args],
            "additionalProperties": false,
        })
    }

    /// The grammar a forced call is decoded under (`None` unless
    /// `required` or named): one call in the template's format.
    pub fn constraint(&self) -> Option<JsonFormat> {
        let chosen: Vec<&Value> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.list.iter().collect(),
            ToolChoice::Named(n) => self
                .list
                .iter()
                .filter(|t| t["function"]["name"].as_str() == Some(n))
                .collect(),
        };
        let schemas: Vec<Value> = chosen
            .into_iter()
            .map(|t| Self::call_schema(t, self.format))
            .collect();
        let mut schema = if schemas.len() == 1 {
            schemas.into_iter().next().unwrap_or_default()
        } else {
            json!({ "anyOf": schemas })
        };
        // Compact JSON, as for response_format: free whitespace lets a small
        // model pad forever.
        schema["x-guidance"] = json!({"whitespace_flexible": false});
        let call = format!("call: %json {schema}");
        let start = match self.format {
            ToolFormat::Hermes => "start: \"<tool_call>\\n\" call \"\\n</tool_call>\"",
            ToolFormat::Json | ToolFormat::Mistral => "start: call",
        };
        Some(JsonFormat::Grammar(format!("{start}\n{call}\n")))
    }
}

/// The one constraint of a request: a forced call's grammar or the asked
/// output format (`format_field` names it); both at once is a 400.
pub fn constraint(
    tools: Option<&Tools>,
    format: Option<JsonFormat>,
    format_field: &str,
) -> Result<Option<JsonFormat>, ApiError> {
    match (tools.and_then(Tools::constraint), format) {
        (Some(_), Some(_)) => Err(bad(
            "tool_choice",
            format!("a forced tool call and `{format_field}` cannot both constrain the output"),
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// A fresh call id, `call_` and 24 hex digits.
pub fn call_id() -> String {
    let (a, b) = (crate::sampling::fresh_seed(), crate::sampling::fresh_seed());
    format!("call_{a:016x}{:08x}", b as u32)
}

/// OpenAI's `tool_calls` of a message (`arguments` as a JSON string); with
/// `index` for a streamed delta.
pub fn openai_calls(calls: &[ToolCall], delta: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": call_id(),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments.to_string()},
            });
            if delta {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// Ollama's `message.tool_calls` (`arguments` as an object).
pub fn ollama_calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"function": {"index": i, "name": c.name, "arguments": c.arguments}}))
        .collect()
}

/// An assistant message's `tool_calls` (`field` names it) in the shape
/// templates read, as transformers and vLLM pass them:
/// `{"id"?, "type": "function", "function": {"name", "arguments": {...}}}`,
/// the arguments parsed when they are a JSON string (OpenAI sends them so).
pub fn message_calls(v: &Value, field: &str) -> Result<Vec<Value>, ApiError> {
    let Value::Array(calls) = v else {
        return Err(bad(field, "must be an array of tool calls"));
    };
    calls
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let at = format!("{field}[{j}]");
            let f = function_of(c, &at)?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(&format!("{at}.function.name"), "must be a string"))?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| {
                        bad(
                            &format!("{at}.function.arguments"),
                            "must be a JSON object (or a string holding one)",
                        )
                    })?,
                Some(o @ Value::Object(_)) => o.clone(),
                Some(_) => {
                    return Err(bad(
                        &format!("{at}.function.arguments"),
                        "must be a JSON object (or a string holding one)",
                    ))
                }
            };
            let mut out =
                json!({"type": "function", "function": {"name": name, "arguments": arguments}});
            if let Some(id) = c.get("id").filter(|i| i.is_string()) {
                out["id"] = id.clone();
            }
            Ok(out)
        })
        .collect()
}

/// The function name of the call `id` among the earlier messages' calls.
pub fn name_of_call(messages: &[specd_text::ChatMessage], id: &str) -> Option<String> {
    messages
        .iter()
        .rev()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .find(|c| c.get("id").and_then(Value::as_str) == Some(id))
        .and_then(|c| c["function"]["name"].as_str().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}},
                           "required": ["city"]}}})
    }

    #[test]
    fn tools_and_choices_are_read_or_refused_by_name() {
        let tools = json!([weather()]);
        let t = read(Some(&tools), None, Some(ToolFormat::Hermes))
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.constraint().is_none() && t.parses());
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let t = read(Some(&tools), Some(&named), Some(ToolFormat::Hermes))
            .unwrap()
            .unwrap();
        let Some(JsonFormat::Grammar(g)) = t.constraint() else {
            panic!()
        };
        assert!(g.starts_with("start: \"<tool_call>\\n\" call"), "{g}");
        assert!(g.contains("\"const\":\"get_weather\""), "{g}");
        // The default model's template renders no tools.
        let e = read(Some(&tools), None, None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools"));
        assert!(e.message.contains("does not render tools"), "{}", e.message);
        let e = read(
            Some(&tools),
            Some(&json!("sometimes")),
            Some(ToolFormat::Hermes),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let other = json!({"type": "function", "function": {"name": "nope"}});
        let e = read(Some(&tools), Some(&other), Some(ToolFormat::Hermes)).unwrap_err();
        assert!(e.message.contains("not among"), "{}", e.message);
        let e = read(None, Some(&json!("required")), Some(ToolFormat::Hermes)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(read(None, Some(&json!("none")), None).unwrap().is_none());
        let e = read(
            Some(&json!([{"type": "function", "function": {}}])),
            None,
            Some(ToolFormat::Hermes),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].function.name"));
    }

    #[test]
    fn assistant_calls_take_the_template_shape() {
        let v = json!([{"id": "call_1", "type": "function",
                        "function": {"name": "f", "arguments": "{\"a\": 1}"}}]);
        let c = message_calls(&v, "messages[1].tool_calls").unwrap();
        assert_eq!(
            c[0],
            json!({"type": "function", "id": "call_1",
                                "function": {"name": "f", "arguments": {"a": 1}}})
        );
        let bad = json!([{"function": {"name": "f", "arguments": "nope"}}]);
        let e = message_calls(&bad, "messages[1].tool_calls").unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("messages[1].tool_calls[0].function.arguments")
        );
        let calls = [ToolCall {
            name: "f".into(),
            arguments: json!({"a": 1}),
        }];
        let oa = openai_calls(&calls, false);
        assert_eq!(oa[0]["function"]["arguments"], json!("{\"a\":1}"));
        assert!(oa[0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(
            ollama_calls(&calls)[0]["function"]["arguments"],
            json!({"a": 1})
        );
    }
}
